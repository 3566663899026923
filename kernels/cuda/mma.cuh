// Warp-level tensor-core and copy primitives as PTX (sm_80 and later), each a small inline function so that a kernel
// names what it does and the CPU emulation (tests/emu/cuda_emulation.h) can stand in for it: under nvcc these are
// inline asm; in a host compilation they forward to the emulation, which implements the same fragment layouts (the
// PTX ISA's), so a kernel's own source runs on host threads.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), with
// g = lane / 4 (the group) and q = lane % 4 (the thread in its group):
//   A 16x16 bf16, 4 registers of bf16x2 (the lower half the lower column):
//     a[0] (row g,     cols 2q, 2q+1)     a[1] (row g + 8, cols 2q, 2q+1)
//     a[2] (row g,     cols 2q+8, 2q+9)   a[3] (row g + 8, cols 2q+8, 2q+9)
//   B 16x8 bf16 (k x n), 2 registers: b[0] (rows 2q, 2q+1, col g)   b[1] (rows 2q+8, 2q+9, col g)
//   C, D 16x8 fp32, 4 floats: d[0], d[1] (row g, cols 2q, 2q+1)   d[2], d[3] (row g + 8, cols 2q, 2q+1)
// Two adjacent D fragments (n tiles 2k and 2k+1) of a product hold, rounded to bf16, exactly the A fragment of k step k
// of a product that takes that result as its left operand: which is what keeps attention's P and dS in registers.
//
// ldmatrix.m8n8.x4 (PTX ISA, "ldmatrix"): lanes 8i..8i+7 give the row addresses (16 bytes each, 16-byte aligned) of
// 8x8 bf16 matrix i, whose fragment lands in register i: without .trans lane l holds row l/4, cols 2(l%4), 2(l%4)+1;
// with .trans it holds rows 2(l%4), 2(l%4)+1 of col l/4 (the matrix transposed).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#ifndef __CUDACC__
#ifndef DDPLAB_CUDA_EMULATION
#error "kernels/cuda/mma.cuh outside nvcc runs on the CPU emulation: include tests/emu/cuda_emulation.h first"
#endif
#endif

namespace ddplab::cuda::ptx {

// e^x = 2^(x log2 e): the exponentials of a softmax as exp2_approx of one FMA from each input.
constexpr float kLog2e = 1.4426950408889634f;

// Two floats rounded to bf16 (round to nearest even) in one register, `lo` in the lower half: an A or B fragment
// register.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  static_assert(sizeof(v) == sizeof(u));
  __builtin_memcpy(&u, &v, sizeof(u));
  return u;
}

#ifdef __CUDACC__

// 2^x by the special function unit alone: ex2.approx.ftz.f32, relative error about 2^-22, subnormal inputs and
// results flushed to 0, 2^-inf = +0. exp2f wraps the same instruction in a range check and two multiplies that keep
// subnormal results: three extra instructions per exponential, for softmax weights below 2^-126 that round away anyway.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// d += a b: one warp-wide 16x8x16 product, bf16 operands, fp32 accumulation (all 32 lanes take part).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 bf16 matrices from shared memory; `row` is this lane's row address (see above).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#else
  __trap();
#endif
}

// The same, each matrix transposed on the way.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#if __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#else
  __trap();
#endif
}

// 16 bytes global -> shared without passing through registers (both addresses 16-byte aligned), or 16 zero bytes
// without reading `src` when !from_src. Lands once a later cp_async_wait covers the group it was committed in.
__device__ __forceinline__ void cp_async_16(void* dst_shared, const void* src_global, bool from_src) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst_shared)), "l"(src_global),
               "r"(from_src ? 16 : 0)
               : "memory");
#else
  __trap();
#endif
}

// Closes this thread's group of cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most `kPending` of this thread's committed groups are still in flight (the newest ones). Other
// threads' copies need a barrier after their own wait.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

#else  // the CPU emulation

__device__ __forceinline__ float exp2_approx(float x) { return ::ddplab::emu::exp2_approx(x); }
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  ::ddplab::emu::mma_bf16_16816(d, a, b);
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  ::ddplab::emu::ldmatrix_x4(r, row, false);
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  ::ddplab::emu::ldmatrix_x4(r, row, true);
}
__device__ __forceinline__ void cp_async_16(void* dst_shared, const void* src_global, bool from_src) {
  ::ddplab::emu::cp_async_16(dst_shared, src_global, from_src);
}
__device__ __forceinline__ void cp_async_commit() { ::ddplab::emu::cp_async_commit(); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  ::ddplab::emu::cp_async_wait(kPending);
}

#endif

}  // namespace ddplab::cuda::ptx
