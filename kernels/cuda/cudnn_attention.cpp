// cuDNN's fused attention through its frontend's graph API (cudnn_attention.h has the contract). The frontend is
// header-only; it reaches libcudnn through symbols looked up in the handle this file opens (dynamic loading), so the
// program starts, and every other path runs, where the library is missing.
#include "kernels/cuda/cudnn_attention.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/sequence.h"

#ifdef DDPLAB_HAVE_CUDNN
#include <dlfcn.h>

#include <cudnn_frontend.h>

// The library handle the frontend's dynamic loading resolves every cuDNN call through.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace ddplab::cuda {

namespace {

void check_problem(const char* what, int B, int S, int C, int NH) {
  const std::string sizes = " (B=" + std::to_string(B) + " S=" + std::to_string(S) + " C=" + std::to_string(C) +
                            " NH=" + std::to_string(NH) + ")";
  if (B < 0 || S < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    throw std::invalid_argument(std::string(what) + ": need B, S >= 0 and C > 0 divisible by NH > 0" + sizes);
  if (S == 1)  // cuDNN's own refusal ("s_q = s_kv = 1 is not supported"), made before anything is built
    throw std::invalid_argument(std::string(what) + ": cuDNN's attention takes no single-token sequences (S = 1)" +
                                sizes);
  if (!cudnn_attention_supports_head_size(C / NH))
    throw std::invalid_argument(std::string(what) + ": head size C/NH = " + std::to_string(C / NH) +
                                " is not one cuDNN's attention takes (a multiple of 8 up to 128)" + sizes);
}

void require_aligned(const char* what, const char* name, const void* p) {
  if (p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 != 0)
    throw std::invalid_argument(std::string(what) + ": " + name + " must be a non-null, 16-byte aligned pointer");
}

}  // namespace

std::string CudnnBuildStats::describe() const {
  char text[160];
  std::snprintf(text, sizeof text, "%lld graph%s (%s shapes%s) built in %.2f s, workspace %.1f MiB",
                static_cast<long long>(graphs), graphs == 1 ? "" : "s",
                shapes == CudnnShapes::kDynamic ? "dynamic" : "static",
                built_static ? (", " + std::to_string(built_static) + " of them static").c_str() : "", build_ms / 1000,
                static_cast<double>(workspace_bytes) / (1 << 20));
  return text;
}

#ifdef DDPLAB_HAVE_CUDNN

namespace fe = cudnn_frontend;

namespace {

// Why the library cannot be used here, or "" once it is loaded (asked once per process).
const std::string& cudnn_load_error() {
  static const std::string error = [] {
    // The library CMake found first (a build on this machine), then the loader's search path.
    for (const char* name : {DDPLAB_CUDNN_LIBRARY, "libcudnn.so.9", "libcudnn.so"}) {
      if (void* h = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) {
        fe::cudnn_dlhandle = h;
        return std::string();
      }
    }
    const char* said = dlerror();
    return std::string("libcudnn.so.9 could not be loaded (") + (said ? said : "not found") +
           "): install cuDNN 9 or put its lib folder on LD_LIBRARY_PATH";
  }();
  return error;
}

// The tensors' uids in the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqLenQ, kSeqLenKV };

// [B, NH, S, hs] views into the row-major activations: head h of token (b, t) starts at (b * S + t) * row + h * hs.
std::vector<int64_t> head_major_dims(int B, int NH, int S, int hs) { return {B, NH, S, hs}; }
std::vector<int64_t> head_major_strides(int S, int hs, int64_t row) { return {S * row, hs, row, 1}; }

struct Problem {
  int B, S, C, NH;
  bool causal, padded, backward;
  bool operator<(const Problem& o) const {
    return std::tie(B, S, C, NH, causal, padded, backward) <
           std::tie(o.B, o.S, o.C, o.NH, o.causal, o.padded, o.backward);
  }
  // What a dynamic-shape graph's kernels are compiled for: all but B and S.
  std::tuple<int, int, bool, bool, bool> structure() const { return {C, NH, causal, padded, backward}; }
};

void check(fe::error_t status, const char* what, const Problem& p) {
  if (status.is_good()) return;
  throw std::runtime_error(std::string("cuDNN attention: ") + what + " failed for B=" + std::to_string(p.B) +
                           " S=" + std::to_string(p.S) + " C=" + std::to_string(p.C) + " NH=" + std::to_string(p.NH) +
                           (p.causal ? " causal" : "") + (p.padded ? " padded" : "") + ": " + status.get_message());
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

TensorPtr input(fe::graph::Graph& g, const char* name, Uid uid, std::vector<int64_t> dims,
                std::vector<int64_t> strides) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides));
}

