#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention alone, per backend, on the problem bench_cuda_kernels times ddplab's
attentions on: bf16, causal, batch 8, 12 heads, 1024 tokens, head size 64, q/k/v as [B, H, S, hs] views into one
[B, S, 3C] tensor (what a GPT-2 block's fused qkv projection yields). Forward and backward (dq, dk, dv from a random
dout) are timed apart with CUDA events: median of --repeat after --warmup. TFLOP/s count the causal half, as
bench_cuda_kernels does: forward 2 * 2 * B * H * (S^2 / 2) * hs, backward 2.5x that.

  bench/gpu/torch_attention.py [--batch 8] [--heads 12] [--seq 1024] [--head-size 64] [--csv out.csv]
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -P and PYTHONSAFEPATH leave this dir out
import torch_bench_util as util  # noqa: E402

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def median_ms(fn, warmup, repeat):
    for _ in range(warmup):
        fn()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2 * repeat)]
    for i in range(repeat):
        events[2 * i].record()
        fn()
        events[2 * i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(events[2 * i].elapsed_time(events[2 * i + 1]) for i in range(repeat))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--csv")
    args = ap.parse_args()
    util.refuse_unwritable(args.csv)
    B, H, S, hs = args.batch, args.heads, args.seq, args.head_size
    C = H * hs
    forward_flops = 2.0 * 2 * B * H * (S * S / 2) * hs
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    print(f"F.scaled_dot_product_attention, bf16, causal, B {B} H {H} S {S} hs {hs}; median of {args.repeat}; "
          f"TFLOP/s of the causal half (fwd 2 B S^2 C, bwd 2.5x)")
    print(f"{'backend':<10} {'fwd ms':>8} {'fwd TFLOP/s':>12} {'bwd ms':>8} {'bwd TFLOP/s':>12} {'f+b TFLOP/s':>12}")
    torch.manual_seed(1)
    qkv = torch.randn(B, S, 3 * C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(B, H, S, hs, device="cuda", dtype=torch.bfloat16)
    rows = []
    for name, backend in BACKENDS.items():
        q, k, v = qkv.view(B, S, 3, H, hs).permute(2, 0, 3, 1, 4)
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), args.warmup,
                                args.repeat)
                bwd = median_ms(lambda: torch.autograd.grad(out, qkv, dout, retain_graph=True), args.warmup,
                                args.repeat)
        except RuntimeError as e:  # a backend that cannot run this problem says why, in one line
            print(f"{name:<10} unavailable: {str(e).splitlines()[0][:100]}")
            continue
        f_t, b_t = forward_flops / fwd / 1e9, 2.5 * forward_flops / bwd / 1e9
        fb = 3.5 * forward_flops / (fwd + bwd) / 1e9
        print(f"{name:<10} {fwd:>8.3f} {f_t:>12.1f} {bwd:>8.3f} {b_t:>12.1f} {fb:>12.1f}")
        rows.append(f"{name},{B},{H},{S},{hs},{fwd:.6f},{bwd:.6f},{f_t:.2f},{b_t:.2f},{fb:.2f}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("backend,batch,heads,seq,head_size,forward_ms,backward_ms,forward_tflops,backward_tflops,"
                    "fwd_bwd_tflops\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
