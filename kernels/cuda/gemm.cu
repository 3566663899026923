// cuBLASLt wrapper (see gemm.h for the contracts): the context and its plan cache, the row-major -> column-major
// mapping of the three Linear GEMMs, and the launchers of the forward epilogue's fallback and of the bias gradient
// (their kernels are in elementwise_kernels.cuh and bias_backward_kernels.cuh, which the CPU emulation runs too).
//
// cuBLAS is column-major, and a row-major [R, C] matrix is the column-major [C, R] matrix with the same ld. So with
// X^T meaning "the same buffer read column-major":
//   forward          out^T[OC,B]   = W^T[C,OC]^T · inp^T[C,B]            m=OC n=B  k=C   A=W(T)   B=inp(N)
//   backward input   dinp^T[C,B]   = W^T[C,OC]   · dout^T[OC,B]          m=C  n=B  k=OC  A=W(N)   B=dout(N)
//   backward weight  dW^T[C,rows] += inp^T[C,B] · (dout^T[rows,B])^T     m=C  n=rows k=B A=inp(N) B=dout(T)
// and a bias over the columns of the row-major output is a bias over the rows of D, which is what cuBLASLt's BIAS
// epilogue adds. The bias gradient is our kernel's (bias_backward): cuBLASLt's BGRADB epilogue on the weight GEMM
// computes it too, but ran slower on an H200 than the GEMM and our kernel (docs/BENCHMARKS.md, "GPU, the final call").
// The input GEMM's D is dinp^T [C, B]; its DGELU epilogue multiplies D by gelu'(aux), aux = pre_gelu^T [C, B] with
// ld C, the same layout as D.
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/bias_backward_kernels.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_algo_table.h"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

// ---- cuBLASLt problems and plans --------------------------------------------------------------------------------

// One cuBLASLt call in its own column-major terms: D[m,n] = op(A) op(B) + beta C, with an optional epilogue. C has
// D's type and layout, and is D itself unless given (the forward's residual).
struct LtGemm {
  cublasOperation_t ta, tb;
  int m, n, k;
  const void* A;
  int64_t lda;
  const void* B;
  int64_t ldb;
  void* D;
  int64_t ldd;
  cudaDataType_t ab_type, d_type;
  float beta;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // D's type, length m: the BIAS epilogue's
  const void* aux = nullptr;   // the GELU input, [m, n] with ld m, D's type (GELU_AUX: written, DGELU: read)
  const void* C = nullptr;     // beta's matrix where it is not D
  const void* c() const { return C ? C : D; }
};

// Largest power of two (at most 256) dividing the address: cuBLASLt's kernels are chosen per pointer alignment, so
// it is part of the plan's key and passed to the heuristic.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 1;
  while (al < 256 && a % (2 * al) == 0) al *= 2;
  return al;
}

using PlanKey = std::array<int64_t, 19>;

template <typename T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  cublasCheck(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

}  // namespace

struct GemmContext::Plans {
  // Owns its descriptors from their creation: a plan that fails halfway (a cuBLASLt call throws) frees what it made.
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;  // the heuristic found an algorithm
    // A timed plan made during a graph capture, which cannot time: it runs the heuristic's first answer until a call
    // outside a capture times these (the descriptors stay, so a captured graph keeps what it captured).
    std::vector<cublasLtMatmulAlgo_t> untimed;

    Plan() = default;
    Plan(Plan&& o) noexcept
        : desc(std::exchange(o.desc, nullptr)),
          a(std::exchange(o.a, nullptr)),
          b(std::exchange(o.b, nullptr)),
          d(std::exchange(o.d, nullptr)),
          algo(o.algo),
          ok(o.ok),
          untimed(std::move(o.untimed)) {}
    Plan& operator=(Plan&&) = delete;
    ~Plan() {
      for (cublasLtMatrixLayout_t layout : {a, b, d})
        if (layout) cublasLtMatrixLayoutDestroy(layout);
      if (desc) cublasLtMatmulDescDestroy(desc);
    }
  };
  std::map<PlanKey, Plan> cache;
  std::unique_ptr<GemmAlgoTable> table;  // made by the first timed plan, for the device current then
  bool table_warned = false;             // that the table could not be written
};

