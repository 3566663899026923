// The CUDA device vocabulary of our kernels for the host compiler, so that g++ compiles a kernel's own source and runs
// it on host threads: a CTA is blockDim.x std::threads (CTAs one after another), __syncthreads and __syncwarp are
// barriers over the CTA's and the warp's threads, warp-collective steps (__shfl_xor_sync, __any_sync, and the PTX primitives of
// kernels/cuda/mma.cuh: mma.sync m16n8k16, ldmatrix, cp.async) are emulated with the PTX ISA's register layouts, and
// dynamic shared memory is one buffer the CTA's threads share. Made to check index arithmetic, fragment layouts,
// shared-memory layouts, masking, barriers and block skipping against a CPU reference without a GPU
// (tests/emu/test_flash_attention_emu.cpp, tests/emu/test_mma_emu.cpp); it says nothing about timing, and little
// about the memory model.
//
// Include this first (before cuda_bf16.h's users and the kernels), from a g++ translation unit; never from nvcc.
//
// What it checks, failing loudly (a message on stderr, then abort) rather than computing something:
//   - every barrier is reached by every thread of its CTA or warp: a thread that returns from the kernel while others
//     wait at a barrier (or arrives after another returned) fails at once; a barrier still incomplete after
//     kBarrierTimeout (threads waiting at different barriers) fails then, instead of hanging;
//   - ldmatrix and cp.async: shared addresses 16-byte aligned and within the launch's dynamic shared memory, cp.async's
//     global source 16-byte aligned;
//   - the launch: a 1-D block of whole warps, at most 1024 threads; dynamic shared memory within 227 KB (an H100's
//     per-block opt-in maximum);
//   - shared memory: poisoned (0xFF bytes: NaN as fp32 and as bf16) before each CTA, so that a read of anything the
//     CTA did not write shows as NaN; the bytes past the launch's size are checked untouched after each CTA; under
//     AddressSanitizer they are poisoned too, so any access past the end fails where it happens.
//
// The warp model: a warp-collective step writes each lane's operands (a shuffle's value, ldmatrix's row address,
// mma.sync's A and B registers) to the warp's exchange buffer, waits at the warp's barrier, and computes the lane's
// own result from every lane's operands: mma.sync rebuilds the A and B tiles from the registers by the ISA's element
// tables and computes the lane's 4 accumulator elements (exact products summed in fp32 in k order after the
// accumulator, not the tensor cores' order); ldmatrix reads the lane's elements at the other lanes' row addresses. So
// a fragment built or consumed with another layout gives another product. cp.async copies land only when a
// cp.async.wait_group retires their group: a tile read before its wait reads stale data or the poison.
#pragma once
#ifdef __CUDACC__
#error "tests/emu/cuda_emulation.h stands in for nvcc's device side: include it from host-compiled code only"
#endif

#define DDPLAB_CUDA_EMULATION 1  // kernels/cuda/mma.cuh forwards its PTX primitives here

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>  // make_uint4, make_float4

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define DDPLAB_EMU_ASAN 1
#endif

// cuda_runtime_api.h (crt/host_defines.h) already makes __global__, __device__, __host__, __shared__ empty for the
// host compiler, __forceinline__ an always-inline and __align__(n) an aligned attribute; not __launch_bounds__.
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

// CUDA's device math declares isnan and isfinite for float in the global namespace, as C's math.h does; <cmath> puts
// them in std.
using std::isfinite;
using std::isnan;

