// The Reducer on the GPU: the CPU Reducer's buckets (ddp/reducer.h: assign_buckets, the cross-rank layout check),
// all-reduced on a comm stream while backward runs on the compute stream, by NCCL (comm/nccl_allreduce.h) or by our
// ring (comm/ring_cuda.h), both behind StreamAllreduce.
//
//   - mark_ready(piece, event) is backward's hook (model/mlp_cuda.h). A complete bucket is launched at once, in
//     bucket order on every rank: the comm stream waits for the compute stream (on the device), runs the all-reduce
//     (sum), then scale_and_check_finite, which multiplies by 1/(world x micro-batches) and sets the bucket's
//     non-finite flag. The host never waits (the ring's comm thread may, off the main thread). With overlap off
//     every bucket is launched in wait_all, after backward.
//   - Sum + fused scale rather than ncclAvg: the finite check is a pass over the bucket the step needs anyway, so
//     the scale is free there; it folds in the micro-batch count, which ncclAvg cannot; and it is the CPU
//     Reducer's arithmetic (sum, then one multiply), so both paths round alike.
//   - wait_all makes the compute stream wait for the comm stream (on the device); the flags' copy to pinned host
//     memory rides behind the last bucket; finish_step, after backward, is the host's wait for the comm stream
//     (watchdog-named), then the flags are read; the timings are resolved from CUDA events once the update is queued
//     (resolve_bucket_times). (Our ring's ipc and host links also hold the host in wait_all: see there.)
//
// Not thread-safe; the current device must be the engine's. Plain C++ (no kernels of its own).
#pragma once
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/stream_allreduce.h"
#include "ddp/reducer.h"
#include "kernels/cuda/owned.h"

namespace ddplab::cuda {

class CudaReducer {
 public:
  // Collective over comm (the layout check throws on every rank if the layouts differ). numel/offset: the gradient
  // pieces in ready order, as for the Reducer; flat_grads: device memory. engine must outlive the reducer.
  CudaReducer(StreamAllreduce& engine, MPI_Comm comm, const ReducerConfig& config, const std::vector<int64_t>& numel,
              const std::vector<int64_t>& offset, float* flat_grads, cudaStream_t compute_stream);
  CudaReducer(const CudaReducer&) = delete;
  CudaReducer& operator=(const CudaReducer&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }

  // Every bucket pending, flags cleared. origin: an event on the compute stream at step start (the engine's mark),
  // the zero of the timings; grad_scale multiplies the summed gradients (1/(world x micro-batches)). Call after
  // the engine's begin_step, once the previous step's finish_step has returned.
  void begin_step(cudaEvent_t origin, float grad_scale);
  // false: gradients only accumulate (no_sync); true: complete buckets are reduced.
  void set_sync(bool sync) { sync_ = sync; }
  // Backward's hook: gradient piece `piece` (ready order) is final once `ready`, on the compute stream, is reached.
  void mark_ready(int piece, cudaEvent_t ready);
  // Launches the buckets not yet launched (overlap off: all), then makes the compute stream wait for every bucket.
  // With NCCL it returns at once; with our ring it first waits for the comm thread to queue every bucket, and over
  // the ipc and host links, whose exchanges block that thread until each ring step's copies are done, that is until
  // the all-reduces are all but finished (RingAllreduceCuda::wait). Work the host must overlap with them goes first.
  void wait_all();
  // The update bucket by bucket: launch_all() is wait_all() without the compute stream's wait for every bucket;
  // then wait_bucket(b, stream) makes `stream` wait for bucket b's all-reduce and its check (our ring: once its comm
  // thread has run that bucket's job, not the later ones), and nonfinite_flag(b) is its flag on the device (set by
  // the check), for a kernel to read behind that wait.
  void launch_all();
  void wait_bucket(int bucket, cudaStream_t stream);
  const int* nonfinite_flag(int bucket) const { return flags_.get() + bucket; }
  // The host waits for the comm stream (throws on a communication error): first_nonfinite_bucket() is then known.
  void finish_step();
  // After finish_step: bucket_times() as origin_ms plus the milliseconds since the origin event. Apart from the wait,
  // so that the caller queues the update first (~60 event queries: tens of us the GPU would otherwise sit idle).
  void resolve_bucket_times(double origin_ms);
  const std::vector<BucketTimes>& bucket_times() const { return times_; }
  // After finish_step: the first bucket whose reduced gradients hold a NaN or Inf, or -1. Every rank reduces to
  // the same values, so every rank gets the same answer.
  int first_nonfinite_bucket() const;

 private:
  void launch(int bucket);

  StreamAllreduce& engine_;
  ReducerConfig config_;
  std::vector<Bucket> buckets_;
  BucketCountdown countdown_;  // this step's pieces, and which bucket launches next
  float* flat_grads_;
  cudaStream_t compute_;
  std::unique_ptr<int, cuda::CudaFree> flags_;           // per bucket, device: set by scale_and_check_finite
  std::unique_ptr<int, cuda::CudaFreeHost> flags_host_;  // pinned: copied on the comm stream behind the last bucket

  bool sync_ = true;
  float grad_scale_ = 1;
  cudaEvent_t origin_ = nullptr;
  std::vector<cudaEvent_t> ready_, start_, end_;  // per bucket, this step's events (pooled by the engine)
  std::vector<BucketTimes> times_;
};

}  // namespace ddplab::cuda
