// Point-to-point transports beneath the collective algorithms.
//
// An algorithm (comm/ring_allreduce.*, comm/recursive_doubling.*) only ever calls send / recv / wait_sends on a
// Transport, so the same ring runs over shared memory or MPI host messages here; on the GPU the same ring runs over
// NCCL p2p, CUDA IPC or host staging through the links of comm/ring_device.h and comm/ring_cuda.h; link emulation (comm/link_emulation.h) is a wrapper Transport that delays messages.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/clock.h"  // monotonic_ns: the polls, the naps, link emulation's stamps
#include "runtime/owned_comm.h"

namespace ddplab {

// Every message carries the tag of the operation it belongs to (the Reducer's bucket index). A receive that
// finds the next message from `peer` tagged for another operation throws this instead of mixing buffers: ranks
// ran their operations in different orders. The algorithm above rewrites it into a message naming the operation.
class TagMismatch : public std::runtime_error {
 public:
  TagMismatch(int rank, int peer, int expected_tag, int received_tag);
  int rank, peer, expected_tag, received_tag;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Starts sending; may return before the data left. `buf` must stay untouched until wait_sends() retires it.
  virtual void send(int peer, const void* buf, size_t bytes, int tag) = 0;
  // Blocks until the next message from `peer` is in `buf`. Messages between a pair arrive in the order sent.
  // Throws TagMismatch when that message carries another tag, std::runtime_error when its size is not `bytes`.
  virtual void recv(int peer, void* buf, size_t bytes, int tag) = 0;
  // Like recv, but hands the message to consume(piece, offset, length) in order, piece by piece, so the caller
  // can use the data where it lies: a shared-memory transport passes pieces of its FIFO (the reduction reads the
  // sender's copy directly, one copy fewer). Pieces split the message at multiples of 64 bytes, so they hold whole
  // elements. Default: recv into `staging` (at least bytes long), then one call.
  using Consume = std::function<void(const void* piece, size_t offset, size_t length)>;
  virtual void recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume);
  // Blocks until at most the keep_last most recently started sends are still in flight: every older one has
  // completed and its buffer may be reused. Sends complete in the order they were started.
  virtual void wait_sends(size_t keep_last = 0) = 0;
  // Lets sends in flight advance without waiting for them; returns whether some are still in flight. MPI has no
  // progress thread: a rendezvous message moves only while both ends are inside MPI calls, so a rank that sleeps
  // (link emulation) calls this between naps.
  virtual bool progress() { return false; }

  // Called between polls while this transport waits (for a message, room in a FIFO, a send's completion). The
  // transport table (comm/transport_table.h) sets it to move the other transports' sends along: MPI moves a
  // rendezvous message only while its sender is inside an MPI call, so a rank that waits on shared memory must keep
  // its MPI sends moving, or the peer they go to may wait for them forever. A hook may throw to end the wait (an
  // owner that gives up on the peers): the exception leaves the call, and MpiTransport first cancels the receive it
  // waited for, so that no message lands in the caller's buffer after it, and settles its sends as before any throw.
  void set_while_waiting(std::function<void()> hook) { while_waiting_ = std::move(hook); }
  // A rank of this transport as messages and the watchdog name it: its rank in MPI_COMM_WORLD, which the user
  // sees, also where the transport joins a subgroup (hier's groups within and across nodes, the lab's smaller world
  // sizes). A rank outside the communicator is named as given: the call with it fails with MPI's own error.
  int named(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < world_rank_.size() ? world_rank_[rank] : rank;
  }

 protected:
  void waiting() const {
    if (while_waiting_) while_waiting_();
  }
  void name_ranks_as_in_world(MPI_Comm comm);

 private:
  std::function<void()> while_waiting_;
  std::vector<int> world_rank_;  // of each rank of the transport's communicator; empty: the same
};

// How a transport waits for MPI requests. Open MPI's blocking calls busy-poll a core; in ddplab the all-reduce
// runs on a communication thread beside the compute thread, on as few as two cores, so a long wait should sleep.
// The waiter polls MPI_Test for up to spin_us (short waits keep their latency), then sleeps between polls,
// doubling the sleep from 1 us up to max_sleep_us. spin_us < 0 spins forever (lowest latency, one core busy).
struct PollPolicy {
  int spin_us = 0;
  int max_sleep_us = 1;
  // DDPLAB_COMM_SPIN_US / DDPLAB_COMM_MAX_SLEEP_US, read once, or their defaults (runtime/settings.h).
  static PollPolicy from_env();
};

// Sleeps `ns` nanoseconds, seconds included: nanosleep refuses a tv_nsec of 10^9 or more at once, which would turn a
// wait with a DDPLAB_COMM_MAX_SLEEP_US of a second or more into a busy poll.
void nap(int64_t ns);

// Linux rounds a thread's sleeps up by its timer slack, 50 us by default: a "1 us" poll would sleep 50. Sets the
// calling thread's to 1 us, once per thread, for a thread that naps between polls (poll_wait's, the GPU stream
// waits').
void tighten_timer_slack_once();

// What a sched_yield() costs a thread when compute threads hold every core: the shm transport's waits yield between
// polls, and a yield that hands the core to a compute thread returns after that thread's time slice (a few ms, not
// the us the poll meant; docs/PREDICT.md). Collective: every rank spins `compute_threads` threads, standing in for
// backward's, while one more thread naps and yields `samples` times, until every rank is done. Returns the mean of
// the yields that lost the core, over all ranks; 0 when none did (a spare core).
double measure_lost_yield_ms(MPI_Comm comm, int compute_threads, int samples = 16);

// Waits for `request` per `policy`, calling `between_polls` (if any) after each poll that found it pending (also
// when spinning, spin_us < 0: on MPI_Test then, on MPI_Wait only without it). Returns MPI_Wait's error code (status
// is filled either way). An exception from between_polls leaves the request pending.
int poll_wait(MPI_Request* request, MPI_Status* status, const PollPolicy& policy,
              const std::function<void()>& between_polls = nullptr);

// Host memory over MPI point-to-point (MPI_Isend / MPI_Irecv on MPI_ANY_TAG, then compare the tag) on a private
// duplicate of the communicator, so its messages never match anyone else's.
class MpiTransport final : public Transport {
 public:
  // MPI counts are int, so a message is split into pieces of at most max_message_bytes (both sides split the same
  // way). Tests pass a tiny limit to exercise the split without allocating gigabytes.
  static constexpr size_t kMaxMessageBytes = size_t{1} << 30;
  explicit MpiTransport(MPI_Comm comm, size_t max_message_bytes = kMaxMessageBytes,
                        PollPolicy poll = PollPolicy::from_env());
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, const void* buf, size_t bytes, int tag) override;
  void recv(int peer, void* buf, size_t bytes, int tag) override;
  void wait_sends(size_t keep_last = 0) override;
  bool progress() override;

 private:
  void check_tag(int tag) const;
  void settle_sends_before_throwing() noexcept;

  // Sends still pending when it is freed only happen when an exception unwound through an algorithm; waiting for
  // them could hang, so they are left to MPI.
  OwnedComm comm_;
  int rank_ = 0, size_ = 1, tag_ub_ = 32767;
  size_t max_message_bytes_ = kMaxMessageBytes;
  PollPolicy poll_;
  std::vector<MPI_Request> pending_sends_;  // oldest first
  struct Sent {
    size_t requests;  // a message larger than max_message_bytes_ takes several
    int peer;
  };
  std::deque<Sent> sends_;  // in flight, oldest first: their requests are pending_sends_, in the same order
};

}  // namespace ddplab
