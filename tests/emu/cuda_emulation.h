// The CUDA device vocabulary of our kernels for the host compiler, so that g++ compiles a kernel's own source and runs
// it on the CPU: CTAs one after another, a CTA's blockDim.x threads as fibers (ucontext) on the launching thread,
// __syncthreads and __syncwarp barriers over the CTA's and the warp's threads, warp-collective steps (__shfl_xor_sync,
// __any_sync, __ballot_sync, and the PTX primitives of kernels/cuda/mma.cuh: mma.sync m16n8k16, ldmatrix, cp.async)
// emulated with the PTX ISA's register layouts, and dynamic shared memory one buffer the CTA's threads share. Made to
// check index arithmetic, fragment layouts, shared-memory layouts, masking, barriers and block skipping against a CPU
// reference without a GPU (tests/emu/test_flash_attention_emu.cpp, tests/emu/test_mma_emu.cpp); it says nothing about
// timing, and little about the memory model.
//
// Include this first (before cuda_bf16.h's users and the kernels), from a g++ translation unit; never from nvcc.
//
// The schedule: a thread runs until it waits at a barrier (__syncthreads, __syncwarp, a warp-collective step) or
// returns from the kernel; then the lowest-numbered thread that can run goes on, the highest in odd CTAs; a barrier's
// threads can run again once all of them arrived. So from one __syncthreads to the next the warps run one after
// another, each whole, in ascending order in even CTAs and descending in odd ones, and a warp's lanes run in the same
// order from one of its collective steps to the next. Of two threads that touch the same shared memory with no
// barrier between them, each goes first in one of the two orders: a grid of two CTAs or more runs both, so a missing
// barrier reads the poison, stale data, or data written too early, whichever thread is the lower. It is
// deterministic: a launch computes the same bits every run, atomicAdd's order included.
//
// What it checks, failing loudly (a message on stderr, then abort) rather than computing something:
//   - every barrier is reached by every thread of its CTA or warp: a thread that returns from the kernel while others
//     wait at a barrier, or arrives at one after another thread of it returned, fails at once; so do lanes of a warp
//     at different collective steps (a shuffle in some, an mma.sync in others); when no thread can run and some have
//     not returned (threads wait at different barriers), the launch fails naming the barriers and who waits at each;
//   - ldmatrix and cp.async: shared addresses 16-byte aligned and within the launch's dynamic shared memory, cp.async's
//     global source 16-byte aligned; sm_90's float4 atomicAdd: a global address, 16-byte aligned;
//   - the launch: a 1-D block of whole warps, at most 1024 threads; dynamic shared memory within 227 KB (an H100's
//     per-block opt-in maximum);
//   - shared memory: poisoned (0xFF bytes: NaN as fp32 and as bf16) before each CTA, so that a read of anything the
//     CTA did not write shows as NaN; the bytes past the launch's size are checked untouched after the launch; under
//     AddressSanitizer they are poisoned too, so any access past the end fails where it happens.
// What it cannot see: threads never interleave between barriers, so only those two orders run. A race that needs
// another interleaving (two writers of one word, a read of half a write), fences and the memory model's orderings,
// a dependence between lanes of a warp across a shuffle or an mma.sync (no __syncwarp between: the lanes run in turn
// around it, as around a barrier) and a dependence between CTAs all pass; a thread that spins until another writes
// hangs, as only barriers switch threads. A thread's stack is 256 KiB with a guard page below it: a kernel whose locals
// overflow it dies of SIGSEGV.
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
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector_functions.h>  // make_uint4, make_float4

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>  // __sanitizer_start_switch_fiber
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

// The built-in variables: the running CTA's, and threadIdx the running thread's (set at each switch).
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

