// CudaTrainer: see cuda_trainer.h. Host code only: every kernel it runs is a kernels/cuda launcher or NCCL's.
#include "launcher/cuda_trainer.h"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <utility>

#include "comm/mpi_check.h"
#include "comm/nccl_allreduce.h"
#include "comm/ring_cuda.h"
#include "comm/watchdog.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/nvtx.h"
#include "launcher/cuda_step_phases.h"
#include "launcher/trainer.h"
#include "launcher/workload.h"

namespace ddplab {

namespace {

// --comm nccl: NCCL's collective; --comm ring: our ring over --ring-link.
std::unique_ptr<cuda::StreamAllreduce> make_stream_allreduce(const TrainConfig& config, MPI_Comm comm) {
  if (config.comm == "nccl") return std::make_unique<cuda::NcclAllreduce>(comm);
  return std::make_unique<cuda::RingAllreduceCuda>(comm,
                                                   cuda::CudaRingConfig{cuda::parse_ring_link(config.ring_link)});
}

}  // namespace

CudaTrainer::CudaTrainer(const TrainConfig& config, MPI_Comm comm)
    : config_(config), agreement_(comm), profile_steps_(parse_profile_steps(config.profile_steps)) {
  mpiCheck(MPI_Comm_rank(comm, &rank_));
  mpiCheck(MPI_Comm_size(comm, &world_));
  engine_ = make_stream_allreduce(config, comm);
  cudaStream_t stream = nullptr;
  cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  compute_.reset(stream);
  cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  copy_.reset(stream);

  workload_ = make_cuda_workload(config, rank_, world_, compute_.get());
  workload_->set_grad_piece_elements(static_cast<int64_t>(config.grad_slice_mb * 1048576.0 / sizeof(float)));
  std::vector<int64_t> numel, offset;
  for (const GradPiece& g : workload_->grad_pieces()) {
    numel.push_back(g.numel);
    offset.push_back(g.offset);
  }
  reducer_ = std::make_unique<cuda::CudaReducer>(
      *engine_, comm, ReducerConfig{config.bucket_mb, config.first_bucket_mb, config.overlap}, numel, offset,
      workload_->flat_grads(), compute_.get());

  // AdamW's moments in one allocation, the second on a 256-byte boundary (as if cudaMalloc'd: vector loads).
  const size_t moment = (workload_->flat_size() * sizeof(float) + 255) / 256 * 256;
  void* memory = nullptr;
  cudaCheck(cudaMalloc(&memory, 2 * moment));
  moments_.reset(memory);
  m_ = static_cast<float*>(memory);
  v_ = reinterpret_cast<float*>(static_cast<char*>(memory) + moment);
  cudaCheck(cudaMemsetAsync(memory, 0, 2 * moment, compute_.get()));
  extra_count_ = static_cast<size_t>(config.extra_allreduce_mb * 1048576.0 / sizeof(float));
  if (extra_count_ > 0) {
    cudaCheck(cudaMalloc(&memory, extra_count_ * sizeof(float)));
    extra_buffer_.reset(memory);
    cudaCheck(cudaMemsetAsync(memory, 0, extra_count_ * sizeof(float), compute_.get()));
  }
  for (auto& copied : copied_) {
    cudaEvent_t e = nullptr;
    cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));  // only ever waited on
    copied.reset(e);
  }
  cudaCheck(cudaStreamSynchronize(compute_.get()));
  prefetcher_ = std::make_unique<BatchPrefetcher>([this](int64_t step) { return stage(step); }, config.steps);
}

// Members go in reverse order of declaration: the prefetcher, the engine, then what they used. Only the unwinding
// of an error towards the program's edge (main.cpp), which ends the job, needs more: with communication in flight,
// peers may never answer (the engine would wait for them) and the comm thread and the GPU may still write the
// gradients and flags (freeing them could corrupt memory). Then everything the engine may touch stays allocated.
CudaTrainer::~CudaTrainer() {
  prefetcher_.reset();  // a prefetch may still be filling the pinned slots and queuing their copy
  if (copy_) cudaStreamSynchronize(copy_.get());
  if (std::uncaught_exceptions() > 0 && engine_ && !engine_->idle()) {
    engine_.release();
    reducer_.release();
    workload_.release();
    moments_.release();
    extra_buffer_.release();
  }
}

std::string CudaTrainer::piece_name(const GradPiece& piece) const {
  return grad_piece_name(workload_->parameters(), piece);
}

std::string CudaTrainer::describe() const {
  return workload_->describe() + " on GPU " + std::to_string(engine_->device()) + " (" + cuda::query_cuda().name +
         "), " + config_.precision + ", all-reduce " + engine_->name();
}