namespace {

using Plan = GemmContext::Plans::Plan;

// The heuristic's first `count` answers for the plan's problem: fewer where it has fewer, none where it has no
// algorithm. "No algorithm" is an answer here (NOT_SUPPORTED or 0 results), not an error: the caller may fall back.
std::vector<cublasLtMatmulAlgo_t> heuristic_answers(GemmContext& ctx, const Plan& p, const LtGemm& g, int count) {
  cublasLtMatmulPreference_t created = nullptr;
  cublasCheck(cublasLtMatmulPreferenceCreate(&created));
  const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)> owned(
      created, cublasLtMatmulPreferenceDestroy);  // freed on every way out, a throw below included
  cublasLtMatmulPreference_t pref = owned.get();
  const uint64_t ws = ctx.workspace_bytes();
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t align[4] = {alignment_of(g.A), alignment_of(g.B), alignment_of(g.c()), alignment_of(g.D)};
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof(align[i])));
  // Split-K's partial sums stay in the compute type (fp32), in the workspace: the INPLACE and OUTPUT_TYPE schemes
  // round them to D's type. Timed under compute-sanitizer, a bf16 DGELU call chose such a candidate, and 1904 of
  // 33024 elements left the CPU's bound, as a split of K into 16s with bf16 partial sums reproduces exactly
  // (bench/results/2026-12-04-zen4-recomputed/splitk_dgelu.py). Algorithms without split-K (NONE) stay allowed.
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                   sizeof(reductions)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(count);
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(ctx.lt_handle(), p.desc, p.a, p.b, p.d, p.d, pref, count, results.data(), &found);
  // An epilogue the library does not support for the types may also come back as INVALID_VALUE (an fp32 bias on
  // bf16 D did, H200, cuBLAS 13.1): that too leaves the caller's fallback, which is always correct.
  const bool unsupported = status == CUBLAS_STATUS_NOT_SUPPORTED ||
                           (status == CUBLAS_STATUS_INVALID_VALUE && g.epilogue != CUBLASLT_EPILOGUE_DEFAULT);
  if (!unsupported) cublasCheck(status);
  std::vector<cublasLtMatmulAlgo_t> answers;
  if (status == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < found; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) answers.push_back(results[i].algo);
  return answers;
}

// Holds the stream for `ns` of the GPU's clock, so that the calls queued behind it run back to back: timed, they are
// the kernels' pace, not the host's pace of launching them (a small GEMM runs faster than cuBLASLt's host call).
__global__ void hold_stream_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// What timing borrows, given back however it ends.
struct TimingResources {
  explicit TimingResources(size_t events, cudaStream_t s) : stream(s), events(events) {
    for (cudaEvent_t& e : this->events) cudaCheck(cudaEventCreate(&e));
  }
  ~TimingResources() {
    for (cudaEvent_t e : events)
      if (e) cudaEventDestroy(e);
    if (scratch) cudaFreeAsync(scratch, stream);
  }
  TimingResources(const TimingResources&) = delete;
  TimingResources& operator=(const TimingResources&) = delete;
  cudaStream_t stream;
  std::vector<cudaEvent_t> events;
  void* scratch = nullptr;
};

