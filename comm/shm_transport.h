// Shared-memory transport between the ranks of one node that share a host (after NCCL's SHM transport). It reaches
// those peers only; the transport table (comm/transport_table.h) routes each of the others to MPI.
//
// Why: Open MPI moves a message above its 4 KiB eager limit by rendezvous, which on this machine costs ~4 us per
// message and copies with process_vm_readv at 4-10 GB/s (measured in docs/COMM.md), and a rendezvous message only
// moves while both ranks are inside MPI calls. Here every ordered pair of ranks on a node has a FIFO in POSIX shared
// memory: send copies the message into the receiver's FIFO at once (eagerly; it completes when copied, the peer
// need not be listening), and the receiver reduces straight from the FIFO (recv_consume): one copy per hop, the
// receiver's copy is its reduction.
//
// FIFO: a ring of 64 one-cache-line records {number, bytes, tag, up to 40 bytes of payload}, which the receiver
// polls by number (a small message is one cache line from core to core), and a payload ring of `fifo_bytes` with
// a producer counter (head) and a consumer counter (tail) on their own cache lines; the sender reads the
// consumer's counters only when the room it last saw is used up. A payload larger than the free space streams
// through in pieces: the sender copies what fits and keeps the rest pending, pushed on by its later calls
// (progress, recv, wait_sends) — so a rank that waits for anything keeps pushing.
// Waiting polls the counters: a few us of PAUSE spinning, then sched_yield polls until PollPolicy::spin_us, then
// sleeps with growing naps (no core burnt); ShmWaitStats counts each phase.
//
// Setup is collective over the communicator (like MpiTransport's MPI_Comm_dup): each rank shares one segment
// holding its notice board for the direct collectives (comm/shm_direct.h) and its incoming FIFOs, and everyone maps
// everyone's; the names are gone before any of that memory is allocated or mapped (shm_detail::SharedSegments, in
// comm/shm_segments.h). Pages of FIFOs that are never used are never touched (tmpfs allocates on write).
//
// Single copy for registered buffers (after NCCL's user-buffer registration and P2P direct read): a RegisteredBuffer
// lies in shared memory that every rank of the host maps. A send from inside one, to a peer that maps it, puts only
// a reference (segment, offset) in the FIFO's record; the receiver reduces or copies straight out of the sender's
// buffer, then acknowledges by advancing the record counter it already publishes (slots_done). Such a send
// completes at that acknowledgement, not when queued, so the Transport contract (the buffer stays untouched until
// wait_sends retires the send) is exactly what keeps the data valid while the peer reads it. Per message: any other
// send (unregistered memory, a peer that does not map the segment, <= 40 bytes) is copied through the FIFO.
// Traffic per hop: the copy path writes the FIFO and reads it back (2 more passes over the data than single copy).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/shm_segments.h"
#include "comm/transport.h"
#include "runtime/owned_comm.h"