namespace ddplab::emu {

constexpr int kWarpSize = 32;
constexpr size_t kSharedCapacity = 227 * 1024;  // an H100's / H200's opt-in dynamic shared memory per block
// A barrier some thread never reaches is a bug of the kernel; one reached late is a busy host (a block's threads share
// two cores with other tests): the limit only has to end a deadlock well before ctest's 300 s.
constexpr auto kBarrierTimeout = std::chrono::seconds(120);

[[noreturn]] inline void fail(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fputs("CUDA emulation: ", stderr);
  std::vfprintf(stderr, format, args);
  std::fputs("\n", stderr);
  va_end(args);
  std::fflush(stderr);
  std::abort();
}

// The dynamic shared memory: one buffer, defined by the test next to the kernels (DDPLAB_EMU_SHARED_MEMORY), shared
// by the threads of the CTA that runs; `bytes` is the current launch's size.
struct SharedMemory {
  unsigned char* base = nullptr;
  size_t capacity = 0;
  size_t bytes = 0;
};
inline SharedMemory& shared_memory() {
  static SharedMemory memory;
  return memory;
}
inline bool register_shared_memory(unsigned char* base, size_t capacity) {
  shared_memory() = SharedMemory{base, capacity, 0};
  return true;
}

// Fails unless [p, p + bytes) lies within the launch's dynamic shared memory, when p points into the shared buffer
// at all (a pointer elsewhere is global memory, not checked here).
inline void check_shared(const void* p, size_t bytes, const char* what) {
  const SharedMemory& sm = shared_memory();
  const auto* c = static_cast<const unsigned char*>(p);
  if (sm.base == nullptr || c < sm.base || c >= sm.base + sm.capacity) return;
  const size_t offset = static_cast<size_t>(c - sm.base);
  if (offset + bytes > sm.bytes)
    fail("%s: shared-memory access [%zu, %zu) past the launch's %zu bytes of dynamic shared memory", what, offset,
         offset + bytes, sm.bytes);
}

// A barrier over n threads that fails instead of hanging: a thread leaving the kernel while others wait (or before
// others arrive), or an incomplete barrier after kBarrierTimeout. `completion` runs in the last arriving thread
// before any is released.
class Barrier {
 public:
  explicit Barrier(int n, std::function<void()> completion = {}) : n_(n), completion_(std::move(completion)) {}

  void arrive_and_wait(const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    if (left_ > 0) not_reached(what);
    const uint64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      if (completion_) completion_();
      lock.unlock();
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, kBarrierTimeout, [&] { return generation_ != generation; }))
      fail(
          "%s: %d of %d threads arrived within %lld s (CTA %u,%u,%u): threads wait at different barriers, or one is "
          "never reached",
          what, arrived_, n_, static_cast<long long>(kBarrierTimeout.count()), blockIdx_x(), blockIdx_y(),
          blockIdx_z());
  }

  // The calling thread returned from the kernel.
  void leave(const char* what) {
    std::lock_guard<std::mutex> lock(mu_);
    ++left_;
    if (arrived_ > 0) not_reached(what);
  }
  // Between CTAs: every thread is back.
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    left_ = 0;
  }

 private:
  [[noreturn]] void not_reached(const char* what) const {
    fail(
        "%s: %d of %d threads wait at it while %d returned from the kernel (CTA %u,%u,%u): a barrier not reached by "
        "every thread",
        what, arrived_, n_, left_, blockIdx_x(), blockIdx_y(), blockIdx_z());
  }
  static unsigned blockIdx_x();
  static unsigned blockIdx_y();
  static unsigned blockIdx_z();

  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0, left_ = 0;
  uint64_t generation_ = 0;
  std::function<void()> completion_;
};

// What a warp-collective operation (a shuffle, ldmatrix, mma.sync) passes between lanes: each lane's operands in
// its slot. Two sets used in turn, so one barrier per operation suffices: a lane writing set p again (two operations
// later) has passed the barrier of the operation in between, which every lane reaches only after reading set p.
constexpr size_t kExchangeSlotBytes = 32;
struct WarpExchange {
  alignas(16) unsigned char slot[2][kWarpSize][kExchangeSlotBytes];
};

// What the threads of the running CTA share: its barriers and the warps' exchange buffers.
struct Cta {
  explicit Cta(int threads) : block(threads), warps(threads / kWarpSize), exchange(threads / kWarpSize) {
    for (auto& w : warps) w = std::make_unique<Barrier>(kWarpSize);
  }
  Barrier block;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<WarpExchange> exchange;
};

