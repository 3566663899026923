// What the GPU models (model/mlp_cuda.h, model/transformer_cuda.h) share: one device allocation carved into aligned
// buffers (and, where the GPU lacks the room, an error that says what took it), the per-piece events and their
// announcement to the gradient-ready hook, the mean loss's asynchronous read-back, NVTX ranges. Host code only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/nvtx.h"
#include "kernels/cuda/owned.h"
#include "model/mlp.h"  // GradPiece, GradReadyHook

namespace ddplab::cuda_model {

using cuda::NvtxRange;  // kernels/cuda/nvtx.h

// A buffer of the models' one allocation as the activation type of the precision in use.
template <typename T>
T* as(void* p) {
  return static_cast<T*>(p);
}

// Byte offsets of the buffers of one allocation. Each starts on a 256-byte boundary, as if it had its own
// cudaMalloc: cuBLASLt picks kernels by operand alignment, and the vectorised kernels want 16 bytes.
class BufferLayout {
 public:
  size_t reserve(size_t bytes) {
    const size_t at = (end_ + kAlign - 1) / kAlign * kAlign;
    end_ = at + bytes;
    return at;
  }
  size_t bytes() const { return end_; }

 private:
  static constexpr size_t kAlign = 256;
  size_t end_ = 0;
};

// The model's one device allocation, `bytes` of which `weights` hold the parameters, their gradients and their bf16
// copy, `scratch` the workspaces, and the rest the activations of `rows` `unit` (e.g. 8192 "tokens"). Where the GPU
// lacks the room it throws std::runtime_error naming the model, what it needed against what was free, and each part,
// instead of cudaMalloc's bare "out of memory": the activations and the scratch grow with the batch, and a user can
// shrink it.
inline cuda::DeviceMemory allocate_model_memory(const char* model, size_t bytes, size_t weights, size_t scratch,
                                                int64_t rows, const char* unit) {
  void* base = nullptr;
  const cudaError_t status = cudaMalloc(&base, bytes);
  if (status == cudaSuccess) return cuda::DeviceMemory(base);
  if (status != cudaErrorMemoryAllocation) cudaCheck(status);
  cudaGetLastError();  // the failed allocation must not surface at the next launch
  size_t free = 0, total = 0;
  int device = 0;
  cudaCheck(cudaMemGetInfo(&free, &total));
  cudaCheck(cudaGetDevice(&device));
  const auto gb = [](size_t b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f GB", static_cast<double>(b) / 1e9);
    return std::string(text);
  };
  throw std::runtime_error(
      std::string(model) + ": needs " + gb(bytes) + " of GPU memory; GPU " + std::to_string(device) + " has " +
      gb(free) + " free of " + gb(total) + " (parameters, gradients and their bf16 copy " + gb(weights) +
      ", activations for " + std::to_string(rows) + " " + unit + " " + gb(bytes - weights - scratch) +
      (scratch ? ", workspaces " + gb(scratch) : "") + "): a step of fewer " + unit + " needs less");
}

// One event per gradient piece, recorded by backward after the piece's last kernel. Timing is enabled: a trainer
// reads a bucket's ready time from its last piece's event after the step.
class PieceEvents {
 public:
  void ensure(size_t pieces) {
    while (events_.size() < pieces) events_.push_back(cuda::make_event(cudaEventDefault));
  }
  cudaEvent_t at(int k) const { return events_.at(k).get(); }

 private:
  std::vector<cuda::Event> events_;
};

// Backward's announcements on the GPU (PieceAnnouncer, model/parameters.h): each piece's event recorded on the stream
// behind the kernels that finalised it, then the hook called. The host never waits: the hook may make another stream
// wait on the event. `events` and `on_ready` must outlive the announcer.
inline PieceAnnouncer device_piece_announcer(const std::vector<GradPiece>& pieces, const PieceEvents& events,
                                             cudaStream_t stream, const GradReadyHook& on_ready) {
  return PieceAnnouncer(pieces, on_ready,
                        [&events, stream](int piece) { cudaCheck(cudaEventRecord(events.at(piece), stream)); });
}

// The mean loss of the last forward, copied to pinned host memory behind it on the stream: wait() waits for that
// copy only, not for later work. NaN before the first copy.
class LossReadback {
 public:
  LossReadback() : done_(cuda::make_event(cudaEventDisableTiming)) {  // only ever waited on
    float* host = nullptr;
    cudaCheck(cudaMallocHost(&host, sizeof(float)));
    host_.reset(host);
    *host = NAN;
  }
  void enqueue(const float* device_loss, cudaStream_t stream) {
    cudaCheck(cudaMemcpyAsync(host_.get(), device_loss, sizeof(float), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaEventRecord(done_.get(), stream));
  }
  float wait() const {
    cudaCheck(cudaEventSynchronize(done_.get()));
    return *host_;
  }

 private:
  std::unique_ptr<float, cuda::CudaFreeHost> host_;
  cuda::Event done_;
};

// What MlpCuda and TransformerCuda share: their parameters in the CPU model's flat layout (names, shapes, offsets and
// alignment gaps as lay_out_in_reverse made them; data and grad point into device memory), the gradient pieces with
// a ready event each, and the stream everything is enqueued on.
class DeviceParameters {
 public:
  cudaStream_t stream() const { return stream_; }
  // Registration (forward) order, as the CPU model's; data and grad are device pointers into the flat buffers.
  const std::vector<Parameter<float>>& parameters() const { return params_; }
  int64_t num_parameters() const { return count_parameters(params_); }
  int64_t flat_size() const { return flat_size_; }  // as the CPU model's: alignment gaps included
  // Device, the fp32 master weights. Write access: the caller may change them (the optimizer, a checkpoint's
  // upload), so a bf16 model remakes its bf16 copy before the next forward; forwards in between (the micro-batches of
  // one step) reuse it. Write through this pointer, not parameters()' data, and get it afresh for each change.
  float* flat_params() {
    master_weights_changed_ = true;
    return flat_params_;
  }
  float* flat_grads() { return flat_grads_; }  // device, fp32
  // Write access for an optimizer step that also rewrites, in full, the bf16 copy a bf16 model's GEMMs read (null in
  // fp32 and tf32 models), as adamw_update does with params_bf16: its next forward then keeps that copy instead of
  // converting the masters again (a pass of 6 bytes per parameter). An update that does not write the copy takes
  // flat_params().
  struct UpdateTarget {
    float* params;
    __nv_bfloat16* params_bf16;
  };
  UpdateTarget params_for_update() {
    if (weights_bf16_ == nullptr) master_weights_changed_ = true;
    return {flat_params_, weights_bf16_};
  }
  const float* flat_params() const { return flat_params_; }
  const float* flat_grads() const { return flat_grads_; }