void mark_output(const TensorPtr& t, Uid uid, std::vector<int64_t> dims, std::vector<int64_t> strides) {
  t->set_output(true).set_uid(uid).set_dim(dims).set_stride(strides);
}

// kernel_cache: null for a graph specialised to p's shape; else a dynamic-shape graph whose kernels come from, or go
// into, the cache of p's structure.
std::shared_ptr<fe::graph::Graph> build_graph(cudnnHandle_t handle, const Problem& p, bool deterministic_backward,
                                              const std::shared_ptr<fe::KernelCache>& kernel_cache) {
  const int hs = p.C / p.NH;
  const int64_t qkv_row = 3 * int64_t{p.C}, row = p.C;
  const auto dims = head_major_dims(p.B, p.NH, p.S, hs);
  const auto qkv_strides = head_major_strides(p.S, hs, qkv_row), strides = head_major_strides(p.S, hs, row);
  const std::vector<int64_t> stats_dims{p.B, p.NH, p.S, 1}, stats_strides{int64_t{p.NH} * p.S, p.S, 1, 1};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));

  auto g = new_graph();
  if (kernel_cache) g->set_dynamic_shape_enabled(true).set_kernel_cache(kernel_cache);
  // Q, K and V are the three thirds of one qkv row: the same strides, offset by C and 2C (set when executing).
  auto q = input(*g, "Q", kQ, dims, qkv_strides);
  auto k = input(*g, "K", kK, dims, qkv_strides);
  auto v = input(*g, "V", kV, dims, qkv_strides);
  TensorPtr seq_q, seq_kv;
  if (p.padded) {
    seq_q = g->tensor(fe::graph::Tensor_attributes()
                          .set_name("seq_len_q")
                          .set_uid(kSeqLenQ)
                          .set_dim({p.B, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_data_type(fe::DataType_t::INT32));
    seq_kv = g->tensor(fe::graph::Tensor_attributes()
                           .set_name("seq_len_kv")
                           .set_uid(kSeqLenKV)
                           .set_dim({p.B, 1, 1, 1})
                           .set_stride({1, 1, 1, 1})
                           .set_data_type(fe::DataType_t::INT32));
  }
  if (!p.backward) {
    auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(scale);
    if (p.causal) options.set_causal_mask(true);
    if (p.padded) options.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    auto [o, stats] = g->sdpa(q, k, v, options);
    mark_output(o, kO, dims, strides);
    mark_output(stats, kStats, stats_dims, stats_strides);
    stats->set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = input(*g, "O", kO, dims, strides);
    auto dout = input(*g, "dO", kDO, dims, strides);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim(stats_dims)
                               .set_stride(stats_strides)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("attention_backward")
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(deterministic_backward);
    if (p.causal) options.set_causal_mask(true);
    if (p.padded) options.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
    mark_output(dq, kDQ, dims, qkv_strides);
    mark_output(dk, kDK, dims, qkv_strides);
    mark_output(dv, kDV, dims, qkv_strides);
  }
  check(g->validate(), "validate", p);
  check(g->build_operation_graph(handle), "build_operation_graph", p);
  check(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", p);
  check(g->check_support(handle), "check_support", p);
  check(g->build_plans(handle), "build_plans", p);
  return g;
}

}  // namespace

struct CudnnAttention::Impl {
  struct Built {
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace_bytes;
  };
  Impl(bool deterministic, CudnnShapes shapes) : deterministic_backward(deterministic) { stats.shapes = shapes; }
  bool deterministic_backward;
  cudnnHandle_t handle = nullptr;
  std::map<Problem, Built> graphs;
  // kDynamic: each structure's kernel cache and how many graphs built with it; the cache null once cuDNN refused the
  // structure's first dynamic graph (the cache is finalized against the first graph it builds with, refused or not).
  struct StructureCache {
    std::shared_ptr<fe::KernelCache> cache = std::make_shared<fe::KernelCache>();
    int64_t graphs = 0;
  };
  std::map<std::tuple<int, int, bool, bool, bool>, StructureCache> kernel_caches;
  void* workspace = nullptr;
  CudnnBuildStats stats;

  ~Impl() {
    if (workspace) cudaFree(workspace);
    if (handle) fe::detail::destroy_handle(handle);
  }

  // The graph for p as the object's shapes ask; where cuDNN refuses p's structure a dynamic shape, the static one.
  Built build(const Problem& p) {
    if (stats.shapes == CudnnShapes::kDynamic) {
      StructureCache& structure = kernel_caches[p.structure()];
      if (structure.cache) {
        try {
          Built built = with_workspace_size(build_graph(handle, p, deterministic_backward, structure.cache), p);
          ++structure.graphs;
          return built;
        } catch (const std::runtime_error&) {
          // Refused at its first graph: the structure's other shapes go static without asking again. Refused later:
          // this shape alone.
          if (structure.graphs == 0) structure.cache = nullptr;
        }
      }
      Built built = with_workspace_size(build_graph(handle, p, deterministic_backward, nullptr), p);
      ++stats.built_static;
      return built;
    }
    return with_workspace_size(build_graph(handle, p, deterministic_backward, nullptr), p);
  }

  static Built with_workspace_size(std::shared_ptr<fe::graph::Graph> graph, const Problem& p) {
    Built built{std::move(graph), 0};
    check(built.graph->get_workspace_size(built.workspace_bytes), "get_workspace_size", p);
    return built;
  }

  // Per call: the stream, one map lookup and the execution; the library, handle, graph and workspace come once.
  void run(const Problem& p, std::unordered_map<int64_t, void*>& pack, cudaStream_t stream) {
    if (!handle) {
      if (const std::string& error = cudnn_load_error(); !error.empty())
        throw std::runtime_error("cuDNN attention: " + error);
      if (fe::detail::create_handle(&handle) != CUDNN_STATUS_SUCCESS)
        throw std::runtime_error("cuDNN attention: cudnnCreate failed (no usable GPU, or a cuDNN built for another "
                                 "CUDA)");
    }
    if (fe::detail::set_stream(handle, stream) != CUDNN_STATUS_SUCCESS)
      throw std::runtime_error("cuDNN attention: cudnnSetStream failed");
    const auto start = std::chrono::steady_clock::now();
    auto it = graphs.find(p);
    const bool new_graph = it == graphs.end();
    if (new_graph) {
      it = graphs.emplace(p, build(p)).first;
      ++stats.graphs;
    }
    if (it->second.workspace_bytes > stats.workspace_bytes) {  // the free waits for the whole GPU
      if (workspace) cudaCheck(cudaFree(workspace));
      workspace = nullptr, stats.workspace_bytes = 0;  // a failed allocation must not leave the old size for later
      cudaCheck(cudaMalloc(&workspace, static_cast<size_t>(it->second.workspace_bytes)));
      stats.workspace_bytes = it->second.workspace_bytes;
    }
    if (new_graph)
      stats.build_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    check(it->second.graph->execute(handle, pack, workspace), "execute", p);
  }
};

bool cudnn_attention_available(std::string* why) {
  std::string error = cudnn_load_error();
  if (error.empty()) {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      error = "no usable CUDA device";
    else if (major < 8)
      error = "cuDNN's fused attention needs compute capability 8.0 or later";
  }
  cudaGetLastError();  // a failed query above must not surface at the next launch
  if (why) *why = error;
  return error.empty();
}

CudnnAttention::CudnnAttention(bool deterministic_backward, CudnnShapes shapes)
    : impl_(std::make_unique<Impl>(deterministic_backward, shapes)) {}
CudnnAttention::~CudnnAttention() = default;
CudnnBuildStats CudnnAttention::build_stats() const { return impl_->stats; }

void CudnnAttention::forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const int32_t* lengths, int B,
                             int S, int C, int NH, bool causal, cudaStream_t stream) {
  const char* what = "cudnn_attention_forward";
  check_problem(what, B, S, C, NH);
  if (int64_t{B} * S == 0) return;
  require_aligned(what, "out", out);
  require_aligned(what, "qkv", qkv);
  if (lse == nullptr) throw std::invalid_argument(std::string(what) + ": lse is null");
  auto* q = const_cast<__nv_bfloat16*>(qkv);  // the variant pack takes void*; cuDNN only reads the inputs
  std::unordered_map<int64_t, void*> pack{{kQ, q}, {kK, q + C}, {kV, q + 2 * C}, {kO, out}, {kStats, lse}};
  if (lengths) {
    pack[kSeqLenQ] = const_cast<int32_t*>(lengths);
    pack[kSeqLenKV] = const_cast<int32_t*>(lengths);
  }
  impl_->run({B, S, C, NH, causal, lengths != nullptr, false}, pack, stream);
  // cuDNN leaves the padded query rows as its kernels left them; the contract says exact zeros.
  if (lengths) zero_padded_rows(out, lengths, B, S, C, stream);
}

