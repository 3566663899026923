// allreduce_perf's GPU implementations: ncclAllReduce and our ring (comm/ring_cuda.h) on device buffers (built with
// the CUDA engine only).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace ddplab::bench {

// Device buffers of `max_count` floats for in and out, and a call that all-reduces `count` of them and waits for
// the comm stream, so the harness times what a host sees (as nccl-tests does per batch of calls).
struct DeviceAllreduce {
  float* in = nullptr;
  float* out = nullptr;
  std::function<void(const float* in, float* out, size_t count)> run;
  std::shared_ptr<void> owner;  // the NCCL communicator and the buffers
};

// Why this rank cannot run the GPU implementations (no device, NCCL too old), or "": checked before any of them
// starts, so that a machine without a GPU is refused with exit code 2 rather than failing inside NCCL's bootstrap.
std::string device_problem();
DeviceAllreduce make_nccl_allreduce(size_t max_count);  // collective over MPI_COMM_WORLD; throws on failure
// Our ring over `link` ("nccl", "ipc" or "host") in chunks of at most chunk_bytes (0: the trainer's); the time
// includes the host's wait for the comm stream.
DeviceAllreduce make_ring_cuda_allreduce(size_t max_count, const std::string& link, size_t chunk_bytes);
void copy_to_device(float* device, const float* host, size_t count);
void copy_to_host(float* host, const float* device, size_t count);

}  // namespace ddplab::bench
