// Point-to-point transports beneath the collective algorithms.
//
// An algorithm (comm/ring_allreduce.*) only ever calls send / recv / wait_sends on a Transport, so the same
// ring runs over MPI host messages today and over NCCL p2p or CUDA IPC on the GPU later; link emulation is a
// wrapper Transport that delays messages.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <vector>

namespace ddplab {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Starts sending; may return before the data left. `buf` must stay untouched until wait_sends().
  virtual void send(int peer, const void* buf, size_t bytes) = 0;
  // Blocks until `bytes` from `peer` are in `buf`. Messages between a pair arrive in the order sent.
  virtual void recv(int peer, void* buf, size_t bytes) = 0;
  // Blocks until every send started so far has completed (its buffer may be reused).
  virtual void wait_sends() = 0;
};

// Host memory over MPI point-to-point (MPI_Isend / MPI_Recv) on a private duplicate of the communicator,
// so its messages never match anyone else's.
class MpiTransport final : public Transport {
 public:
  // MPI counts are int, so a message is split into pieces of at most max_message_bytes (both sides split the same
  // way). Tests pass a tiny limit to exercise the split without allocating gigabytes.
  static constexpr size_t kMaxMessageBytes = size_t{1} << 30;
  explicit MpiTransport(MPI_Comm comm, size_t max_message_bytes = kMaxMessageBytes);
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, const void* buf, size_t bytes) override;
  void recv(int peer, void* buf, size_t bytes) override;
  void wait_sends() override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  size_t max_message_bytes_ = kMaxMessageBytes;
  std::vector<MPI_Request> pending_sends_;
};

}  // namespace ddplab
