// CudaBackend: see cuda_backend.h. Host code only: every kernel it runs is a kernels/cuda launcher or NCCL's.
#include "train/cuda_backend.h"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <utility>

#include "comm/nccl_allreduce.h"
#include "comm/ring_cuda.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/nvtx.h"
#include "runtime/mpi_check.h"
#include "runtime/watchdog.h"
#include "train/clock.h"

namespace ddplab {

namespace {

// --comm nccl: NCCL's collective; --comm ring: our ring over --ring-link.
// --comm-dtype bf16 | fp16: gradients cross the wire in 16 bits, memory and the optimizer stay fp32.
std::unique_ptr<cuda::StreamAllreduce> make_stream_allreduce(const TrainConfig& config, MPI_Comm comm) {
  const std::optional<float16::Format> wire = wire_format(config.comm_dtype);
  if (config.comm == AllreduceImpl::kNccl) return std::make_unique<cuda::NcclAllreduce>(comm, wire);
  cuda::CudaRingConfig ring{config.ring_link};
  ring.wire = wire;
  const CommOptions comm_config = comm_options(config);
  ring.links = comm_config.link;
  ring.ranks_per_node = comm_config.ranks_per_node;
  return std::make_unique<cuda::RingAllreduceCuda>(comm, ring);
}

}  // namespace

CudaBackend::CudaBackend(const TrainConfig& config, MPI_Comm comm)
    : config_(config),
      profile_steps_(parse_profile_steps(config.profile_steps)),
      bucketed_update_(config.update_in_backward()) {
  lr_ = config.optimizer.lr;  // until the Trainer sets a step's
  int rank = 0;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  mpiCheck(MPI_Comm_size(comm, &world_));
  engine_ = make_stream_allreduce(config, comm);
  cudaStream_t stream = nullptr;
  cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  compute_.reset(stream);
  cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  copy_.reset(stream);

  workload_ = make_cuda_workload(config, rank, world_, compute_.get());
  workload_->set_grad_piece_elements(grad_slice_elements(config));
  std::vector<int64_t> numel, offset;
  for (const GradPiece& g : workload_->grad_pieces()) {
    numel.push_back(g.numel);
    offset.push_back(g.offset);
  }
  reducer_ = std::make_unique<cuda::CudaReducer>(*engine_, comm, ReducerConfig{bucket_caps(config), config.overlap},
                                                 numel, offset, workload_->flat_grads(), compute_.get());

  // The update's state in one allocation, each buffer on a 256-byte boundary as the models' (vector loads): AdamW's
  // moments, and with --grad-clip the norm's workspace and result.
  cuda_model::BufferLayout layout;
  const size_t moment_bytes = workload_->flat_size() * sizeof(float);
  const size_t at_m = layout.reserve(moment_bytes), at_v = layout.reserve(moment_bytes);
  const bool clips = config.optimizer.clips();
  const size_t at_workspace = clips ? layout.reserve(cuda::grad_norm_workspace_bytes()) : 0;
  const size_t at_norm = clips ? layout.reserve(sizeof(cuda::ClippedNorm)) : 0;
  void* memory = nullptr;
  cudaCheck(cudaMalloc(&memory, layout.bytes()));
  update_memory_.reset(memory);
  char* const bytes = static_cast<char*>(memory);
  m_ = reinterpret_cast<float*>(bytes + at_m);
  v_ = reinterpret_cast<float*>(bytes + at_v);
  cudaCheck(cudaMemsetAsync(memory, 0, layout.bytes(), compute_.get()));
  if (clips) {
    norm_workspace_ = bytes + at_workspace;
    clipped_norm_ = reinterpret_cast<cuda::ClippedNorm*>(bytes + at_norm);
    cudaCheck(cudaMallocHost(&memory, sizeof(cuda::ClippedNorm)));
    clipped_norm_host_.reset(static_cast<cuda::ClippedNorm*>(memory));
    *clipped_norm_host_ = cuda::ClippedNorm{0.0, 1.0f};
  }
  extra_count_ = static_cast<size_t>(floats_in_mb(config.extra_allreduce_mb));
  if (extra_count_ > 0) {
    cudaCheck(cudaMalloc(&memory, extra_count_ * sizeof(float)));
    extra_buffer_.reset(memory);
    cudaCheck(cudaMemsetAsync(memory, 0, extra_count_ * sizeof(float), compute_.get()));
  }
  for (cuda::Event& copied : copied_) copied = cuda::make_event(cudaEventDisableTiming);  // only ever waited on
  cudaCheck(cudaStreamSynchronize(compute_.get()));
  prefetcher_ = std::make_unique<BatchPrefetcher>([this](int64_t step) { return stage(step); }, config.steps);
}

// Members go in reverse order of declaration: the prefetcher, the engine, then what they used. Only the unwinding
// of an error towards the program's edge (main.cpp), which ends the job, needs more: with communication in flight,
// peers may never answer (the engine would wait for them) and the comm thread and the GPU may still write the
// gradients and flags (freeing them could corrupt memory). Then everything the engine may touch stays allocated.
CudaBackend::~CudaBackend() {
  prefetcher_.reset();  // a prefetch may still be filling the pinned slots and queuing their copy
  if (copy_) cudaStreamSynchronize(copy_.get());
  if (std::uncaught_exceptions() > 0 && engine_ && !engine_->idle()) {
    engine_.release();
    reducer_.release();
    workload_.release();
    update_memory_.release();  // the norm's kernels and AdamW may still be queued
    extra_buffer_.release();
    clipped_norm_host_.release();  // its copy from the device may still be queued
  }
}

std::string CudaBackend::describe() const {
  const std::string attention =
      config_.transformer() ? std::string(", attention ") + (config_.attention ? to_string(*config_.attention) : "auto")
                            : std::string();
  return workload_->describe() + " on GPU " + std::to_string(engine_->device()) + " (" + cuda::query_cuda().name +
         "), " + to_string(config_.precision) + attention + (config_.deterministic ? ", deterministic" : "") +
         ", all-reduce " + engine_->name();
}

std::vector<float> CudaBackend::download(const float* device, int64_t n) const {
  std::vector<float> host(n);
  cudaCheck(cudaMemcpyAsync(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost, compute_.get()));
  cudaCheck(cudaStreamSynchronize(compute_.get()));
  return host;
}

// On the compute stream, which is non-blocking: a plain cudaMemcpy (the legacy stream) would not be ordered with
// the steps' kernels, and from pageable memory it returns before the data has arrived.
void CudaBackend::upload(float* device, const std::vector<float>& host) {
  cudaCheck(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, compute_.get()));
  cudaCheck(cudaStreamSynchronize(compute_.get()));  // `host` may go right after
}