inline thread_local Cta* t_cta = nullptr;
inline thread_local unsigned t_exchanges = 0;  // the calling lane's warp-collective operations so far in its CTA

inline Cta& this_cta() {
  if (t_cta == nullptr) fail("a device function called outside emulate_launch");
  return *t_cta;
}

}  // namespace ddplab::emu

// The built-in variables, per emulated thread.
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

namespace ddplab::emu {
inline unsigned Barrier::blockIdx_x() { return ::blockIdx.x; }
inline unsigned Barrier::blockIdx_y() { return ::blockIdx.y; }
inline unsigned Barrier::blockIdx_z() { return ::blockIdx.z; }
inline int lane_id() { return static_cast<int>(::threadIdx.x) % kWarpSize; }
inline int warp_id() { return static_cast<int>(::threadIdx.x) / kWarpSize; }
inline void require_full_mask(unsigned mask, const char* what) {
  if (mask != 0xffffffffu) fail("%s: only the full warp mask is emulated (got 0x%08x)", what, mask);
}

// A warp-collective step: every lane gives `mine`, and gets every lane's (index = lane) once all 32 have given theirs.
template <typename T>
std::array<T, kWarpSize> exchange_in_warp(const T& mine, const char* what) {
  static_assert(sizeof(T) <= kExchangeSlotBytes && std::is_trivially_copyable_v<T>, "fits a lane's exchange slot");
  Cta& cta = this_cta();
  const int warp = warp_id();
  auto& set = cta.exchange[warp].slot[t_exchanges++ % 2];
  std::memcpy(set[lane_id()], &mine, sizeof(T));
  cta.warps[warp]->arrive_and_wait(what);
  std::array<T, kWarpSize> all;
  for (int l = 0; l < kWarpSize; ++l) std::memcpy(&all[l], set[l], sizeof(T));
  return all;
}
}  // namespace ddplab::emu

// ---- intrinsics ---------------------------------------------------------------------------------------------------

inline void __syncthreads() { ddplab::emu::this_cta().block.arrive_and_wait("__syncthreads"); }

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ddplab::emu::require_full_mask(mask, "__syncwarp");
  ddplab::emu::this_cta().warps[ddplab::emu::warp_id()]->arrive_and_wait("__syncwarp");
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = ddplab::emu::kWarpSize) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>, "a register-sized value");
  ddplab::emu::require_full_mask(mask, "__shfl_xor_sync");
  if (width != ddplab::emu::kWarpSize || lane_mask < 0 || lane_mask >= ddplab::emu::kWarpSize)
    ddplab::emu::fail("__shfl_xor_sync: width %d, lane mask %d: only whole warps are emulated", width, lane_mask);
  return ddplab::emu::exchange_in_warp(var, "__shfl_xor_sync")[ddplab::emu::lane_id() ^ lane_mask];
}

inline bool __any_sync(unsigned mask, bool predicate) {
  ddplab::emu::require_full_mask(mask, "__any_sync");
  bool any = false;
  for (bool p : ddplab::emu::exchange_in_warp(predicate, "__any_sync")) any |= p;
  return any;
}

inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
  ddplab::emu::require_full_mask(mask, "__reduce_add_sync");
  unsigned sum = 0;
  for (unsigned v : ddplab::emu::exchange_in_warp(value, "__reduce_add_sync")) sum += v;
  return sum;
}

inline float atomicAdd(float* address, float value) {
  return std::atomic_ref<float>(*address).fetch_add(value, std::memory_order_relaxed);
}

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

[[noreturn]] inline void __trap() { ddplab::emu::fail("__trap"); }

