// Link emulation: a Transport wrapper that makes every message take as long as it would on a slower link,
// without burning CPU, so that overlap studies mean something on a 2-core machine and model slower
// interconnects on fast ones.
//
// Model. Each hop has a link class (comm/topology.h says which): intra-node hops a full-duplex link per direction,
// i.e. per (sender, receiver) pair, as in a switched network; inter-node hops the sending node's NIC, one per node,
// shared by all of its ranks (its egress: what the node's ranks send to other nodes queues on it, in the order sent):
//   departure = max(now, link_free)         link_free: the pair's link, or the node's NIC (shared memory, atomic)
//   link_free = departure + bytes / bandwidth
//   arrival   = link_free + latency
// The sender computes the arrival time and sends it in an 8-byte header before the payload, over the wrapped
// transport with the same tag; the receiver receives both at the real transport's speed and then sleeps until the
// arrival time (clock_nanosleep, absolute; the waiting transport below sleeps too, see PollPolicy), waking now
// and then while it has sends in flight to let them progress (MPI moves a large message only while both ends are
// in MPI calls): every 50 us at first, backing off to 1 ms. So a receiver never sees a message before its arrival,
// and a step that computes is not delayed further than the link.
//
// Left out: the receiving NIC (ingress; two nodes sending to one are not slowed), the switch, congestion control,
// and a message's pipelining across hops. Assumptions: all ranks read one CLOCK_MONOTONIC (one machine: clocks_differ
// refuses ranks under several kernels; across them the header would need the clocks' offsets), and the ranks sharing a
// NIC share a host (an emulated node spread over hosts gets a NIC per host). The emulation can only add delay: a link
// faster than the real transport (nvlink4 on this machine's ~10 GB/s of host messages) runs at the real transport's
// speed.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace ddplab {

struct LinkModel;  // comm/communicator.h

// The egress of one node's NIC: the time it is busy until, in a small shared-memory segment that the node's ranks on
// this host map, advanced atomically by whichever rank sends across nodes.
class SharedNic {
 public:
  // Collective over comm: the ranks with the same `node` share one. Throws std::runtime_error when the segment
  // cannot be made (on every rank of the node alike).
  SharedNic(MPI_Comm comm, int node);
  ~SharedNic();
  SharedNic(const SharedNic&) = delete;
  SharedNic& operator=(const SharedNic&) = delete;
  // Queues `busy_ns` of sending behind what the node's ranks queued before; returns when that sending ends.
  int64_t reserve(int64_t now_ns, int64_t busy_ns);
  int ranks() const { return ranks_; }  // the ranks sharing it

 private:
  void* segment_ = nullptr;
  int ranks_ = 1;
};

// One hop's link, as the sender sees it.
struct HopLink {
  double latency_us = 0, gbps = 0;  // gbps 0: unlimited bandwidth
  bool through_nic = false;         // queued on the node's SharedNic instead of the pair's own link
};

// Sleeps (does not spin) until CLOCK_MONOTONIC reaches t_ns.
void sleep_until_ns(int64_t t_ns);

// This kernel's boot id (/proc/sys/kernel/random/boot_id): processes that share it read one CLOCK_MONOTONIC,
// containers and network namespaces of one machine included; other machines and VMs each have their own.
std::string this_boot_id();

// The emulation stamps each message's arrival by the sender's CLOCK_MONOTONIC and the receiver waits for it on its
// own, which only one kernel's clock makes meaningful: across machines, whose clocks count from their own boots, a
// receiver would wait for hours or not at all. Why the ranks of comm cannot share an emulated link (two ranks under
// different kernels, named), or "" where every rank's boot_id is rank 0's. Collective; alike on every rank.
std::string clocks_differ(MPI_Comm comm, const std::string& boot_id = this_boot_id());

class LinkEmulatedTransport final : public Transport {
 public:
  // Every hop alike: latency in microseconds, bandwidth in Gbit/s (0: unlimited).
  LinkEmulatedTransport(std::unique_ptr<Transport> inner, double latency_us, double gbps);
  // A link per peer (by rank of inner); `nic` serves the hops through_nic (required when any is).
  LinkEmulatedTransport(std::unique_ptr<Transport> inner, const std::vector<HopLink>& hops,
                        std::shared_ptr<SharedNic> nic);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void send(int peer, const void* buf, size_t bytes, int tag) override;
  // send(), timed on the link as a message of link_bytes: for a payload that moves another way (GPU memory over a
  // device link, comm/ring_device.h's LinkEmulatedRingLink), a message of no bytes that carries only its arrival.
  void send_as(int peer, const void* buf, size_t bytes, size_t link_bytes, int tag);
  void recv(int peer, void* buf, size_t bytes, int tag) override;
  void recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume) override;
  void wait_sends(size_t keep_last = 0) override;
  bool progress() override { return inner_->progress(); }

  // Time the link to `peer` needs for `bytes` (serialisation only, without latency), in ns.
  int64_t serialisation_ns(int peer, size_t bytes) const;

 private:
  struct Hop {
    int64_t latency_ns;
    double ns_per_byte;
    bool through_nic;
    int64_t link_free_ns;  // the pair's own link (unused through the NIC)
  };
  void set_hops(const std::vector<HopLink>& hops);
  void sleep_until_arrival(int64_t arrival);

  std::unique_ptr<Transport> inner_;
  std::vector<Hop> hops_;  // per destination rank
  std::shared_ptr<SharedNic> nic_;
  std::deque<int64_t> headers_;        // arrival times in flight (a deque: pushing keeps earlier addresses valid)
};

}  // namespace ddplab
