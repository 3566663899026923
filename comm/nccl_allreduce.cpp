// NcclAllreduce: see nccl_allreduce.h. Host code only (no kernels of ours), so the host compiler builds it.
#include "comm/nccl_allreduce.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCudaRt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "comm/mpi_check.h"
#include "comm/watchdog.h"
#include "kernels/cuda/check.cuh"

namespace ddplab::cuda {

namespace {

constexpr int kMinNcclVersion = 21000;  // ncclAvg arrived in NCCL 2.10
constexpr int kBusIdLen = 32;           // cudaDeviceGetPCIBusId wants >= 13; NCCL uses 64-bit domains

// Rank 0's verdict travels with the id, so a failed ncclGetUniqueId throws on every rank instead of leaving the
// others waiting in ncclCommInitRank.
struct Bootstrap {
  int ok = 0;
  ncclUniqueId id;
};

// NVTX range for the host side of one call; the kernels show up on the named comm stream.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
};

}  // namespace

std::string NcclAllreduce::availability() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version < kMinNcclVersion)
    return "NCCL " + std::to_string(version) + " is older than 2.10 (no ncclAvg)";
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it: a later, unrelated check must not report it again
    return std::string("no CUDA device: ") + cudaGetErrorString(err);
  }
  if (count == 0) return "no CUDA device: cudaGetDeviceCount found 0 devices";
  return "";
}