// ---- PTX primitives (kernels/cuda/mma.cuh): mma.sync m16n8k16 bf16, ldmatrix x4, cp.async ---------------------------
//
// Lanes hold exactly the registers the PTX ISA gives them (layouts in kernels/cuda/mma.cuh); a warp-collective step
// exchanges them (exchange_in_warp), so a fragment built or read with a wrong layout computes a wrong product.

namespace ddplab::emu {

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline uint16_t half_of(uint32_t reg, int half) { return static_cast<uint16_t>(half == 0 ? reg & 0xffffu : reg >> 16); }

// Where element `half` of register `reg` of `lane` sits in the product's tiles (the PTX ISA's m16n8k16 layouts).
struct TileIndex {
  int row, col;
};
inline TileIndex a_fragment_index(int lane, int reg, int half) {  // A 16x16 (m x k)
  return {lane / 4 + 8 * (reg % 2), 2 * (lane % 4) + half + 8 * (reg / 2)};
}
inline TileIndex b_fragment_index(int lane, int reg, int half) {  // B 16x8 (k x n)
  return {2 * (lane % 4) + half + 8 * reg, lane / 4};
}
inline TileIndex d_fragment_index(int lane, int i) {  // C, D 16x8 (m x n)
  return {lane / 4 + 8 * (i / 2), 2 * (lane % 4) + i % 2};
}

// ex2.approx.ftz.f32: subnormal inputs and results flushed to +-0. Exact otherwise: the hardware's 2^-22 relative error
// is below what the tests allow (the attention's bf16 roundings; the cross-entropy's 1e-5, which the GPU tests check
// against the hardware's own).
inline float exp2_approx(float x) {
  const auto flushed = [](float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; };
  return flushed(std::exp2(flushed(x)));
}

// d += a b over the warp: the lanes' A and B registers gathered into the tiles, then each lane's own 4 elements of D,
// exact products summed in fp32 in k order after the accumulator (the tensor cores' order and rounding may differ).
inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  struct Operands {
    uint32_t a[4], b[2];
  };
  const auto all = exchange_in_warp(Operands{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, "mma.sync");
  float A[16][16], B[16][8];
  for (int l = 0; l < kWarpSize; ++l)
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < 4; ++r) {
        const TileIndex i = a_fragment_index(l, r, h);
        A[i.row][i.col] = bf16_bits_to_float(half_of(all[l].a[r], h));
      }
      for (int r = 0; r < 2; ++r) {
        const TileIndex i = b_fragment_index(l, r, h);
        B[i.row][i.col] = bf16_bits_to_float(half_of(all[l].b[r], h));
      }
    }
  const int lane = lane_id();
  for (int e = 0; e < 4; ++e) {
    const TileIndex i = d_fragment_index(lane, e);
    float sum = d[e];
    for (int k = 0; k < 16; ++k) sum += A[i.row][k] * B[k][i.col];
    d[e] = sum;
  }
}

// Fails unless p (of `bytes`) is `alignment`-aligned and lies within the launch's dynamic shared memory.
inline void require_shared(const void* p, size_t bytes, size_t alignment, const char* what) {
  const SharedMemory& sm = shared_memory();
  const auto* c = static_cast<const unsigned char*>(p);
  if (sm.base == nullptr || c < sm.base || c >= sm.base + sm.capacity)
    fail("%s: %p is not a shared-memory address", what, p);
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
    fail("%s: shared-memory address %p is not %zu-byte aligned", what, p, alignment);
  check_shared(p, bytes, what);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: matrix i's rows at the addresses of lanes 8i..8i+7.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool transposed) {
  const char* what = transposed ? "ldmatrix .trans" : "ldmatrix";
  require_shared(row, 16, 16, what);
  const auto rows = exchange_in_warp(static_cast<const uint16_t*>(row), what);
  const int lane = lane_id(), g = lane / 4, q = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const uint16_t lo = transposed ? rows[8 * i + 2 * q][g] : rows[8 * i + g][2 * q];
    const uint16_t hi = transposed ? rows[8 * i + 2 * q + 1][g] : rows[8 * i + g][2 * q + 1];
    r[i] = uint32_t{lo} | uint32_t{hi} << 16;
  }
}

