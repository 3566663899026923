#include "bench/allreduce_perf_nccl.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include "comm/nccl_allreduce.h"
#include "kernels/cuda/check.cuh"

namespace ddplab::bench {
namespace {

// NcclAllreduce bootstraps the communicator (device choice, one GPU per rank check, ncclUniqueId over MPI) and owns
// the comm stream; the benchmark calls ncclAllReduce directly so out-of-place runs without an extra copy.
struct NcclBuffers {
  cuda::NcclAllreduce nccl{MPI_COMM_WORLD};
  float* in = nullptr;
  float* out = nullptr;
  explicit NcclBuffers(size_t max_count) {
    cudaCheck(cudaMalloc(&in, max_count * sizeof(float)));
    cudaCheck(cudaMalloc(&out, max_count * sizeof(float)));
  }
  ~NcclBuffers() {
    cudaFree(in);
    cudaFree(out);
  }
};

}  // namespace

DeviceAllreduce make_nccl_allreduce(size_t max_count) {
  auto buffers = std::make_shared<NcclBuffers>(max_count);
  DeviceAllreduce d;
  d.in = buffers->in;
  d.out = buffers->out;
  d.owner = buffers;
  NcclBuffers* b = buffers.get();
  d.run = [b](const float* in, float* out, size_t count) {
    ncclCheck(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, b->nccl.nccl_comm(), b->nccl.stream()));
    b->nccl.synchronize();  // polls the stream and NCCL's asynchronous errors
  };
  return d;
}

void copy_to_device(float* device, const float* host, size_t count) {
  cudaCheck(cudaMemcpy(device, host, count * sizeof(float), cudaMemcpyHostToDevice));
}

void copy_to_host(float* host, const float* device, size_t count) {
  cudaCheck(cudaMemcpy(host, device, count * sizeof(float), cudaMemcpyDeviceToHost));
}

}  // namespace ddplab::bench
