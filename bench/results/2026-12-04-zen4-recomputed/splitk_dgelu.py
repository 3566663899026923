#!/usr/bin/python3
"""The memcheck-only failure of GemmTimedAlgorithmsMatchCpuAndAreKept (../2026-12-04-h200-shared-gpu/sanitizer.log:
"backward input + dGELU", B 129, C 256, OC 72: 1904 of 33024 elements past the bound, the worst -39.1895 bounds at
element 2743), recomputed on the CPU from the test's own operands and bound (tests/gpu/test_cuda_kernels.cpp). A
split-K GEMM that rounds its partial sums to D's type (cuBLASLt's OUTPUT_TYPE reduction, K = 72 in slices of 16)
reproduces it exactly; the same product summed in fp32 passes.

usage: python3 splitk_dgelu.py
"""
import numpy as np

B, C, OC = 129, 256, 72
f32 = np.float32


def mt19937(seed, n):
    """std::mt19937(seed)'s first n outputs."""
    state = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        state.append((1812433253 * (state[-1] ^ (state[-1] >> 30)) + i) & 0xFFFFFFFF)
    out, index = [], 624
    for _ in range(n):
        if index == 624:
            for i in range(624):
                y = (state[i] & 0x80000000) | (state[(i + 1) % 624] & 0x7FFFFFFF)
                state[i] = state[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            index = 0
        y = state[index]
        index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        out.append(y)
    return np.array(out, dtype=np.uint64)


def random_vector(n, lo, hi, seed):
    """tests/gpu/gpu_test_util.h's: std::uniform_real_distribution<float> over std::mt19937 (libstdc++: one draw
    per number, u / 2^32 in float, then u * (hi - lo) + lo in float)."""
    u = mt19937(seed, n).astype(f32) / f32(4294967296.0)
    u = np.minimum(u, np.nextafter(f32(1), f32(0)))
    return u * (f32(hi) - f32(lo)) + f32(lo)


def round_bf16(x):
    bits = np.asarray(x, dtype=f32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(f32)


def gelu_grad(x):  # tanh GELU's derivative in float, as cpu::gelu_backward
    k, a = f32(0.7978845608), f32(0.044715)
    t = np.tanh(k * (x + a * x * x * x))
    return f32(0.5) * (f32(1) + t) + f32(0.5) * x * (f32(1) - t * t) * k * (f32(1) + f32(3) * a * x * x)


weight = round_bf16(random_vector(OC * C, -1, 1, 52 + C)).reshape(OC, C)
dout = round_bf16(random_vector(B * OC, -1, 1, 54 + OC)).reshape(B, OC)
pre = round_bf16(random_vector(B * C, -3, 3, 58 + C)).reshape(B, C)


def dot(k0, k1):
    """dout[:, k0:k1] . weight[k0:k1, :], summed in float in k's order (bf16 products are exact in float)."""
    s = np.zeros((B, C), dtype=f32)
    for o in range(k0, k1):
        s = s + dout[:, o:o + 1] * weight[o:o + 1, :]
    return s


product = dot(0, OC)
abs_dot = sum(np.abs(dout[:, o:o + 1].astype(np.float64) * weight[o:o + 1, :]) for o in range(OC))
want = (product * gelu_grad(pre)).astype(np.float64)
# The test's bound: tol 1e-5 of |dout|.|W| x 1.2, and (4e-3 + 5e-4) of |want| + |product|.
bound = 1e-5 * (abs_dot * 1.2).astype(f32) + (4e-3 + 5e-4) * (np.abs(want) + np.abs(product)) + 1e-7


def report(what, got):
    e = ((got.astype(np.float64) - want) / bound).ravel()
    worst = int(np.argmax(np.abs(e)))
    print(f"{what:<74} {int(np.sum(~(np.abs(e) <= 1))):5d} of {B * C} past the bound, worst {e[worst]:9.4f} "
          f"bounds at element {worst}")


def split_k(slice_k):
    total = np.zeros((B, C), dtype=f32)
    for k in range(0, OC, slice_k):
        total = total + round_bf16(dot(k, min(OC, k + slice_k)))
    return round_bf16(total)


report("one pass, summed in fp32 (no split-K, or the COMPUTE_TYPE reduction)", round_bf16(product * gelu_grad(pre)))
report("split-K, K in slices of 16, partial sums in bf16 (OUTPUT_TYPE reduction)",
       round_bf16(split_k(16) * gelu_grad(pre)))
report("split-K, K in slices of 36, partial sums in bf16", round_bf16(split_k(36) * gelu_grad(pre)))
