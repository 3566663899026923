// The communicator the training loop talks to: all-reduce on host fp32 buffers, by one of several
// implementations (our ring over a Transport, or the MPI library's MPI_Allreduce).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace ddplab {

enum class AllreduceImpl { kRing, kMpi };
AllreduceImpl parse_allreduce_impl(const std::string& name);  // "ring" | "mpi"; throws std::invalid_argument
const char* to_string(AllreduceImpl impl);

class Communicator {
 public:
  Communicator(MPI_Comm comm, AllreduceImpl impl);
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm mpi_comm() const { return comm_; }
  AllreduceImpl impl() const { return impl_; }

  // data[i] = sum over ranks of data[i], in place. Same result on every rank, bit for bit.
  void allreduce_sum(float* data, size_t count);
  // Sum, then multiply by 1/size: gradients averaged over the world (DDP semantics).
  void allreduce_mean(float* data, size_t count);

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  AllreduceImpl impl_;
  std::unique_ptr<Transport> transport_;  // for the ring
  std::vector<float> scratch_;            // receive buffer for the ring
};

}  // namespace ddplab
