// The Linear layer's GEMMs through cuBLASLt, in the row-major conventions of kernels/cpu/ops.h: the CUDA twins of
// cpu::matmul_forward (+ bias_forward, + gelu_forward), matmul_backward_input (+ gelu_backward), matmul_backward_weight
// and bias_backward. A weight is [OC, C] like PyTorch's; activations are [B, C] and [B, OC].
//
// Precision (data type from the pointers, compute mode from the context):
//   T = float, GemmMath::kFp32   fp32 in, fp32 out, fp32 FMA (CUBLAS_COMPUTE_32F)
//   T = float, GemmMath::kTf32   fp32 in and out, tensor cores with inputs rounded to TF32 (10-bit mantissa)
//   T = __nv_bfloat16            bf16 in, bf16 activations out, fp32 accumulation (CUBLAS_COMPUTE_32F)
// The bias has the output's type (cuBLASLt's epilogue adds a bias of D's type); weight/bias GRADIENTS are fp32 in
// every mode (master parameters stay fp32; a bf16 run keeps bf16 copies of the weights and biases for the GEMMs,
// made with convert.h).
//
// Asynchronous: each call enqueues on `stream`. Bad sizes throw std::invalid_argument; CUDA/cuBLAS failures
// std::runtime_error. A GEMM with an empty output launches nothing; one with K == 0 is still defined (forward:
// out = bias or 0; backward input: dinp = 0; backward weight: nothing to add).
#pragma once
#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ddplab::cuda {

enum class GemmMath { kFp32, kTf32 };

// Owns the cuBLASLt and cuBLAS handles, one workspace, and the cache of cuBLASLt plans (descriptors + the
// heuristic's algorithm) keyed by problem, so a training step's GEMMs pay the heuristic once. The handles and the
// workspace are created on first use, not by the constructor, so a context can be built (and argument checks
// tested) without a device. Not thread-safe, and the workspace is shared: use one context per stream (or order
// the streams).
class GemmContext {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper

  explicit GemmContext(GemmMath math = GemmMath::kFp32, size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  GemmMath math() const { return math_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  // Created on first call (throws std::runtime_error without a usable device).
  cublasLtHandle_t lt_handle();
  // The cuBLAS handle, bound to `stream` and to the shared workspace (for the strided-batched GEMMs).
  cublasHandle_t blas_handle(cudaStream_t stream);
  void* workspace();
  int64_t cached_plans() const;  // for tests: distinct problems planned so far
  // Which of cuBLASLt's heuristic answers new plans take: 0, its first (the default), or k, its (k+1)-th where it gives
  // that many (else the plan has no algorithm: an epilogue falls back, a plain GEMM throws). For the benchmark, which
  // times the other candidates against the heuristic's pick; the choice is part of a plan's key, and a rank above 0
  // overrides timed algorithms (below).
  void set_heuristic_rank(int rank);  // rank >= 0, else std::invalid_argument
  int heuristic_rank() const { return heuristic_rank_; }
  // How new plans pick cuBLASLt's algorithm: the heuristic's first answer (off, the default), or (on) the fastest of
  // its first kTimedCandidates, timed once on the call's own operands, as PyTorch's TunableOp does. At gpt2-small's
  // shapes on an H200 another candidate ran up to 14% faster than the first (docs/BENCHMARKS.md). The answers are
  // kept per GPU model and cuBLASLt version in table_dir (gemm_algo_table.h; the host's cache, or "" for this context
  // alone), so later contexts and runs on the host read them instead of timing again, and compute alike. A plan made
  // while `stream` is being captured into a graph cannot time: it reads the table, else takes the first answer.
  static constexpr int kTimedCandidates = 8;
  void set_timed_algos(bool on, std::string table_dir);
  bool timed_algos() const { return timed_algos_; }
  const std::string& algo_table_dir() const { return algo_table_dir_; }
  std::string algo_table_path() const;  // "" until a plan was timed or read, or where nothing is kept
  // Plans whose algorithm this context timed, and those it read from the table.
  int64_t timed_plans() const { return timed_plans_; }
  int64_t table_plans() const { return table_plans_; }
  void count_algo_choice(bool timed) { ++(timed ? timed_plans_ : table_plans_); }
  // "timed: 14 problems timed now, 26 read from <table>" or "heuristic: cuBLASLt's first answer for each GEMM".
  std::string describe_algos() const;
  // Calls with an epilogue so far (forward bias or bias+GELU, backward dGELU): those cuBLASLt fused into the GEMM,
  // and those that ran our kernel after it (unaligned bias/aux, a GELU width not a multiple of 8, or no algorithm).
  // The benchmark and the tests print which ran: a fallback costs a pass over the GEMM's output.
  int64_t fused_epilogues() const { return fused_epilogues_; }
  int64_t fallback_epilogues() const { return fallback_epilogues_; }
  void count_epilogue(bool fused) { ++(fused ? fused_epilogues_ : fallback_epilogues_); }

  struct Plans;  // opaque: defined and used in gemm.cu only
  Plans& plans() { return *plans_; }

 private:
  void init();
  GemmMath math_;
  size_t workspace_bytes_;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  std::unique_ptr<Plans> plans_;
  int64_t fused_epilogues_ = 0, fallback_epilogues_ = 0;
  int heuristic_rank_ = 0;
  bool timed_algos_ = false;
  std::string algo_table_dir_;
  int64_t timed_plans_ = 0, table_plans_ = 0;
};

// The name of the current device's table of timed algorithms (GemmAlgoTable::file_name: its model, SM count and
// cuBLASLt's version). Throws std::runtime_error without a usable device.
std::string gemm_algo_table_file();

// out[B,OC] = inp[B,C] @ weight[OC,C]^T (+ bias[OC] broadcast over rows; bias may be null). OVERWRITES out. The bias
// is a T, as cuBLASLt's epilogue wants it (the type of D): the models pass their bf16 copy of it in bf16.
template <typename T>
void matmul_forward(GemmContext& ctx, T* out, const T* inp, const T* weight, const T* bias, int B, int C, int OC,
                    cudaStream_t stream);

// out[B,OC] = inp @ weight^T + bias + residual[B,OC]: a transformer block's branch ending in its residual sum. The
// residual is cuBLASLt's C (beta 1), read by the GEMM's epilogue: the sum costs no pass over memory of its own, and
// (bias fused too) bf16 rounds it once, not twice. bias may be null; residual may not, and must not alias out: in
// place, the bf16 GEMM with its bias fused (cuBLAS 13.1, H200) got 2-4% of the sums wrong by up to 5x the rounding
// bound, where the same call out of place was right.
template <typename T>
void matmul_residual_forward(GemmContext& ctx, T* out, const T* inp, const T* weight, const T* bias, const T* residual,
                             int B, int C, int OC, cudaStream_t stream);

// pre_gelu[B,OC] = inp @ weight^T + bias, out = gelu(pre_gelu) (tanh form, as cpu::gelu_forward), one GEMM with a
// fused epilogue where cuBLASLt has one for the shape and alignment, else the GEMM and our epilogue kernel.
// pre_gelu is what gelu_backward needs. Both OVERWRITTEN; bias must not be null.
template <typename T>
void matmul_bias_gelu_forward(GemmContext& ctx, T* out, T* pre_gelu, const T* inp, const T* weight, const T* bias,
                              int B, int C, int OC, cudaStream_t stream);

// dinp[B,C] = dout[B,OC] @ weight[OC,C]. OVERWRITES dinp (an activation gradient).
template <typename T>
void matmul_backward_input(GemmContext& ctx, T* dinp, const T* dout, const T* weight, int B, int C, int OC,
                           cudaStream_t stream);

// The same through the GELU that made the layer's input: dinp = (dout @ weight) * gelu'(pre_gelu), pre_gelu[B,C] being
// what matmul_bias_gelu_forward kept (cpu::matmul_backward_input then cpu::gelu_backward). One GEMM with cuBLASLt's
// DGELU epilogue (pre_gelu as its aux input; the product is multiplied in fp32 and rounded once) where it has one for
// the shape and alignment (C a multiple of 8, pre_gelu 16-byte aligned), else the GEMM and gelu_backward (the product
// rounded to T, then the result). OVERWRITES dinp; pre_gelu must not be null; dinp must not alias pre_gelu.
template <typename T>
void matmul_backward_input_dgelu(GemmContext& ctx, T* dinp, const T* dout, const T* weight, const T* pre_gelu, int B,
                                 int C, int OC, cudaStream_t stream);

// dweight[r,:] += dout[:,r]^T @ inp[B,C] for rows r in [row_begin, row_end) of the [OC, C] weight gradient:
// ACCUMULATES (accumulate = false: = instead, a discarded gradient's first write), in fp32 whatever T is. A row range
// lets a caller finish (and hand to communication) a block of rows at a time, as with cpu::matmul_backward_weight.
// Requires 0 <= row_begin <= row_end <= OC.
template <typename T>
void matmul_backward_weight(GemmContext& ctx, float* dweight, const T* dout, const T* inp, int B, int C, int OC,
                            int row_begin, int row_end, cudaStream_t stream, bool accumulate = true);

// dbias[OC] += sum over rows of dout[B,OC]: ACCUMULATES (accumulate = false: =), fp32, deterministic (a fixed grid and
// summation order; see bias_backward_kernels.cuh). Row blocks' partial sums go to ctx's workspace (stream-ordered
// with its GEMMs).
template <typename T>
void bias_backward(GemmContext& ctx, float* dbias, const T* dout, int B, int OC, cudaStream_t stream,
                   bool accumulate = true);

// Row-major strided-batched C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C for `batch` matrices (A + i*stride_a, ...),
// fp32 data and the context's math, through cublasGemmStridedBatchedEx: attention's per-head products.
void gemm_strided_batched(GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const float* A, int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                          float beta, float* C, int ldc, int64_t stride_c, int batch, cudaStream_t stream);

}  // namespace ddplab::cuda
