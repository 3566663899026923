// ring-sharded: the sharded update's two collectives in a row (--zero-stage 1): reduce-scatter, then all-gather
// (Communicator::reduce_scatter_gradients, all_gather), each with its own tag as the Reducer gives them, direct where
// the Communicator takes it, as in training. The sum comes out as the ring all-reduce's, bit for bit. Out of place
// it copies the input into the output first.
#include <cstring>
#include <memory>

#include "bench/allreduce_perf/impl.h"

namespace ddplab::perf {

std::vector<Impl> make_ring_sharded(const ImplContext& c) {
  const Options& o = c.options;
  auto comm = std::make_shared<Communicator>(
      MPI_COMM_WORLD, CommOptions{AllreduceImpl::kRing, WireDtype::kFp32, o.link, o.ranks_per_node});
  c.transports.push_back(c.name + " over " + comm->transport_name());
  Impl impl;
  impl.label = c.name;
  impl.run = [comm, tag = 0](const float* in, float* out, size_t count) mutable {
    if (in != out) std::memcpy(out, in, count * sizeof(float));
    comm->reduce_scatter_gradients(out, count, 1.0f, tag);
    comm->all_gather(out, count, tag + 1);
    tag = (tag + 2) % 32768;
  };
  impl.owner = comm;
  return {impl};
}

}  // namespace ddplab::perf