const float* CudaBackend::host_parameters() {
  // Read only (the const accessor): no bf16 remake.
  host_params_ = download(std::as_const(*workload_).flat_params(), workload_->flat_size());
  return host_params_.data();
}

// Checkpoints hold host state: the device's master weights and AdamW moments go through host copies, in an
// Optimizer<float> that carries the moments and the update count as the CPU path's does.
void CudaBackend::write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) {
  const int64_t n = workload_->flat_size();
  Optimizer<float> optimizer(config_.optimizer, n);
  optimizer.restore(adam_steps_, download(m_, n), download(v_, n));
  save_checkpoint(path, force, workload_->parameters(), host_parameters(), optimizer, info);
}

CheckpointInfo CudaBackend::read_checkpoint(const std::string& path) {
  const int64_t n = workload_->flat_size();
  std::vector<float> params = download(std::as_const(*workload_).flat_params(), n);
  Optimizer<float> optimizer(config_.optimizer, n);
  const CheckpointInfo info = load_checkpoint(path, workload_->parameters(), params.data(), optimizer);
  upload(workload_->flat_params(), params);  // the bf16 copy is remade from these before the next forward
  upload(m_, optimizer.first_moment());
  upload(v_, optimizer.second_moment());
  adam_steps_ = optimizer.steps_taken();
  return info;
}

