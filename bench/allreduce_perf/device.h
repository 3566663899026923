// allreduce_perf's GPU side (built with CUDA only): device buffers, the untimed copies in and out, and -G's CUDA
// graphs. nccl.cpp and gpu_ring.cpp say how to set up and run their collectives on top of it.
#pragma once
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench/allreduce_perf/impl.h"
#include "kernels/cuda/check.cuh"

namespace ddplab::perf {

// A collective on device buffers of max_count floats: out = sum over ranks of in (in == out: in place).
struct DeviceCollective {
  float* in = nullptr;
  float* out = nullptr;
  cudaStream_t stream = nullptr;  // where it runs
  // One call queued on `stream`, without waiting: what a CUDA graph captures. Unset where a call makes the host wait
  // inside it (parse_options refuses -G for those).
  std::function<void(const float* in, float* out, size_t count)> enqueue;
  std::function<void()> wait;  // the host waits for `stream` (and the library's asynchronous errors)
  // One call and the host's wait for it, so the harness times what a host sees (as nccl-tests does per batch);
  // unset: enqueue, then wait.
  std::function<void(const float* in, float* out, size_t count)> run;
  std::shared_ptr<void> owner;
};

// An engine (NcclAllreduce, RingAllreduceCuda: device choice, comm stream) and the in and out buffers beside it.
template <typename Engine>
struct EngineBuffers {
  Engine engine;
  float* in = nullptr;
  float* out = nullptr;
  template <typename... Args>
  explicit EngineBuffers(size_t max_count, Args&&... args) : engine(MPI_COMM_WORLD, std::forward<Args>(args)...) {
    cudaCheck(cudaMalloc(&in, max_count * sizeof(float)));
    cudaCheck(cudaMalloc(&out, max_count * sizeof(float)));
    // Defined values where the calls moved along the buffers land (call_offset): zeros, as the host's (main.cpp).
    cudaCheck(cudaMemset(in, 0, max_count * sizeof(float)));
    cudaCheck(cudaMemset(out, 0, max_count * sizeof(float)));
  }
  ~EngineBuffers() {
    cudaFree(in);
    cudaFree(out);
  }
  EngineBuffers(const EngineBuffers&) = delete;
  EngineBuffers& operator=(const EngineBuffers&) = delete;
};

// Why this rank cannot run the GPU implementations (no device, NCCL too old), or "": checked before any of them
// starts, so that a machine without a GPU is refused with exit code 2 rather than failing inside NCCL's bootstrap.
std::string device_problem();
// The PCI bus id of the device this rank's GPU implementations run on (the current one), or "" where none is.
std::string device_bus_id();
// The plain launch's Impl and, with -G N, the CUDA graph's beside it ("<name>-graph": the -n calls captured into
// one graph, launched N times; times are per collective).
std::vector<Impl> device_impls(const ImplContext& c, DeviceCollective d);
void copy_to_device(float* device, const float* host, size_t count);
void copy_to_host(float* host, const float* device, size_t count);

}  // namespace ddplab::perf