NcclAllreduce::NcclAllreduce(MPI_Comm comm) {
  mpiCheck(MPI_Comm_rank(comm, &rank_));
  mpiCheck(MPI_Comm_size(comm, &size_));

  // Every rank decides the same way whether to go on: one that threw alone would leave the rest in a collective.
  const auto agree = [&](const std::string& local_error) {
    const int mine = local_error.empty() ? 0 : 1;
    int any = 0;
    mpiCheck(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm));
    if (mine) throw std::runtime_error("rank " + std::to_string(rank_) + ": NcclAllreduce: " + local_error);
    if (any) throw std::runtime_error("rank " + std::to_string(rank_) + ": NcclAllreduce: another rank failed");
  };

  // Device from the node-local rank; the bus ids of every rank of the node then show whether two share a GPU.
  MPI_Comm node = MPI_COMM_NULL;
  mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  int local_size = 1;
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size);
  std::string error = availability();
  int count = 0;
  char bus_id[kBusIdLen] = {};
  if (error.empty()) {
    cudaError_t err = cudaGetDeviceCount(&count);
    device_ = local_rank_ % std::max(count, 1);
    if (err == cudaSuccess) err = cudaSetDevice(device_);
    if (err == cudaSuccess) err = cudaDeviceGetPCIBusId(bus_id, kBusIdLen, device_);
    if (err != cudaSuccess) {
      cudaGetLastError();
      error = "device " + std::to_string(device_) + ": " + cudaGetErrorString(err);
      bus_id[0] = '\0';
    }
  }
  // Bus ids rather than local rank >= device count alone: with CUDA_VISIBLE_DEVICES set per rank every rank sees
  // one device 0 and the GPUs still differ.
  std::vector<char> all_ids(static_cast<size_t>(local_size) * kBusIdLen);
  const int gathered = MPI_Allgather(bus_id, kBusIdLen, MPI_CHAR, all_ids.data(), kBusIdLen, MPI_CHAR, node);
  MPI_Comm_free(&node);
  mpiCheck(gathered);
  for (int r = 0; r < local_size && error.empty() && bus_id[0] != '\0'; ++r) {
    if (r == local_rank_ || std::strncmp(&all_ids[static_cast<size_t>(r) * kBusIdLen], bus_id, kBusIdLen) != 0)
      continue;
    error = std::to_string(local_size) + " ranks on this node, " + std::to_string(count) + " visible GPU(s): local " +
            "ranks " + std::to_string(std::min(r, local_rank_)) + " and " + std::to_string(std::max(r, local_rank_)) +
            " would share GPU " + std::to_string(device_) + " (" + bus_id + "). NCCL refuses two ranks on one GPU " +
            "(\"Duplicate GPU detected\"): run at most one rank per GPU (our ring over CUDA IPC, which lets ranks " +
            "share a GPU, is not built yet)";
  }
  agree(error);

  Bootstrap boot;
  if (rank_ == 0) boot.ok = ncclGetUniqueId(&boot.id) == ncclSuccess;
  mpiCheck(MPI_Bcast(&boot, sizeof(boot), MPI_BYTE, 0, comm));
  if (!boot.ok) throw std::runtime_error("rank " + std::to_string(rank_) + ": ncclGetUniqueId failed on rank 0");

  try {
    ncclComm_t nccl = nullptr;
    ncclCheck(ncclCommInitRank(&nccl, size_, boot.id, rank_));
    comm_ = nccl;
    // A watchdog abort must not leave NCCL kernels spinning on the GPU for a dead peer.
    abort_hook_ = watchdog::add_abort_hook([](void* comm) { ncclCommAbort(static_cast<ncclComm_t>(comm)); }, comm_);
    // Highest priority: the block scheduler prefers the comm kernels whenever backward's kernels leave room,
    // so a bucket's all-reduce runs beside compute instead of queueing behind it.
    int least = 0, greatest = 0;
    cudaCheck(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaCheck(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    nvtxNameCudaStreamA(stream_, "ddplab comm");
    cudaCheck(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  } catch (...) {
    failed_ = true;  // NCCL ranks may be half-connected: abort, never a destroy that waits for peers
    release(/*abort=*/true);
    throw;
  }
}

NcclAllreduce::~NcclAllreduce() {
  // An asynchronous NCCL error (a peer died, a network fault) leaves the communicator unusable: abort it.
  ncclResult_t async = ncclSuccess;
  if (comm_ != nullptr && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess) failed_ = true;
  release(failed_);
}

void NcclAllreduce::release(bool abort) noexcept {
  if (abort_hook_ >= 0) watchdog::remove_abort_hook(abort_hook_);
  abort_hook_ = -1;
  if (stream_ != nullptr && !abort) cudaStreamSynchronize(stream_);
  if (comm_ != nullptr) abort ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
  comm_ = nullptr;
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  pool_.clear();
  pool_used_ = 0;
  if (done_ != nullptr) cudaEventDestroy(done_);
  done_ = nullptr;
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  stream_ = nullptr;
  cudaGetLastError();  // errors here are already being reported (or cannot be): leave no sticky state behind
}

cudaEvent_t NcclAllreduce::pooled_event() {
  if (pool_used_ == pool_.size()) {
    cudaEvent_t e = nullptr;
    cudaCheck(cudaEventCreate(&e));  // timing enabled: the Reducer resolves these into milliseconds
    pool_.push_back(e);
  }
  return pool_[pool_used_++];
}

cudaEvent_t NcclAllreduce::mark(cudaStream_t stream) {
  cudaEvent_t e = pooled_event();
  cudaCheck(cudaEventRecord(e, stream));
  return e;
}

void NcclAllreduce::begin_step() {
  pool_used_ = 0;
  records_.clear();
}

AllreduceEvents NcclAllreduce::allreduce_async(float* data, size_t count, bool average, cudaStream_t compute_stream,
                                               int tag) {
  char name[48];
  std::snprintf(name, sizeof(name), "allreduce bucket %d", tag);
  NvtxRange range(name);

  AllreduceEvents ev;
  ev.ready = pooled_event();
  ev.start = pooled_event();
  ev.end = pooled_event();
  // The gradients are final once everything queued on compute_stream so far has run (after llm.c).
  cudaCheck(cudaEventRecord(ev.ready, compute_stream));
  cudaCheck(cudaStreamWaitEvent(stream_, ev.ready, 0));
  cudaCheck(cudaEventRecord(ev.start, stream_));
  if (count > 0) {
    try {
      ncclCheck(ncclAllReduce(data, data, count, ncclFloat32, average ? ncclAvg : ncclSum, comm_, stream_));
    } catch (...) {
      failed_ = true;
      throw;
    }
  }
  cudaCheck(cudaEventRecord(ev.end, stream_));
  records_.push_back(AllreduceRecord{tag, count, average, ev});
  return ev;
}

void NcclAllreduce::wait(cudaStream_t compute_stream) {
  // A fresh event at the comm stream's tail covers every call so far, including any from before begin_step().
  cudaCheck(cudaEventRecord(done_, stream_));
  cudaCheck(cudaStreamWaitEvent(compute_stream, done_, 0));
}

void NcclAllreduce::synchronize() {
  const watchdog::Wait wait("NCCL all-reduces on the comm stream");
  for (;;) {
    const cudaError_t done = cudaStreamQuery(stream_);
    if (done != cudaErrorNotReady) cudaCheck(done);
    ncclResult_t async = ncclSuccess;
    ncclCheck(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess) failed_ = true;
    ncclCheck(async);
    if (done == cudaSuccess) return;
    std::this_thread::sleep_for(std::chrono::microseconds(20));  // short against a bucket's all-reduce
  }
}

float NcclAllreduce::elapsed_ms(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  cudaCheck(cudaEventElapsedTime(&ms, from, to));
  return ms;
}

float NcclAllreduce::last_elapsed_ms() {
  if (records_.empty()) throw std::logic_error("NcclAllreduce::last_elapsed_ms: no allreduce_async since begin_step");
  const AllreduceEvents& ev = records_.back().events;
  cudaCheck(cudaEventSynchronize(ev.end));
  return elapsed_ms(ev.start, ev.end);
}

}  // namespace ddplab::cuda
