#include "comm/link_emulation.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/shm_segments.h"
#include "runtime/mpi_check.h"
#include "runtime/owned_comm.h"

namespace ddplab {

namespace {
constexpr int64_t kFirstNapNs = 50'000, kLongestNapNs = 1'000'000;
}  // namespace

void sleep_until_ns(int64_t t_ns) {
  tighten_timer_slack_once();  // the default 50 us slack would make every emulated message up to 50 us late
  const timespec ts{static_cast<time_t>(t_ns / 1'000'000'000), static_cast<long>(t_ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

std::string this_boot_id() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(file, id);
  return id;  // empty where /proc does not say: every such rank alike
}

std::string clocks_differ(MPI_Comm comm, const std::string& boot_id) {
  constexpr int kWidth = 48;  // a boot id is 36 characters
  int size = 1;
  mpiCheck(MPI_Comm_size(comm, &size));
  std::string mine = boot_id.substr(0, kWidth);
  mine.resize(kWidth, '\0');
  std::vector<char> all(static_cast<size_t>(kWidth) * size);
  mpiCheck(MPI_Allgather(mine.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, comm));
  for (int r = 1; r < size; ++r)
    if (!std::equal(all.begin(), all.begin() + kWidth, all.begin() + static_cast<ptrdiff_t>(r) * kWidth))
      return "--link emulates each message's arrival by the sender's clock, and ranks 0 and " + std::to_string(r) +
             " run on different machines (other kernels' boot ids), whose clocks differ: emulate links between ranks "
             "of one machine (network namespaces, or --ranks-per-node K)";
  return "";
}

namespace {

using NicClock = std::atomic<int64_t>;
static_assert(NicClock::is_always_lock_free, "the NIC's clock is shared between processes");
constexpr size_t kNicSegmentBytes = 64;

}  // namespace

SharedNic::SharedNic(MPI_Comm comm, int node) {
  // The node's ranks on this host: the first shares the segment, whose clock ftruncate zeroes; all map it.
  int rank = 0, group_rank = 0;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  OwnedComm host, group;
  mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, host.receive()));
  mpiCheck(MPI_Comm_split(host, node, rank, group.receive()));
  host.reset();
  mpiCheck(MPI_Comm_rank(group, &group_rank));
  mpiCheck(MPI_Comm_size(group, &ranks_));
  try {
    const shm_detail::SharedSegments shared(group, "nic", group_rank == 0 ? kNicSegmentBytes : 0, "SharedNic: ");
    std::string error = group_rank == 0 ? shm_detail::allocate(shared.own().fd, kNicSegmentBytes) : "";
    if (error.empty()) segment_ = shm_detail::map_shared(shared[0].fd, kNicSegmentBytes, /*populate=*/false, error);
    shm_detail::agree(group, error, "SharedNic: mapping the NIC's clock");
  } catch (...) {
    if (segment_) munmap(segment_, kNicSegmentBytes);
    throw;
  }
}

SharedNic::~SharedNic() {
  if (segment_) munmap(segment_, kNicSegmentBytes);
}

int64_t SharedNic::reserve(int64_t now_ns, int64_t busy_ns) {
  NicClock& free_at = *static_cast<NicClock*>(segment_);
  int64_t seen = free_at.load(std::memory_order_relaxed), end = 0;
  do {
    end = std::max(now_ns, seen) + busy_ns;
  } while (!free_at.compare_exchange_weak(seen, end, std::memory_order_relaxed));
  return end;
}

LinkEmulatedTransport::LinkEmulatedTransport(std::unique_ptr<Transport> inner, double latency_us, double gbps)
    : inner_(std::move(inner)) {
  set_hops(std::vector<HopLink>(inner_->size(), HopLink{latency_us, gbps, false}));
}

LinkEmulatedTransport::LinkEmulatedTransport(std::unique_ptr<Transport> inner, const std::vector<HopLink>& hops,
                                             std::shared_ptr<SharedNic> nic)
    : inner_(std::move(inner)), nic_(std::move(nic)) {
  set_hops(hops);
}

void LinkEmulatedTransport::set_hops(const std::vector<HopLink>& hops) {
  if (hops.size() != static_cast<size_t>(inner_->size()))
    throw std::invalid_argument("LinkEmulatedTransport: a link per peer is needed");
  for (const HopLink& h : hops) {
    if (!(h.latency_us >= 0) || !(h.gbps >= 0) || !std::isfinite(h.latency_us) || !std::isfinite(h.gbps))
      throw std::invalid_argument("LinkEmulatedTransport: latency and bandwidth must be finite and >= 0");
    if (h.through_nic && !nic_) throw std::invalid_argument("LinkEmulatedTransport: a hop through a NIC needs one");
    hops_.push_back({std::llround(h.latency_us * 1000.0), h.gbps > 0 ? 8.0 / h.gbps : 0.0,  // Gbit/s = bits per ns
                     h.through_nic, 0});
  }
}

int64_t LinkEmulatedTransport::serialisation_ns(int peer, size_t bytes) const {
  return std::llround(static_cast<double>(bytes) * hops_.at(peer).ns_per_byte);
}

void LinkEmulatedTransport::send(int peer, const void* buf, size_t bytes, int tag) {
  send_as(peer, buf, bytes, bytes, tag);
}

void LinkEmulatedTransport::send_as(int peer, const void* buf, size_t bytes, size_t link_bytes, int tag) {
  if (peer < 0 || peer >= size())
    throw std::invalid_argument("rank " + std::to_string(rank()) + ": LinkEmulatedTransport::send to rank " +
                                std::to_string(peer) + " of " + std::to_string(size()));
  Hop& hop = hops_[peer];
  const int64_t now = monotonic_ns(), busy = serialisation_ns(peer, link_bytes);
  int64_t sent_by = 0;  // when the last byte has left
  if (hop.through_nic) {
    sent_by = nic_->reserve(now, busy);
  } else {
    hop.link_free_ns = std::max(now, hop.link_free_ns) + busy;
    sent_by = hop.link_free_ns;
  }
  headers_.push_back(sent_by + hop.latency_ns);
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
