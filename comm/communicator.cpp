#include "comm/communicator.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>

#include "comm/mpi_check.h"
#include "comm/ring_allreduce.h"
#include "kernels/cpu/ops.h"

namespace ddplab {

AllreduceImpl parse_allreduce_impl(const std::string& name) {
  if (name == "ring") return AllreduceImpl::kRing;
  if (name == "mpi") return AllreduceImpl::kMpi;
  throw std::invalid_argument("unknown --comm '" + name + "' (expected ring or mpi)");
}

const char* to_string(AllreduceImpl impl) {
  switch (impl) {
    case AllreduceImpl::kRing:
      return "ring";
    case AllreduceImpl::kMpi:
      return "mpi";
  }
  return "?";
}

Communicator::Communicator(MPI_Comm comm, AllreduceImpl impl) : comm_(comm), impl_(impl) {
  mpiCheck(MPI_Comm_rank(comm_, &rank_));
  mpiCheck(MPI_Comm_size(comm_, &size_));
  // Collective (MPI_Comm_dup): every rank must construct its Communicator with the same impl.
  if (impl_ == AllreduceImpl::kRing) transport_ = std::make_unique<MpiTransport>(comm_);
}

void Communicator::allreduce_sum(float* data, size_t count) {
  switch (impl_) {
    case AllreduceImpl::kRing:
      ring_allreduce_sum(data, count, *transport_, scratch_);
      return;
    case AllreduceImpl::kMpi:
      // MPI counts are int: larger buffers go in INT_MAX-element pieces (elementwise, so pieces are independent).
      for (size_t offset = 0; offset < count;) {
        const int piece = static_cast<int>(std::min(count - offset, static_cast<size_t>(INT_MAX)));
        mpiCheck(MPI_Allreduce(MPI_IN_PLACE, data + offset, piece, MPI_FLOAT, MPI_SUM, comm_));
        offset += piece;
      }
      return;
  }
}

void Communicator::allreduce_mean(float* data, size_t count) {
  allreduce_sum(data, count);
  cpu::scale(data, 1.0f / static_cast<float>(size_), static_cast<int64_t>(count));
}

}  // namespace ddplab
