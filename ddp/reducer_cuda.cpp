// CudaReducer: see reducer_cuda.h. Host code only: its one kernel is convert.h's launcher.
#include "ddp/reducer_cuda.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/convert.h"

namespace ddplab::cuda {

CudaReducer::CudaReducer(StreamAllreduce& engine, MPI_Comm comm, const ReducerConfig& config,
                         const std::vector<int64_t>& numel, const std::vector<int64_t>& offset, float* flat_grads,
                         cudaStream_t compute_stream)
    : engine_(engine),
      config_(config),
      buckets_(assign_buckets(numel, offset, config.caps)),
      countdown_(buckets_, "CudaReducer"),
      flat_grads_(flat_grads),
      compute_(compute_stream),
      ready_(buckets_.size()),
      start_(buckets_.size()),
      end_(buckets_.size()),
      times_(buckets_.size()) {
  check_same_layout(buckets_, comm);
  const size_t bytes = std::max<size_t>(buckets_.size(), 1) * sizeof(int);
  int* p = nullptr;
  cudaCheck(cudaMalloc(&p, bytes));
  flags_.reset(p);
  cudaCheck(cudaMallocHost(&p, bytes));
  flags_host_.reset(p);
}

void CudaReducer::begin_step(cudaEvent_t origin, float grad_scale) {
  origin_ = origin;
  grad_scale_ = grad_scale;
  sync_ = true;
  countdown_.restart();
  // On the comm stream, which alone writes the flags: ordered before this step's first check.
  cudaCheck(cudaMemsetAsync(flags_.get(), 0, buckets_.size() * sizeof(int), engine_.stream()));
}

void CudaReducer::mark_ready(int piece, cudaEvent_t ready) {
  if (!sync_) return;
  if (!countdown_.mark_ready(piece)) return;
  ready_[countdown_.bucket_of(piece)] = ready;  // the bucket's last piece: later in stream order than the others
  if (!config_.overlap) return;
  for (int b; (b = countdown_.next_to_launch()) >= 0;) launch(b);
}

void CudaReducer::launch(int b) {
  const Bucket& bucket = buckets_[b];
  float* grads = flat_grads_ + bucket.offset;
  const int64_t count = bucket.count;
  const float scale = grad_scale_;
  const int nb = static_cast<int>(buckets_.size());
  int* flags = flags_.get();
  int* flags_host = flags_host_.get();
  // Enqueued by the engine right behind the all-reduce (the ring's comm thread runs it later), so it captures values.
  const auto scale_and_check = [=](cudaStream_t comm_stream, float scale_left) {
    scale_and_check_finite(grads, scale_left, count, flags + b, comm_stream);
    if (b == nb - 1)  // buckets run in order: the last one's flag is the last written
      cudaCheck(cudaMemcpyAsync(flags_host, flags, nb * sizeof(int), cudaMemcpyDeviceToHost, comm_stream));
  };
  const AllreduceEvents ev =
      engine_.allreduce_scaled_async(grads, static_cast<size_t>(count), scale, compute_, b, scale_and_check);
  start_[b] = ev.start;
  end_[b] = ev.end;  // after the check, as the CPU Reducer's comm_end
}

void CudaReducer::launch_all() {
  countdown_.require_all_ready();
  for (int b; (b = countdown_.next_to_launch()) >= 0;) launch(b);  // overlap off: everything starts now
}

void CudaReducer::wait_all() {
  launch_all();
  engine_.wait(compute_);
}

void CudaReducer::wait_bucket(int bucket, cudaStream_t stream) {
  engine_.wait_recorded(end_.at(bucket));  // a wait on an event not yet recorded would not wait
  cudaCheck(cudaStreamWaitEvent(stream, end_.at(bucket), 0));
}

void CudaReducer::finish_step() { engine_.synchronize(); }

void CudaReducer::resolve_bucket_times(double origin_ms) {
  const auto at = [&](cudaEvent_t e) { return origin_ms + elapsed_ms(origin_, e); };
  for (size_t b = 0; b < buckets_.size(); ++b) times_[b] = BucketTimes{at(ready_[b]), at(start_[b]), at(end_[b])};
}

int CudaReducer::first_nonfinite_bucket() const {
  const int* flags = flags_host_.get();
  const int* it = std::find_if(flags, flags + buckets_.size(), [](int f) { return f != 0; });
  return it == flags + buckets_.size() ? -1 : static_cast<int>(it - flags);
}

}  // namespace ddplab::cuda