std::vector<float> CudaTrainer::download(const float* device, int64_t n) const {
  std::vector<float> host(n);
  cudaCheck(cudaMemcpyAsync(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost, compute_.get()));
  cudaCheck(cudaStreamSynchronize(compute_.get()));
  return host;
}

// On the compute stream, which is non-blocking: a plain cudaMemcpy (the legacy stream) would not be ordered with
// the steps' kernels, and from pageable memory it returns before the data has arrived.
void CudaTrainer::upload(float* device, const std::vector<float>& host) {
  cudaCheck(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, compute_.get()));
  cudaCheck(cudaStreamSynchronize(compute_.get()));  // `host` may go right after
}

std::vector<float> CudaTrainer::parameters() const {
  return download(std::as_const(*workload_).flat_params(), workload_->flat_size());  // read only: no bf16 remake
}

// Checkpoints hold host state: the device's master weights and AdamW moments go through host copies, in an
// Optimizer<float> that carries the moments and the update count as the CPU path's does.
void CudaTrainer::write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) {
  const int64_t n = workload_->flat_size();
  Optimizer<float> optimizer(config_.optimizer, n);
  optimizer.restore(adam_steps_, download(m_, n), download(v_, n));
  save_checkpoint(path, force, workload_->parameters(), parameters().data(), optimizer, info);
}