// cp.async: a copy is queued in the issuing thread's open group and lands (read from global, written to shared) only
// when cp_async_wait retires its group, so a kernel that reads a tile before waiting for it reads the shared memory's
// old contents (or its NaN poison), as the hardware may. The hardware may also land it at once: with
// CpAsyncLanding::kAtIssue every copy lands as it is issued, so a kernel that overwrites a tile it still has to read
// (a copy issued too early) reads the new contents. A test runs a kernel both ways.
enum class CpAsyncLanding { kAtWait, kAtIssue };
inline std::atomic<CpAsyncLanding> g_cp_async_landing{CpAsyncLanding::kAtWait};
// While it lives, copies land as `landing` says (the threads of the launches it spans read it).
class CpAsyncLandingScope {
 public:
  explicit CpAsyncLandingScope(CpAsyncLanding landing) : before_(g_cp_async_landing.exchange(landing)) {}
  ~CpAsyncLandingScope() { g_cp_async_landing = before_; }
  CpAsyncLandingScope(const CpAsyncLandingScope&) = delete;
  CpAsyncLandingScope& operator=(const CpAsyncLandingScope&) = delete;

 private:
  CpAsyncLanding before_;
};
struct AsyncCopy {
  void* dst;
  const void* src;  // null: 16 zero bytes
};
// The copy landing: 16 bytes from the source, or 16 zero bytes.
inline void land(const AsyncCopy& c) {
  if (c.src != nullptr)
    std::memcpy(c.dst, c.src, 16);
  else
    std::memset(c.dst, 0, 16);
}
inline thread_local std::vector<AsyncCopy> t_open_group;
inline thread_local std::deque<std::vector<AsyncCopy>> t_committed_groups;

inline void cp_async_16(void* dst_shared, const void* src_global, bool from_src) {
  require_shared(dst_shared, 16, 16, "cp.async (destination)");
  if (from_src && reinterpret_cast<uintptr_t>(src_global) % 16 != 0)
    fail("cp.async: global source %p is not 16-byte aligned", src_global);
  const AsyncCopy copy{dst_shared, from_src ? src_global : nullptr};
  if (g_cp_async_landing == CpAsyncLanding::kAtIssue)
    land(copy);
  else
    t_open_group.push_back(copy);
}
inline void cp_async_commit() {
  t_committed_groups.push_back(std::move(t_open_group));
  t_open_group.clear();
}
inline void cp_async_wait(int pending) {
  while (static_cast<int>(t_committed_groups.size()) > pending) {
    for (const AsyncCopy& c : t_committed_groups.front()) land(c);
    t_committed_groups.pop_front();
  }
}
// A thread leaving its CTA: copies never waited for are dropped (they could land anywhere in the next CTA's memory).
inline void forget_async_copies() {
  t_open_group.clear();
  t_committed_groups.clear();
}

}  // namespace ddplab::emu

// ---- the launch -----------------------------------------------------------------------------------------------------

// In the kernels' namespace, before they are defined: `extern __shared__ ... name[]` inside a kernel is, to g++, a
// block-scope extern declaration, which names this variable (the innermost enclosing namespace's). E.g.
//   namespace ddplab::cuda { namespace { DDPLAB_EMU_SHARED_MEMORY(smem) } }
#define DDPLAB_EMU_SHARED_MEMORY(name)                             \
  alignas(128) unsigned char name[::ddplab::emu::kSharedCapacity]; \
  [[maybe_unused]] const bool name##_emulation_registered = ::ddplab::emu::register_shared_memory(name, sizeof(name));

