// nccl: ncclAllReduce on device buffers, one GPU per rank. NcclAllreduce bootstraps the communicator (device choice,
// the one-GPU-per-rank check, ncclUniqueId over MPI) and owns the comm stream; the call is ncclAllReduce itself, so
// out of place runs without an extra copy. A plain call's time includes the host's wait for the comm stream; -G
// captures the calls alone.
#include <nccl.h>

#include <memory>

#include "bench/allreduce_perf/device.h"
#include "comm/nccl_allreduce.h"

namespace ddplab::perf {

std::vector<Impl> make_nccl(const ImplContext& c) {
  auto buffers = std::make_shared<EngineBuffers<cuda::NcclAllreduce>>(c.max_count);
  cuda::NcclAllreduce* nccl = &buffers->engine;
  DeviceCollective d;
  d.in = buffers->in;
  d.out = buffers->out;
  d.stream = nccl->stream();
  d.enqueue = [nccl](const float* in, float* out, size_t count) {
    ncclCheck(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, nccl->nccl_comm(), nccl->stream()));
  };
  d.wait = [nccl] { nccl->synchronize(); };  // polls the stream and NCCL's asynchronous errors
  d.owner = buffers;
  return device_impls(c, d);
}

}  // namespace ddplab::perf