// Each answer's time in µs on g's own operands (+inf for one that does not run): a call each to warm up, then rounds
// over all of them, interleaved so that a clock ramping up meanwhile favours none, each round queued behind a hold of
// the stream; an answer's time is its best round's. A call that adds to D (beta 1 with C = D: an accumulated gradient)
// is timed on a scratch D, so that only the real call that follows writes D.
std::vector<double> time_answers(GemmContext& ctx, const LtGemm& g, const Plan& p,
                                 const std::vector<cublasLtMatmulAlgo_t>& answers, cudaStream_t stream) {
  constexpr int kRounds = 3, kCallsPerRound = 3;
  constexpr uint64_t kHoldNs = 500'000;  // ~10x what the host takes to queue a round of 8 answers
  const int n = static_cast<int>(answers.size());
  std::vector<double> us(n, std::numeric_limits<double>::infinity());
  TimingResources borrowed(2 * kRounds * n, stream);
  void* d = g.D;
  const void* c = g.c();
  if (g.beta != 0.0f && g.C == nullptr) {
    const size_t bytes = size_t(g.ldd) * g.n * (g.d_type == CUDA_R_32F ? sizeof(float) : sizeof(__nv_bfloat16));
    if (cudaMallocAsync(&borrowed.scratch, bytes, stream) != cudaSuccess) {
      (void)cudaGetLastError();  // no room to time it: the caller takes the heuristic's first
      borrowed.scratch = nullptr;
      return us;
    }
    d = borrowed.scratch, c = borrowed.scratch;
  }
  const float alpha = 1.0f;
  const auto call = [&](int i) {
    return cublasLtMatmul(ctx.lt_handle(), p.desc, &alpha, g.A, p.a, g.B, p.b, &g.beta, c, p.d, d, p.d, &answers[i],
                          ctx.workspace(), ctx.workspace_bytes(), stream) == CUBLAS_STATUS_SUCCESS;
  };
  std::vector<char> runs(n);
  for (int i = 0; i < n; ++i) runs[i] = call(i);
  const auto pair = [&](int round, int i) { return &borrowed.events[2 * (round * n + i)]; };
  for (int round = 0; round < kRounds; ++round) {
    hold_stream_kernel<<<1, 1, 0, stream>>>(kHoldNs);
    cudaCheck(cudaGetLastError());
    for (int i = 0; i < n; ++i) {
      if (!runs[i]) continue;
      cudaCheck(cudaEventRecord(pair(round, i)[0], stream));
      for (int k = 0; k < kCallsPerRound && runs[i]; ++k) runs[i] = call(i);
      cudaCheck(cudaEventRecord(pair(round, i)[1], stream));
    }
  }
  cudaCheck(cudaStreamSynchronize(stream));
  for (int i = 0; i < n; ++i) {
    if (!runs[i]) continue;  // failed in some round: never run it
    for (int round = 0; round < kRounds; ++round) {
      float ms = 0;
      cudaCheck(cudaEventElapsedTime(&ms, pair(round, i)[0], pair(round, i)[1]));
      us[i] = std::min(us[i], 1e3 * ms / kCallsPerRound);
    }
  }
  return us;
}

// The problem as the table names it: everything in the plan's key but the candidate rank, and the workspace, which
// bounds the heuristic's answers.
std::string problem_name(const PlanKey& key, size_t workspace_bytes) {
  std::string name;
  for (size_t i = 0; i + 1 < key.size(); ++i) name += std::to_string(key[i]) + ",";
  return name + "ws" + std::to_string(workspace_bytes);
}

GemmAlgoTable& algo_table(GemmContext& ctx) {
  std::unique_ptr<GemmAlgoTable>& table = ctx.plans().table;
  if (!table) table = std::make_unique<GemmAlgoTable>(ctx.algo_table_dir(), gemm_algo_table_file());
  return *table;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess) return capture != cudaStreamCaptureStatusNone;
  (void)cudaGetLastError();
  return true;  // the stream cannot be asked, as while another stream captures in global mode: do not sync it
}

// Which of the heuristic's answers a timed plan runs: the table's, else the fastest as timed now (and recorded);
// nullopt while `stream` is being captured into a graph, where nothing can be timed. Another answer replaces the
// heuristic's first only where it ran kMinGain faster: less is within what timings of one kernel vary by.
std::optional<int> timed_rank(GemmContext& ctx, const LtGemm& g, const Plan& p,
                              const std::vector<cublasLtMatmulAlgo_t>& answers, const PlanKey& key,
                              cudaStream_t stream) {
  constexpr double kMinGain = 0.03;
  const int candidates = static_cast<int>(answers.size());
  if (candidates == 1) return 0;
  GemmAlgoTable& table = algo_table(ctx);
  const std::string problem = problem_name(key, ctx.workspace_bytes());
  if (const std::optional<int> rank = table.find(problem, candidates)) {
    ctx.count_algo_choice(/*timed=*/false);
    return *rank;
  }
  if (capturing(stream)) return std::nullopt;
  const std::vector<double> us = time_answers(ctx, g, p, answers, stream);
  int fastest = static_cast<int>(std::min_element(us.begin(), us.end()) - us.begin());
  if (!std::isfinite(us[fastest])) return 0;  // none timed: the first answer, whose own call says what fails
  if (us[fastest] > (1 - kMinGain) * us[0]) fastest = 0;
  std::string error;
  const int rank = table.record(problem, fastest, us, candidates, error);
  if (!error.empty() && !ctx.plans().table_warned) {
    std::fprintf(stderr, "ddplab: cuBLASLt's timed algorithms are kept in this process only: %s\n", error.c_str());
    ctx.plans().table_warned = true;
  }
  ctx.count_algo_choice(/*timed=*/true);
  return rank;
}

