// bench_cuda_kernels: every CUDA kernel family at training shapes, timed with CUDA events.
//
//   memory-bound kernels  achieved GB/s = bytes a minimal implementation must move / median time, as a share of the
//                         HBM's peak (the device's memory clock and bus width), of a 1 GiB device-to-device
//                         cudaMemcpy ("of copy", read + write, measured in the same run), and of a copy kernel moving
//                         the row's own bytes, launched and timed as the rows are ("of its size's": a 10 us kernel
//                         pays its launch and ramp as a copy of its size does);
//   attention             TFLOP/s of the unfused kernels (kernels/cuda/attention.h) and of the fused bf16 ones
//                         (flash_attention.h) beside them on the same causal problem;
//   GEMMs                 TFLOP/s through our wrapper (kernels/cuda/gemm.h) next to raw cuBLASLt (its first heuristic
//                         answer, no epilogue) and cublasGemmEx for the same problem and precision.
// Shapes: a GPT-2-small block (B*S = 8 x 1024 tokens, C = 768, 12 heads, the preset's vocabulary of 50304) and the
// default MLP (batch 128, 1024 wide). Each figure is the median over --reps samples, each one call timed alone after a
// read of a buffer several times the L2's size (Sampling, below).
//
//   bench_cuda_kernels [--reps 100] [--csv out.csv] [--quick]
// --quick shrinks every shape 8x (a smoke test). Needs a GPU; exits 2 with the reason without one.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "analysis/stats.h"
#include "bench/bench_cli.h"
#include "bench/gpu/bench_device.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/sequence.h"
#include "kernels/cuda/softmax_ce.h"
#include "kernels/cuda/wire_cast.h"