void CudnnAttention::backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                              const __nv_bfloat16* out, const float* lse, const int32_t* lengths, int B, int S, int C,
                              int NH, bool causal, cudaStream_t stream) {
  const char* what = "cudnn_attention_backward";
  check_problem(what, B, S, C, NH);
  if (int64_t{B} * S == 0) return;
  require_aligned(what, "dqkv", dqkv);
  require_aligned(what, "dout", dout);
  require_aligned(what, "qkv", qkv);
  require_aligned(what, "out", out);
  if (lse == nullptr) throw std::invalid_argument(std::string(what) + ": lse is null");
  auto* q = const_cast<__nv_bfloat16*>(qkv);
  std::unordered_map<int64_t, void*> pack{{kQ, q},
                                          {kK, q + C},
                                          {kV, q + 2 * C},
                                          {kO, const_cast<__nv_bfloat16*>(out)},
                                          {kDO, const_cast<__nv_bfloat16*>(dout)},
                                          {kStats, const_cast<float*>(lse)},
                                          {kDQ, dqkv},
                                          {kDK, dqkv + C},
                                          {kDV, dqkv + 2 * C}};
  if (lengths) {
    pack[kSeqLenQ] = const_cast<int32_t*>(lengths);
    pack[kSeqLenKV] = const_cast<int32_t*>(lengths);
  }
  impl_->run({B, S, C, NH, causal, lengths != nullptr, true}, pack, stream);
  if (lengths) zero_padded_rows(dqkv, lengths, B, S, 3 * C, stream);
}