// On the prefetcher's worker, while the previous step runs, so that generating the samples overlaps the device's
// work (at the MLP's default sizes it takes longer than a GPU step): the workload fills `step`'s slot and queues its
// copy on the copy stream. The slot's last reader, step - 2, is complete: the prefetcher is handed step once step - 1
// has begun, and every step ends with the host waiting for the compute stream, which waited for that copy. The lab's
// input pipeline (--data-cost-ms per sample, a sleep as on the CPU) is paid here too, divided by --loader-threads: T
// workers deliver batches T times as fast. Hidden while it is shorter than a step; beyond that the step waits in its
// data phase (the data-bound case).
BatchStats CudaBackend::stage(int64_t step) {
  const int slot = static_cast<int>(step % CudaWorkload::kSlots);
  cudaCheck(cudaSetDevice(engine_->device()));  // the worker thread started on device 0
  const BatchStats stats = workload_->stage(slot, step, copy_.get());
  sleep_ms(config_.data_cost_ms * stats.samples / std::max(config_.loader_threads, 1));
  cudaCheck(cudaEventRecord(copied_[slot].get(), copy_.get()));
  return stats;
}

// The name of the first gradient piece of the first non-finite bucket holding a NaN or Inf (a rare path: the bucket
// is downloaded).
std::string CudaBackend::first_nonfinite_gradient() {
  const int bucket = reducer_->first_nonfinite_bucket();
  if (bucket < 0) return "";
  const Bucket& b = buckets()[bucket];
  const std::vector<float> grads = download(workload_->flat_grads() + b.offset, b.count);
  for (int k = b.first_piece; k <= b.last_piece; ++k) {
    const GradPiece& piece = grad_pieces()[k];
    if (!cpu::all_finite(grads.data() + (piece.offset - b.offset), piece.numel))
      return "gradient " + grad_piece_name(parameters(), piece);
  }
  return "gradient bucket " + std::to_string(bucket);
}

double CudaBackend::begin_step(int64_t step, double t0_ms) {
  // --profile-steps A:B: `ncu --profile-from-start off` / `nsys --capture-range=cudaProfilerApi` see steps A..B
  // only, the steady state, not start-up.
  if (step == profile_steps_.first) cudaCheck(cudaProfilerStart());
  step_range_.emplace(("step " + std::to_string(step)).c_str());
  start_ms_ = now_ms() - t0_ms;
  slot_ = static_cast<int>(step % CudaWorkload::kSlots);
  // The compute stream is idle here (the last step ended with the host waiting for it), so the origin completes as
  // it is recorded: the step's device times anchor to the host clock within a launch latency.
  engine_->begin_step();
  marks_.clear();
  mark();
  return t0_ms + start_ms_;
}

void CudaBackend::resolve_bucket_times() {
  if (std::exchange(bucket_times_pending_, false)) reducer_->resolve_bucket_times(start_ms_);
}

void CudaBackend::end_step(int64_t step) {
  resolve_bucket_times();  // if no synchronize came first
  step_range_.reset();
  if (step == profile_steps_.second) cudaCheck(cudaProfilerStop());
}

int CudaBackend::mark() {
  marks_.push_back(engine_->mark(compute_.get()));
  return static_cast<int>(marks_.size()) - 1;
}

double CudaBackend::mark_ms(int mark) const {
  return static_cast<double>(cuda::elapsed_ms(marks_.front(), marks_.at(mark)));
}

// Micro-batch 0 brings the whole step's batches: its copy is queued (a wait only if its samples took longer than the
// last step), and step + 1's staging starts, to run beside this whole step, the all-reduces included.
BatchStats CudaBackend::load(int64_t step, int micro) {
  if (micro > 0) return {};
  const BatchStats batch = prefetcher_->take(step);
  cudaCheck(cudaStreamWaitEvent(compute_.get(), copied_[slot_].get(), 0));
  return batch;
}

void CudaBackend::start_gradients(float grad_scale) {
  reducer_->begin_step(marks_.front(), grad_scale);
  workload_->discard_grad();
}

void CudaBackend::backward(int micro, bool sync, const GradReadyHook& before_ready) {
  reducer_->set_sync(sync);  // no_sync for all but the last micro-batch
  workload_->backward(slot_, micro, [&](int piece) {
    if (before_ready) before_ready(piece);
    reducer_->mark_ready(piece, workload_->piece_ready_event(piece));
  });
}