CheckpointInfo CudaTrainer::read_checkpoint(const std::string& path) {
  const int64_t n = workload_->flat_size();
  std::vector<float> params = parameters();
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
BatchStats CudaTrainer::stage(int64_t step) {
  const int slot = static_cast<int>(step % CudaWorkload::kSlots);
  cudaCheck(cudaSetDevice(engine_->device()));  // the worker thread started on device 0
  const BatchStats stats = workload_->stage(slot, step, copy_.get());
  sleep_ms(config_.data_cost_ms * stats.samples / std::max(config_.loader_threads, 1));
  cudaCheck(cudaEventRecord(copied_[slot].get(), copy_.get()));
  return stats;
}

// The name of the first gradient piece of `bucket` holding a NaN or Inf (a rare path: the bucket is downloaded).
std::string CudaTrainer::first_nonfinite_gradient(int bucket) const {
  const Bucket& b = buckets()[bucket];
  const std::vector<float> grads = download(workload_->flat_grads() + b.offset, b.count);
  for (int k = b.first_piece; k <= b.last_piece; ++k) {
    const GradPiece& piece = grad_pieces()[k];
    if (!cpu::all_finite(grads.data() + (piece.offset - b.offset), piece.numel)) return piece_name(piece);
  }
  return "bucket " + std::to_string(bucket);
}

StepRecord CudaTrainer::step(int step, double t0_ms) {
  // --profile-steps A:B: `ncu --profile-from-start off` / `nsys --capture-range=cudaProfilerApi` see steps A..B
  // only, the steady state, not start-up.
  if (step == profile_steps_.first) cudaCheck(cudaProfilerStart());
  StepRecord r;
  {
    const cuda::NvtxRange range(("step " + std::to_string(step)).c_str());
    r = run_step(step, t0_ms);
  }
  if (step == profile_steps_.second) cudaCheck(cudaProfilerStop());
  return r;
}

StepRecord CudaTrainer::run_step(int step, double t0_ms) {
  StepRecord r;
  watchdog::set_step(step);
  inject_fault_before(config_, rank_, step);
  const int micro_batches = config_.grad_accum;
  cudaStream_t compute = compute_.get();
  const auto mark = [&] { return engine_->mark(compute); };  // a timing event, pooled, valid until the next step

  const double t_start = now_ms();
  // The compute stream is idle here (the last step ended with the host waiting for it), so the origin completes as
  // it is recorded: the step's device times anchor to the host clock within a launch latency.
  engine_->begin_step();
  const cudaEvent_t origin = mark();
  reducer_->begin_step(origin, 1.0f / static_cast<float>(world_ * micro_batches));
  // --straggler-ms: this rank is late with its batches (in its data phase, as on the CPU); the others wait for it
  // in the all-reduces.
  if (rank_ == config_.slow_rank) sleep_ms(config_.straggler_ms * micro_batches);
  const int slot = static_cast<int>(step % CudaWorkload::kSlots);
  // The batch's copy is queued (a wait only if its samples took longer than the last step), and step + 1's staging
  // starts: it runs beside this whole step, the all-reduces included.
  const BatchStats batch = prefetcher_->take(step);
  cudaCheck(cudaStreamWaitEvent(compute, copied_[slot].get(), 0));
  const cudaEvent_t data_end = mark();

  workload_->zero_grad();  // counted in forward
  const bool poison_gradient = config_.fault == "nan" && step == config_.fault_step && rank_ == config_.fault_rank;
  float* const first_gradient = workload_->flat_grads() + workload_->grad_pieces()[0].offset;
  bool loss_finite = true;
  std::vector<cudaEvent_t> forward_end(micro_batches), backward_end(micro_batches);
  for (int m = 0; m < micro_batches; ++m) {
    const bool last = m == micro_batches - 1;
    workload_->forward(slot, m);
    forward_end[m] = mark();
    reducer_->set_sync(last);  // no_sync for all but the last micro-batch
    workload_->backward(slot, m, [&](int piece) {
      // --fault nan: the first gradient to become final gets a NaN before its bucket is reduced.
      if (last && poison_gradient && piece == 0)
        cudaCheck(cudaMemsetAsync(first_gradient, 0xFF, sizeof(float), compute));
      reducer_->mark_ready(piece, workload_->piece_ready_event(piece));
    });
    backward_end[m] = mark();
    // Waits for this forward's loss only: backward is queued behind it, so the device keeps busy.
    const double loss = workload_->loss();
    loss_finite = loss_finite && std::isfinite(loss);
    r.loss += loss / micro_batches;
  }
  reducer_->wait_all();
  agreement_.start(loss_finite);

  // The host's wait before the update: stopping or skipping is decided on the host, from the buckets' flags.
  reducer_->finish_step(t_start - t0_ms);
  const std::string nonfinite = agreement_.finish([this] {
    const int bucket = reducer_->first_nonfinite_bucket();
    return bucket < 0 ? std::string() : "gradient " + first_nonfinite_gradient(bucket);
  });
  const bool skip = skip_nonfinite_step(config_, nonfinite, step);
  r.skipped = skip ? 1 : 0;
  const cudaEvent_t optimizer_start = mark();
  if (!skip) {
    const OptimizerConfig& o = config_.optimizer;
    cuda::adamw_update(workload_->flat_params(), workload_->flat_grads(), m_, v_, workload_->flat_size(), o.lr,
                       o.beta1, o.beta2, o.eps, o.weight_decay, ++adam_steps_, compute);
  }
  if (config_.fault == "diverge" && step == config_.fault_step && rank_ == config_.fault_rank) {
    float* first = workload_->flat_params() + grad_pieces().back().offset;  // the first registered parameter
    const float nudged = download(first, 1)[0] + 1e-3f;
    cudaCheck(cudaMemcpyAsync(first, &nudged, sizeof nudged, cudaMemcpyHostToDevice, compute));
  }
  if (config_.check_sync > 0 && (step + 1) % config_.check_sync == 0)
    check_replicas_agree(
        parameters().data(), grad_pieces(), [this](const GradPiece& g) { return piece_name(g); }, agreement_.comm(),
        step);
  cudaCheck(cudaStreamSynchronize(compute));  // the update's end: the step's events can be resolved
  const double t_optimized = now_ms();
  // The lab's other pathologies, as on the CPU: an all-reduce nobody needs (--extra-allreduce-mb) on the same
  // engine, and rank 0's host work before a barrier the others wait in (--rank0-work-ms).
  if (extra_count_ > 0) {
    engine_->allreduce_sum_async(static_cast<float*>(extra_buffer_.get()), extra_count_, compute, /*tag=*/-1, nullptr);
    engine_->synchronize();
  }
  const double t_extra = now_ms();
  const bool barrier_step = config_.rank0_work_ms > 0 && (step + 1) % config_.barrier_every == 0;
  if (barrier_step && rank_ == 0) sleep_ms(config_.rank0_work_ms);
  const double t_work = now_ms();
  if (barrier_step) {
    const watchdog::Wait wait("MPI_Barrier after rank 0's work (--rank0-work-ms)");
    MPI_Barrier(agreement_.comm());
  }
  const double t_end = now_ms();

  // The record: device phases from the compute stream's events, the rest from the host's clock.
  const auto at = [&](cudaEvent_t e) { return static_cast<double>(cuda::elapsed_ms(origin, e)); };
  CudaStepClock clock{t_start, t_optimized, t_extra, t_work, t_end, at(data_end), {}, {}, at(optimizer_start)};
  for (int m = 0; m < micro_batches; ++m) {
    clock.forward_end.push_back(at(forward_end[m]));
    clock.backward_end.push_back(at(backward_end[m]));
  }
  set_cuda_step_phases(r, clock, t0_ms);
  r.samples = batch.samples;
  r.useful_tokens = batch.useful_tokens;
  r.padded_tokens = batch.padded_tokens;
  r.max_len = batch.max_len;
  add_comm_times(r, bucket_times(), r.start_ms + clock.forward_end.back(), r.start_ms + clock.backward_end.back());
  return r;
}

}  // namespace ddplab