Plan make_plan(GemmContext& ctx, const LtGemm& g, cublasComputeType_t compute, const PlanKey& key,
               cudaStream_t stream) {
  Plan p;
  cublasCheck(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, g.ta);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, g.tb);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  if (g.bias) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.aux) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(g.m));
  }
  const bool ta = g.ta != CUBLAS_OP_N, tb = g.tb != CUBLAS_OP_N;
  cublasCheck(cublasLtMatrixLayoutCreate(&p.a, g.ab_type, ta ? g.k : g.m, ta ? g.m : g.k, g.lda));
  cublasCheck(cublasLtMatrixLayoutCreate(&p.b, g.ab_type, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb));
  cublasCheck(cublasLtMatrixLayoutCreate(&p.d, g.d_type, g.m, g.n, g.ldd));
  const bool timed = key.back() < 0;  // the key's last entry (run_lt): the rank asked for, or -1 to time the answers
  const int rank = ctx.heuristic_rank();
  const std::vector<cublasLtMatmulAlgo_t> answers =
      heuristic_answers(ctx, p, g, timed ? GemmContext::kTimedCandidates : rank + 1);
  if (answers.empty() || (!timed && static_cast<int>(answers.size()) <= rank)) return p;
  p.ok = true;
  const std::optional<int> chosen = timed ? timed_rank(ctx, g, p, answers, key, stream) : rank;
  p.algo = answers[chosen.value_or(0)];
  if (!chosen) p.untimed = answers;
  return p;
}

// Runs g through its cached plan. Returns false, having launched nothing, when cuBLASLt has no algorithm for it
// (possible with an epilogue and unaligned bias/aux or odd sizes); the caller then falls back.
bool run_lt(GemmContext& ctx, const LtGemm& g, cudaStream_t stream) {
  const cublasComputeType_t compute =
      g.ab_type == CUDA_R_32F && ctx.math() == GemmMath::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // Everything the descriptors and the heuristic's choice depend on (pointer values excepted, alignments included).
  const int64_t bias_align = g.bias ? alignment_of(g.bias) : 0, aux_align = g.aux ? alignment_of(g.aux) : 0;
  // clang-format off
  const PlanKey key = {g.ta, g.tb, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, g.ab_type, g.d_type, compute, g.epilogue,
                       alignment_of(g.A), alignment_of(g.B), alignment_of(g.c()), alignment_of(g.D), bias_align,
                       aux_align, ctx.timed_algos() && ctx.heuristic_rank() == 0 ? -1 : ctx.heuristic_rank()};
  // clang-format on
  auto& cache = ctx.plans().cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_plan(ctx, g, compute, key, stream)).first;
  Plan& p = it->second;
  if (!p.ok) return false;
  // The plan was made for pointers of this alignment; the pointers themselves change from call to call.
  if (g.bias) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.aux) set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
  if (!p.untimed.empty() && !capturing(stream))  // timed on this call's operands, as a new plan is
    if (const std::optional<int> chosen = timed_rank(ctx, g, p, p.untimed, key, stream)) {
      p.algo = p.untimed[*chosen];
      p.untimed.clear();
    }
  const float alpha = 1.0f;
  cublasCheck(cublasLtMatmul(ctx.lt_handle(), p.desc, &alpha, g.A, p.a, g.B, p.b, &g.beta, g.c(), p.d, g.D, p.d,
                             &p.algo, ctx.workspace(), ctx.workspace_bytes(), stream));
  return true;
}

