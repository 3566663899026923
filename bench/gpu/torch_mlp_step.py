#!/usr/bin/env python3
"""PyTorch eager on what bench_mlp_cuda measures: the MLP 1024-1024x2-1000 (tanh GELU), cross-entropy, AdamW
(lr 1e-3, weight decay 0.01), batch 128/512/2048, fp32/tf32/bf16; one training step timed the same way (steps back
to back, an event at every step boundary, median over --steps after --warmup; TFLOP/s = 6 * params * batch / step).

Precision as ddplab's: fp32 (TF32 off), tf32 (allow_tf32 on matmuls), bf16 (autocast: bf16 matmuls on bf16 copies of
the fp32 weights, made every forward; fp32 gradients and optimizer: the split MlpCuda's bf16 uses). AdamW is the
fused single-kernel version by default (as ddplab's), --adamw foreach for PyTorch's default on CUDA.

  bench/gpu/torch_mlp_step.py [--steps 50] [--warmup 10] [--batch N] [--precision P] [--adamw fused|foreach]
                              [--csv out.csv]
"""
import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -P and PYTHONSAFEPATH leave this dir out
import torch_bench_util as util  # noqa: E402


def step_time_ms(precision, batch, args):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.manual_seed(1)
    dims = [1024, 1024, 1024, 1000]
    layers = []
    for i in range(len(dims) - 2):
        layers += [nn.Linear(dims[i], dims[i + 1]), nn.GELU(approximate="tanh")]
    model = nn.Sequential(*layers, nn.Linear(dims[-2], dims[-1])).cuda()
    opt = util.adamw(model.parameters(), args)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, dims[0], device="cuda")
    y = torch.randint(0, dims[-1], (batch,), device="cuda")
    ms = util.median_step_ms(lambda: loss_fn(model(x), y), opt, precision, args)
    params = sum(p.numel() for p in model.parameters())
    return ms, 6.0 * params * batch / (ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    util.add_common_args(ap, steps=50, warmup=10)
    ap.add_argument("--batch", type=int, help="one batch size instead of 128, 512, 2048")
    args = ap.parse_args()
    util.refuse_unwritable(args.csv)
    util.print_device()
    print(f"PyTorch eager, MLP 1024-1024x2-1000, AdamW ({args.adamw}); median of {args.steps} steps after "
          f"{args.warmup} warm-up; TFLOP/s = 6 * params * batch / step")
    print(f"{'precision':<9} {'batch':>6} {'step ms':>9} {'TFLOP/s':>8}")
    rows = []
    for precision in util.precisions(args):
        for batch in [args.batch] if args.batch else [128, 512, 2048]:
            ms, tflops = step_time_ms(precision, batch, args)
            print(f"{precision:<9} {batch:>6} {ms:>9.4f} {tflops:>8.1f}")
            rows.append(f"{precision},{batch},{ms:.6f},{tflops:.3f}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("precision,batch,step_ms,tflop_per_s\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