namespace ddplab::emu {

constexpr int kWarpSize = 32;
constexpr size_t kSharedCapacity = 227 * 1024;  // an H100's / H200's opt-in dynamic shared memory per block
// A thread's stack: many times the kernels' locals (the attention's fragment arrays, the mma emulation's tiles: a few
// KB); only the pages a thread touches are ever backed.
constexpr size_t kStackBytes = 256 * 1024;

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

// A cp.async copy, queued until its group is waited for (cp_async_16 below): 16 bytes to shared memory.
struct AsyncCopy {
  void* dst;
  const void* src;  // null: 16 zero bytes
};
inline void land(const AsyncCopy& c) {
  if (c.src != nullptr)
    std::memcpy(c.dst, c.src, 16);
  else
    std::memset(c.dst, 0, 16);
}

// A barrier over threads [first, first + count) of the CTA: __syncthreads' over all of them, a warp's over its lanes.
struct Barrier {
  int first = 0, count = 0;
  int arrived = 0;        // threads waiting at it
  int returned = 0;       // threads that returned from the kernel: it can never complete again in this CTA
  const char* what = "";  // what the waiting threads called
};

// What a warp-collective operation (a shuffle, ldmatrix, mma.sync) passes between lanes: each lane's operands in
// its slot. Two sets used in turn, so one barrier per operation suffices: a lane writing set p again (two operations
// later) has passed the barrier of the operation in between, which every lane reaches only after reading set p.
constexpr size_t kExchangeSlotBytes = 32;
struct WarpExchange {
  alignas(16) unsigned char slot[2][kWarpSize][kExchangeSlotBytes];
};

// Where a context resumes: the registers swapcontext saves, and for AddressSanitizer the stack it runs on.
struct Context {
  ucontext_t registers;
#ifdef DDPLAB_EMU_ASAN
  void* fake_stack = nullptr;
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
#endif
};

// A thread of the running CTA: its context, and what the emulation keeps per thread.
struct Fiber {
  Context context;
  unsigned char* stack = nullptr;     // kStackBytes, a guard page below
  unsigned exchanges = 0;             // its warp-collective operations so far in the CTA: which exchange set is next
  std::vector<AsyncCopy> open_group;  // cp.async copies issued since its last commit
  std::deque<std::vector<AsyncCopy>> committed_groups;
};

// A CTA's threads as fibers, their barriers and the warps' exchange buffers, and the scheduler that runs them on the
// launching thread. Made once a launch, run once for each of its CTAs.
class Cta {
 public:
  explicit Cta(int threads);
  ~Cta() { munmap(stacks_, stacks_bytes_); }
  Cta(const Cta&) = delete;
  Cta& operator=(const Cta&) = delete;

  // Runs body(arg) on every thread (threadIdx.x each), the lowest-numbered runnable one first, or the highest if
  // `descending`; returns when all returned from it.
  void run(void (*body)(void*), void* arg, bool descending);
  Fiber& running() { return fibers_[running_]; }
  // The running thread, calling `what`, waits at `barrier` until all of its threads arrived.
  void wait_at(Barrier& barrier, const char* what);

  Barrier block;
  std::vector<Barrier> warps;
  std::vector<WarpExchange> exchange;

 private:
  static void fiber_main();
  [[noreturn]] void returned_from_kernel();
  // The running thread stopped (waits, or returned: `ends`): the next runnable one goes on. Returns when the running
  // thread is resumed, at once when it is still the one to run.
  void run_next(bool ends);
  int next_runnable() const;
  void stop(int thread);
  void release(const Barrier& barrier);
  void switch_context(Context& from, Context& to, bool from_ends);
  void finish_switch(void* fake_stack);
  std::string name(const Barrier& barrier) const;
  [[noreturn]] void not_reached(const Barrier& barrier) const;
  [[noreturn]] void deadlock() const;

  const int threads_;
  std::vector<Fiber> fibers_;  // never resized: a ucontext_t points into itself
  Context launcher_;
  unsigned char* stacks_ = nullptr;
  size_t stacks_bytes_ = 0;
  void (*body_)(void*) = nullptr;
  void* arg_ = nullptr;
  bool descending_ = false;
  int running_ = -1;
  int returned_ = 0;
  uint32_t runnable_warps_ = 0;                // bit w: warp w has a runnable lane
  std::array<uint32_t, 32> runnable_lanes_{};  // bit l of [w]: lane l of warp w can run
#ifdef DDPLAB_EMU_ASAN
  Context* switching_from_ = nullptr;
#endif
};

inline thread_local Cta* t_cta = nullptr;

inline Cta& this_cta() {
  if (t_cta == nullptr) fail("a device function called outside emulate_launch");
  return *t_cta;
}

inline Cta::Cta(int threads)
    : warps(threads / kWarpSize), exchange(threads / kWarpSize), threads_(threads), fibers_(threads) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), each = page + kStackBytes;
  stacks_bytes_ = each * threads;
  void* const stacks =
      mmap(nullptr, stacks_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) fail("launch: no memory for %d threads' stacks (%zu bytes)", threads, stacks_bytes_);
  stacks_ = static_cast<unsigned char*>(stacks);
  for (int t = 0; t < threads; ++t) {
    unsigned char* const guard = stacks_ + each * t;  // the stack grows down to it
    if (mprotect(guard, page, PROT_NONE) != 0) fail("launch: no guard page for a thread's stack");
    Fiber& f = fibers_[t];
    f.stack = guard + page;
    getcontext(&f.context.registers);  // makecontext's starting point, once: each CTA makes it afresh from there
    f.context.registers.uc_stack.ss_sp = f.stack;
    f.context.registers.uc_stack.ss_size = kStackBytes;
    f.context.registers.uc_link = nullptr;
#ifdef DDPLAB_EMU_ASAN
    f.context.stack_bottom = f.stack;
    f.context.stack_size = kStackBytes;
#endif
  }
  block = Barrier{0, threads};
  for (int w = 0; w < threads / kWarpSize; ++w) warps[w] = Barrier{w * kWarpSize, kWarpSize};
}