// run_lt where nothing falls back: no algorithm is an error, named by the call and its shape.
void run_lt_or_throw(GemmContext& ctx, const LtGemm& g, cudaStream_t stream, const char* call, int B, int C,
                     const char* n_name, int n) {
  if (!run_lt(ctx, g, stream))
    throw std::runtime_error(std::string("cuBLASLt: no algorithm for ") + call + " B=" + std::to_string(B) +
                             " C=" + std::to_string(C) + " " + n_name + "=" + std::to_string(n));
}

template <typename T>
constexpr cudaDataType_t kDataType = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;

void check_sizes(const char* what, int B, int C, int OC) {
  if (B < 0 || C < 0 || OC < 0)
    throw std::invalid_argument(std::string(what) + ": negative size: B=" + std::to_string(B) +
                                " C=" + std::to_string(C) + " OC=" + std::to_string(OC));
}

// Our bias/GELU kernel after a plain GEMM (or none, C == 0), counted as a fallback epilogue.
template <typename T>
void launch_epilogue(GemmContext& ctx, T* out, T* pre_gelu, const T* bias, int B, int OC, bool gelu,
                     cudaStream_t stream) {
  ctx.count_epilogue(/*fused=*/false);
  // 16-byte accesses of out and pre_gelu where they allow them; the bias is read element by element either way.
  constexpr int V = 16 / sizeof(T);
  const bool packed = OC % V == 0 && detail::all_aligned(16, out, pre_gelu);
  using Kernel = void (*)(T*, T*, const T*, int, int);
  const Kernel kernel = gelu ? (packed ? elementwise::bias_gelu_epilogue_kernel<T, true, V>
                                       : elementwise::bias_gelu_epilogue_kernel<T, true, 1>)
                             : (packed ? elementwise::bias_gelu_epilogue_kernel<T, false, V>
                                       : elementwise::bias_gelu_epilogue_kernel<T, false, 1>);
  // About kTargetBlocks blocks in all, whatever the shape; rows beyond gridDim.y (at most 65535) wrap in the kernel.
  constexpr int64_t kTargetBlocks = 4096;
  const unsigned grid_x = detail::grid_size(packed ? OC / V : OC);
  const unsigned grid_y = static_cast<unsigned>(std::clamp<int64_t>(kTargetBlocks / grid_x, 1, std::min(B, 65535)));
  kernel<<<dim3(grid_x, grid_y), detail::kBlockSize, 0, stream>>>(out, pre_gelu, bias, B, OC);
  cudaCheck(cudaGetLastError());
}

// Forward with an optional bias or bias+GELU, and an optional residual added before them (cuBLASLt's beta C: the
// epilogue reads it, no pass of its own): fused when cuBLASLt has an algorithm, else plain GEMM + our kernel.
template <typename T>
void forward(GemmContext& ctx, T* out, T* pre_gelu, const T* inp, const T* weight, const T* bias, const T* residual,
             int B, int C, int OC, bool gelu, cudaStream_t stream) {
  if (B == 0 || OC == 0) return;
  if (C == 0) {  // an empty sum: out = residual (or 0), + bias, through the epilogue
    if (residual == nullptr)
      cudaCheck(cudaMemsetAsync(out, 0, sizeof(T) * B * OC, stream));
    else if (residual != out)
      cudaCheck(cudaMemcpyAsync(out, residual, sizeof(T) * B * OC, cudaMemcpyDeviceToDevice, stream));
    if (bias || gelu) launch_epilogue(ctx, out, pre_gelu, bias, B, OC, gelu, stream);
    return;
  }
  LtGemm g{CUBLAS_OP_T, CUBLAS_OP_N, OC, B, C, weight, C, inp, C, out, OC, kDataType<T>, kDataType<T>, 0.0f};
  if (residual) g.beta = 1.0f, g.C = residual;
  // The heuristic's alignment preferences cover A, B, C and D only, not the bias or aux pointers: it may pick a
  // kernel that assumes 16-byte ones, which faults ("misaligned address", sticky) on a bias sliced from a buffer at
  // a 4-byte offset (the models' parameters start on 64-byte boundaries since, parameters.h). Such a bias or aux
  // takes the fallback.
  // The bias has D's type (cublasLt.h, BIAS_DATA_TYPE's default), which is why it is a T: asked for an fp32 bias on
  // bf16 D, the heuristic answered CUBLAS_STATUS_INVALID_VALUE (cuBLAS 13.1).
  if (bias && alignment_of(bias) >= 16 && (!gelu || alignment_of(pre_gelu) >= 16)) {
    g.bias = bias;
    g.epilogue = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
    // The GELU input's leading dimension must be a multiple of 8: otherwise go straight to the fallback.
    if (gelu) g.aux = OC % 8 == 0 ? pre_gelu : nullptr;
    if ((!gelu || g.aux) && run_lt(ctx, g, stream)) {
      ctx.count_epilogue(/*fused=*/true);
      return;
    }
    g.bias = nullptr, g.aux = nullptr, g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  }
  run_lt_or_throw(ctx, g, stream, "matmul_forward", B, C, "OC", OC);
  if (bias || gelu) launch_epilogue(ctx, out, pre_gelu, bias, B, OC, gelu, stream);
}

}  // namespace

