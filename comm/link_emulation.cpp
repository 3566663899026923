#include "comm/link_emulation.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <stdexcept>
#include <string>

namespace ddplab {

namespace {
constexpr int64_t kFirstNapNs = 50'000, kLongestNapNs = 1'000'000;
}  // namespace

int64_t monotonic_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

void sleep_until_ns(int64_t t_ns) {
  // The default 50 us timer slack would make every emulated message up to 50 us late.
  thread_local bool slack_set = false;
  if (!slack_set) {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    slack_set = true;
  }
  const timespec ts{static_cast<time_t>(t_ns / 1'000'000'000), static_cast<long>(t_ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

LinkEmulatedTransport::LinkEmulatedTransport(std::unique_ptr<Transport> inner, double latency_us, double gbps)
    : inner_(std::move(inner)),
      latency_ns_(std::llround(latency_us * 1000.0)),
      ns_per_byte_(gbps > 0 ? 8.0 / gbps : 0.0),  // Gbit/s = bits per ns
      link_free_ns_(inner_->size(), 0) {
  if (!(latency_us >= 0) || !(gbps >= 0) || !std::isfinite(latency_us) || !std::isfinite(gbps))
    throw std::invalid_argument("LinkEmulatedTransport: latency and bandwidth must be finite and >= 0");
}

int64_t LinkEmulatedTransport::serialisation_ns(size_t bytes) const {
  return std::llround(static_cast<double>(bytes) * ns_per_byte_);
}

void LinkEmulatedTransport::send(int peer, const void* buf, size_t bytes, int tag) {
  if (peer < 0 || peer >= size())
    throw std::invalid_argument("rank " + std::to_string(rank()) + ": LinkEmulatedTransport::send to rank " +
                                std::to_string(peer) + " of " + std::to_string(size()));
  int64_t& link_free = link_free_ns_[peer];
  const int64_t departure = std::max(monotonic_ns(), link_free);
  link_free = departure + serialisation_ns(bytes);
  headers_.push_back(link_free + latency_ns_);
  inner_->send(peer, &headers_.back(), sizeof(int64_t), tag);
  inner_->send(peer, buf, bytes, tag);
}

void LinkEmulatedTransport::sleep_until_arrival(int64_t arrival) {
  // Wake now and then while our own sends are still in flight, to move them along (see Transport::progress).
  int64_t nap = kFirstNapNs;
  for (int64_t now = monotonic_ns(); now < arrival; now = monotonic_ns()) {
    sleep_until_ns(inner_->progress() ? std::min(arrival, now + nap) : arrival);
    nap = std::min(2 * nap, kLongestNapNs);
  }
}

void LinkEmulatedTransport::recv(int peer, void* buf, size_t bytes, int tag) {
  int64_t arrival = 0;
  inner_->recv(peer, &arrival, sizeof arrival, tag);
  inner_->recv(peer, buf, bytes, tag);
  sleep_until_arrival(arrival);
}

// The data may be used where the inner transport holds it, but not before its arrival time.
void LinkEmulatedTransport::recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume) {
  int64_t arrival = 0;
  inner_->recv(peer, &arrival, sizeof arrival, tag);
  bool arrived = false;
  inner_->recv_consume(peer, bytes, tag, staging, [&](const void* piece, size_t offset, size_t length) {
    if (!arrived) sleep_until_arrival(arrival);
    arrived = true;
    consume(piece, offset, length);
  });
  if (!arrived) sleep_until_arrival(arrival);
}

void LinkEmulatedTransport::wait_sends(size_t keep_last) {
  inner_->wait_sends(2 * keep_last);  // each message is a header and a payload
  while (headers_.size() > keep_last) headers_.pop_front();
}

}  // namespace ddplab
