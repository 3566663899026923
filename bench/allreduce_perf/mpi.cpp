// mpi: ddplab's Communicator with --comm mpi: MPI_Allreduce plus the order check (and the link model when --link is
// set). mpi-raw: MPI_Allreduce alone on a duplicate communicator, Open MPI's own number.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <stdexcept>

#include "bench/allreduce_perf/impl.h"
#include "runtime/owned_comm.h"

namespace ddplab::perf {

std::vector<Impl> make_mpi(const ImplContext& c) {
  const Options& o = c.options;
  return communicator_impl(c, {AllreduceImpl::kMpi, WireDtype::kFp32, o.link, o.ranks_per_node});
}

std::vector<Impl> make_mpi_raw(const ImplContext& c) {
  auto comm = std::make_shared<OwnedComm>();
  MPI_Comm_dup(MPI_COMM_WORLD, comm->receive());
  Impl impl;
  impl.label = c.name;
  impl.run = [comm](const float* in, float* out, size_t count) {
    if (count > static_cast<size_t>(INT32_MAX)) throw std::invalid_argument("mpi-raw: count > INT_MAX");
    MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, static_cast<int>(count), MPI_FLOAT, MPI_SUM, *comm);
  };
  impl.owner = comm;
  return {impl};
}

}  // namespace ddplab::perf
