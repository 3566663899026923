#include "train/cpu_backend.h"

#include <cmath>
#include <utility>

#include "kernels/grad_clip.h"
#include "train/clock.h"

namespace ddplab {

CpuBackend::CpuBackend(const TrainConfig& config, MPI_Comm comm)
    : config_(config),
      comm_(std::make_unique<Communicator>(comm, comm_options(config))),
      workload_(make_workload(config, comm_->rank(), comm_->size())),
      optimizer_(config.optimizer, workload_->flat_size()) {
  grads_memory_ = comm_->allocate_registered(static_cast<size_t>(workload_->flat_size()) * sizeof(float));
  workload_->place_grads(static_cast<float*>(grads_memory_.data()));
  if (config.zero_stage == 1) {
    params_memory_ = comm_->allocate_registered(static_cast<size_t>(workload_->flat_size()) * sizeof(float));
    workload_->place_params(static_cast<float*>(params_memory_.data()));
  }
  workload_->set_grad_piece_elements(grad_slice_elements(config));
  std::vector<int64_t> numel, offset;
  for (const GradPiece& g : workload_->grad_pieces()) {
    numel.push_back(g.numel);
    offset.push_back(g.offset);
  }
  reducer_ =
      std::make_unique<Reducer>(*comm_, ReducerConfig{bucket_caps(config), config.overlap, config.zero_stage == 1},
                                numel, offset, workload_->flat_grads());
  if (config.update_in_backward()) {
    update_gates_ = std::make_unique<std::atomic<int>[]>(workload_->grad_pieces().size());
    optimizer_thread_ = std::make_unique<WorkerThread>("optimizer thread");
    reducer_->set_on_reduced([this](int first_piece, int last_piece, bool finite) {
      if (!finite) return;  // they stay as they were: the step stops
      for (int piece = first_piece; piece <= last_piece; ++piece) open_update_gate(piece);
    });
    reducer_->set_alone_finisher(optimizer_thread_.get());  // world size 1: each piece's check, then its update
  }
  if (config.extra_allreduce_mb > 0) {
    extra_comm_ = std::make_unique<Communicator>(comm, comm_->options());
    extra_buffer_.assign(static_cast<size_t>(floats_in_mb(config.extra_allreduce_mb)), 0.0f);
  }
}

CpuBackend::~CpuBackend() = default;

double CpuBackend::begin_step(int64_t, double t0_ms) {
  t0_ms_ = t0_ms;
  marks_.clear();
  losses_.assign(config_.grad_accum, 0.0);
  origin_ms_ = now_ms();
  return origin_ms_;
}

int CpuBackend::mark() {
  marks_.push_back(now_ms());
  return static_cast<int>(marks_.size()) - 1;
}

void CpuBackend::start_gradients(float grad_scale) {
  reducer_->begin_step(t0_ms_, grad_scale, static_cast<float>(workload_->weight()));
  // The last update left the gradients zero, and backward adds to them; after a skipped step they hold its values.
  if (!std::exchange(grads_are_zero_, false)) workload_->discard_grad();
  if (optimizer_thread_) {
    optimizer_.begin_step();  // the updates of this step's pieces share its step count
    for (size_t k = 0; k < workload_->grad_pieces().size(); ++k) update_gates_[k].store(2, std::memory_order_relaxed);
    released_pieces_ = 0;
  }
}

void CpuBackend::forward(int micro) { losses_.at(micro) = workload_->forward(); }

void CpuBackend::backward(int, bool sync, const GradReadyHook& before_ready) {
  reducer_->set_sync(sync);  // no_sync for all but the last micro-batch
  const bool update_in_backward = sync && optimizer_thread_;
  workload_->backward([&](int piece) {
    if (before_ready) before_ready(piece);
    if (update_in_backward) release_before(piece);
    reducer_->mark_ready(piece);
  });
  if (update_in_backward) release_before(static_cast<int>(workload_->grad_pieces().size()));
}

void CpuBackend::release_before(int piece) {
  const std::vector<GradPiece>& pieces = workload_->grad_pieces();
  int end = piece;  // the pieces before `end` are released
  if (piece < static_cast<int>(pieces.size())) {
    const int param = pieces[piece].param;
    if (!workload_->parameters()[param].read_after_its_gradient)
      end = piece + 1;  // nor is `piece` read again, nor the pieces of its parameter before it
    else
      while (end > 0 && pieces[end - 1].param == param) --end;  // its parameter may still be read
  }
  while (released_pieces_ < end) open_update_gate(released_pieces_++);
}

void CpuBackend::open_update_gate(int piece) {
  if (update_gates_[piece].fetch_sub(1, std::memory_order_acq_rel) != 1) return;  // the other condition is missing
  optimizer_thread_->submit([this, piece] {
    if (claim_update(piece)) update_piece(piece);
  });
}

// An open gate (0) is claimed once, by the optimizer thread or by the main thread in optimizer_step().
bool CpuBackend::claim_update(int piece) {
  int open = 0;
  return update_gates_[piece].compare_exchange_strong(open, -1, std::memory_order_acq_rel);
}

void CpuBackend::update_piece(int piece) {
  const GradPiece& g = workload_->grad_pieces()[piece];
  optimizer_.update_and_zero_grads(workload_->flat_params(), workload_->flat_grads(), g.offset, g.numel);
}

// --grad-clip: the factor of this step's update (refused with the update in backward, which cannot wait for the norm).
float CpuBackend::clip_scale_of_step() {
  if (!config_.optimizer.clips()) return 1.0f;
  grad_norm_ = std::sqrt(reducer_->sum_of_squares());
  return clip_scale(grad_norm_, config_.optimizer.grad_clip);
}

void CpuBackend::optimizer_step() {
  grads_are_zero_ = true;  // once this returns: every piece was updated (the alignment gaps are always zero)
  if (config_.zero_stage == 1) return sharded_optimizer_step();
  if (!optimizer_thread_) {
    optimizer_.begin_step(clip_scale_of_step());
    return optimizer_.update_and_zero_grads(workload_->flat_params(), workload_->flat_grads(), 0,
                                            workload_->flat_size());
  }
  // Every gate is open now (the buckets are reduced, backward is over), and the updates still queued are the step's
  // tail. The main thread takes them from the back (the pieces released last, such as backward's last piece, which
  // at world size 1 it has just finished itself: Reducer::finish_alone) while the optimizer thread works from the
  // front, rather than waiting for that thread alone.
  for (int piece = last_piece(); piece >= 0; --piece)
    if (claim_update(piece)) update_piece(piece);
  optimizer_thread_->wait_all();  // the piece it is updating, if any
}

// Each bucket's owned elements updated, then its parameters handed to the comm thread to gather, which runs beside
// the next bucket's update. The gradients are all zero after it: the Reducer zeroed what this rank does not own.
void CpuBackend::sharded_optimizer_step() {
  optimizer_.begin_step(clip_scale_of_step());
  float* params = workload_->flat_params();
  for (int b = 0; b < static_cast<int>(reducer_->buckets().size()); ++b) {
    for (const RingChunk& c : reducer_->owned_chunks(b))
      optimizer_.update_and_zero_grads(params, workload_->flat_grads(), static_cast<int64_t>(c.offset),
                                       static_cast<int64_t>(c.count));
    reducer_->all_gather(b, params);
  }
  reducer_->wait_all_gathers();
}

void CpuBackend::gather_optimizer_state() {
  if (config_.zero_stage != 1) return;
  for (std::vector<float>* moment : {&optimizer_.first_moment(), &optimizer_.second_moment()}) {
    if (moment->empty()) continue;  // a state the optimizer does not keep (SGD without momentum's)
    for (int b = 0; b < static_cast<int>(reducer_->buckets().size()); ++b) reducer_->all_gather(b, moment->data());
    reducer_->wait_all_gathers();
  }
}

// The name of the first gradient piece of the first non-finite bucket holding a NaN or Inf (collective when the
// update is sharded: every rank calls it, as the step's agreement has every rank ask).
std::string CpuBackend::first_nonfinite_gradient() {
  const int bucket = reducer_->first_nonfinite_bucket();
  if (bucket < 0) return "";
  // At one rank each piece is checked, then updated, on its own: the finite pieces of this bucket may still be updated
  // (their gradients zeroed) on the optimizer thread. Only a stop comes here, so waiting costs the normal step nothing.
  if (optimizer_thread_) optimizer_thread_->wait_all();
  const int piece = reducer_->first_nonfinite_piece();
  if (piece >= 0) return "gradient " + grad_piece_name(parameters(), grad_pieces()[piece]);
  return "gradient bucket " + std::to_string(bucket);
}

void CpuBackend::set_gradient_nan(int piece) {
  workload_->flat_grads()[workload_->grad_pieces()[piece].offset] = NAN;
}

void CpuBackend::add_to_first_parameter(float delta) {
  workload_->flat_params()[workload_->grad_pieces().back().offset] += delta;  // the first registered parameter
}

void CpuBackend::extra_allreduce() {
  if (extra_comm_) extra_comm_->allreduce_sum(extra_buffer_.data(), extra_buffer_.size());
}

void CpuBackend::write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) {
  save_checkpoint(path, force, workload_->parameters(), workload_->flat_params(), optimizer_, info);
}

CheckpointInfo CpuBackend::read_checkpoint(const std::string& path) {
  return load_checkpoint(path, workload_->parameters(), workload_->flat_params(), optimizer_);
}

}  // namespace ddplab