namespace ddplab::emu {

// Runs kernel(args...) over the grid: CTAs one after another (x fastest), each on block.x threads, with smem_bytes of
// dynamic shared memory. Returns when every CTA is done; fails (abort) on a broken precondition or barrier.
template <typename Kernel, typename... Args>
void emulate_launch(dim3 grid, dim3 block, size_t smem_bytes, Kernel kernel, Args... args) {
  const int threads = static_cast<int>(block.x);
  if (block.y != 1 || block.z != 1 || threads <= 0 || threads % kWarpSize != 0 || threads > 1024)
    fail("launch: block (%u,%u,%u): the emulation runs 1-D blocks of whole warps, at most 1024 threads", block.x,
         block.y, block.z);
  if (grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u)
    fail("launch: grid (%u,%u,%u): past the hardware's limits (2^31 - 1, 65535, 65535)", grid.x, grid.y, grid.z);
  SharedMemory& sm = shared_memory();
  if (smem_bytes > kSharedCapacity || (smem_bytes > 0 && (sm.base == nullptr || smem_bytes > sm.capacity)))
    fail("launch: %zu bytes of dynamic shared memory: more than %zu, or no DDPLAB_EMU_SHARED_MEMORY buffer (%zu bytes)",
         smem_bytes, kSharedCapacity, sm.capacity);
  sm.bytes = smem_bytes;
  const int64_t ctas = int64_t{grid.x} * grid.y * grid.z;
  if (ctas == 0) return;

  Cta cta(threads);
  bool first = true;
  // Between CTAs (every thread out of the kernel): the bytes past the launch's size still poison, the barriers' exits
  // forgotten, the shared memory poisoned again for the next CTA.
  const auto between_ctas = [&] {
    if (sm.base != nullptr) {
#ifdef DDPLAB_EMU_ASAN
      ASAN_UNPOISON_MEMORY_REGION(sm.base, sm.capacity);
#endif
      if (!first)
        for (size_t i = sm.bytes; i < sm.capacity; ++i)
          if (sm.base[i] != 0xFF) fail("a kernel wrote shared-memory byte %zu, past its %zu bytes", i, sm.bytes);
      std::memset(sm.base, 0xFF, sm.capacity);
#ifdef DDPLAB_EMU_ASAN
      ASAN_POISON_MEMORY_REGION(sm.base + sm.bytes, sm.capacity - sm.bytes);
#endif
    }
    first = false;
    cta.block.reset();
    for (auto& w : cta.warps) w->reset();
  };
  Barrier between(threads, between_ctas);

  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int tid = 0; tid < threads; ++tid)
    pool.emplace_back([&, tid] {
      ::threadIdx = uint3{static_cast<unsigned>(tid), 0, 0};
      ::blockDim = block;
      ::gridDim = grid;
      t_cta = &cta;
      for (int64_t c = 0; c < ctas; ++c) {
        between.arrive_and_wait("the launch's barrier between CTAs");
        ::blockIdx = uint3{static_cast<unsigned>(c % grid.x), static_cast<unsigned>(c / grid.x % grid.y),
                           static_cast<unsigned>(c / grid.x / grid.y)};
        t_exchanges = 0;
        kernel(args...);
        forget_async_copies();
        cta.block.leave("__syncthreads");
        cta.warps[tid / kWarpSize]->leave("__syncwarp / __shfl_xor_sync");
      }
      between.arrive_and_wait("the launch's barrier between CTAs");
      t_cta = nullptr;
    });
  for (std::thread& t : pool) t.join();
#ifdef DDPLAB_EMU_ASAN
  if (sm.base != nullptr) ASAN_UNPOISON_MEMORY_REGION(sm.base, sm.capacity);
#endif
}

// The `launch` that a kernel header's launch sequence takes, launch(kernel, grid, block, smem_bytes, args...),
// emulated: what the tests hand the launch sequences in place of layernorm.cu's or flash_attention.cu's <<<>>>.
inline constexpr auto emulated_launch = [](auto kernel, dim3 grid, dim3 block, size_t smem_bytes, auto... args) {
  emulate_launch(grid, block, smem_bytes, kernel, args...);
};

}  // namespace ddplab::emu
