#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention alone, per backend, on the problem bench_cuda_kernels times ddplab's
attentions on: bf16, causal, batch 8, 12 heads, 1024 tokens, head size 64, q/k/v as [B, H, S, hs] views into one
[B, S, 3C] tensor (what a GPT-2 block's fused qkv projection yields). Forward and backward (the gradient of qkv from
a random dout) are each measured two ways, per backend:

- events: CUDA events around each call, median of --repeat after --warmup. What a PyTorch user's call costs on the
  stream: the kernels, the GPU's idle time between them while the host launches the next (autograd's work between
  the backward's launches), and the copies that assemble dq, dk and dv into the [B, S, 3C] gradient of qkv.
- kernels: the device time of each kernel (and memcpy/memset) the call launches, from PyTorch's profiler (CUPTI),
  summed per call and averaged over --repeat profiled calls, each kernel printed under its row with its ms. What the
  GPU spent: the figure bench_cuda_kernels' cuDNN and ddplab rows are (device time of one kernel call, no host), so
  the one to set beside them; the backward's still includes the gradient's assembly copies, listed by name. Every
  backend's events are timed first, then all are profiled in one session: a profiler session may leave its launch
  callbacks behind, which would lengthen event-timed calls after it.

TFLOP/s count the causal half, as bench_cuda_kernels does: forward 2 * 2 * B * H * (S^2 / 2) * hs, backward 2.5x
that, f+b 3.5x over the two times' sum; the events' over the events' ms, the kernels' over the kernels' ms. Where the
profiler cannot run (no CUPTI), one line says why and the event columns stand alone. The CSV keeps its first ten
columns (the events') and appends forward_kernel_ms, backward_kernel_ms, forward_kernel_tflops,
backward_kernel_tflops, fwd_bwd_kernel_tflops, forward_kernels, backward_kernels (the last two "name=ms" joined by
';', commas dropped; the kernel fields empty where the profiler did not run).

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
LISTED_KERNELS = 6  # under each row, per direction, the largest first


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


def sdpa_calls(qkv, dout, heads):
    """The forward and the backward call, q/k/v as views into qkv; the forward run once for the backward's graph
    (under the caller's sdpa_kernel: the backend is picked there)."""
    B, S, three_c = qkv.shape
    q, k, v = qkv.view(B, S, 3, heads, three_c // 3 // heads).permute(2, 0, 3, 1, 4)

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    out = forward()

    def backward():
        return torch.autograd.grad(out, qkv, dout, retain_graph=True)

    return forward, backward


def under(backend, fn):
    def call():
        with sdpa_kernel(backend):
            return fn()
    return call


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
    print(f"F.scaled_dot_product_attention, bf16, causal, B {B} H {H} S {S} hs {hs}; TFLOP/s of the causal half "
          f"(fwd 2 B S^2 C, bwd 2.5x)")
    print(f"events: CUDA events around each call, median of {args.repeat}; kernels (below): the device time of the "
          f"call's kernels (PyTorch's profiler), mean of {args.repeat} calls, each kernel listed under its row")
    columns = f"{'fwd ms':>8} {'fwd TFLOP/s':>12} {'bwd ms':>8} {'bwd TFLOP/s':>12} {'f+b TFLOP/s':>12}"
    print(f"{'events':<10} {columns}")
    torch.manual_seed(1)
    qkv = torch.randn(B, S, 3 * C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(B, H, S, hs, device="cuda", dtype=torch.bfloat16)

    def tflops(fwd, bwd):
        return forward_flops / fwd / 1e9, 2.5 * forward_flops / bwd / 1e9, 3.5 * forward_flops / (fwd + bwd) / 1e9

    def write_csv(rows):
        if args.csv:
            with open(args.csv, "w") as f:
                f.write("backend,batch,heads,seq,head_size,forward_ms,backward_ms,forward_tflops,backward_tflops,"
                        "fwd_bwd_tflops,forward_kernel_ms,backward_kernel_ms,forward_kernel_tflops,"
                        "backward_kernel_tflops,fwd_bwd_kernel_tflops,forward_kernels,backward_kernels\n" +
                        "".join(row + "\n" for row in rows.values()))

    # Every backend's events first, each row printed and the CSV written as measured, so that nothing measured is lost
    # to the profiler after them.
    rows, profiled_calls = {}, {}
    for name, backend in BACKENDS.items():
        try:
            with sdpa_kernel(backend):
                forward, backward = sdpa_calls(qkv, dout, H)
                fwd = median_ms(forward, args.warmup, args.repeat)
                bwd = median_ms(backward, args.warmup, args.repeat)
        except RuntimeError as e:  # a backend that cannot run this problem says why, in one line
            print(f"{name:<10} unavailable: {str(e).splitlines()[0][:100]}")
            continue
        f_t, b_t, fb = tflops(fwd, bwd)
        print(f"{name:<10} {fwd:>8.3f} {f_t:>12.1f} {bwd:>8.3f} {b_t:>12.1f} {fb:>12.1f}", flush=True)
        rows[name] = f"{name},{B},{H},{S},{hs},{fwd:.6f},{bwd:.6f},{f_t:.2f},{b_t:.2f},{fb:.2f},,,,,,,"
        write_csv(rows)
        profiled_calls[f"{name} fwd"], profiled_calls[f"{name} bwd"] = under(backend, forward), under(backend, backward)
    # Then one profiling session for all: the profiler may leave CUPTI's callbacks on the launches after it, which
    # would lengthen an event-timed call that waits on its host's launches.
    if not profiled_calls:
        return
    try:
        kernels = util.kernel_times_each(profiled_calls, args.repeat)
    except Exception as e:  # the profiler's failure, whatever its kind: one line, the events' rows kept
        print(f"kernels not timed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]}")
        return
    print(f"{'kernels':<10} {columns}")
    for name in rows:
        fwd_kernels, bwd_kernels = kernels[f"{name} fwd"], kernels[f"{name} bwd"]
        fwd_k, bwd_k = sum(ms for _, ms in fwd_kernels), sum(ms for _, ms in bwd_kernels)
        fk_t, bk_t, fbk = tflops(fwd_k, bwd_k)
        print(f"{name:<10} {fwd_k:>8.4f} {fk_t:>12.1f} {bwd_k:>8.4f} {bk_t:>12.1f} {fbk:>12.1f}")
        for direction, listed in (("fwd", fwd_kernels), ("bwd", bwd_kernels)):
            for kernel, ms in listed[:LISTED_KERNELS]:
                print(f"    {direction} {ms:>8.4f} ms  {util.short_kernel_name(kernel)}")
            if len(listed) > LISTED_KERNELS:  # the math backend's dozens of small ones; the CSV lists them all
                rest = listed[LISTED_KERNELS:]
                print(f"    {direction} {sum(ms for _, ms in rest):>8.4f} ms  {len(rest)} more kernels")
        rows[name] = (rows[name][:-len(",,,,,,,")] + f",{fwd_k:.6f},{bwd_k:.6f},{fk_t:.2f},{bk_t:.2f},{fbk:.2f},"
                      f"{util.kernels_csv_field(fwd_kernels)},{util.kernels_csv_field(bwd_kernels)}")
    write_csv(rows)

if __name__ == "__main__":
    main()
