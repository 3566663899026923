#!/usr/bin/env python3
"""PyTorch eager on what bench_transformer_cuda measures: the gpt2-small preset (GPT-2 124M's shapes, pre-LN, tanh
GELU, learned positions, the LM head tied to wte: 124.5M parameters, as GPT-2's), batch 8 x 1024 tokens, next-token
cross-entropy, AdamW (lr 1e-3, weight decay 0.01); one training step timed the same way (steps back to back, an event
at every step boundary, median over --steps after --warmup). TFLOP/s counts ddplab's FLOPs (3 x
TransformerConfig::flops_per_token x tokens / step: the attention's whole square, PaLM's convention); MFU is against
989 TFLOP/s, the dense bf16 peak of an H100 SXM (the H200's too), and "MFU causal" counts the causal half of the
square, as bench_transformer_cuda prints both.

Precision as ddplab's: fp32 (TF32 off), tf32 (allow_tf32 on matmuls), bf16 (autocast: bf16 matmuls on bf16 copies of
the fp32 weights, made every forward; fp32 gradients and optimizer). Attention: --attention sdpa (default, PyTorch's
fused scaled_dot_product_attention, what a PyTorch user runs) or manual (softmax(q k^T / sqrt(hs)) v with the S x S
matrix stored, as ddplab's kernels do today). --ddp wraps the model in DistributedDataParallel at world size 1 (NCCL,
one process), to show what the wrapper costs. --compile runs the model through torch.compile (Inductor, Triton kernels:
what a PyTorch user picks for speed); its compilation happens in the warm-up steps. AdamW is the fused single-kernel
version by default.

After the last precision's timed steps (bf16 by default: every precision is timed before any profiling) two more
steps run, the second under PyTorch's profiler, and a line under its row names the SDPA kernels PyTorch picked for
the step (kernels named flash / fmha / cudnn / sdpa / attention / efficient) with their device ms a step, all
layers, forward and backward: which backend the step ran, and what it cost on the GPU (with --attention manual there
is none). The CSV's columns end with sdpa_kernels: "name=ms" joined by ';', commas
dropped ("none" with --attention manual; empty for the other precisions, and where the profiler could not run, the
line saying why).

  bench/gpu/torch_transformer_step.py [--steps 10] [--warmup 3] [--batch 8] [--seq 1024] [--precision P]
                                      [--attention sdpa|manual] [--ddp] [--compile] [--adamw fused|foreach]
                                      [--csv out.csv]
"""
import argparse
import math
import os
import re
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -P and PYTHONSAFEPATH leave this dir out
import torch_bench_util as util  # noqa: E402

# gpt2-small in model/transformer.cpp's TransformerConfig::preset
VOCAB, D_MODEL, HEADS, LAYERS, MLP_HIDDEN, MAX_LEN = 50304, 768, 12, 12, 3072, 1024
PEAK_BF16_DENSE_TFLOPS = 989.0
# What SDPA's backends launch: FlashAttention-2's flash_*, the memory-efficient fmha_cutlass*, cuDNN's cudnn_*sdpa*
SDPA_KERNEL = re.compile(r"flash|fmha|cudnn|sdpa|attention|efficient", re.IGNORECASE)


def flops_per_token(seq, causal_half=False):
    """TransformerConfig::flops_per_token for the LM head: the attention's whole square, or its causal half."""
    c, h = D_MODEL, MLP_HIDDEN
    square = 4.0 * seq * c
    return LAYERS * (2 * (4 * c * c + 2 * c * h) + (square / 2 if causal_half else square)) + 2 * c * VOCAB


class Block(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention = attention
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv, self.proj = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
        self.fc, self.fcproj = nn.Linear(D_MODEL, MLP_HIDDEN), nn.Linear(MLP_HIDDEN, D_MODEL)

    def attend(self, x):
        b, s, c = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4)  # each [b, heads, s, hs]
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // HEADS)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, s, c))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt2Small(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D_MODEL), nn.Embedding(MAX_LEN, D_MODEL)
        self.blocks = nn.ModuleList(Block(attention) for _ in range(LAYERS))
        self.lnf, self.head = nn.LayerNorm(D_MODEL), nn.Linear(D_MODEL, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2's and ddplab's

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.lnf(x))
        # Next-token targets: position t predicts token t + 1; the last position has none (-1, ignored), as ddplab
        # masks it. Written as nanoGPT writes it: the logits whole, not a sliced copy of them (autocast runs the loss
        # in fp32).
        targets = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -1)], dim=1)
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=-1)


