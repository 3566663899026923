// How a hand-written model keeps its parameters: ONE flat parameter buffer and ONE flat gradient buffer, both laid
// out in REVERSE registration order — the order in which backward finalises gradients. A gradient bucket (a run of
// consecutive ready gradients) is therefore one contiguous slice of the gradient buffer: the communication engine
// reduces views into it with no copy in or out, and the optimizer runs once over the whole flat buffer. Both CPU
// models (Mlp, Transformer) are ParameterStores; the GPU models copy the CPU model's layout (model/cuda_common.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ddplab {

// A view of one registered parameter inside the flat buffers.
template <typename T>
struct Parameter {
  std::string name;          // "fc0.weight", "fc0.bias", ..., registration order = forward order
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;        // element offset into the flat param and grad buffers
  T* data = nullptr;
  T* grad = nullptr;
  // Backward may read it after announcing a piece of its gradient (a weight, for its layer's input gradient). The
  // models clear it where backward never does (a bias, a LayerNorm's weight, an embedding; the MLP's first weight,
  // whose input needs no gradient), so that --optimizer-in-backward can update each piece as soon as it is announced.
  bool read_after_its_gradient = true;
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

// Called by backward with a piece's index in grad_pieces() as soon as that piece of gradient is final. The models
// keep two more promises, which let --optimizer-in-backward update parameters while backward runs: once backward
// announces a piece of one parameter, it no longer reads the parameters of the pieces it announced before that
// parameter's first (a layer reads its weight for its input gradient after announcing the weight's gradient, and
// before announcing any piece of the next); and it never reads a parameter whose read_after_its_gradient is false
// once it has announced a piece of it.
using GradReadyHook = std::function<void(int piece)>;

// Backward's side of that contract, for every model: announces the pieces strictly in grad_pieces() order, each to
// `before` (on the GPU: the piece's event recorded) and then the hook, and refuses any other. Both by reference or
// small: no allocation per backward.
class PieceAnnouncer {
 public:
  PieceAnnouncer(const std::vector<GradPiece>& pieces, const GradReadyHook& on_ready,
                 std::function<void(int piece)> before = nullptr)
      : pieces_(pieces), on_ready_(on_ready), before_(std::move(before)) {}

  // The next piece if it belongs to `param` (a weight's row blocks are computed one by one), else null.
  const GradPiece* next_of(int param) const {
    return next_ < pieces_.size() && pieces_[next_].param == param ? &pieces_[next_] : nullptr;
  }
  // The next piece, which must belong to `param`, is final.
  void ready(int param) {
    if (!next_of(param)) throw std::logic_error("gradient pieces announced out of order");
    if (before_) before_(static_cast<int>(next_));
    if (on_ready_) on_ready_(static_cast<int>(next_));
    ++next_;
  }
  // Every piece of `param` is final (a parameter computed as a whole).
  void all_of(int param) {
    do ready(param);
    while (next_of(param));
  }
  bool done() const { return next_ == pieces_.size(); }

 private:
  const std::vector<GradPiece>& pieces_;
  const GradReadyHook& on_ready_;
  std::function<void(int piece)> before_;  // two words of captures: held in place, not on the heap
  size_t next_ = 0;
};

// Every parameter starts on a 64-byte boundary of the flat buffers (16 floats): cuBLASLt's tensor-core kernels need
// 16-byte-aligned operands (otherwise it picks slower kernels, and a fused bias epilogue can fault), and the bf16
// copies of the weights at the same element offsets stay 32-byte aligned. Back to back, a head of GPT-2's vocabulary
// with a bias (50257 x 769 floats) would leave every block parameter after it 4-byte aligned. The gaps hold zeros in
// both buffers: no gradient is written there, so they stay 0 through the all-reduce (buckets span them) and the
// optimizer.
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

// The flat buffers, the parameters' views into them and the gradient pieces backward announces. A model registers
// its parameters (add) in forward order, then calls lay_out() once; the views stay valid for the store's life.
template <typename T>
class ParameterStore {
 public:
  ParameterStore() = default;
  ParameterStore(const ParameterStore&) = delete;  // the views point into this object's buffers
  ParameterStore& operator=(const ParameterStore&) = delete;