// ---- context ----------------------------------------------------------------------------------------------------

GemmContext::GemmContext(GemmMath math, size_t workspace_bytes)
    : math_(math), workspace_bytes_(workspace_bytes), plans_(std::make_unique<Plans>()) {}

GemmContext::~GemmContext() {
  plans_.reset();  // descriptors before the handle
  if (blas_) cublasDestroy(blas_);
  if (lt_) cublasLtDestroy(lt_);
  if (workspace_) cudaFree(workspace_);
}

void GemmContext::init() {
  if (lt_) return;
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  void* ws = nullptr;
  try {
    cudaCheck(cudaMalloc(&ws, std::max<size_t>(workspace_bytes_, 1)));
    cublasCheck(cublasCreate(&blas));
    cublasCheck(cublasLtCreate(&lt));
  } catch (...) {
    if (blas) cublasDestroy(blas);
    if (ws) cudaFree(ws);
    throw;
  }
  lt_ = lt, blas_ = blas, workspace_ = ws;
}

cublasLtHandle_t GemmContext::lt_handle() {
  init();
  return lt_;
}

void* GemmContext::workspace() {
  init();
  return workspace_;
}

cublasHandle_t GemmContext::blas_handle(cudaStream_t stream) {
  init();
  cublasCheck(cublasSetStream(blas_, stream));
  // cublasSetStream resets the workspace to cuBLAS's own pool: point it back at ours every time.
  cublasCheck(cublasSetWorkspace(blas_, workspace_, workspace_bytes_));
  return blas_;
}

int64_t GemmContext::cached_plans() const { return static_cast<int64_t>(plans_->cache.size()); }

void GemmContext::set_heuristic_rank(int rank) {
  if (rank < 0)
    throw std::invalid_argument("GemmContext::set_heuristic_rank: need rank >= 0, got " + std::to_string(rank));
  heuristic_rank_ = rank;
}

void GemmContext::set_timed_algos(bool on, std::string table_dir) {
  timed_algos_ = on;
  if (table_dir != algo_table_dir_) plans_->table.reset();  // the next timed plan opens the new one
  algo_table_dir_ = std::move(table_dir);
}

std::string GemmContext::algo_table_path() const { return plans_->table ? plans_->table->path() : ""; }

std::string GemmContext::describe_algos() const {
  if (!timed_algos_) return "heuristic: cuBLASLt's first answer for each GEMM";
  const std::string table = algo_table_path().empty() ? "nowhere (no cache directory)" : algo_table_path();
  return "timed: " + std::to_string(timed_plans_) + " problems timed now, " + std::to_string(table_plans_) +
         " read from " + table;
}