def step_time_ms(precision, args, profile_step):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.manual_seed(1)
    model = Gpt2Small(args.attention).cuda()
    params = sum(p.numel() for p in model.parameters())
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(model)
    opt = util.adamw(model.parameters(), args)
    if args.compile:
        model = torch.compile(model)
    tokens = torch.randint(0, VOCAB, (args.batch, args.seq), device="cuda")
    ms = util.median_step_ms(lambda: model(tokens), opt, precision, args)
    tokens_per_s = args.batch * args.seq / (ms * 1e-3)
    tflops = 3 * flops_per_token(args.seq) * tokens_per_s / 1e12
    tflops_causal = 3 * flops_per_token(args.seq, causal_half=True) * tokens_per_s / 1e12
    step_kernels = None  # the kernels of one more step, profiled: which SDPA backend ran, and its device time
    if args.attention == "sdpa" and profile_step:
        try:
            step_kernels = util.kernel_times(lambda: util.train_step(lambda: model(tokens), opt, precision), calls=1)
        except Exception as e:  # the profiler's failure, or the step's under it: one line, the timed figures kept
            step_kernels = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
    model = opt = None  # freed before the cache is emptied
    torch.cuda.empty_cache()
    return ms, tokens_per_s, tflops, tflops_causal, params, step_kernels


def sdpa_kernels_said(step_kernels, args):
    """The line under a precision's row and its CSV field: the step's SDPA kernels, or why there are none.
    step_kernels: kernel_times' list for one step, the profiler's reason (a string), or None (not profiled: only the
    last precision is)."""
    if args.attention == "manual":
        return "  SDPA kernels: none (--attention manual: matmuls and a softmax over the stored S x S)", "none"
    if not isinstance(step_kernels, list):
        return f"  SDPA kernels: not timed: {step_kernels or 'the profiler could not run'}", ""
    sdpa = [(name, ms) for name, ms in step_kernels if SDPA_KERNEL.search(name)]
    all_ms = sum(ms for _, ms in step_kernels)
    if not sdpa:
        return f"  SDPA kernels: none found among the step's {len(step_kernels)} kernels ({all_ms:.3f} ms)", ""
    named = "; ".join(f"{util.short_kernel_name(name)} {ms:.3f}" for name, ms in sdpa)
    return (f"  SDPA kernels, device ms a step ({sum(ms for _, ms in sdpa):.3f} of the step's {all_ms:.3f} ms of "
            f"kernels): {named}", util.kernels_csv_field(sdpa))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    util.add_common_args(ap, steps=10, warmup=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--attention", choices=["sdpa", "manual"], default="sdpa")
    ap.add_argument("--ddp", action="store_true", help="DistributedDataParallel at world size 1")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (compiled in the warm-up)")
    args = ap.parse_args()
    util.refuse_unwritable(args.csv)
    if args.ddp:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    util.print_device()
    mode = "torch.compile" if args.compile else "eager"
    print(f"PyTorch {mode}{' + DDP (ws 1)' if args.ddp else ''}, gpt2-small, batch {args.batch} x {args.seq} tokens, "
          f"attention {args.attention}, AdamW ({args.adamw}); median of {args.steps} steps after {args.warmup} "
          f"warm-up; MFU against {PEAK_BF16_DENSE_TFLOPS:.0f} TFLOP/s (dense bf16)")
    print(f"{'precision':<9} {'step ms':>9} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'MFU causal':>11}")
    rows = []
    # Only the last precision's step is profiled, after its timed steps: a profiler session may leave its launch
    # callbacks behind, which would lengthen the steps timed after it.
    precisions = util.precisions(args)
    for precision in precisions:
        ms, tokens_per_s, tflops, tflops_causal, params, step_kernels = step_time_ms(precision, args,
                                                                                     precision == precisions[-1])
        mfu, mfu_causal = tflops / PEAK_BF16_DENSE_TFLOPS, tflops_causal / PEAK_BF16_DENSE_TFLOPS
        print(f"{precision:<9} {ms:>9.3f} {tokens_per_s:>10.0f} {tflops:>8.1f} {100 * mfu:>5.1f}% "
              f"{100 * mfu_causal:>10.1f}%")
        line, field = sdpa_kernels_said(step_kernels, args)
        if step_kernels is not None or args.attention == "manual":
            print(line)
        rows.append(f"{precision},{mode},{args.batch},{args.seq},{args.attention},{int(args.ddp)},{ms:.6f},"
                    f"{tokens_per_s:.1f},{tflops:.3f},{mfu:.5f},{mfu_causal:.5f},{field}")
    print(f"({params / 1e6:.1f}M parameters)")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("precision,mode,batch,seq,attention,ddp,step_ms,tokens_per_s,tflop_per_s,mfu,mfu_causal_half,"
                    "sdpa_kernels\n" + "\n".join(rows) + "\n")
    if args.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