  // Parameters in registration (forward) order.
  std::vector<Parameter<T>>& parameters() { return params_; }
  const std::vector<Parameter<T>>& parameters() const { return params_; }
  int64_t num_parameters() const { return count_parameters(params_); }
  // Elements of the flat parameter and gradient buffers: the parameters and the alignment gaps between them.
  int64_t flat_size() const { return flat_size_; }
  T* flat_params() { return values_; }
  T* flat_grads() { return grads_; }
  const T* flat_params() const { return values_; }
  const T* flat_grads() const { return grads_; }

  // How backward produces the gradients: 2-D parameters in blocks of whole rows of at most `max_elements` elements
  // each (at least one row), so that the communication of a large weight's first rows can start while its last
  // rows are still being computed. 0 (the default): one piece per parameter, as PyTorch's autograd does.
  void set_grad_piece_elements(int64_t max_elements) { pieces_ = grad_pieces_in_backward_order(params_, max_elements); }
  const std::vector<GradPiece>& grad_pieces() const { return pieces_; }
  void zero_grad() { std::fill(grads_, grads_end_, T(0)); }
  // The next backward writes the gradients instead of adding to them: zero_grad() without a pass of its own (the
  // gradients keep their stale values until then, and the alignment gaps, never written, stay zero). OpenBLAS still
  // zeroes each beta-0 GEMM's output before adding to it, which is why the CPU backend has the update leave the
  // gradients zero instead and uses this only after a skipped step (train/cpu_backend.h).
  void discard_grad() { discard_pending_ = true; }
  // Moves the gradients (values included) into `storage`, flat_size() elements that the caller keeps alive for
  // the store's life: memory the communication engine registered (comm/shm_segments.h: RegisteredBuffer).
  void place_grads(T* storage) {
    grads_end_ = std::copy(grads_, grads_end_, storage);
    grads_ = storage;
    for (Parameter<T>& p : params_) p.grad = grads_ + p.offset;
    flat_grads_ = {};
  }
  // The same for the parameters (--zero-stage 1 all-gathers them, from registered memory too).
  void place_params(T* storage) {
    std::copy(values_, values_ + flat_size_, storage);
    values_ = storage;
    for (Parameter<T>& p : params_) p.data = values_ + p.offset;
    flat_params_ = {};
  }

 protected:
  // Registers a parameter after the ones before it; returns its registration index.
  int add_parameter(std::string name, std::vector<int64_t> shape) {
    Parameter<T> p;
    p.name = std::move(name);
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.shape = std::move(shape);
    params_.push_back(std::move(p));
    return static_cast<int>(params_.size()) - 1;
  }
  // For backward, once per call: true when it must overwrite the gradients (discard_grad() since the last backward).
  bool take_discard() { return std::exchange(discard_pending_, false); }
  // Zero-filled buffers in reverse registration order, one gradient piece per parameter.
  void lay_out() {
    lay_out_in_reverse(params_, flat_params_, flat_grads_);
    flat_size_ = static_cast<int64_t>(flat_params_.size());
    values_ = flat_params_.data();
    grads_ = flat_grads_.data();
    grads_end_ = grads_ + flat_grads_.size();
    set_grad_piece_elements(0);
  }

 private:
  std::vector<T> flat_params_, flat_grads_;
  int64_t flat_size_ = 0;
  T* values_ = nullptr;  // flat_params_, or the storage given to place_params
  // flat_grads_, or the storage given to place_grads. The end is kept, not computed from flat_size(): GCC 12 cannot
  // bound a fill over a pointer plus a size and warns (-Wstringop-overflow).
  T *grads_ = nullptr, *grads_end_ = nullptr;
  std::vector<Parameter<T>> params_;
  std::vector<GradPiece> pieces_;
  bool discard_pending_ = false;
};

}  // namespace ddplab
