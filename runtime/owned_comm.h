// A communicator this process made (MPI_Comm_dup, MPI_Comm_split, MPI_Comm_split_type) and must free: freed on every
// way out of its scope, an exception's included, so no error path leaks one. Nothing is freed after MPI_Finalize,
// which an object living until the process exits may outlast.
#pragma once
#include <mpi.h>

#include <utility>

namespace ddplab {

class OwnedComm {
 public:
  OwnedComm() = default;
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;
  OwnedComm(OwnedComm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  OwnedComm& operator=(OwnedComm&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    }
    return *this;
  }
  ~OwnedComm() { reset(); }

  // The handle, where MPI takes one; MPI_COMM_NULL when none is held (a split with MPI_UNDEFINED makes none).
  operator MPI_Comm() const { return comm_; }
  // The output argument of the call that makes one: mpiCheck(MPI_Comm_dup(comm, owned.receive())).
  MPI_Comm* receive() {
    reset();
    return &comm_;
  }
  void reset() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace ddplab
