// CudaWorkload: see cuda_workload.h. Host code only.
#include "train/cuda_workload.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "data/synthetic.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/gemm_algo_table.h"
#include "kernels/cuda/owned.h"
#include "model/cuda_common.h"
#include "model/mlp_cuda.h"
#include "model/precision.h"
#include "model/transformer_cuda.h"
#include "runtime/settings.h"
#include "train/token_batches.h"

namespace ddplab {
namespace {

// kSlots slots of `bytes` each, in pinned host memory and on the device: a step's batch is written into its host
// slot and copied whole.
class StagingSlots {
 public:
  explicit StagingSlots(size_t bytes) : bytes_((bytes + 255) / 256 * 256) {  // slots on 256-byte boundaries
    void* p = nullptr;
    cudaCheck(cudaMalloc(&p, CudaWorkload::kSlots * bytes_));
    device_.reset(p);
    cudaCheck(cudaMallocHost(&p, CudaWorkload::kSlots * bytes_));
    host_.reset(p);
  }
  char* host(int slot) const { return static_cast<char*>(host_.get()) + slot * bytes_; }
  char* device(int slot) const { return static_cast<char*>(device_.get()) + slot * bytes_; }
  void copy(int slot, cudaStream_t stream) const {
    cudaCheck(cudaMemcpyAsync(device(slot), host(slot), bytes_, cudaMemcpyHostToDevice, stream));
  }

 private:
  size_t bytes_;
  cuda::DeviceMemory device_;
  std::unique_ptr<void, cuda::CudaFreeHost> host_;
};

// What every workload answers from its model alone (MlpCuda and TransformerCuda share these calls).
template <typename Model>
class CudaModelWorkload : public CudaWorkload {
 public:
  const std::vector<Parameter<float>>& parameters() const override { return model_.parameters(); }
  int64_t flat_size() const override { return model_.flat_size(); }
  float* flat_params() override { return model_.flat_params(); }
  const float* flat_params() const override { return model_.flat_params(); }
  cuda_model::DeviceParameters::UpdateTarget params_for_update() override { return model_.params_for_update(); }
  float* flat_grads() override { return model_.flat_grads(); }
  void set_grad_piece_elements(int64_t n) override { model_.set_grad_piece_elements(n); }
  const std::vector<GradPiece>& grad_pieces() const override { return model_.grad_pieces(); }
  cudaEvent_t piece_ready_event(int piece) const override { return model_.piece_ready_event(piece); }
  void discard_grad() override { model_.discard_grad(); }
  std::string gemm_algorithms() const override { return model_.gemm().describe_algos(); }

 protected:
  template <typename... Args>
  explicit CudaModelWorkload(GemmAlgo gemm_algo, Args&&... model_args) : model_(std::forward<Args>(model_args)...) {
    model_.gemm().set_timed_algos(gemm_algo == GemmAlgo::kTimed, cuda::GemmAlgoTable::default_dir());
  }
  Model model_;
};

// The MLP on synthetic classification data. A step's micro-batches are consecutive samples of the rank's shard (the
// CPU MLP's sharding), so a slot holds them back to back: one fill and one copy per step.
class MlpCudaWorkload final : public CudaModelWorkload<MlpCuda> {
 public:
  MlpCudaWorkload(const TrainConfig& c, int rank, int world, cudaStream_t compute)
      : CudaModelWorkload(c.gemm_algo, c.mlp, c.seed, c.precision, c.batch, compute),
        batch_(c.batch),
        data_(SyntheticConfig{c.mlp.input_dim, c.mlp.num_classes, c.seed, c.data_noise}),
        shard_{rank, world, c.batch * c.grad_accum},
        x_bytes_((int64_t{shard_.batch} * c.mlp.input_dim * sizeof(float) + 255) / 256 * 256),
        slots_(x_bytes_ + shard_.batch * sizeof(int32_t)) {}