std::string gemm_algo_table_file() {
  int device = 0;
  cudaCheck(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  cudaCheck(cudaGetDeviceProperties(&prop, device));
  return GemmAlgoTable::file_name(prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                                  static_cast<long>(cublasLtGetVersion()));
}

// ---- launchers --------------------------------------------------------------------------------------------------

template <typename T>
void matmul_forward(GemmContext& ctx, T* out, const T* inp, const T* weight, const T* bias, int B, int C, int OC,
                    cudaStream_t stream) {
  check_sizes("matmul_forward", B, C, OC);
  forward<T>(ctx, out, nullptr, inp, weight, bias, /*residual=*/nullptr, B, C, OC, /*gelu=*/false, stream);
}

template <typename T>
void matmul_residual_forward(GemmContext& ctx, T* out, const T* inp, const T* weight, const T* bias, const T* residual,
                             int B, int C, int OC, cudaStream_t stream) {
  check_sizes("matmul_residual_forward", B, C, OC);
  if (B > 0 && OC > 0 && residual == nullptr)
    throw std::invalid_argument("matmul_residual_forward: residual must not be null");
  if (B > 0 && OC > 0 && residual == out)
    throw std::invalid_argument("matmul_residual_forward: out must not be the residual (gemm.h)");
  forward<T>(ctx, out, nullptr, inp, weight, bias, residual, B, C, OC, /*gelu=*/false, stream);
}

template <typename T>
void matmul_bias_gelu_forward(GemmContext& ctx, T* out, T* pre_gelu, const T* inp, const T* weight, const T* bias,
                              int B, int C, int OC, cudaStream_t stream) {
  check_sizes("matmul_bias_gelu_forward", B, C, OC);
  if (B > 0 && OC > 0 && (bias == nullptr || pre_gelu == nullptr))
    throw std::invalid_argument("matmul_bias_gelu_forward: bias and pre_gelu must not be null");
  forward<T>(ctx, out, pre_gelu, inp, weight, bias, /*residual=*/nullptr, B, C, OC, /*gelu=*/true, stream);
}

template <typename T>
void matmul_backward_input(GemmContext& ctx, T* dinp, const T* dout, const T* weight, int B, int C, int OC,
                           cudaStream_t stream) {
  check_sizes("matmul_backward_input", B, C, OC);
  if (B == 0 || C == 0) return;
  if (OC == 0) {
    cudaCheck(cudaMemsetAsync(dinp, 0, sizeof(T) * B * C, stream));
    return;
  }
  const LtGemm g{CUBLAS_OP_N, CUBLAS_OP_N, C, B, OC, weight, C, dout, OC, dinp, C, kDataType<T>, kDataType<T>, 0.0f};
  run_lt_or_throw(ctx, g, stream, "matmul_backward_input", B, C, "OC", OC);
}

template <typename T>
void matmul_backward_weight(GemmContext& ctx, float* dweight, const T* dout, const T* inp, int B, int C, int OC,
                            int row_begin, int row_end, cudaStream_t stream, bool accumulate) {
  check_sizes("matmul_backward_weight", B, C, OC);
  if (row_begin < 0 || row_begin > row_end || row_end > OC)
    throw std::invalid_argument("matmul_backward_weight: rows [" + std::to_string(row_begin) + ", " +
                                std::to_string(row_end) + ") not within [0, " + std::to_string(OC) + ")");
  const int rows = row_end - row_begin;
  if (C == 0 || rows == 0) return;
  float* dweight_rows = dweight + int64_t{row_begin} * C;
  if (B == 0) {  // an empty sum
    if (!accumulate) cudaCheck(cudaMemsetAsync(dweight_rows, 0, sizeof(float) * rows * C, stream));
    return;
  }
  const T* dout_rows = dout + row_begin;  // rows [row_begin, row_end) of dout^T: same ld, shifted start
  const float beta = accumulate ? 1.0f : 0.0f;  // 0: cuBLASLt does not read C (a discarded gradient's NaN stays out)
  const LtGemm g{CUBLAS_OP_N, CUBLAS_OP_T,  C, rows,         B,          inp, C, dout_rows,
                 OC,          dweight_rows, C, kDataType<T>, CUDA_R_32F, beta};
  run_lt_or_throw(ctx, g, stream, "matmul_backward_weight", B, C, "rows", rows);
}

template <typename T>
void matmul_backward_input_dgelu(GemmContext& ctx, T* dinp, const T* dout, const T* weight, const T* pre_gelu, int B,
                                 int C, int OC, cudaStream_t stream) {
  check_sizes("matmul_backward_input_dgelu", B, C, OC);
  if (B == 0 || C == 0) return;
  if (pre_gelu == nullptr) throw std::invalid_argument("matmul_backward_input_dgelu: pre_gelu must not be null");
  if (OC == 0) {  // an empty product: 0 * gelu'(x) = 0
    cudaCheck(cudaMemsetAsync(dinp, 0, sizeof(T) * B * C, stream));
    return;
  }
  LtGemm g{CUBLAS_OP_N, CUBLAS_OP_N, C, B, OC, weight, C, dout, OC, dinp, C, kDataType<T>, kDataType<T>, 0.0f};
  // The epilogue in bf16 only: on an H200 it beat the GEMM and our gelu_backward there (gpt2-small's 3072 -> 768:
  // 0.086 against 0.146 ms) and lost in fp32 (1.011 against 0.920) and tf32 (0.325 against 0.231), the GELU pass then
  // one float at a time (bench/results/2026-11-30-h200-speed/kernels.log).
  // As in forward: the heuristic is not told the aux pointer's alignment, and the aux ld (C) must be a multiple of 8.
  if (std::is_same_v<T, __nv_bfloat16> && C % 8 == 0 && alignment_of(pre_gelu) >= 16) {
    g.epilogue = CUBLASLT_EPILOGUE_DGELU;
    g.aux = pre_gelu;
    if (run_lt(ctx, g, stream)) {
      ctx.count_epilogue(/*fused=*/true);
      return;
    }
    g.aux = nullptr, g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  }
  run_lt_or_throw(ctx, g, stream, "matmul_backward_input_dgelu", B, C, "OC", OC);
  ctx.count_epilogue(/*fused=*/false);
  gelu_backward(dinp, pre_gelu, dinp, int64_t{B} * C, stream);
}

template <typename T>
void bias_backward(GemmContext& ctx, float* dbias, const T* dout, int B, int OC, cudaStream_t stream, bool accumulate) {
  check_sizes("bias_backward", B, 0, OC);
  if (OC == 0) return;
  if (B == 0) {  // an empty sum
    if (!accumulate) cudaCheck(cudaMemsetAsync(dbias, 0, sizeof(float) * OC, stream));
    return;
  }
  bias_backward_launches(detail::launch_on(stream), dbias, static_cast<float*>(ctx.workspace()),
                         static_cast<int64_t>(ctx.workspace_bytes() / sizeof(float)), dout, B, OC, accumulate);
}

void gemm_strided_batched(GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const float* A, int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                          float beta, float* C, int ldc, int64_t stride_c, int batch, cudaStream_t stream) {
  if (M < 0 || N < 0 || K < 0 || batch < 0) throw std::invalid_argument("gemm_strided_batched: negative size");
  if (M == 0 || N == 0 || batch == 0) return;
  const cublasComputeType_t compute = ctx.math() == GemmMath::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep each one's flag.
  cublasCheck(cublasGemmStridedBatchedEx(ctx.blas_handle(stream), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_32F, ldb,
                                         stride_b, A, CUDA_R_32F, lda, stride_a, &beta, C, CUDA_R_32F, ldc, stride_c,
                                         batch, compute, CUBLAS_GEMM_DEFAULT));
}

#define DDPLAB_INSTANTIATE(T)                                                                                       \
  template void matmul_forward<T>(GemmContext&, T*, const T*, const T*, const T*, int, int, int, cudaStream_t);     \
  template void matmul_residual_forward<T>(GemmContext&, T*, const T*, const T*, const T*, const T*, int, int, int, \
                                           cudaStream_t);                                                           \
  template void matmul_bias_gelu_forward<T>(GemmContext&, T*, T*, const T*, const T*, const T*, int, int, int,      \
                                            cudaStream_t);                                                          \
  template void matmul_backward_input<T>(GemmContext&, T*, const T*, const T*, int, int, int, cudaStream_t);        \
  template void matmul_backward_weight<T>(GemmContext&, float*, const T*, const T*, int, int, int, int, int,        \
                                          cudaStream_t, bool);                                                      \
  template void matmul_backward_input_dgelu<T>(GemmContext&, T*, const T*, const T*, const T*, int, int, int,       \
                                               cudaStream_t);                                                       \
  template void bias_backward<T>(GemmContext&, float*, const T*, int, int, cudaStream_t, bool);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(__nv_bfloat16)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cuda