inline void Cta::run(void (*body)(void*), void* arg, bool descending) {
  body_ = body;
  arg_ = arg;
  descending_ = descending;
  block.arrived = block.returned = 0;
  for (Barrier& w : warps) w.arrived = w.returned = 0;
  for (Fiber& f : fibers_) {
    f.exchanges = 0;
    makecontext(&f.context.registers, &Cta::fiber_main, 0);
  }
  returned_ = 0;
  release(block);
  running_ = next_runnable();
  ::threadIdx = uint3{static_cast<unsigned>(running_), 0, 0};
  switch_context(launcher_, fibers_[running_].context, false);
}

inline void Cta::fiber_main() {
  Cta& cta = *t_cta;
  cta.finish_switch(nullptr);
  cta.body_(cta.arg_);
  cta.returned_from_kernel();
}

inline void Cta::wait_at(Barrier& barrier, const char* what) {
  if (barrier.arrived > 0 && barrier.what != what && std::strcmp(barrier.what, what) != 0)
    fail("%s and %s at once in warp %d (CTA %u,%u,%u): a warp's lanes at different collective steps", barrier.what,
         what, barrier.first / kWarpSize, ::blockIdx.x, ::blockIdx.y, ::blockIdx.z);
  barrier.what = what;
  ++barrier.arrived;
  if (barrier.returned > 0) not_reached(barrier);
  stop(running_);
  if (barrier.arrived == barrier.count) {
    barrier.arrived = 0;
    release(barrier);
  }
  run_next(false);
}

inline void Cta::returned_from_kernel() {
  Fiber& self = running();
  self.open_group.clear();  // copies never waited for are dropped: they could land anywhere in the next CTA's memory
  self.committed_groups.clear();
  stop(running_);
  ++returned_;
  for (Barrier* b : {&block, &warps[running_ / kWarpSize]}) {
    ++b->returned;
    if (b->arrived > 0) not_reached(*b);
  }
  run_next(true);
  fail("a thread resumed after it returned from the kernel");
}

inline void Cta::run_next(bool ends) {
  const int from = running_, next = next_runnable();
  if (next == from) return;
  if (next < 0 && returned_ < threads_) deadlock();
  running_ = next;
  if (next >= 0) ::threadIdx = uint3{static_cast<unsigned>(next), 0, 0};
  switch_context(fibers_[from].context, next >= 0 ? fibers_[next].context : launcher_, ends);
}

inline int Cta::next_runnable() const {
  if (runnable_warps_ == 0) return -1;
  const auto pick = [this](uint32_t bits) {
    return descending_ ? 31 - std::countl_zero(bits) : std::countr_zero(bits);
  };
  const int w = pick(runnable_warps_);
  return w * kWarpSize + pick(runnable_lanes_[w]);
}

inline void Cta::stop(int thread) {
  const int w = thread / kWarpSize;
  runnable_lanes_[w] &= ~(1u << thread % kWarpSize);
  if (runnable_lanes_[w] == 0) runnable_warps_ &= ~(1u << w);
}

inline void Cta::release(const Barrier& barrier) {
  for (int w = barrier.first / kWarpSize; w < (barrier.first + barrier.count) / kWarpSize; ++w) {
    runnable_lanes_[w] = ~0u;
    runnable_warps_ |= 1u << w;
  }
}

