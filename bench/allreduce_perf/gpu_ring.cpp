// gpu-ring-nccl, gpu-ring-ipc, gpu-ring-host: our ring on device buffers (comm/ring_cuda.h) over NCCL p2p, CUDA IPC
// (ranks may share a GPU) or host staging, in chunks of --gpu-chunk-mb (0: the trainer's), under --link as the trainer
// emulates it. A plain call's time
// includes the host's wait for the comm stream. Over NCCL p2p nothing waits on the host until the end, so -G can
// capture it; the ipc and host links make the host wait at every step, and parse_options refuses -G for them.
#include <memory>
#include <string>

#include "bench/allreduce_perf/device.h"
#include "comm/ring_cuda.h"

namespace ddplab::perf {

std::vector<Impl> make_gpu_ring(const ImplContext& c) {
  cuda::CudaRingConfig config{parse_choice<RingLinkKind>(c.name.substr(std::string("gpu-ring-").size()), "--impls")};
  const auto chunk_bytes = static_cast<size_t>(c.options.gpu_chunk_mb * (1 << 20));
  if (chunk_bytes > 0) config.chunk_bytes = chunk_bytes;
  config.links = c.options.link;
  config.ranks_per_node = c.options.ranks_per_node;
  auto buffers = std::make_shared<EngineBuffers<cuda::RingAllreduceCuda>>(c.max_count, config);
  cuda::RingAllreduceCuda* ring = &buffers->engine;
  DeviceCollective d;
  d.in = buffers->in;
  d.out = buffers->out;
  d.stream = ring->stream();
  d.run = [ring](const float* in, float* out, size_t count) { ring->allreduce_sum(in, out, count); };
  if (ring->queues_whole())  // the nccl link, not emulated (--link sleeps on the host in each exchange)
    d.enqueue = [ring](const float* in, float* out, size_t count) { ring->enqueue_allreduce_sum(in, out, count); };
  d.wait = [ring] { ring->synchronize(); };
  d.owner = buffers;
  const auto algorithm = [ring](size_t count) { return ring->doubles(count) ? "recursive doubling" : "ring"; };
  c.transports.push_back(c.name + " over " + ring->name());
  std::vector<Impl> impls = device_impls(c, d);
  for (Impl& impl : impls) impl.algorithm = algorithm;
  return impls;
}

}  // namespace ddplab::perf
