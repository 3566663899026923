// NcclAllreduce: see nccl_allreduce.h. Host code only (no kernels of ours), so the host compiler builds it.
#include "comm/nccl_allreduce.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/nvtx.h"
#include "kernels/cuda/wire_cast.h"
#include "runtime/mpi_check.h"
#include "runtime/watchdog.h"

namespace ddplab::cuda {

namespace {

constexpr int kMinNcclVersion = 21000;  // ncclAvg arrived in NCCL 2.10

// Rank 0's verdict travels with the id, so a failed ncclGetUniqueId throws on every rank instead of leaving the
// others waiting in ncclCommInitRank.
struct Bootstrap {
  int ok = 0;
  ncclUniqueId id;
};

}  // namespace

std::string NcclAllreduce::availability() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version < kMinNcclVersion)
    return "NCCL " + std::to_string(version) + " is older than 2.10 (no ncclAvg)";
  return missing_cuda_device();
}

NcclAllreduce::NcclAllreduce(MPI_Comm comm, std::optional<float16::Format> wire) : wire_(wire) {
  mpiCheck(MPI_Comm_rank(comm, &rank_));
  mpiCheck(MPI_Comm_size(comm, &size_));

  agree_or_throw(comm, "NcclAllreduce", availability());
  const DeviceChoice choice = choose_device(comm, /*exclusive=*/true, "NcclAllreduce");
  device_ = choice.device;

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
    stream_ = create_comm_stream("ddplab comm");
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
  // So does this rank's own error on its way to the program's edge: its peers may be waiting for its next bucket,
  // and a destroy (which finalizes with them) would then wait for peers that never get there.
  release(failed_ || std::uncaught_exceptions() > 0);
}

void NcclAllreduce::release(bool abort) noexcept {
  if (abort_hook_ >= 0) watchdog::remove_abort_hook(abort_hook_);
  abort_hook_ = -1;
  if (stream_ != nullptr && !abort) cudaStreamSynchronize(stream_);
  if (wire_staging_ != nullptr) cudaFreeAsync(wire_staging_, stream_);
  wire_staging_ = nullptr;
  if (comm_ != nullptr) abort ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
  comm_ = nullptr;
  if (done_ != nullptr) cudaEventDestroy(done_);
  done_ = nullptr;
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  stream_ = nullptr;
  cudaGetLastError();  // errors here are already being reported (or cannot be): leave no sticky state behind
}

cudaEvent_t NcclAllreduce::mark(cudaStream_t stream) {
  cudaEvent_t e = events_.get();
  cudaCheck(cudaEventRecord(e, stream));
  return e;
}

void NcclAllreduce::begin_step() {
  events_.reset();
  records_.clear();
}

AllreduceEvents NcclAllreduce::launch(float* data, size_t count, bool average, float scale, cudaStream_t compute_stream,
                                      int tag, const CommEpilogue& epilogue) {
  const ScaleAroundSum scaled = split_scale(wire_, scale, epilogue != nullptr);
  char name[48];
  std::snprintf(name, sizeof(name), "allreduce bucket %d", tag);
  NvtxRange range(name);

  AllreduceEvents ev;
  ev.ready = events_.get();
  ev.start = events_.get();
  ev.end = events_.get();
  // The gradients are final once everything queued on compute_stream so far has run (after llm.c).
  cudaCheck(cudaEventRecord(ev.ready, compute_stream));
  cudaCheck(cudaStreamWaitEvent(stream_, ev.ready, 0));
  cudaCheck(cudaEventRecord(ev.start, stream_));
  if (count > 0) {
    try {
      const ncclRedOp_t op = average ? ncclAvg : ncclSum;
      if (!wire_) {
        ncclCheck(ncclAllReduce(data, data, count, ncclFloat32, op, comm_, stream_));
      } else {
        uint16_t* words = wire_staging(count);
        const auto n = static_cast<int64_t>(count);
        if (scaled.before != 1.0f) cuda::scale(data, scaled.before, n, stream_);
        wire_encode(*wire_, words, data, n, stream_);
        const ncclDataType_t type = *wire_ == float16::Format::kBf16 ? ncclBfloat16 : ncclFloat16;
        ncclCheck(ncclAllReduce(words, words, count, type, op, comm_, stream_));
        wire_decode(*wire_, data, words, n, stream_);
      }
    } catch (...) {
      failed_ = true;
      throw;
    }
  }
  if (epilogue) epilogue(stream_, scaled.after);
  cudaCheck(cudaEventRecord(ev.end, stream_));
  records_.push_back(AllreduceRecord{tag, count, average, ev});
  return ev;
}

uint16_t* NcclAllreduce::wire_staging(size_t count) {
  if (count > wire_capacity_) {
    // Freed and allocated in the comm stream's order: the calls queued before still use the old buffer.
    if (wire_staging_ != nullptr) cudaCheck(cudaFreeAsync(wire_staging_, stream_));
    void* p = nullptr;
    cudaCheck(cudaMallocAsync(&p, count * sizeof(uint16_t), stream_));
    wire_staging_ = static_cast<uint16_t*>(p);
    wire_capacity_ = count;
  }
  return wire_staging_;
}

void NcclAllreduce::wait(cudaStream_t compute_stream) {
  // A fresh event at the comm stream's tail covers every call so far, including any from before begin_step().
  cudaCheck(cudaEventRecord(done_, stream_));
  cudaCheck(cudaStreamWaitEvent(compute_stream, done_, 0));
}

void NcclAllreduce::synchronize() {
  wait_for_stream(stream_, "NCCL all-reduces on the comm stream", [this] { check_async_error(); });
}

bool NcclAllreduce::idle() {
  const cudaError_t done = cudaStreamQuery(stream_);
  if (done != cudaSuccess && done != cudaErrorNotReady) failed_ = true;
  return !failed_ && done == cudaSuccess;
}

void NcclAllreduce::check_async_error() {
  ncclResult_t async = ncclSuccess;
  ncclCheck(ncclCommGetAsyncError(comm_, &async));
  if (async != ncclSuccess) failed_ = true;
  ncclCheck(async);
}

float NcclAllreduce::last_elapsed_ms() {
  if (records_.empty()) throw std::logic_error("NcclAllreduce::last_elapsed_ms: no allreduce_async since begin_step");
  const AllreduceEvents& ev = records_.back().events;
  cudaCheck(cudaEventSynchronize(ev.end));
  return elapsed_ms(ev.start, ev.end);
}

}  // namespace ddplab::cuda