// Saves the running context in `from` and resumes `to`; returns when `from` is resumed. `from_ends`: it never is (its
// thread returned), so ASan drops its fake stack.
inline void Cta::switch_context(Context& from, Context& to, [[maybe_unused]] bool from_ends) {
#ifdef DDPLAB_EMU_ASAN
  switching_from_ = &from;
  __sanitizer_start_switch_fiber(from_ends ? nullptr : &from.fake_stack, to.stack_bottom, to.stack_size);
  swapcontext(&from.registers, &to.registers);
  finish_switch(from.fake_stack);
#else
  swapcontext(&from.registers, &to.registers);
#endif
}

// In the context that was switched to: ASan learns the stack of the one it came from (the launcher's, the first time).
inline void Cta::finish_switch([[maybe_unused]] void* fake_stack) {
#ifdef DDPLAB_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, &switching_from_->stack_bottom, &switching_from_->stack_size);
#endif
}

inline std::string Cta::name(const Barrier& barrier) const {
  if (&barrier == &block) return barrier.what;
  return "warp " + std::to_string(barrier.first / kWarpSize) + "'s " + barrier.what;
}

inline void Cta::not_reached(const Barrier& barrier) const {
  fail(
      "%s: %d of %d threads wait at it while %d returned from the kernel (CTA %u,%u,%u): a barrier not reached by "
      "every thread",
      name(barrier).c_str(), barrier.arrived, barrier.count, barrier.returned, ::blockIdx.x, ::blockIdx.y,
      ::blockIdx.z);
}

inline void Cta::deadlock() const {
  std::string waiting;
  const auto add = [&](const Barrier& b) {
    if (b.arrived == 0) return;
    waiting += (waiting.empty() ? "" : ", ") + name(b) + " holds " + std::to_string(b.arrived) + " of " +
               std::to_string(b.count);
  };
  add(block);
  for (const Barrier& w : warps) add(w);
  fail("no thread can go on (CTA %u,%u,%u): %s: threads wait at different barriers", ::blockIdx.x, ::blockIdx.y,
       ::blockIdx.z, waiting.c_str());
}

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
  auto& set = cta.exchange[warp].slot[cta.running().exchanges++ % 2];
  std::memcpy(set[lane_id()], &mine, sizeof(T));
  cta.wait_at(cta.warps[warp], what);
  std::array<T, kWarpSize> all;
  for (int l = 0; l < kWarpSize; ++l) std::memcpy(&all[l], set[l], sizeof(T));
  return all;
}
}  // namespace ddplab::emu

// ---- intrinsics ---------------------------------------------------------------------------------------------------

