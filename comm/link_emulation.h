// Link emulation: a Transport wrapper that makes every message take as long as it would on a slower link,
// without burning CPU, so that overlap studies mean something on a 2-core machine and model slower
// interconnects on fast ones.
//
// Model (one full-duplex link per direction, i.e. per (sender, receiver) pair, as in a switched network):
//   departure = max(now, link_free)         the link serialises messages in the order they are sent
//   link_free = departure + bytes / bandwidth
//   arrival   = link_free + latency
// The sender computes the arrival time and sends it in an 8-byte header before the payload, over the wrapped
// transport with the same tag; the receiver receives both at the real transport's speed and then sleeps until the
// arrival time (clock_nanosleep, absolute; the waiting transport below sleeps too, see PollPolicy), waking now
// and then while it has sends in flight to let them progress (MPI moves a large message only while both ends are
// in MPI calls): every 50 us at first, backing off to 1 ms. So a
// receiver never sees a message before its arrival, and a step that computes is not delayed further than the link.
//
// Assumptions: all ranks read one CLOCK_MONOTONIC (one host; across hosts the header would need the clock
// offsets of DESIGN.md's alignment step). The emulation can only add delay: a link faster than the real
// transport (nvlink4 on this machine's ~10 GB/s of host messages) runs at the real transport's speed.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "comm/transport.h"

namespace ddplab {

struct LinkModel;  // comm/communicator.h

// ns on CLOCK_MONOTONIC, the clock the headers carry.
int64_t monotonic_ns();
// Sleeps (does not spin) until CLOCK_MONOTONIC reaches t_ns.
void sleep_until_ns(int64_t t_ns);

class LinkEmulatedTransport final : public Transport {
 public:
  // latency in microseconds, bandwidth in Gbit/s (0: unlimited).
  LinkEmulatedTransport(std::unique_ptr<Transport> inner, double latency_us, double gbps);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void send(int peer, const void* buf, size_t bytes, int tag) override;
  void recv(int peer, void* buf, size_t bytes, int tag) override;
  void recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume) override;
  void wait_sends(size_t keep_last = 0) override;
  bool progress() override { return inner_->progress(); }

  // Time the link needs for `bytes` (serialisation only, without latency), in ns.
  int64_t serialisation_ns(size_t bytes) const;

 private:
  void sleep_until_arrival(int64_t arrival);

  std::unique_ptr<Transport> inner_;
  int64_t latency_ns_;
  double ns_per_byte_;
  std::vector<int64_t> link_free_ns_;  // per destination rank
  std::deque<int64_t> headers_;        // arrival times in flight (a deque: pushing keeps earlier addresses valid)
};

}  // namespace ddplab