#else  // built without cuDNN: everything refuses with the reason

struct CudnnAttention::Impl {
  bool deterministic_backward;
  CudnnShapes shapes;
};

bool cudnn_attention_available(std::string* why) {
  if (why)
    *why = "this build has no cuDNN attention: CMake found no cudnn.h or no cuDNN frontend headers "
           "(scripts/install_deps.sh fetches the frontend; docs/GPU.md says where each is looked for)";
  return false;
}

CudnnAttention::CudnnAttention(bool deterministic_backward, CudnnShapes shapes)
    : impl_(std::make_unique<Impl>(Impl{deterministic_backward, shapes})) {}
CudnnAttention::~CudnnAttention() = default;
CudnnBuildStats CudnnAttention::build_stats() const { return {impl_->shapes}; }

void CudnnAttention::forward(__nv_bfloat16*, float*, const __nv_bfloat16*, const int32_t*, int B, int S, int C, int NH,
                             bool, cudaStream_t) {
  check_problem("cudnn_attention_forward", B, S, C, NH);
  std::string why;
  cudnn_attention_available(&why);
  throw std::runtime_error("cudnn_attention_forward: " + why);
}

void CudnnAttention::backward(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                              const float*, const int32_t*, int B, int S, int C, int NH, bool, cudaStream_t) {
  check_problem("cudnn_attention_backward", B, S, C, NH);
  std::string why;
  cudnn_attention_available(&why);
  throw std::runtime_error("cudnn_attention_backward: " + why);
}

#endif

}  // namespace ddplab::cuda