inline void __syncthreads() {
  ddplab::emu::Cta& cta = ddplab::emu::this_cta();
  cta.wait_at(cta.block, "__syncthreads");
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ddplab::emu::require_full_mask(mask, "__syncwarp");
  ddplab::emu::Cta& cta = ddplab::emu::this_cta();
  cta.wait_at(cta.warps[ddplab::emu::warp_id()], "__syncwarp");
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

inline unsigned __ballot_sync(unsigned mask, bool predicate) {
  ddplab::emu::require_full_mask(mask, "__ballot_sync");
  unsigned bits = 0;
  const auto all = ddplab::emu::exchange_in_warp(predicate, "__ballot_sync");
  for (int l = 0; l < ddplab::emu::kWarpSize; ++l) bits |= unsigned{all[l]} << l;
  return bits;
}

inline int __ffs(int x) { return __builtin_ffs(x); }  // 1 + the lowest set bit's index; 0 for 0

inline float atomicAdd(float* address, float value) {
  return std::atomic_ref<float>(*address).fetch_add(value, std::memory_order_relaxed);
}

// sm_90's vector atomicAdd (the CUDA C++ Programming Guide's float4 overload): global memory only, 16-byte aligned,
// each of the four elements atomic on its own (not the 16 bytes as one). The emulation stands for an H100 / H200, so
// a kernel takes this path here as it does there; a shared or misaligned address fails, where the scalar fallback
// would pass.
inline float4 atomicAdd(float4* address, float4 value) {
  const ddplab::emu::SharedMemory& sm = ddplab::emu::shared_memory();
  const auto* c = reinterpret_cast<const unsigned char*>(address);
  if (sm.base != nullptr && c >= sm.base && c < sm.base + sm.capacity)
    ddplab::emu::fail("atomicAdd(float4*): %p is a shared-memory address (sm_90 has it for global memory only)",
                      static_cast<void*>(address));
  if (reinterpret_cast<uintptr_t>(address) % 16 != 0)
    ddplab::emu::fail("atomicAdd(float4*): %p is not 16-byte aligned", static_cast<void*>(address));
  float* const f = reinterpret_cast<float*>(address);
  return make_float4(atomicAdd(f, value.x), atomicAdd(f + 1, value.y), atomicAdd(f + 2, value.z),
                     atomicAdd(f + 3, value.w));
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
inline CpAsyncLanding g_cp_async_landing = CpAsyncLanding::kAtWait;
// While it lives, copies land as `landing` says.
class CpAsyncLandingScope {
 public:
  explicit CpAsyncLandingScope(CpAsyncLanding landing) : before_(std::exchange(g_cp_async_landing, landing)) {}
  ~CpAsyncLandingScope() { g_cp_async_landing = before_; }
  CpAsyncLandingScope(const CpAsyncLandingScope&) = delete;
  CpAsyncLandingScope& operator=(const CpAsyncLandingScope&) = delete;

 private:
  CpAsyncLanding before_;
};
inline void cp_async_16(void* dst_shared, const void* src_global, bool from_src) {
  require_shared(dst_shared, 16, 16, "cp.async (destination)");
  if (from_src && reinterpret_cast<uintptr_t>(src_global) % 16 != 0)
    fail("cp.async: global source %p is not 16-byte aligned", src_global);
  const AsyncCopy copy{dst_shared, from_src ? src_global : nullptr};
  if (g_cp_async_landing == CpAsyncLanding::kAtIssue)
    land(copy);
  else
    this_cta().running().open_group.push_back(copy);
}
inline void cp_async_commit() {
  Fiber& self = this_cta().running();
  self.committed_groups.push_back(std::move(self.open_group));
  self.open_group.clear();
}
inline void cp_async_wait(int pending) {
  Fiber& self = this_cta().running();
  while (static_cast<int>(self.committed_groups.size()) > pending) {
    for (const AsyncCopy& c : self.committed_groups.front()) land(c);
    self.committed_groups.pop_front();
  }
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

  // The bytes past the launch's size poisoned once, checked after its last CTA; under ASan, unaddressable meanwhile.
  if (sm.base != nullptr) {
#ifdef DDPLAB_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(sm.base, sm.capacity);
#endif
    std::memset(sm.base, 0xFF, sm.capacity);
#ifdef DDPLAB_EMU_ASAN
    ASAN_POISON_MEMORY_REGION(sm.base + sm.bytes, sm.capacity - sm.bytes);
#endif
  }
  Cta cta(threads);
  auto body = [&] { kernel(args...); };
  ::blockDim = block;
  ::gridDim = grid;
  t_cta = &cta;
  for (int64_t c = 0; c < ctas; ++c) {
    if (sm.base != nullptr && c > 0) std::memset(sm.base, 0xFF, sm.bytes);
    ::blockIdx = uint3{static_cast<unsigned>(c % grid.x), static_cast<unsigned>(c / grid.x % grid.y),
                       static_cast<unsigned>(c / grid.x / grid.y)};
    // Ascending in even CTAs, descending in odd ones: a missing barrier shows whichever thread is the lower.
    cta.run([](void* f) { (*static_cast<decltype(body)*>(f))(); }, &body, c % 2 == 1);
  }
  t_cta = nullptr;
  if (sm.base != nullptr) {
#ifdef DDPLAB_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(sm.base, sm.capacity);
#endif
    for (size_t i = sm.bytes; i < sm.capacity; ++i)
      if (sm.base[i] != 0xFF) fail("a kernel wrote shared-memory byte %zu, past its %zu bytes", i, sm.bytes);
  }
}

// The `launch` that a kernel header's launch sequence takes, launch(kernel, grid, block, smem_bytes, args...),
// emulated: what the tests hand the launch sequences in place of layernorm.cu's or flash_attention.cu's <<<>>>.
inline constexpr auto emulated_launch = [](auto kernel, dim3 grid, dim3 block, size_t smem_bytes, auto... args) {
  emulate_launch(grid, block, smem_bytes, kernel, args...);
};

}  // namespace ddplab::emu