// The host waits for the buckets' finite flags: stopping or skipping is decided on the host. With the update bucket by
// bucket, every bucket but the closing one is updated first, on the compute stream behind backward (which no longer
// reads the parameters) and behind its own all-reduce, unless its own reduced gradients are not finite: a stop then
// leaves the finite buckets updated, as the CPU's update in backward does (--skip-nonfinite is refused with it).
void CudaBackend::finish_reduction() {
  if (!bucketed_update_) {
    reducer_->wait_all();
  } else {
    reducer_->launch_all();
    ++adam_steps_;
    for (int b = 0; b + 1 < static_cast<int>(buckets().size()); ++b) {
      reducer_->wait_bucket(b, compute_.get());
      update_bucket(b, reducer_->nonfinite_flag(b));
    }
  }
  reducer_->finish_step();
  bucket_times_pending_ = true;
}

void CudaBackend::optimizer_step() {
  const OptimizerConfig& o = config_.optimizer;
  const cuda_model::DeviceParameters::UpdateTarget target = workload_->params_for_update();
  if (!bucketed_update_) {
    // --grad-clip: the norm and its factor on the device, read by the update, so that the host need not wait for them.
    if (clipped_norm_) {
      cuda::grad_norm(workload_->flat_grads(), workload_->flat_size(), o.grad_clip, clipped_norm_, norm_workspace_,
                      compute_.get());
      cudaCheck(cudaMemcpyAsync(clipped_norm_host_.get(), clipped_norm_, sizeof(cuda::ClippedNorm),
                                cudaMemcpyDeviceToHost, compute_.get()));
    }
    cuda::adamw_update(target.params, target.params_bf16, workload_->flat_grads(), m_, v_, workload_->flat_size(), lr_,
                       o.beta1, o.beta2, o.eps, o.weight_decay, ++adam_steps_, compute_.get(), nullptr,
                       clipped_norm_ ? &clipped_norm_->scale : nullptr);
    return;
  }
  // The closing bucket, finite (the host checked): its all-reduce is done (finish_step waited for it).
  const int last = static_cast<int>(buckets().size()) - 1;
  reducer_->wait_bucket(last, compute_.get());
  update_bucket(last, nullptr);
}

void CudaBackend::update_bucket(int b, const int* skip_if_set) {
  const OptimizerConfig& o = config_.optimizer;
  const cuda_model::DeviceParameters::UpdateTarget target = workload_->params_for_update();
  const Bucket& bucket = buckets()[b];
  const int64_t at = bucket.offset;
  cuda::adamw_update(target.params + at, target.params_bf16 ? target.params_bf16 + at : nullptr,
                     workload_->flat_grads() + at, m_ + at, v_ + at, bucket.count, lr_, o.beta1, o.beta2, o.eps,
                     o.weight_decay, adam_steps_, compute_.get(), skip_if_set);
}

// The host's bookkeeping on the step first, while the GPU runs what is queued (the update).
void CudaBackend::synchronize() {
  resolve_bucket_times();
  cudaCheck(cudaStreamSynchronize(compute_.get()));
}

// Called from backward's hook, after the piece's ready event was recorded and before the reducer is told: the event is
// recorded again behind the NaN, or the piece's all-reduce could read the gradient before the NaN lands (and the NaN
// would then land in this rank's reduced gradients only).
void CudaBackend::set_gradient_nan(int piece) {
  float* gradient = workload_->flat_grads() + workload_->grad_pieces()[piece].offset;
  cudaCheck(cudaMemsetAsync(gradient, 0xFF, sizeof(float), compute_.get()));  // all ones: a NaN
  cudaCheck(cudaEventRecord(workload_->piece_ready_event(piece), compute_.get()));
}

void CudaBackend::add_to_first_parameter(float delta) {
  float* first = workload_->flat_params() + grad_pieces().back().offset;  // the first registered parameter
  const float before = download(std::as_const(*workload_).flat_params() + grad_pieces().back().offset, 1)[0];
  upload(first, {before + delta});
}

// On the same engine as the gradients, as the CPU's runs on the same transport.
void CudaBackend::extra_allreduce() {
  if (extra_count_ == 0) return;
  engine_->allreduce_scaled_async(static_cast<float*>(extra_buffer_.get()), extra_count_, 1.0f, compute_.get(),
                                  /*tag=*/-1, nullptr);
  engine_->synchronize();
}

}  // namespace ddplab