  // As the CPU model's: 2-D parameters in blocks of whole rows of at most max_elements (0: one piece per parameter),
  // so communication of a large weight starts while its last rows are computed.
  void set_grad_piece_elements(int64_t max_elements) {
    pieces_ = grad_pieces_in_backward_order(params_, max_elements);
    piece_events_.ensure(pieces_.size());
  }
  const std::vector<GradPiece>& grad_pieces() const { return pieces_; }
  // Recorded on the stream by every backward once grad_pieces()[k] is final. Timing is enabled: the trainer reads a
  // bucket's ready time from its last piece's event after the step.
  cudaEvent_t piece_ready_event(int k) const { return piece_events_.at(k); }
  void zero_grad() {
    discard_pending_ = false;
    cudaCheck(cudaMemsetAsync(flat_grads_, 0, flat_size_ * sizeof(float), stream_));
  }
  // As the CPU model's: the next backward writes every gradient over instead of adding to it (GEMMs with beta 0, the
  // bias and LayerNorm sums written, the embeddings zeroed where a scatter adds to them), so no pass zeroes the
  // whole buffer first: zero_grad writes 0.5 GB a step for gpt2-small. The alignment gaps, never written, stay 0.
  void discard_grad() { discard_pending_ = true; }

 protected:
  explicit DeviceParameters(cudaStream_t stream) : stream_(stream) {}
  // The CPU model's names, shapes and layout (its host pointers until place_on_device).
  template <typename Model>
  void take_layout(const Model& reference) {
    params_ = reference.parameters();
    flat_size_ = reference.flat_size();
  }
  // Points every parameter at the device buffers (flat_size() floats each), queues the upload of the CPU model's
  // values (host_values: its flat parameters, which must live until the stream has copied them) and zeroes the
  // gradients.
  void place_on_device(float* flat_params, float* flat_grads, const float* host_values) {
    flat_params_ = flat_params;
    flat_grads_ = flat_grads;
    for (Parameter<float>& p : params_) {
      p.data = flat_params_ + p.offset;
      p.grad = flat_grads_ + p.offset;
    }
    cudaCheck(cudaMemcpyAsync(flat_params_, host_values, flat_size_ * sizeof(float), cudaMemcpyHostToDevice, stream_));
    zero_grad();
  }

  // A parameter as the GEMMs read it: the fp32 master, or in a bf16 model its bf16 copy (weights and biases alike).
  template <typename T>
  const T* operand(int param) const {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      return weights_bf16_ + params_[param].offset;
    else
      return params_[param].data;
  }

  // Whether flat_params() gave write access since the last call (a model's forward asks, bf16 models to remake
  // their bf16 weights: one pass over 6 bytes per parameter per optimizer step, not per micro-batch).
  bool master_weights_changed() { return std::exchange(master_weights_changed_, false); }
  // For backward, once per call: true when it must write the gradients over (discard_grad() since the last backward).
  bool take_discard() { return std::exchange(discard_pending_, false); }

  cudaStream_t stream_;
  std::vector<Parameter<float>> params_;
  int64_t flat_size_ = 0;
  float* flat_params_ = nullptr;
  float* flat_grads_ = nullptr;
  __nv_bfloat16* weights_bf16_ = nullptr;  // bf16 models: the flat parameters converted, same offsets
  std::vector<GradPiece> pieces_;
  PieceEvents piece_events_;
  bool master_weights_changed_ = true;  // the initial upload
  bool discard_pending_ = false;
};

}  // namespace ddplab::cuda_model