  std::string describe() const override {
    const MlpConfig& m = model_.config();
    char text[160];
    std::snprintf(text, sizeof text, "MLP %d-%dx%d-%d (%.2fM params)", m.input_dim, m.hidden_dim, m.num_hidden_layers,
                  m.num_classes, model_.num_parameters() / 1e6);
    return text;
  }
  BatchStats stage(int slot, int64_t step, cudaStream_t copy) override {
    data_.fill(x(slots_.host(slot)), y(slots_.host(slot)), shard_.first_sample(step), shard_.batch);
    slots_.copy(slot, copy);
    return BatchStats{static_cast<double>(shard_.batch), 0, 0, 0, static_cast<double>(shard_.batch)};
  }
  void forward(int slot, int micro) override {
    const int64_t first_row = int64_t{micro} * batch_;
    char* device = slots_.device(slot);
    model_.forward(x(device) + first_row * model_.config().input_dim, y(device) + first_row, batch_);
  }
  void backward(int, int, const GradReadyHook& on_ready) override { model_.backward(on_ready); }
  double loss() const override { return model_.loss(); }
  double evaluate(const int32_t*, int, int) override {
    throw std::logic_error("the MLP has no validation pass (--val-data is the transformer's)");
  }

 private:
  // A slot: the step's inputs [rows, input_dim], then its targets [rows].
  float* x(char* slot) const { return reinterpret_cast<float*>(slot); }
  int32_t* y(char* slot) const { return reinterpret_cast<int32_t*>(slot + x_bytes_); }

  int batch_;  // rows per micro-batch
  SyntheticClassification data_;
  ShardedBatches shard_;
  size_t x_bytes_;
  StagingSlots slots_;
};

// The transformer on the CPU workload's token batches (train/token_batches.h). A slot holds the step's
// micro-batches one after the other, each in a region of the largest micro-batch's size (tokens, lengths, labels,
// and positions where rows are packed), and their shapes and loss weights on the host.
class TransformerCudaWorkload final : public CudaModelWorkload<TransformerCuda> {
 public:
  TransformerCudaWorkload(const TrainConfig& c, int rank, int world, cudaStream_t compute)
      : CudaModelWorkload(c.gemm_algo, TokenBatches::model_config(c), c.seed, c.precision, TokenBatches::max_tokens(c),
                          TokenBatches::max_seq(c), compute, resolved_attention(c, cuda::cudnn_attention_available()),
                          c.deterministic,
                          settings::choice(settings::kCudnnShapes) == "dynamic" ? cuda::CudnnShapes::kDynamic
                                                                                : cuda::CudnnShapes::kStatic),
        batches_(c, model_.config(), rank, world),
        capacity_(TokenBatches::max_tokens(c)),
        arrays_(c.batching == Batching::kPack ? 4 : 3),
        slots_(static_cast<size_t>(c.grad_accum) * arrays_ * capacity_ * sizeof(int32_t)) {
    for (auto& m : micro_) m.resize(c.grad_accum);
    if (!c.val_data.empty()) {  // made with the rest: an out-of-memory comes before the first step, not hours in
      void* memory = nullptr;
      cudaCheck(cudaMalloc(&memory, static_cast<size_t>(capacity_) * sizeof(int32_t)));
      eval_tokens_.reset(memory);
    }
  }

