// EventPool, elapsed_ms, wait_for_stream, agree_or_throw, the comm stream and choose_device: see stream_allreduce.h.
// Host code only.
#include "comm/stream_allreduce.h"

#include <nvtx3/nvToolsExtCudaRt.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "comm/transport.h"  // nap, tighten_timer_slack_once
#include "comm/wire.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"
#include "runtime/mpi_check.h"
#include "runtime/owned_comm.h"
#include "runtime/watchdog.h"

namespace ddplab::cuda {

EventPool::~EventPool() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

cudaEvent_t EventPool::get() {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    cudaCheck(cudaEventCreate(&e));  // timing enabled: the reducer resolves these into milliseconds
    events_.push_back(e);
  }
  return events_[used_++];
}

ScaleAroundSum split_scale(std::optional<float16::Format> wire, float scale, bool has_epilogue) {
  ScaleAroundSum s;
  (wire && wire::scales_before_sum(*wire) ? s.before : s.after) = scale;
  if (s.after != 1.0f && !has_epilogue)
    throw std::invalid_argument("an all-reduce scaled by " + std::to_string(scale) + " needs an epilogue to apply it");
  return s;
}

float elapsed_ms(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  cudaCheck(cudaEventElapsedTime(&ms, from, to));
  return ms;
}

void wait_for_stream(cudaStream_t stream, const char* what, const std::function<void()>& between_polls) {
  using Clock = std::chrono::steady_clock;
  // 20 us naps with a 1 us timer slack: with Linux's default of 50 a 20 us sleep took 92 us on a KVM guest here, and
  // the trainer's GPU sat 50-120 us idle before AdamW (an H200's trace), the wait's end seen late.
  constexpr auto kSpin = std::chrono::microseconds(200);
  constexpr int64_t kNapNs = 20'000;
  const watchdog::Wait wait(what);
  const Clock::time_point spin_until = Clock::now() + kSpin;
  for (;;) {
    const cudaError_t done = cudaStreamQuery(stream);
    if (done != cudaSuccess && done != cudaErrorNotReady) cudaCheck(done);
    if (between_polls) between_polls();
    if (done == cudaSuccess) return;
    if (Clock::now() > spin_until) {
      tighten_timer_slack_once();
      nap(kNapNs);
    }
  }
}

namespace {
constexpr int kBusIdLen = 32;  // the gather's fixed width: pci_bus_id's ids are 16 characters
}  // namespace

void agree_or_throw(MPI_Comm comm, const std::string& who, const std::string& local_error) {
  int rank = 0;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  const int mine = local_error.empty() ? 0 : 1;
  int any = 0;
  mpiCheck(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm));
  const std::string prefix = "rank " + std::to_string(rank) + ": " + who + ": ";
  if (mine) throw std::runtime_error(prefix + local_error);
  if (any) throw std::runtime_error(prefix + "another rank failed");
}

std::string missing_cuda_device(int* count) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (count) *count = err == cudaSuccess ? devices : 0;
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it: a later, unrelated check must not report it again
    return "no CUDA device: " + cuda::device_count_error(err);
  }
  return devices == 0 ? "no CUDA device: cudaGetDeviceCount found 0 devices" : "";
}

cudaStream_t create_comm_stream(const char* name) {
  int least = 0, greatest = 0;
  cudaCheck(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  cudaCheck(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  nvtxNameCudaStreamA(stream, name);
  return stream;
}

DeviceChoice choose_device(MPI_Comm comm, bool exclusive, const char* who) {
  int rank = 0;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  DeviceChoice choice;
  OwnedComm node;
  mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, node.receive()));
  MPI_Comm_rank(node, &choice.local_rank);
  MPI_Comm_size(node, &choice.local_size);

  // Nothing here creates a context (cudaSetDevice does, since CUDA 12): which GPU, its bus id and compute mode are
  // read first, so that ranks which may not share a GPU are refused with the reason, not a failed context creation.
  std::string error = missing_cuda_device(&choice.device_count), sharing_refused;
  char bus_id[kBusIdLen] = {};
  if (error.empty()) {
    choice.device = choice.local_rank % choice.device_count;
    const std::string id = pci_bus_id(choice.device);
    if (id.empty())
      error = "device " + std::to_string(choice.device) + ": CUDA cannot read its PCI bus id";
    else
      id.copy(bus_id, kBusIdLen - 1);
    sharing_refused = process_sharing_refused(choice.device);
  }
  // Bus ids rather than local rank >= device count alone: with CUDA_VISIBLE_DEVICES set per rank every rank sees
  // one device 0 and the GPUs still differ.
  std::vector<char> all_ids(static_cast<size_t>(choice.local_size) * kBusIdLen);
  mpiCheck(MPI_Allgather(bus_id, kBusIdLen, MPI_CHAR, all_ids.data(), kBusIdLen, MPI_CHAR, node));
  node.reset();
  int shared = 0;  // this GPU serves another rank of the node too
  for (int r = 0; r < choice.local_size && error.empty(); ++r)
    if (r != choice.local_rank && std::strncmp(&all_ids[static_cast<size_t>(r) * kBusIdLen], bus_id, kBusIdLen) == 0)
      shared = 1;
  for (int r = 0; (exclusive || !sharing_refused.empty()) && r < choice.local_size && error.empty(); ++r) {
    if (r == choice.local_rank || std::strncmp(&all_ids[static_cast<size_t>(r) * kBusIdLen], bus_id, kBusIdLen) != 0)
      continue;
    error = std::to_string(choice.local_size) + " ranks on this node, " + std::to_string(choice.device_count) +
            " visible GPU(s): local ranks " + std::to_string(std::min(r, choice.local_rank)) + " and " +
            std::to_string(std::max(r, choice.local_rank)) + " would share GPU " + std::to_string(choice.device) +
            " (" + bus_id + "). ";
    if (exclusive)
      error += "NCCL refuses two ranks on one GPU (\"Duplicate GPU detected\"): run at most one rank per GPU, or use "
               "our ring (--comm ring), whose CUDA IPC link lets ranks share a GPU";
    else
      error += sharing_refused + ": run at most one rank per GPU, or switch it to the Default compute mode " +
               "(nvidia-smi -c DEFAULT)";
  }
  if (cudaError_t err; error.empty() && (err = cudaSetDevice(choice.device)) != cudaSuccess) {
    cudaGetLastError();
    error = "device " + std::to_string(choice.device) + ": " + cudaGetErrorString(err);
  }

  // Every rank decides the same way whether to go on: one that threw alone would leave the rest in a collective.
  const int mine[2] = {error.empty() ? 0 : 1, shared};
  int any[2] = {0, 0};
  mpiCheck(MPI_Allreduce(mine, any, 2, MPI_INT, MPI_MAX, comm));
  const std::string prefix = "rank " + std::to_string(rank) + ": " + who + ": ";
  if (mine[0]) throw std::runtime_error(prefix + error);
  if (any[0]) throw std::runtime_error(prefix + "another rank failed");
  choice.gpu_shared = any[1] != 0;
  return choice;
}

}  // namespace ddplab::cuda