namespace {

namespace cuda = ddplab::cuda;
using bf16 = __nv_bfloat16;

struct Options {
  int reps = 100;
  bool quick = false;
  std::string csv;
};

// Device memory for the run, freed at exit; filled with small random values (uniform [-1, 1]) by a host upload so
// no kernel sees NaN or inf (which would change its speed: scale_and_check_finite's flag store, say).
class Arena {
 public:
  ~Arena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  T* alloc(int64_t n) {
    void* p = nullptr;
    cudaCheck(cudaMalloc(&p, std::max<int64_t>(n, 1) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  float* random_f32(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> h(n);
    std::mt19937 rng(static_cast<uint32_t>(ptrs_.size()));
    std::uniform_real_distribution<float> dist(lo, hi);
    for (float& x : h) x = dist(rng);
    float* d = alloc<float>(n);
    cudaCheck(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
  }
  bf16* random_bf16(int64_t n) {
    bf16* d = alloc<bf16>(n);
    float* tmp = random_f32(n);
    cuda::f32_to_bf16(d, tmp, n, nullptr);
    cudaCheck(cudaDeviceSynchronize());
    return d;
  }
  int32_t* ints(const std::vector<int32_t>& h) {
    int32_t* d = alloc<int32_t>(static_cast<int64_t>(h.size()));
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    return d;
  }

 private:
  std::vector<void*> ptrs_;
};

// Packed rows (--batching pack) as the benchmarks lay them out: every row of S tokens four sequences of S / 4 back to
// back, each token's position counted from its sequence's start. S is a multiple of 4.
std::vector<int32_t> four_sequences_a_row(int B, int S) {
  std::vector<int32_t> positions(static_cast<size_t>(B) * S);
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int32_t>(i % S % (S / 4));
  return positions;
}

// Reads n 16-byte words: afterwards the L2 holds only these lines, and clean ones. A memset would leave up to the
// L2's size of dirty lines, whose write-back the timed call after it would pay.
__global__ void evict_l2_kernel(const int4* __restrict__ words, int64_t n, int* sink) {
  int bits = 0;
  for (int64_t i = cuda::detail::global_index(); i < n; i += cuda::detail::grid_stride()) {
    const int4 w = words[i];
    bits |= w.x | w.y | w.z | w.w;
  }
  if (bits != 0) *sink = bits;  // never (the buffer is zeros): keeps the loads
}

// How every figure is sampled: --reps samples, each one call between its own pair of events, after a read of a buffer
// of 256 MiB (5x an H200's 50 MB L2; 4x the L2 where that is more) outside the events. Called back to back on the same
// buffers, the rows at N 8192 x C 768 (12-50 MB) would find part of their data in L2 from the call before, some rows
// more than their reference copy; a training step's kernels find other kernels' data there. Timing one call per sample
// is what the eviction requires (the second of two back-to-back calls would find the L2 warm), and the read hides the
// host's launches: the samples are queued back to back and read after one synchronize.
class Sampling {
 public:
  Sampling(int reps, Arena& a) : reps_(reps), start_(reps), stop_(reps) {
    int device = 0, l2 = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    l2_bytes_ = l2;
    evict_bytes_ = std::max<int64_t>(int64_t{256} << 20, (4 * l2_bytes_ + 15) / 16 * 16);
    words_ = a.alloc<int4>(evict_bytes_ / 16);
    sink_ = a.alloc<int>(1);
    cudaCheck(cudaMemset(words_, 0, evict_bytes_));
    for (int r = 0; r < reps; ++r) {
      cudaCheck(cudaEventCreate(&start_[r]));
      cudaCheck(cudaEventCreate(&stop_[r]));
    }
  }
  ~Sampling() {
    for (int r = 0; r < reps_; ++r) {
      cudaEventDestroy(start_[r]);
      cudaEventDestroy(stop_[r]);
    }
  }
  Sampling(const Sampling&) = delete;
  Sampling& operator=(const Sampling&) = delete;

  int reps() const { return reps_; }
  int64_t l2_bytes() const { return l2_bytes_; }
  int64_t evict_bytes() const { return evict_bytes_; }

  // The median over the samples of one call's time, in ms, after a warm-up (plans, caches, clocks).
  double median_ms(cudaStream_t stream, const std::function<void()>& fn) const {
    for (int i = 0; i < 3; ++i) fn();
    const int64_t n = evict_bytes_ / 16;
    for (int r = 0; r < reps_; ++r) {
      evict_l2_kernel<<<cuda::detail::grid_size(n), cuda::detail::kBlockSize, 0, stream>>>(words_, n, sink_);
      cudaCheck(cudaGetLastError());
      cudaCheck(cudaEventRecord(start_[r], stream));
      fn();
      cudaCheck(cudaEventRecord(stop_[r], stream));
    }
    cudaCheck(cudaEventSynchronize(stop_.back()));
    std::vector<double> t(reps_);
    for (int r = 0; r < reps_; ++r) {
      float ms = 0;
      cudaCheck(cudaEventElapsedTime(&ms, start_[r], stop_[r]));
      t[r] = ms;
    }
    return ddplab::median(std::move(t));
  }

 private:
  int reps_;
  int64_t l2_bytes_ = 0, evict_bytes_ = 0;
  int4* words_ = nullptr;
  int* sink_ = nullptr;
  std::vector<cudaEvent_t> start_, stop_;
};

struct Row {
  std::string group, name, shape;
  double ms, bytes, flops;  // bytes for memory-bound rows, flops for GEMMs (0 when not applicable)
  double same_size_copy_gbs = 0;  // filled by Report::add
  double gbs() const { return bytes / (ms * 1e-3) / 1e9; }  // memory-bound rows: bytes moved per second
};

// Memory-bound rows are set beside the HBM's peak, the device's copy bandwidth (a 1 GiB cudaMemcpy) and the copy
// kernel moving the row's own bytes (half read, half written), timed on first use per size; sizes past the largest
// copy take its rate.
class Report {
 public:
  // The goal's rows: those moving at least 1 MiB (under it a kernel is not bandwidth-bound: a check that finds
  // nothing to do). None passes above kCountingError of its size's copy: a kernel does not outrun the copy of its
  // bytes by more than the noise, so such a row counts bytes it does not move (a store it skips, data it finds in L2).
  static constexpr double kGoalBytes = 1 << 20, kCountingError = 1.05;
  using CopyMs = std::function<double(int64_t bytes)>;  // the copy kernel over `bytes` bytes, median ms
  Report(CopyMs copy_ms, int64_t largest_copy, double memcpy_gbs, double peak_gbs)
      : copy_ms_(std::move(copy_ms)), largest_copy_(largest_copy), memcpy_gbs_(memcpy_gbs), peak_gbs_(peak_gbs) {}
  // GB/s (read + write) of the copy kernel moving `moved` bytes in all, rounded to whole 256-byte lines.
  double copy_gbs_moving(double moved) {
    const int64_t bytes = std::min<int64_t>(largest_copy_, (static_cast<int64_t>(moved / 2) + 255) / 256 * 256);
    auto [at, added] = copy_ms_by_size_.try_emplace(bytes, 0.0);
    if (added) at->second = copy_ms_(bytes);
    return 2.0 * bytes / (at->second * 1e-3) / 1e9;
  }
  void add(Row r) {
    if (r.bytes > 0) r.same_size_copy_gbs = copy_gbs_moving(r.bytes);
    print(r);
    rows_.push_back(std::move(r));
  }
  void print(const Row& r) const {
    if (r.bytes > 0) {
      const double gbs = r.gbs(), of_size = gbs / r.same_size_copy_gbs;
      std::printf("  %-42s %-26s %9.4f ms %8.1f GB/s %s %5.0f%% of copy %5.0f%% of its size's%s\n", r.name.c_str(),
                  r.shape.c_str(), r.ms, gbs, of_peak(gbs).c_str(), 100 * gbs / memcpy_gbs_, 100 * of_size,
                  r.bytes >= kGoalBytes && of_size > kCountingError ? "  (over its copy: bytes over-counted)" : "");
    } else {
      std::printf("  %-42s %-26s %9.4f ms %8.1f TFLOP/s\n", r.name.c_str(), r.shape.c_str(), r.ms,
                  r.flops / (r.ms * 1e-3) / 1e12);
    }
  }
  // The memory-bound goal (docs/BENCHMARKS.md): each kernel at >= `goal` of what the copy kernel reaches over its own
  // bytes, over the rows of kGoalBytes or more; rows past kCountingError are listed as counting errors, not passes.
  void print_goal(double goal) const {
    int met = 0;
    std::string missed, over;
    for (const Row& r : rows_) {
      if (r.bytes < kGoalBytes) continue;
      const double of_size = r.gbs() / r.same_size_copy_gbs;
      char item[160];
      std::snprintf(item, sizeof item, "\n    %-42s %-26s %5.0f%%", r.name.c_str(), r.shape.c_str(), 100 * of_size);
      if (of_size > kCountingError)
        over += item;
      else if (of_size >= goal)
        ++met;
      else
        missed += item;
    }
    std::printf("\nmemory-bound rows at >= %.0f%% of a copy of their own bytes: %d; under it:%s\n", 100 * goal, met,
                missed.empty() ? " none" : missed.c_str());
    std::printf("over %.0f%% of it, counting errors (bytes the kernel does not move), not passes:%s\n",
                100 * kCountingError, over.empty() ? " none" : over.c_str());
  }
  // Whole or not at all (record/files.h); main checked the path before the run.
  void write_csv(const std::string& path) const {
    using ddplab::bench::csv_field;
    std::string text =
        "group,kernel,shape,ms,bytes,gb_per_s,pct_of_copy,pct_of_same_size_copy,flops,tflop_per_s,pct_of_hbm_peak\n";
    char numbers[256];
    for (const Row& r : rows_) {
      const double gbs = r.bytes > 0 ? r.gbs() : 0;
      const double tf = r.flops > 0 ? r.flops / (r.ms * 1e-3) / 1e12 : 0;
      std::snprintf(numbers, sizeof numbers, ",%.6f,%.0f,%.2f,%.1f,%.1f,%.0f,%.3f,%.1f\n", r.ms, r.bytes, gbs,
                    r.bytes > 0 ? 100 * gbs / memcpy_gbs_ : 0.0, r.bytes > 0 ? 100 * gbs / r.same_size_copy_gbs : 0.0,
                    r.flops, tf, r.bytes > 0 && peak_gbs_ > 0 ? 100 * gbs / peak_gbs_ : 0.0);
      text += csv_field(r.group) + "," + csv_field(r.name) + "," + csv_field(r.shape) + numbers;
    }
    ddplab::write_text_file(path, text, /*force=*/true);
  }

 private:
  std::string of_peak(double gbs) const {
    char s[32];
    if (peak_gbs_ > 0)
      std::snprintf(s, sizeof s, "%5.0f%% of peak", 100 * gbs / peak_gbs_);
    else
      std::snprintf(s, sizeof s, "%5s   of peak", "-");
    return s;
  }

  CopyMs copy_ms_;
  int64_t largest_copy_;
  double memcpy_gbs_, peak_gbs_;
  std::map<int64_t, double> copy_ms_by_size_;
  std::vector<Row> rows_;
};

std::string dims(std::initializer_list<std::pair<const char*, int64_t>> d) {
  std::string s;
  for (auto [k, v] : d) s += (s.empty() ? "" : " ") + std::string(k) + "=" + std::to_string(v);
  return s;
}

// ---- memory-bound kernels ----------------------------------------------------------------------------------------

template <typename T>
void bench_rowwise(const Sampling& sampling, cudaStream_t s, Arena& a, Report& rep, int N, int C, int V,
                   const char* tag) {
  const double t = sizeof(T);
  auto act = [&](int64_t n) {
    if constexpr (std::is_same_v<T, bf16>)
      return a.random_bf16(n);
    else
      return a.random_f32(n);
  };
  T *x = act(int64_t{N} * C), *y = act(int64_t{N} * C), *dy = act(int64_t{N} * C), *dx = act(int64_t{N} * C);
  float *w = a.random_f32(C, 0.5f, 1.5f), *b = a.random_f32(C), *dw = a.random_f32(C), *db = a.random_f32(C);
  float *mean = a.alloc<float>(N), *rstd = a.alloc<float>(N);
  float* scratch = a.alloc<float>(cuda::layernorm_backward_scratch_floats(N, C));
  const std::string sh = dims({{"N", N}, {"C", C}});
  rep.add({"layernorm", std::string("layernorm_forward<") + tag + ">", sh,
           sampling.median_ms(s, [&] { cuda::layernorm_forward<T>(y, mean, rstd, x, w, b, N, C, s); }),
           2.0 * N * C * t + 8.0 * N + 8.0 * C, 0});
  // Backward accumulates: the values drift over the reps, which does not change the work.
  rep.add(
      {"layernorm", std::string("layernorm_backward<") + tag + ">", sh,
       sampling.median_ms(s, [&] { cuda::layernorm_backward<T>(dx, dw, db, scratch, dy, x, w, mean, rstd, N, C, s); }),
       4.0 * N * C * t + 8.0 * N + 12.0 * C, 0});
  // With dinp's column sums in the same pass (the transformer's proj and fcproj bias gradients): what it saves is a
  // bias_backward over dinp (the bias_grad rows at OC = C).
  float* dcols = a.random_f32(C);
  rep.add(
      {"layernorm", std::string("layernorm_backward<") + tag + "> + dinp's column sums", sh,
       sampling.median_ms(
           s, [&] { cuda::layernorm_backward<T>(dx, dw, db, scratch, dy, x, w, mean, rstd, N, C, s, true, dcols); }),
       4.0 * N * C * t + 8.0 * N + 16.0 * C, 0});

  // The GPU ring's reduction (fp32), in place (out = out + x), at the residual stream's size: also what a residual
  // sum would cost as a pass of its own, which matmul_residual_forward's epilogue replaces (see the GEMMs' rows).
  if constexpr (std::is_same_v<T, float>)
    rep.add({"elementwise", "residual_forward<fp32>", sh,
             sampling.median_ms(s, [&] { cuda::residual_forward(y, x, y, int64_t{N} * C, s); }), 3.0 * N * C * t, 0});

  // Cross-entropy over the LM head's logits, dlogits written in place; 10% of the targets ignored.
  T* logits = act(int64_t{N} * V);
  std::vector<int32_t> tg(N);
  for (int n = 0; n < N; ++n) tg[n] = n % 10 == 9 ? -1 : (n * 7919) % V;
  int32_t* targets = a.ints(tg);
  float *losses = a.alloc<float>(N), *mean_loss = a.alloc<float>(1);
  int* count = a.alloc<int>(1);
  // Each call overwrites the logits with dlogits, whose softmax is as cheap to compute: same work every rep.
  // Each row kernel: staged in shared memory (the default, where the row fits; else streamed) and streamed.
  for (cuda::CrossEntropyRows rows : {cuda::CrossEntropyRows::kStreamed, cuda::CrossEntropyRows::kStaged}) {
    const std::string how = rows == cuda::CrossEntropyRows::kStreamed ? "" : " (rows staged)";
    rep.add({"softmax_ce", std::string("softmax_cross_entropy_fused<") + tag + ">" + how, dims({{"N", N}, {"V", V}}),
             sampling.median_ms(s,
                                [&] {
                                  cuda::softmax_cross_entropy_fused<T>(logits, losses, mean_loss, count, logits,
                                                                       targets, N, V, 1.0f, s, rows);
                                }),
             2.0 * N * V * t + 12.0 * N, 0});
  }

  // Embedding: B sequences of S = 1024 tokens, all full length (the most work). dwte from the rows sorted by token:
  // every token distinct (one row each), and tokens as skewed as text's (Zipf's law, s = 1: the most common token is
  // 1 / H(V) of them, 8.8% at V 50304 — about twice GPT-2's most common on web text — whose rows one warp walks).
  const int S = std::min(N, 1024), B = N / S;
  const int64_t rows = int64_t{B} * S;
  std::vector<int32_t> distinct(rows), zipf(rows), len(B, S);
  for (int64_t i = 0; i < rows; ++i) distinct[i] = static_cast<int32_t>((i * 7919) % V);  // 7919 is prime to V
  {
    std::vector<double> cdf(V);
    double sum = 0;
    for (int k = 0; k < V; ++k) cdf[k] = sum += 1.0 / (k + 1);
    std::mt19937 gen(7);
    std::uniform_real_distribution<double> u(0, sum);
    for (int32_t& token : zipf)
      token = static_cast<int32_t>(std::lower_bound(cdf.begin(), cdf.end() - 1, u(gen)) - cdf.begin());
  }
  int32_t* d_len = a.ints(len);
  float *wte = a.random_f32(int64_t{V} * C), *wpe = a.random_f32(int64_t{S} * C);
  float *dwte = a.random_f32(int64_t{V} * C), *dwpe = a.random_f32(int64_t{S} * C);
  const size_t sort_bytes = cuda::rows_by_token_workspace_bytes(rows, V, C);
  void* sort_space = a.alloc<char>(static_cast<int64_t>(sort_bytes));
  const std::string esh = dims({{"B", B}, {"S", S}, {"C", C}});
  for (const auto& [tokens, which] : {std::pair{&distinct, ""}, std::pair{&zipf, ", Zipf tokens"}}) {
    int32_t* d_tok = a.ints(*tokens);
    if (tokens == &distinct)
      rep.add(
          {"embedding", std::string("embedding_forward<") + tag + ">", esh,
           sampling.median_ms(s, [&] { cuda::embedding_forward<T>(y, d_tok, d_len, nullptr, wte, wpe, B, S, C, s); }),
           rows * C * (4.0 + t) + 4.0 * S * C, 0});  // wte rows + out, and wpe once (L2-resident after the first b)
    cuda::RowsByToken sorted;
    rep.add({"embedding", std::string("sort_rows_by_token") + which, dims({{"B", B}, {"S", S}, {"V", V}}),
             sampling.median_ms(
                 s, [&] { sorted = cuda::sort_rows_by_token(sort_space, sort_bytes, d_tok, d_len, B, S, V, C, s); }),
             0, 0});
    std::vector<int32_t> unique = *tokens;
    std::sort(unique.begin(), unique.end());
    const int64_t tokens_seen = std::unique(unique.begin(), unique.end()) - unique.begin();
    rep.add({"embedding", std::string("embedding_backward<") + tag + ">" + which, esh,
             sampling.median_ms(
                 s, [&] { cuda::embedding_backward<T>(dwte, dwpe, dy, sorted, d_len, nullptr, B, S, C, s); }),
             rows * C * 2.0 * t + tokens_seen * C * 8.0 + 8.0 * S * C, 0});  // dout twice, dwte rows RMW, dwpe RMW
    if (tokens == &distinct && S % 4 == 0) {
      // Packed rows, four sequences a row: dwpe's threads for position p find its rows among the batch's positions,
      // 32 a warp step; the same bytes and the positions once.
      const int32_t* d_positions = a.ints(four_sequences_a_row(B, S));
      rep.add({"embedding", std::string("embedding_backward<") + tag + ">, packed rows of 4 sequences", esh,
               sampling.median_ms(
                   s, [&] { cuda::embedding_backward<T>(dwte, dwpe, dy, sorted, d_len, d_positions, B, S, C, s); }),
               rows * C * 2.0 * t + tokens_seen * C * 8.0 + 8.0 * S * C + 4.0 * rows, 0});
    }
  }

  // The bias gradient (our two-pass kernel) over the block's widths and the LM head's: dout read once, dbias read and
  // written.
  cuda::GemmContext ctx;
  float* dbias = a.random_f32(V);
  for (int OC : {C, 3 * C, 4 * C, V})
    rep.add({"bias_grad", std::string("bias_backward<") + tag + ">", dims({{"N", N}, {"OC", OC}}),
             sampling.median_ms(s, [&] { cuda::bias_backward<T>(ctx, dbias, logits, N, OC, s); }),
             int64_t{N} * OC * t + 8.0 * OC, 0});
}

void bench_streaming(const Sampling& sampling, cudaStream_t s, Arena& a, Report& rep, int64_t n) {
  float *x = a.random_f32(n), *y = a.random_f32(n), *g = a.random_f32(n), *m = a.random_f32(n);
  float* v = a.random_f32(n, 0.0f, 1.0f);
  bf16* h = a.alloc<bf16>(n);
  int* flag = a.alloc<int>(1);
  cudaCheck(cudaMemset(flag, 0, sizeof(int)));
  const std::string sh = dims({{"n", n}});
  rep.add({"convert", "f32_to_bf16", sh, sampling.median_ms(s, [&] { cuda::f32_to_bf16(h, x, n, s); }), 6.0 * n, 0});
  rep.add({"convert", "bf16_to_f32", sh, sampling.median_ms(s, [&] { cuda::bf16_to_f32(y, h, n, s); }), 6.0 * n, 0});
  // s = -1: the kernel skips its stores at s == 1 (only reads, 4n bytes), and -1 keeps the values where they are over
  // the reps while every element is read and written.
  rep.add({"convert", "scale_and_check_finite", sh,
           sampling.median_ms(s, [&] { cuda::scale_and_check_finite(y, -1.0f, n, flag, s); }), 8.0 * n, 0});
  rep.add({"elementwise", "gelu_backward", sh, sampling.median_ms(s, [&] { cuda::gelu_backward(y, x, g, n, s); }),
           12.0 * n, 0});
  rep.add({"elementwise", "scale", sh, sampling.median_ms(s, [&] { cuda::scale(y, 1.0f, n, s); }), 8.0 * n, 0});
  rep.add({"adamw", "adamw_update", sh,
           sampling.median_ms(
               s, [&] { cuda::adamw_update(x, nullptr, g, m, v, n, 1e-9f, 0.9f, 0.999f, 1e-8f, 0.0f, 1000, s); }),
           28.0 * n, 0});
  // With the bf16 copy a bf16 model's GEMMs read, written in the same pass (2 bytes more per parameter): what it
  // replaces is adamw_update above plus f32_to_bf16 (6 bytes per parameter and a launch).
  rep.add(
      {"adamw", "adamw_update + bf16 copy", sh,
       sampling.median_ms(s, [&] { cuda::adamw_update(x, h, g, m, v, n, 1e-9f, 0.9f, 0.999f, 1e-8f, 0.0f, 1000, s); }),
       30.0 * n, 0});
  // --grad-clip's cost: the norm reads the gradients once (two launches, one wave of a fixed grid), and the update
  // reads the factor from the device (a load per thread, no more bytes).
  auto* norm = a.alloc<cuda::ClippedNorm>(1);
  void* norm_workspace = a.alloc<unsigned char>(cuda::grad_norm_workspace_bytes());
  rep.add({"adamw", "grad_norm", sh,
           sampling.median_ms(s, [&] { cuda::grad_norm(g, n, 1.0f, norm, norm_workspace, s); }), 4.0 * n, 0});
  rep.add({"adamw", "adamw_update + bf16 copy, clipped", sh,
           sampling.median_ms(s,
                              [&] {
                                cuda::adamw_update(x, h, g, m, v, n, 1e-9f, 0.9f, 0.999f, 1e-8f, 0.0f, 1000, s, nullptr,
                                                   &norm->scale);
                              }),
           30.0 * n, 0});
  // The 16-bit wire's casts, as the GPU ring's links run them with --comm-dtype bf16 or fp16: encode and decode move
  // 6 bytes an element, add_encode (the reduce-scatter's step) reads both and writes the words back, 8.
  uint16_t* words = a.alloc<uint16_t>(n);
  for (ddplab::float16::Format f : {ddplab::float16::Format::kBf16, ddplab::float16::Format::kFp16}) {
    const std::string name = f == ddplab::float16::Format::kBf16 ? " bf16" : " fp16";
    rep.add({"wire_cast", "wire_encode" + name, sh,
             sampling.median_ms(s, [&] { cuda::wire_encode(f, words, x, n, s); }), 6.0 * n, 0});
    rep.add({"wire_cast", "wire_decode" + name, sh,
             sampling.median_ms(s, [&] { cuda::wire_decode(f, y, words, n, s); }), 6.0 * n, 0});
    rep.add({"wire_cast", "wire_add_encode" + name, sh,
             sampling.median_ms(s, [&] { cuda::wire_add_encode(f, words, x, n, s); }), 8.0 * n, 0});
  }
}

// The small per-sequence kernels of the transformer's heads: the classify head's mean pool over lengths from S down to
// S/2 (bytes: the valid rows read or written, plus the pooled rows), the padded rows' zeroing, the LM head's targets.
void bench_sequence(const Sampling& sampling, cudaStream_t s, Arena& a, Report& rep, int B, int S, int C) {
  std::vector<int32_t> len(B);
  int64_t valid = 0;
  for (int b = 0; b < B; ++b) valid += len[b] = S - b * S / (2 * B);
  int32_t* d_len = a.ints(len);
  float *x = a.random_f32(int64_t{B} * S * C), *pooled = a.random_f32(int64_t{B} * C);
  const std::string sh = dims({{"B", B}, {"S", S}, {"C", C}});
  rep.add({"sequence", "mean_pool_forward (lengths S..S/2)", sh,
           sampling.median_ms(s, [&] { cuda::mean_pool_forward<float>(pooled, x, d_len, B, S, C, s); }),
           4.0 * (valid + B) * C, 0});
  rep.add({"sequence", "mean_pool_backward (lengths S..S/2)", sh,
           sampling.median_ms(s, [&] { cuda::mean_pool_backward<float>(x, pooled, d_len, B, S, C, s); }),
           4.0 * (int64_t{B} * S + B) * C, 0});  // every row written: the padded ones as zeros
  // The attention's padded rows zeroed (cuDNN's output, bf16): the bytes of the padded rows, and with every row full
  // the lengths alone (a row's check each).
  bf16* rows = a.alloc<bf16>(int64_t{B} * S * C);
  rep.add({"sequence", "zero_padded_rows (bf16, lengths S..S/2)", sh,
           sampling.median_ms(s, [&] { cuda::zero_padded_rows(rows, d_len, B, S, C, s); }),
           2.0 * (int64_t{B} * S - valid) * C + 4.0 * B, 0});
  int32_t* d_full = a.ints(std::vector<int32_t>(B, S));
  rep.add({"sequence", "zero_padded_rows (bf16, every row full)", sh,
           sampling.median_ms(s, [&] { cuda::zero_padded_rows(rows, d_full, B, S, C, s); }), 4.0 * B, 0});
  std::vector<int32_t> tokens(int64_t{B} * S, 7);
  int32_t *d_tokens = a.ints(tokens), *targets = a.alloc<int32_t>(int64_t{B} * S);
  rep.add({"sequence", "next_token_targets (lengths S..S/2)", dims({{"B", B}, {"S", S}}),
           sampling.median_ms(s, [&] { cuda::next_token_targets(targets, d_tokens, d_len, nullptr, B, S, s); }),
           4.0 * valid + 4.0 * B * S, 0});
}

void bench_attention(const Sampling& sampling, cudaStream_t s, Arena& a, Report& rep, int B, int S, int C, int NH) {
  cuda::GemmContext ctx(cuda::GemmMath::kTf32);
  float *qkv = a.random_f32(int64_t{B} * S * 3 * C), *out = a.alloc<float>(int64_t{B} * S * C);
  float *dout = a.random_f32(int64_t{B} * S * C), *dqkv = a.alloc<float>(int64_t{B} * S * 3 * C);
  float* att = a.alloc<float>(int64_t{B} * NH * S * S);
  float* ws = a.alloc<float>(cuda::attention_backward_workspace_floats(B, S, C, NH));
  std::vector<int32_t> len(B);
  for (int b = 0; b < B; ++b) len[b] = S - b * S / (2 * B);  // lengths from S down to ~S/2
  int32_t* d_len = a.ints(len);
  const std::string sh = dims({{"B", B}, {"S", S}, {"C", C}, {"NH", NH}});
  // Q K^T and att V over all heads and the full S x S, though the lengths run from S down to S/2: the rate of the
  // GEMMs as launched, not of the problem (bench_fused_attention's "all S" rows are that).
  const double qk_av = 2.0 * 2 * B * int64_t{S} * S * C;
  rep.add({"attention", "attention_forward (tf32, causal, lengths S..S/2, full-square FLOPs)", sh,
           sampling.median_ms(s, [&] { cuda::attention_forward(ctx, out, att, ws, qkv, d_len, B, S, C, NH, true, s); }),
           0, qk_av});
  rep.add({"attention", "attention_backward (tf32, causal, lengths S..S/2, full-square FLOPs)", sh,
           sampling.median_ms(
               s, [&] { cuda::attention_backward(ctx, dqkv, ws, dout, qkv, att, d_len, B, S, C, NH, true, s); }),
           0, 2 * qk_av});
}

// The fused bf16 attention (flash_attention.h) against the unfused one (fp32 data, TF32 GEMMs: what the bf16 model
// runs, less its bf16 <-> fp32 conversions of q, k, v, the output and their gradients) on the same problem: causal,
// every sequence S long. TFLOP/s count the causal half only, the FLOPs an exact kernel must do: forward Q K^T and P V,
// 2 * 2 * B * NH * (S^2 / 2) * hs; backward 2.5x that (Q K^T recomputed, dP, dV, dK, dQ). The unfused kernels compute
// the full square, so their rate in these units is half their hardware rate.
// What a run whose batches change length pays the first time each shape comes: a forward and a backward at S, S - 64,
// ... down to 128 (the buffers S's), each the first at its shape, timed on the host to the stream's end, with cuDNN
// specialising a graph to each shape and with dynamic-shape graphs sharing their kernels. Printed, not a table row:
// one sample each, a build, not a kernel's rate.
void bench_cudnn_builds(cudaStream_t s, bf16* qkv, bf16* out, float* lse, bf16* dout, bf16* dqkv, int B, int S, int C,
                        int NH) {
  for (const cuda::CudnnShapes shapes : {cuda::CudnnShapes::kStatic, cuda::CudnnShapes::kDynamic}) {
    cuda::CudnnAttention cudnn(/*deterministic_backward=*/false, shapes);
    std::vector<double> first_call_ms;
    for (int at = S; at >= 128; at -= 64) {
      cudaCheck(cudaStreamSynchronize(s));
      const auto start = std::chrono::steady_clock::now();
      cudnn.forward(out, lse, qkv, nullptr, B, at, C, NH, true, s);
      cudnn.backward(dqkv, dout, qkv, out, lse, nullptr, B, at, C, NH, true, s);
      cudaCheck(cudaStreamSynchronize(s));
      first_call_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    const double first = first_call_ms.front();
    std::vector<double> later(first_call_ms.begin() + 1, first_call_ms.end());
    std::printf(
        "  cudnn graph builds, %s shapes, B=%d C=%d NH=%d causal, S %d down to 128 by 64: first shape %.1f ms "
        "(forward + backward, built and run), each later shape median %.1f ms, max %.1f; %s\n",
        shapes == cuda::CudnnShapes::kDynamic ? "dynamic" : "static", B, C, NH, S, first,
        later.empty() ? 0.0 : ddplab::median(later),
        later.empty() ? 0.0 : *std::max_element(later.begin(), later.end()), cudnn.build_stats().describe().c_str());
  }
}

void bench_fused_attention(const Sampling& sampling, cudaStream_t s, Arena& a, Report& rep, int B, int S, int C,
                           int NH) {
  const int64_t BSC = int64_t{B} * S * C;
  const std::string sh = dims({{"B", B}, {"S", S}, {"C", C}, {"NH", NH}});
  const double forward_flops = 2.0 * 2 * B * NH * (static_cast<double>(S) * S / 2) * (C / NH);
  bf16 *qkv = a.random_bf16(3 * BSC), *out = a.alloc<bf16>(BSC), *dout = a.random_bf16(BSC);
  bf16* dqkv = a.alloc<bf16>(3 * BSC);
  float* lse = a.alloc<float>(int64_t{B} * NH * S);
  float* ws = a.alloc<float>(cuda::flash_attention_backward_workspace_floats(B, S, C, NH, /*deterministic=*/true));
  const auto fused_forward = [&] {
    cuda::flash_attention_forward(out, lse, qkv, nullptr, nullptr, B, S, C, NH, true, s);
  };
  rep.add({"attention", "flash_attention_forward (bf16, causal)", sh, sampling.median_ms(s, fused_forward), 0,
           forward_flops});
  // The forward's other shape where the head size allows two: one query fragment per warp, 64-query CTAs.
  if (C / NH <= 64)
    rep.add({"attention", "flash_attention_forward (bf16, causal, 1 query fragment per warp)", sh,
             sampling.median_ms(
                 s, [&] { cuda::flash_attention_forward(out, lse, qkv, nullptr, nullptr, B, S, C, NH, true, s, 1); }),
             0, forward_flops});
  rep.add({"attention", "flash_attention_backward (bf16, causal)", sh,
           sampling.median_ms(s,
                              [&] {
                                cuda::flash_attention_backward(dqkv, ws, dout, qkv, out, lse, nullptr, nullptr, B, S, C,
                                                               NH, true, s);
                              }),
           0, 2.5 * forward_flops});
  // --deterministic on's backward: dQ from per-key-block shares summed in order (the workspace above is its size).
  rep.add({"attention", "flash_attention_backward (bf16, causal, deterministic dQ)", sh,
           sampling.median_ms(s,
                              [&] {
                                cuda::flash_attention_backward(dqkv, ws, dout, qkv, out, lse, nullptr, nullptr, B, S, C,
                                                               NH, true, s,
                                                               /*deterministic=*/true);
                              }),
           0, 2.5 * forward_flops});
  // Packed rows (--batching pack): each row holds sequences of S / 4 tokens back to back, each query attending its own
  // sequence's keys only. TFLOP/s count the sequences' causal halves, a quarter of the row's.
  if (S % 4 == 0) {
    const int32_t* d_positions = a.ints(four_sequences_a_row(B, S));
    const double packed_flops = forward_flops / 4;
    rep.add({"attention", "flash_attention_forward (bf16, causal, packed rows of 4 sequences)", sh,
             sampling.median_ms(
                 s, [&] { cuda::flash_attention_forward(out, lse, qkv, nullptr, d_positions, B, S, C, NH, true, s); }),
             0, packed_flops});
    rep.add({"attention", "flash_attention_backward (bf16, causal, packed rows of 4 sequences)", sh,
             sampling.median_ms(s,
                                [&] {
                                  cuda::flash_attention_backward(dqkv, ws, dout, qkv, out, lse, nullptr, d_positions, B,
                                                                 S, C, NH, true, s);
                                }),
             0, 2.5 * packed_flops});
  }
  // cuDNN's fused attention on the same buffers: the library bound ours is measured against.
  if (std::string why; cuda::cudnn_attention_available(&why)) {
    cuda::CudnnAttention cudnn;
    rep.add({"attention", "cudnn_attention_forward (bf16, causal)", sh,
             sampling.median_ms(s, [&] { cudnn.forward(out, lse, qkv, nullptr, B, S, C, NH, true, s); }), 0,
             forward_flops});
    rep.add({"attention", "cudnn_attention_backward (bf16, causal)", sh,
             sampling.median_ms(s, [&] { cudnn.backward(dqkv, dout, qkv, out, lse, nullptr, B, S, C, NH, true, s); }),
             0, 2.5 * forward_flops});
    cuda::CudnnAttention deterministic(/*deterministic_backward=*/true);
    rep.add({"attention", "cudnn_attention_backward (bf16, causal, deterministic)", sh,
             sampling.median_ms(
                 s, [&] { deterministic.backward(dqkv, dout, qkv, out, lse, nullptr, B, S, C, NH, true, s); }),
             0, 2.5 * forward_flops});
    // DDPLAB_CUDNN_SHAPES=dynamic's graphs at the same shape: what a kernel shared across shapes costs each call.
    cuda::CudnnAttention dynamic(/*deterministic_backward=*/false, cuda::CudnnShapes::kDynamic);
    rep.add({"attention", "cudnn_attention_forward (bf16, causal, dynamic shapes)", sh,
             sampling.median_ms(s, [&] { dynamic.forward(out, lse, qkv, nullptr, B, S, C, NH, true, s); }), 0,
             forward_flops});
    rep.add({"attention", "cudnn_attention_backward (bf16, causal, dynamic shapes)", sh,
             sampling.median_ms(s, [&] { dynamic.backward(dqkv, dout, qkv, out, lse, nullptr, B, S, C, NH, true, s); }),
             0, 2.5 * forward_flops});
    std::printf("  cudnn dynamic shapes at %s: %s\n", sh.c_str(), dynamic.build_stats().describe().c_str());
    bench_cudnn_builds(s, qkv, out, lse, dout, dqkv, B, S, C, NH);
  } else {
    std::printf("  cudnn_attention: skipped: %s\n", why.c_str());
  }

  cuda::GemmContext ctx(cuda::GemmMath::kTf32);
  float *qkv32 = a.random_f32(3 * BSC), *out32 = a.alloc<float>(BSC), *dout32 = a.random_f32(BSC);
  float *dqkv32 = a.alloc<float>(3 * BSC), *att = a.alloc<float>(int64_t{B} * NH * S * S);
  float* ws32 = a.alloc<float>(cuda::attention_backward_workspace_floats(B, S, C, NH));
  rep.add({"attention", "attention_forward (tf32, causal, all S)", sh,
           sampling.median_ms(
               s, [&] { cuda::attention_forward(ctx, out32, att, ws32, qkv32, nullptr, B, S, C, NH, true, s); }),
           0, forward_flops});
  rep.add(
      {"attention", "attention_backward (tf32, causal, all S)", sh,
       sampling.median_ms(
           s, [&] { cuda::attention_backward(ctx, dqkv32, ws32, dout32, qkv32, att, nullptr, B, S, C, NH, true, s); }),
       0, 2.5 * forward_flops});
}

// ---- GEMMs: wrapper vs raw cuBLASLt vs cublasGemmEx --------------------------------------------------------------

// Raw cuBLASLt, the way its documentation's samples call it: descriptors, first heuristic answer, no epilogue.
struct RawLt {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~RawLt() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
  }
};

void bench_gemm(const Sampling& sampling, cudaStream_t s, Arena& a, Report& rep, int B, int C, int OC,
                const char* mode) {
  const bool bf = std::strcmp(mode, "bf16") == 0, tf32 = std::strcmp(mode, "tf32") == 0;
  cuda::GemmContext ctx(tf32 ? cuda::GemmMath::kTf32 : cuda::GemmMath::kFp32);
  const cudaDataType_t type = bf ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  void *inp, *w, *bias, *out, *pre, *dout, *dinp;  // the bias has the output's type (gemm.h)
  if (bf) {
    inp = a.random_bf16(int64_t{B} * C), w = a.random_bf16(int64_t{OC} * C), dout = a.random_bf16(int64_t{B} * OC);
    bias = a.random_bf16(OC + 1);  // one more: the rows with the bias one element along, below
    out = a.alloc<bf16>(int64_t{B} * OC), pre = a.alloc<bf16>(int64_t{B} * OC), dinp = a.alloc<bf16>(int64_t{B} * C);
  } else {
    inp = a.random_f32(int64_t{B} * C), w = a.random_f32(int64_t{OC} * C), dout = a.random_f32(int64_t{B} * OC);
    bias = a.random_f32(OC + 1);
    out = a.alloc<float>(int64_t{B} * OC), pre = a.alloc<float>(int64_t{B} * OC), dinp = a.alloc<float>(int64_t{B} * C);
  }
  float *dweight = a.random_f32(int64_t{OC} * C), *dbias = a.random_f32(OC);
  const double flops = 2.0 * B * C * OC;
  const std::string sh = dims({{"B", B}, {"C", C}, {"OC", OC}});
  const std::string tag = std::string(" (") + mode + ")";
  auto wrap = [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    T *i = static_cast<T*>(inp), *ww = static_cast<T*>(w), *o = static_cast<T*>(out), *p = static_cast<T*>(pre);
    T *d = static_cast<T*>(dout), *di = static_cast<T*>(dinp), *b = static_cast<T*>(bias);
    rep.add({"gemm", "matmul_forward" + tag, sh,
             sampling.median_ms(s, [&] { cuda::matmul_forward<T>(ctx, o, i, ww, nullptr, B, C, OC, s); }), 0, flops});
    // Whether cuBLASLt fused the bias and GELU or our epilogue kernel ran after the GEMM: the row says which.
    const int64_t fallbacks = ctx.fallback_epilogues();
    const double bias_gelu_ms =
        sampling.median_ms(s, [&] { cuda::matmul_bias_gelu_forward<T>(ctx, o, p, i, ww, b, B, C, OC, s); });
    const char* how = ctx.fallback_epilogues() == fallbacks ? ", fused" : ", our epilogue";
    rep.add({"gemm", std::string("matmul_bias_gelu_forward (") + mode + how + ")", sh, bias_gelu_ms, 0, flops});
    // The bias one element along, which cuBLASLt's epilogue cannot read (it wants it aligned): the GEMM, then our
    // epilogue kernel over its output, with GELU and without. What a model whose bias or OC the fused path refuses
    // pays; the row says which ran.
    for (const bool gelu : {true, false}) {
      const int64_t before = ctx.fallback_epilogues();
      const double ms = sampling.median_ms(s, [&] {
        if (gelu)
          cuda::matmul_bias_gelu_forward<T>(ctx, o, p, i, ww, b + 1, B, C, OC, s);
        else
          cuda::matmul_forward<T>(ctx, o, i, ww, b + 1, B, C, OC, s);
      });
      rep.add({"gemm",
               std::string(gelu ? "matmul_bias_gelu_forward (" : "matmul_forward + bias (") + mode +
                   ", bias unaligned" + (ctx.fallback_epilogues() == before ? ", fused" : ", our epilogue") + ")",
               sh, ms, 0, flops});
    }
    // + bias + a residual read by the epilogue (dout stands in for it: [B, OC], random): against the plain forward,
    // what adding the residual stream there costs instead of a pass of its own.
    const int64_t before_residual = ctx.fallback_epilogues();
    const double residual_ms =
        sampling.median_ms(s, [&] { cuda::matmul_residual_forward<T>(ctx, o, i, ww, b, d, B, C, OC, s); });
    rep.add({"gemm",
             std::string("matmul_residual_forward (") + mode +
                 (ctx.fallback_epilogues() == before_residual ? ", fused" : ", our epilogue") + ")",
             sh, residual_ms, 0, flops});
    rep.add({"gemm", "matmul_backward_input" + tag, sh,
             sampling.median_ms(s, [&] { cuda::matmul_backward_input<T>(ctx, di, d, ww, B, C, OC, s); }), 0, flops});
    rep.add({"gemm", "matmul_backward_weight" + tag, sh,
             sampling.median_ms(s, [&] { cuda::matmul_backward_weight<T>(ctx, dweight, d, i, B, C, OC, 0, OC, s); }), 0,
             flops});
    // The backward as the step runs it (TFLOP/s of the GEMM alone, so an epilogue's cost shows as a lower rate): the
    // weight GEMM and the bias gradient (cuBLASLt's BGRADB epilogue in its place ran slower on an H200).
    rep.add({"gemm", "matmul_backward_weight + bias_backward" + tag, sh,
             sampling.median_ms(s,
                                [&] {
                                  cuda::matmul_backward_weight<T>(ctx, dweight, d, i, B, C, OC, 0, OC, s);
                                  cuda::bias_backward<T>(ctx, dbias, d, B, OC, s);
                                }),
             0, flops});
    // Input gradient through the GELU (the MLP's second Linear): the GEMM then gelu_backward, or the DGELU epilogue
    // (pre_gelu: the forward's output buffer, [B, C] here as the layer's input).
    rep.add({"gemm", "matmul_backward_input + gelu_backward" + tag, sh,
             sampling.median_ms(s,
                                [&] {
                                  cuda::matmul_backward_input<T>(ctx, di, d, ww, B, C, OC, s);
                                  cuda::gelu_backward(di, i, di, int64_t{B} * C, s);
                                }),
             0, flops});
    const int64_t before = ctx.fallback_epilogues();
    const double dgelu_ms =
        sampling.median_ms(s, [&] { cuda::matmul_backward_input_dgelu<T>(ctx, di, d, ww, i, B, C, OC, s); });
    rep.add({"gemm",
             std::string("matmul_backward_input_dgelu (") + mode +
                 (ctx.fallback_epilogues() == before ? ", DGELU)" : ", our epilogue)"),
             sh, dgelu_ms, 0, flops});
    if (!bf) return;
    // The heuristic's first answer (every row above) against the best of the first kTimedCandidates (those a timed
    // context tries), each timed alike (bias and epilogues as the step calls them): what a plan that timed them would
    // win, per call. The row names how many ran, the winner (#0: the heuristic's pick) and #0's time; the candidates
    // end at the first the heuristic does not give (or that would fall back to our epilogue).
    const auto best_candidate = [&](const char* name, const std::function<void()>& gemm) {
      double best_ms = 0, first_ms = 0;
      int best = -1, ran = 0;
      for (int k = 0; k < cuda::GemmContext::kTimedCandidates; ++k, ++ran) {
        ctx.set_heuristic_rank(k);
        const int64_t fallbacks = ctx.fallback_epilogues();
        double ms = 0;
        try {
          ms = sampling.median_ms(s, gemm);
        } catch (const std::runtime_error&) {  // no k-th algorithm for the plain GEMM
          break;
        }
        if (ctx.fallback_epilogues() != fallbacks) break;
        if (k == 0) first_ms = ms;
        if (best < 0 || ms < best_ms) best_ms = ms, best = k;
      }
      ctx.set_heuristic_rank(0);
      char first[32];
      std::snprintf(first, sizeof first, "; #0 %.4f ms", first_ms);
      if (best >= 0)
        rep.add({"gemm",
                 std::string(name) + " (" + mode + ", best of " + std::to_string(ran) + ": #" + std::to_string(best) +
                     first + ")",
                 sh, best_ms, 0, flops});
    };
    best_candidate("matmul_forward", [&] { cuda::matmul_forward<T>(ctx, o, i, ww, b, B, C, OC, s); });
    best_candidate("matmul_residual_forward",
                   [&] { cuda::matmul_residual_forward<T>(ctx, o, i, ww, b, d, B, C, OC, s); });
    best_candidate("matmul_bias_gelu_forward",
                   [&] { cuda::matmul_bias_gelu_forward<T>(ctx, o, p, i, ww, b, B, C, OC, s); });
    best_candidate("matmul_backward_input", [&] { cuda::matmul_backward_input<T>(ctx, di, d, ww, B, C, OC, s); });
    best_candidate("matmul_backward_input_dgelu",
                   [&] { cuda::matmul_backward_input_dgelu<T>(ctx, di, d, ww, i, B, C, OC, s); });
    best_candidate("matmul_backward_weight",
                   [&] { cuda::matmul_backward_weight<T>(ctx, dweight, d, i, B, C, OC, 0, OC, s); });
  };
  if (bf)
    wrap(static_cast<bf16*>(nullptr));
  else
    wrap(static_cast<float*>(nullptr));

  // The forward problem, raw: column-major out^T[OC, B] = W^T[C, OC]^T inp^T[C, B] (see gemm.cu).
  RawLt raw;
  cublasCheck(cublasLtMatmulDescCreate(&raw.desc, compute, CUDA_R_32F));
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  cublasCheck(cublasLtMatmulDescSetAttribute(raw.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
  cublasCheck(cublasLtMatmulDescSetAttribute(raw.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
  cublasCheck(cublasLtMatrixLayoutCreate(&raw.la, type, C, OC, C));
  cublasCheck(cublasLtMatrixLayoutCreate(&raw.lb, type, C, B, C));
  cublasCheck(cublasLtMatrixLayoutCreate(&raw.ld, type, OC, B, OC));
  cublasLtMatmulPreference_t pref;
  cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws_bytes = ctx.workspace_bytes();
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                   sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx.lt_handle(), raw.desc, raw.la, raw.lb, raw.ld, raw.ld, pref, 1,
                                             &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  const float one = 1.0f, zero = 0.0f;
  if (found > 0) {
    rep.add({"gemm", "raw cublasLtMatmul" + tag, sh,
             sampling.median_ms(s,
                                [&] {
                                  cublasCheck(cublasLtMatmul(ctx.lt_handle(), raw.desc, &one, w, raw.la, inp, raw.lb,
                                                             &zero, out, raw.ld, out, raw.ld, &result.algo,
                                                             ctx.workspace(), ws_bytes, s));
                                }),
             0, flops});
  }
  cublasHandle_t h = ctx.blas_handle(s);
  rep.add({"gemm", "raw cublasGemmEx" + tag, sh,
           sampling.median_ms(s,
                              [&] {
                                cublasCheck(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, B, C, &one, w, type, C, inp,
                                                         type, C, &zero, out, type, OC, compute, CUBLAS_GEMM_DEFAULT));
                              }),
           0, flops});
}

// The reference copy: the packed map of the rows' own elementwise kernels (one 16-byte load and store a thread over a
// grid-stride loop, kernels/cuda/launch.cuh), launched and timed as the rows are. Not cudaMemcpyAsync: its ~7 us floor
// (copies moving 2.75, 12.6 and 25 MB all took 7.1-7.2 us on an H200, where a kernel bottoms at 3.7-4) set every
// 8-10 us kernel at 80-90% of its size's copy whatever it did.
struct Identity {
  __device__ float operator()(float x) const { return x; }
};
__global__ void copy_kernel(float* dst, const float* src, int64_t n) {
  cuda::detail::map_elements<4>(dst, src, n, Identity{});
}

// The copy kernel between two buffers allocated once (16-byte aligned, as cudaMalloc's): the median ms over `bytes`
// of them, a multiple of 16.
Report::CopyMs copy_kernel_timer(const Sampling& sampling, cudaStream_t s, float* dst, const float* src) {
  return [&sampling, s, src, dst](int64_t bytes) {
    const int64_t n = bytes / 4;
    return sampling.median_ms(s, [&] {
      copy_kernel<<<cuda::detail::grid_size(n / 4 + 1), cuda::detail::kBlockSize, 0, s>>>(dst, src, n);
      cudaCheck(cudaGetLastError());
    });
  };
}

// The HBM's peak in GB/s: the memory clock's two transfers a cycle over the bus's width, as the device gives them; 0
// where it gives neither.
double hbm_peak_gbs(int* mhz, int* bits) {
  int device = 0, khz = 0;
  cudaCheck(cudaGetDevice(&device));
  cudaCheck(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device));
  cudaCheck(cudaDeviceGetAttribute(bits, cudaDevAttrGlobalMemoryBusWidth, device));
  *mhz = khz / 1000;
  return 2.0 * khz * 1e3 * (*bits / 8) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "every CUDA kernel family at training shapes: GB/s against the copy bandwidth, GEMM TFLOP/s against cuBLAS"};
  app.add_option("--reps", opt.reps,
                 "samples per figure (the median is reported), each one call after the L2 is emptied")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--csv", opt.csv, "also write the results to this CSV file");
  app.add_flag("--quick", opt.quick, "every shape 8x smaller (a smoke test)");
  if (const auto code = ddplab::bench::parse_command_line(app, argc, argv, "bench_cuda_kernels")) return *code;
  if (const auto code = ddplab::bench::refuse_output("--csv", opt.csv, "bench_cuda_kernels")) return *code;
  if (!ddplab::bench::report_device("bench_cuda_kernels")) return 2;
  try {
    const int q = opt.quick ? 8 : 1;
    cudaStream_t s;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Arena arena;
    const Sampling sampling(opt.reps, arena);
    const int64_t largest_copy = (int64_t{1} << 30) / q;
    float *src = arena.alloc<float>(largest_copy / 4), *dst = arena.alloc<float>(largest_copy / 4);
    cudaCheck(cudaMemset(src, 0, largest_copy));
    const double memcpy_ms =
        sampling.median_ms(s, [&] { cudaCheck(cudaMemcpyAsync(dst, src, largest_copy, cudaMemcpyDeviceToDevice, s)); });
    const double memcpy_gbs = 2.0 * largest_copy / (memcpy_ms * 1e-3) / 1e9;
    int mhz = 0, bits = 0;
    const double peak_gbs = hbm_peak_gbs(&mhz, &bits);
    Report rep(copy_kernel_timer(sampling, s, dst, src), largest_copy, memcpy_gbs, peak_gbs);
    const long long mib = 1024 / q;
    std::printf("cudaMemcpy device-to-device, %lld MiB: %.1f GB/s (read + write): \"of copy\" below\n", mib,
                memcpy_gbs);
    std::printf(
        "copy kernel (16-byte packed map, as the rows' own), %lld MiB: %.1f GB/s; \"of its size's\" below: that kernel "
        "over the row's own bytes, timed as the row\n",
        mib, rep.copy_gbs_moving(2.0 * largest_copy));
    if (peak_gbs > 0)
      std::printf("HBM peak: %.1f GB/s (2 x %d MHz x %d-bit bus, the device's attributes): \"of peak\" below\n",
                  peak_gbs, mhz, bits);
    else
      std::printf("HBM peak: not given by the device (no \"of peak\" below)\n");
    std::printf(
        "each figure: the median of %d samples, each one call timed alone after a %lld MiB read that leaves none of "
        "its data in the %lld MiB L2 (no call finds the one before's buffers there)\n",
        sampling.reps(), static_cast<long long>(sampling.evict_bytes() >> 20),
        static_cast<long long>(sampling.l2_bytes() >> 20));
    const int N = 8 * 1024 / q, C = 768, V = 50304 / q;
    std::printf("\nrow-wise kernels (GPT-2-small shapes)\n");
    bench_rowwise<float>(sampling, s, arena, rep, N, C, V, "fp32");
    bench_rowwise<bf16>(sampling, s, arena, rep, N, C, V, "bf16");
    std::printf("\nstreaming kernels (a 124M-parameter buffer)\n");
    bench_streaming(sampling, s, arena, rep, int64_t{124} * 1000 * 1000 / q);
    std::printf("\nper-sequence kernels and the bias\n");
    bench_sequence(sampling, s, arena, rep, 8 / std::min(q, 8), 1024 / q, 768);
    std::printf("\nattention (simple: cuBLAS batched GEMMs + masked softmax)\n");
    bench_attention(sampling, s, arena, rep, 8 / std::min(q, 8), 1024 / q, 768, 12);
    std::printf(
        "\nattention, fused (bf16) vs unfused (tf32): causal, all S; TFLOP/s of the causal half (fwd 2 B S^2 C, "
        "bwd 2.5x)\n");
    bench_fused_attention(sampling, s, arena, rep, 8 / std::min(q, 8), 1024 / q, 768, 12);
    std::printf("\nGEMMs: wrapper vs raw cuBLASLt vs cublasGemmEx (TFLOP/s = 2 B C OC / time)\n");
    for (const char* mode : {"fp32", "tf32", "bf16"}) {
      bench_gemm(sampling, s, arena, rep, N, C, C, mode);          // attention projection
      bench_gemm(sampling, s, arena, rep, N, C, 3 * C, mode);      // qkv
      bench_gemm(sampling, s, arena, rep, N, C, 4 * C, mode);      // fc
      bench_gemm(sampling, s, arena, rep, N, 4 * C, C, mode);      // fcproj
      bench_gemm(sampling, s, arena, rep, 128, 1024, 1024, mode);  // the default MLP's hidden layer
    }
    cudaCheck(cudaStreamSynchronize(s));
    cudaCheck(cudaStreamDestroy(s));
    rep.print_goal(0.8);
    if (!opt.csv.empty()) rep.write_csv(opt.csv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