  std::string describe() const override { return batches_.describe(model_.num_parameters()); }
  std::string attention_graphs() const override {
    const std::optional<cuda::CudnnBuildStats> stats = model_.cudnn_build_stats();
    return stats ? stats->describe() : "";
  }
  BatchStats stage(int slot, int64_t step, cudaStream_t copy) override {
    BatchStats step_stats;
    for (int m = 0; m < static_cast<int>(micro_[slot].size()); ++m) {
      const BatchStats s = batches_.load(step, m);
      step_stats.samples += s.samples;
      step_stats.useful_tokens += s.useful_tokens;
      step_stats.padded_tokens += s.padded_tokens;
      step_stats.max_len = std::max(step_stats.max_len, s.max_len);
      step_stats.loss_terms += s.loss_terms;
      int32_t* region = inputs(slots_.host(slot), m);
      std::copy(batches_.tokens().begin(), batches_.tokens().end(), region);
      std::copy(batches_.lengths().begin(), batches_.lengths().end(), region + capacity_);
      std::copy(batches_.labels().begin(), batches_.labels().end(), region + 2 * capacity_);
      const int32_t* positions = batches_.positions();
      if (positions) std::copy(positions, positions + batches_.tokens().size(), region + 3 * capacity_);
      // The rank's weight folds into each micro-batch's: the reducer scales every rank alike.
      const int seq = batches_.seq();
      const bool every_row_full = std::all_of(batches_.lengths().begin(), batches_.lengths().end(),
                                              [seq](int32_t length) { return length == seq; });
      MicroBatch& b = micro_[slot][m];
      b = MicroBatch{batches_.rows(), seq};
      b.every_row_full = every_row_full;
      b.packed = positions != nullptr;
      b.loss_scale = batches_.micro_scale();
      b.grad_scale = batches_.micro_scale() * batches_.weight();
    }
    slots_.copy(slot, copy);
    return step_stats;
  }
  void forward(int slot, int micro) override {
    const MicroBatch& b = micro_[slot].at(micro);
    const int32_t* region = inputs(slots_.device(slot), micro);
    // Full rows go without lengths: the attention then runs unmasked (cuDNN's graph without padding, ~0.14 ms less
    // per gpt2-small step) and no kernel looks for padding that is not there (~1.2 ms per step on an H200).
    const int32_t* lengths = b.every_row_full ? nullptr : region + capacity_;
    model_.forward(region, lengths, region + 2 * capacity_, b.rows, b.seq, static_cast<float>(b.grad_scale),
                   b.packed ? region + 3 * capacity_ : nullptr);
    loss_scale_ = b.loss_scale;
  }
  void backward(int, int, const GradReadyHook& on_ready) override { model_.backward(on_ready); }
  double loss() const override { return loss_scale_ * model_.loss(); }
  // Its own device buffer: the staging slots hold the next step's batch, whose copy may be in flight. A pageable
  // copy on the compute stream: the host's tokens may be reused once it returns, and the forward runs after it.
  double evaluate(const int32_t* tokens, int rows, int seq) override {
    if (!eval_tokens_) throw std::logic_error("TransformerCudaWorkload::evaluate: the run has no --val-data");
    const size_t bytes = static_cast<size_t>(rows) * seq * sizeof(int32_t);
    int32_t* device = static_cast<int32_t*>(eval_tokens_.get());
    cudaCheck(cudaMemcpyAsync(device, tokens, bytes, cudaMemcpyHostToDevice, model_.stream()));
    model_.forward(device, nullptr, nullptr, rows, seq);
    return model_.loss();
  }

 private:
  struct MicroBatch {
    int rows = 0, seq = 0;
    bool every_row_full = false;  // every row holds seq tokens: the model needs no lengths
    bool packed = false;          // rows hold several sequences: the model takes their positions
    double loss_scale = 1;        // TokenBatches::micro_scale: the reported loss is the CPU workload's
    double grad_scale = 1;        // and times the rank's weight, on the gradient
  };
  int32_t* inputs(char* slot, int micro) const {
    return reinterpret_cast<int32_t*>(slot) + static_cast<int64_t>(micro) * arrays_ * capacity_;
  }

  TokenBatches batches_;
  int64_t capacity_;  // tokens (and rows) of the largest micro-batch
  // A micro-batch's region: tokens, lengths, labels, and positions where rows are packed (the slot is copied whole
  // every step: an array no batch fills would only add to the copy).
  const int arrays_;
  StagingSlots slots_;
  std::vector<MicroBatch> micro_[kSlots];
  double loss_scale_ = 1;           // of the last forward's micro-batch
  cuda::DeviceMemory eval_tokens_;  // --val-data: capacity_ tokens
};

}  // namespace

std::unique_ptr<CudaWorkload> make_cuda_workload(const TrainConfig& config, int rank, int world_size,
                                                 cudaStream_t compute) {
  if (!config.transformer()) return std::make_unique<MlpCudaWorkload>(config, rank, world_size, compute);
  return std::make_unique<TransformerCudaWorkload>(config, rank, world_size, compute);
}

}  // namespace ddplab
