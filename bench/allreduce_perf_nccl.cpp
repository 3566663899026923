#include "bench/allreduce_perf_nccl.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "comm/nccl_allreduce.h"
#include "comm/ring_cuda.h"
#include "kernels/cuda/check.cuh"

namespace ddplab::bench {
namespace {

// NcclAllreduce bootstraps the communicator (device choice, one GPU per rank check, ncclUniqueId over MPI) and owns
// the comm stream; the benchmark calls ncclAllReduce directly so out-of-place runs without an extra copy.
template <typename Engine>
struct EngineBuffers {
  Engine engine;
  float* in = nullptr;
  float* out = nullptr;
  template <typename... Args>
  explicit EngineBuffers(size_t max_count, Args&&... args) : engine(MPI_COMM_WORLD, std::forward<Args>(args)...) {
    cudaCheck(cudaMalloc(&in, max_count * sizeof(float)));
    cudaCheck(cudaMalloc(&out, max_count * sizeof(float)));
  }
  ~EngineBuffers() {
    cudaFree(in);
    cudaFree(out);
  }
};

template <typename Buffers>
DeviceAllreduce wrap(std::shared_ptr<Buffers> buffers, std::function<void(const float*, float*, size_t)> run) {
  DeviceAllreduce d;
  d.in = buffers->in;
  d.out = buffers->out;
  d.owner = std::move(buffers);
  d.run = std::move(run);
  return d;
}

}  // namespace

std::string device_problem() { return cuda::NcclAllreduce::availability(); }

DeviceAllreduce make_nccl_allreduce(size_t max_count) {
  auto buffers = std::make_shared<EngineBuffers<cuda::NcclAllreduce>>(max_count);
  cuda::NcclAllreduce* nccl = &buffers->engine;
  return wrap(buffers, [nccl](const float* in, float* out, size_t count) {
    ncclCheck(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, nccl->nccl_comm(), nccl->stream()));
    nccl->synchronize();  // polls the stream and NCCL's asynchronous errors
  });
}

DeviceAllreduce make_ring_cuda_allreduce(size_t max_count, const std::string& link, size_t chunk_bytes) {
  cuda::CudaRingConfig config{parse_choice<RingLinkKind>(link, "--ring-link")};
  if (chunk_bytes > 0) config.chunk_bytes = chunk_bytes;
  auto buffers = std::make_shared<EngineBuffers<cuda::RingAllreduceCuda>>(max_count, config);
  cuda::RingAllreduceCuda* ring = &buffers->engine;
  return wrap(buffers, [ring](const float* in, float* out, size_t count) { ring->allreduce_sum(in, out, count); });
}

void copy_to_device(float* device, const float* host, size_t count) {
  cudaCheck(cudaMemcpy(device, host, count * sizeof(float), cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before its DMA lands, and it runs on the legacy stream, which the
  // comm streams (non-blocking) do not wait for: without this, an all-reduce read stale inputs (#wrong on an H200).
  cudaCheck(cudaDeviceSynchronize());
}

void copy_to_host(float* host, const float* device, size_t count) {
  cudaCheck(cudaMemcpy(host, device, count * sizeof(float), cudaMemcpyDeviceToHost));
}

}  // namespace ddplab::bench