namespace ddplab {

// How the shared-memory transports of this process waited, summed since it started (allreduce_perf --diag). A
// wait is a call that found its message or room not there at once; it polls in a pure spin (PAUSE), then yields the
// core between polls until PollPolicy::spin_us, then sleeps. Counted on the waiting path only: free when no rank
// waits, a few relaxed atomic adds per poll when one does.
struct ShmWaitStats {
  uint64_t waits = 0;
  uint64_t spin_polls = 0;   // polls between PAUSEs
  uint64_t yield_polls = 0;  // polls after a sched_yield
  uint64_t sleeps = 0;       // nanosleeps, each followed by a poll
  uint64_t wait_ns = 0;      // inside waits, in all
  uint64_t sleep_ns = 0;     // of which asleep
  ShmWaitStats operator-(const ShmWaitStats& earlier) const;
  ShmWaitStats& operator+=(const ShmWaitStats& more);
};
ShmWaitStats shm_wait_stats();

// Messages the shared-memory transports of this process sent since it started: by reference (single copy, from a
// RegisteredBuffer) or copied through a FIFO. Tests check which path a send took; allreduce_perf --diag prints them.
struct ShmSendCounts {
  uint64_t by_reference = 0, copied = 0;
};
ShmSendCounts shm_send_counts();

class ShmTransport final : public Transport {
 public:
  static constexpr size_t kDefaultFifoBytes = size_t{1} << 20;
  // fifo_bytes: capacity of each pair's FIFO, rounded up to 64 bytes (>= 128). node_of_rank (per rank of comm;
  // empty: the host is the node): only ranks of one node that also share a host talk through shared memory.
  ShmTransport(MPI_Comm comm, const std::vector<int>& node_of_rank, size_t fifo_bytes = kDefaultFifoBytes,
               PollPolicy poll = PollPolicy::from_env());
  explicit ShmTransport(MPI_Comm comm, size_t fifo_bytes = kDefaultFifoBytes, PollPolicy poll = PollPolicy::from_env())
      : ShmTransport(comm, std::vector<int>{}, fifo_bytes, poll) {}
  ~ShmTransport() override;
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, const void* buf, size_t bytes, int tag) override;
  void recv(int peer, void* buf, size_t bytes, int tag) override;
  void recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume) override;
  void wait_sends(size_t keep_last = 0) override;
  bool progress() override;

  int local_peers() const { return local_peers_; }  // peers reached through shared memory
  bool through_shm(int peer) const { return peer >= 0 && peer < size_ && to_[peer] != nullptr; }

  // For collectives built on the segments (comm/shm_direct.h):
  //   board(r)         rank r's notice board, kBoardBytes at the start of its segment, written by r only (null for a
  //                    rank not reached through shared memory);
  //   process_of(r)    the process rank r runs in, to find its registered buffers (0 for such a rank);
  //   wait_for(ready)  waits as the transport's own receives wait (PollPolicy), pushing its pending sends meanwhile;
  //   message_waiting  the first peer whose next message has arrived and that message's tag: a peer in another
  //                    operation;
  //   abandon()        after a mismatch: the transport is done for, nothing touches the callers' buffers any more.
  static constexpr size_t kBoardBytes = 128;
  // Up to this many local ranks, the FIFOs are allocated and faulted in at setup; beyond, they are many, most pairs
  // never talk, and they fault in as they are used.
  static constexpr int kFaultInRanks = 16;
  void* board(int rank) const { return boards_[rank]; }
  uint64_t process_of(int rank) const { return process_of_[rank]; }
  void wait_for(const std::function<bool()>& ready);
  std::optional<std::pair<int, int>> message_waiting() const;
  void abandon() { pending_.clear(); }

 private:
  struct Fifo;  // in shared memory (defined in the .cpp)
  struct Outgoing {
    int peer;
    const char* buf;
    size_t bytes, done;
    int tag;
    bool header_done;
    uint64_t seq;                 // index of its entry in started_ (plus started_base_)
    bool by_reference;            // the record carries a reference into a RegisteredBuffer, no payload
    uint64_t owner, segment, at;  // that reference: this process, its segment, the offset in it
    uint64_t record = 0;          // the record's number on the FIFO, once written
  };
  bool push(Outgoing& m);  // copies what fits; true when the whole message (or its reference) is in the FIFO
  bool push_pending();     // true while some shm send is still pending
  void pushed(const Outgoing& m);  // marks its Started entry: complete, or waiting for the reader's acknowledgement
  template <typename Ready>
  void wait_until(Ready ready);
  std::logic_error not_through_shm(const char* what, int peer) const;
  OwnedComm join_local_group(MPI_Comm comm, const std::vector<int>& node_of_rank, std::vector<int>& world_of);
  std::vector<char*> map_segments(MPI_Comm local, size_t stride);
  void lay_out(const std::vector<char*>& base, const std::vector<int>& world_of, size_t stride);
  void fault_in_fifos(MPI_Comm local);

  int rank_ = 0, size_ = 1, local_peers_ = 0;
  size_t fifo_bytes_ = 0;
  PollPolicy poll_;
  std::vector<Fifo*> to_, from_;             // per world rank; null when remote (or self)
  std::vector<void*> boards_;                // per world rank; null when remote
  struct Peer {                              // this side's view of the two FIFOs with one peer
    uint64_t sent = 0, received = 0;         // messages so far (records carry their number)
    uint64_t tail_seen = 0, slots_seen = 0;  // the consumer counters of our FIFO to the peer, as last read
  };
  std::vector<Peer> peers_;
  std::vector<uint64_t> process_of_;  // per rank reached through shared memory: its process, for references; else 0
  std::vector<void*> maps_;  // every mapped segment
  size_t map_bytes_ = 0;
  // Sends in order of starting.
  struct Started {
    bool complete;  // the whole message, or its reference, is in the FIFO
    int peer = -1;
    uint64_t acked_by = 0;  // by reference: done once the peer's slots_done reaches this record number
  };
  bool done(Started& s);  // complete, and acknowledged when it went by reference
  std::deque<Started> started_;
  uint64_t started_base_ = 0;     // sequence number of started_.front()
  std::deque<Outgoing> pending_;  // sends not yet fully in their FIFO, oldest first
};

}  // namespace ddplab
