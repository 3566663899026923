// A multi-layer perceptron with forward and backward written by hand (no autograd).
//
//   x[B,in] → Linear(in→hidden) → GELU → [Linear(hidden→hidden) → GELU] × (num_hidden_layers-1)
//           → Linear(hidden→classes) → softmax cross-entropy (mean over the batch)
//
// The default is the seed lab's model: 1024 → 1024 → GELU → 1024 → GELU → 1000 (three Linear layers).
//
// Parameter storage: all parameters live in ONE flat buffer and all gradients in ONE flat grad buffer, both
// laid out in REVERSE registration order — the order in which backward finalises gradients. A gradient
// bucket (a run of consecutive ready gradients) is therefore one contiguous slice of the grad buffer: the
// communication engine reduces views into it with no copy in or out, and the optimizer runs once over the
// whole flat buffer.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddplab {

struct MlpConfig {
  int input_dim = 1024;
  int hidden_dim = 1024;
  int num_hidden_layers = 2;  // number of Linear+GELU blocks before the classifier Linear
  int num_classes = 1000;
};

// A view of one registered parameter inside the flat buffers.
template <typename T>
struct Parameter {
  std::string name;          // "fc0.weight", "fc0.bias", ..., registration order = forward order
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;        // element offset into the flat param and grad buffers
  T* data = nullptr;
  T* grad = nullptr;
};

// A run of the flat gradient buffer that backward finalises at once: a bias, a whole weight, or a block of rows of
// a weight (set_grad_piece_elements). Pieces are listed in the order backward finalises them, which is also
// ascending offset in the flat buffer, so consecutive pieces are adjacent.
struct GradPiece {
  int param = 0;            // registration index of the parameter it belongs to
  int64_t offset = 0;       // into the flat grad buffer
  int64_t numel = 0;
  int64_t first_row = 0;    // for a weight: the rows [first_row, first_row + numel / in_features)
};

// Called by backward with a piece's index in grad_pieces() as soon as that piece of gradient is final.
using GradReadyHook = std::function<void(int piece)>;

// Every parameter starts on a 64-byte boundary of the flat buffers (16 floats): cuBLASLt's tensor-core kernels need
// 16-byte-aligned operands (otherwise it picks slower kernels, and a fused bias epilogue can fault), and the bf16
// copies of the weights at the same element offsets stay 32-byte aligned. Back to back, GPT-2's head (50257 x 769
// floats) would leave every block parameter after it 4-byte aligned. The gaps hold zeros in both buffers: no
// gradient is written there, so they stay 0 through the all-reduce (buckets span them) and the optimizer.
inline constexpr int64_t kParameterAlignment = 16;  // elements

// Lays the parameters out in one flat parameter and one flat gradient buffer in REVERSE registration order (the
// first gradient backward finalises sits at offset 0), each at a multiple of kParameterAlignment, and points each
// Parameter at its slices. Zero-filled.
template <typename T>
void lay_out_in_reverse(std::vector<Parameter<T>>& params, std::vector<T>& flat_params, std::vector<T>& flat_grads) {
  int64_t offset = 0;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    offset = (offset + kParameterAlignment - 1) / kParameterAlignment * kParameterAlignment;
    it->offset = offset;
    offset += it->numel;
  }
  flat_params.assign(offset, T(0));
  flat_grads.assign(offset, T(0));
  for (Parameter<T>& p : params) {
    p.data = flat_params.data() + p.offset;
    p.grad = flat_grads.data() + p.offset;
  }
}

// The number of parameters (the flat buffers hold alignment gaps besides: flat_size() >= this).
template <typename T>
int64_t count_parameters(const std::vector<Parameter<T>>& params) {
  int64_t n = 0;
  for (const Parameter<T>& p : params) n += p.numel;
  return n;
}

// The pieces of a model whose backward finalises parameters in reverse registration order, each 2-D parameter in
// blocks of whole rows of at most max_elements from row 0 up (at least one row; 0 = one piece per parameter).
template <typename T>
std::vector<GradPiece> grad_pieces_in_backward_order(const std::vector<Parameter<T>>& params, int64_t max_elements) {
  if (max_elements < 0) throw std::invalid_argument("negative gradient piece size");
  std::vector<GradPiece> pieces;
  for (int p = static_cast<int>(params.size()) - 1; p >= 0; --p) {
    const Parameter<T>& param = params[p];
    const bool is_matrix = param.shape.size() == 2;
    const int64_t rows = is_matrix ? param.shape[0] : 1, cols = param.numel / rows;
    const int64_t block = max_elements == 0 || !is_matrix ? rows : std::max<int64_t>(1, max_elements / cols);
    for (int64_t r = 0; r < rows; r += block) {
      const int64_t n = std::min(block, rows - r);
      pieces.push_back(GradPiece{p, param.offset + r * cols, n * cols, r});
    }
  }
  return pieces;
}

template <typename T>
class Mlp {
 public:
  // Init as PyTorch's nn.Linear: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), deterministic in seed.
  Mlp(const MlpConfig& config, uint64_t seed);
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  const MlpConfig& config() const { return config_; }
  // Parameters in registration (forward) order.
  std::vector<Parameter<T>>& parameters() { return params_; }
  const std::vector<Parameter<T>>& parameters() const { return params_; }
  int64_t num_parameters() const { return count_parameters(params_); }
  // Elements of the flat parameter and gradient buffers: the parameters and the alignment gaps between them.
  int64_t flat_size() const { return static_cast<int64_t>(flat_params_.size()); }
  T* flat_params() { return flat_params_.data(); }
  T* flat_grads() { return flat_grads_.data(); }
  const T* flat_params() const { return flat_params_.data(); }
  const T* flat_grads() const { return flat_grads_.data(); }

  // How backward produces the gradients: weights in blocks of whole rows of at most `max_elements` elements each
  // (at least one row), so that the communication of a large weight's first rows can start while its last rows
  // are still being computed. 0 (the default): one piece per parameter, as PyTorch's autograd does.
  void set_grad_piece_elements(int64_t max_elements);
  const std::vector<GradPiece>& grad_pieces() const { return pieces_; }

  // inputs [B, input_dim], targets [B] in [0, num_classes). Caches activations for backward.
  // Returns the mean cross-entropy loss over the B rows.
  T forward(const T* inputs, const int32_t* targets, int batch);
  // Backward of the mean loss of the last forward. ACCUMULATES (+=) into the parameter gradients, so call
  // zero_grad() first unless accumulating. Calls on_ready(k) as soon as grad_pieces()[k] is final; a layer's
  // weight gradient is finished before its input gradient is computed, so it is announced as early as possible.
  void backward(const GradReadyHook& on_ready = nullptr);
  void zero_grad();
  // Forward FLOPs per sample of the GEMMs (2*in*out per Linear); backward is twice that.
  int64_t gemm_flops_per_sample() const;

 private:
  MlpConfig config_;
  std::vector<T> flat_params_, flat_grads_;
  std::vector<Parameter<T>> params_;
  std::vector<GradPiece> pieces_;
  // Activations of the last forward (sized for its batch).
  int batch_ = 0;
  const T* inputs_ = nullptr;
  const int32_t* targets_ = nullptr;
  std::vector<std::vector<T>> pre_;   // per Linear: pre-activation out = x W^T + b
  std::vector<std::vector<T>> post_;  // per hidden Linear: GELU(pre)
  std::vector<T> probs_, losses_, dact_a_, dact_b_;
};

}  // namespace ddplab
