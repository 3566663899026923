// Shared-memory transport between ranks of one node (after NCCL's SHM transport), MPI for the others: the transport
// is chosen per pair, so one ring mixes both (comm/topology.h says which ranks form a node).
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
// Waiting polls the counters: spin for PollPolicy::spin_us, then sleep with growing naps (no core burnt).
//
// Setup is collective over the communicator (like MpiTransport's MPI_Comm_dup): each rank creates one segment
// holding its board for the direct all-reduce (below) and its incoming FIFOs, everyone maps everyone's, and the names
// are unlinked at once, so nothing is left in /dev/shm even if the job dies. Pages of FIFOs that are never used are
// never touched (tmpfs allocates on write).
//
// Single copy for registered buffers (after NCCL's user-buffer registration and P2P direct read): a RegisteredBuffer
// lies in shared memory that every rank of the host maps. A send from inside one, to a peer that maps it, puts only
// a reference (segment, offset) in the FIFO's record; the receiver reduces or copies straight out of the sender's
// buffer, then acknowledges by advancing the record counter it already publishes (slots_done). Such a send
// completes at that acknowledgement, not when queued, so the Transport contract (the buffer stays untouched until
// wait_sends retires the send) is exactly what keeps the data valid while the peer reads it. Per message: any other
// send (unregistered memory, a peer that does not map the segment, <= 40 bytes) is copied through the FIFO as before.
// Traffic per hop: the copy path writes the FIFO and reads it back (2 more passes over the data than single copy).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "comm/ring_allreduce.h"
#include "comm/transport.h"

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

// The last-level cache as this machine's cpu 0 sees it (sysfs; 32 MiB where it does not say). An out-of-place direct
// all-reduce whose outputs together reach it stores with non-temporal stores (ShmTransport::direct_collective).
size_t last_level_cache_bytes();

// Direct collectives (ShmTransport::direct_collective) this process ran since it started, all kinds together, and
// of those the ones that stored their outputs with non-temporal stores.
uint64_t shm_direct_collectives();
uint64_t shm_streamed_collectives();

// Where the pages of every shared segment this process has mapped now lie: pages per NUMA node (move_pages), and the
// pages not yet placed (never touched) or not answerable. One line, e.g. "1 NUMA node: 514 pages on node 0".
std::string shm_page_placement();

// Host memory in a shared segment that the ranks of this host map (see above): sends from it travel by reference.
// Not copyable; the mappings go when it is destroyed, on every rank after the last all-reduce that uses it (a
// reference to a segment a receiver no longer maps fails that receive with a message, never reads freed memory).
class RegisteredBuffer {
 public:
  RegisteredBuffer() = default;
  // Collective over comm: each rank gets `bytes` of zeroed memory (sizes may differ between ranks). It is registered
  // when `registered` is true on every rank of its host; otherwise (or after a failed shm_open/mmap, which every
  // rank of the host agrees on and throws as std::runtime_error naming it) it is ordinary memory.
  RegisteredBuffer(MPI_Comm comm, size_t bytes, bool registered);
  ~RegisteredBuffer();
  RegisteredBuffer(RegisteredBuffer&& other) noexcept;
  RegisteredBuffer& operator=(RegisteredBuffer&& other) noexcept;

  void* data() const { return base_; }
  size_t bytes() const { return bytes_; }
  bool registered() const { return segment_ != 0; }

 private:
  void release() noexcept;
  void* base_ = nullptr;
  size_t bytes_ = 0, map_bytes_ = 0;
  uint64_t segment_ = 0;  // this process's id of its segment; 0: ordinary memory
  struct PeerMap {
    uint64_t owner, segment;
    void* base;
    size_t map_bytes;
  };
  std::vector<PeerMap> peer_maps_;  // the host peers' segments of the same collective call
};

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

  // The direct collectives ("two-shot", after the one-node all-reduces of TensorRT-LLM and vLLM): collective over
  // the transport, for ranks that all share one host (std::logic_error otherwise). Each rank works on the chunks the
  // ring would have it own (ring_owned_chunks), reading and writing every rank's buffers where they lie:
  //   kAllreduce      sums its chunks of every rank's `in`, in the ring's order, and stores the sums
  //                   (x options.final_scale) into those chunks of every rank's `out` (in == out: in place);
  //   kReduceScatter  the same sums, stored into its own `out` only (the other elements keep what they held);
  //   kAllGather      copies its chunks of its own `in` into every other rank's `out` (in == out: data[i] = its
  //                   owner's data[i]).
  // The ring's result, bit for bit, with each value read once and written once per destination (why: docs/COMM.md,
  // "The direct all-reduce on one host"). Two rendezvous through each rank's board: arrivals (the kind, tag, count
  // and where the buffers lie; a mismatch throws as the ring does, and so does a message from a peer that is in
  // another collective), then departures. Needs `in` and `out` in RegisteredBuffers that every rank maps; when some
  // rank's are not, every rank returns nullopt having touched nothing (the caller runs the ring). Otherwise whether
  // every sum is finite (options.check_finite; else true): every rank's sums for kAllreduce, this rank's own for
  // kReduceScatter. options: tag, final_scale, check_finite, and the ring's cut (slice_elems, slices_per_chunk);
  // fp32 only. Every rank must decide alike whether to call it (Communicator does).
  enum class Direct : int32_t { kAllreduce, kReduceScatter, kAllGather };
  std::optional<bool> direct_collective(Direct kind, const float* in, float* out, size_t count,
                                        const RingOptions& options);

  int local_peers() const { return local_peers_; }  // peers reached through shared memory
  bool through_shm(int peer) const { return peer >= 0 && peer < size_ && to_[peer] != nullptr; }

 private:
 public:
  struct Fifo;   // in shared memory (defined in the .cpp)
  struct Board;  // the direct collectives' notices, at the start of each rank's segment

 private:
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

  int rank_ = 0, size_ = 1, local_peers_ = 0;
  size_t fifo_bytes_ = 0;
  PollPolicy poll_;
  std::unique_ptr<MpiTransport> remote_;     // ranks on other nodes
  std::vector<Fifo*> to_, from_;             // per world rank; null when remote (or self)
  std::vector<Board*> boards_;               // per world rank; null when remote
  uint64_t direct_calls_ = 0;
  std::vector<const float*> direct_ins_, direct_sources_;  // direct_collective's, per rank (reused)
  std::vector<float*> direct_outs_, direct_targets_;
  struct Peer {                              // this side's view of the two FIFOs with one peer
    uint64_t sent = 0, received = 0;         // messages so far (records carry their number)
    uint64_t tail_seen = 0, slots_seen = 0;  // the consumer counters of our FIFO to the peer, as last read
  };
  std::vector<Peer> peers_;
  std::vector<uint64_t> process_of_;  // per rank reached through shared memory: its process, for references; else 0
  std::vector<void*> maps_;  // every mapped segment
  size_t map_bytes_ = 0;
  // Sends in order of starting, shm and remote alike (remote ones are retired through remote_'s own count).
  struct Started {
    bool shm;
    bool complete;  // the whole message, or its reference, is in the FIFO
    int peer = -1;
    uint64_t acked_by = 0;  // by reference: done once the peer's slots_done reaches this record number
  };
  bool done(Started& s);  // complete, and acknowledged when it went by reference
  std::deque<Started> started_;
  uint64_t started_base_ = 0;     // sequence number of started_.front()
  std::deque<Outgoing> pending_;  // shm sends not yet fully in their FIFO, oldest first
  size_t remote_in_flight_ = 0;
};

}  // namespace ddplab
