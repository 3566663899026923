#!/usr/bin/python3
"""PyTorch DDP (gloo, CPU) on the token-skew lab's `tiny` transformer: the reference bench/vs_torch_tokens.py
compares `ddplab train --model tiny` against. Same shapes (vocab 8192, d_model 48, 4 heads, 1 pre-LN block, MLP 96
with tanh GELU, learned positions up to 256, 16 classes, mean-pooled over the true length: 425,344 parameters),
AdamW (lr 1e-3, weight decay 0.01), the same sequence lengths (data/tokens.cpp's hash, ported below) and the same
batching rules (sample or bucket, each batch padded to its longest sequence, with a key-padding mask). The order
of the epoch comes from numpy, not from ddplab's std::shuffle, so batches hold other sequences of the same
distribution. One intra-op thread per rank; launches its own ranks on localhost like bench/torch_ddp.py.

  bench/torch_ddp_tokens.py --np 4 [--batch 16] [--batching sample] [--steps 30] [--warmup 5] [--timeout 300]
Prints one JSON line: {"np":..,"useful_tokens_per_s":..,"slowest_step_ms":..,"step_ms_by_rank":[..],"blas":..}
(blas: rank 0's kernels, "OpenBLAS Cooperlake x1": the family and its thread count), or exits 1
when a rank fails or the run outlives --timeout (Debian's torch 1.13 gloo has hung when oversubscribed).
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -P leaves this dir out
from torch_local_ranks import blas_kernels, run_local_ranks  # noqa: E402

VOCAB, D_MODEL, HEADS, MLP, MAX_LEN, CLASSES = 8192, 48, 4, 96, 256, 16
MASK64 = (1 << 64) - 1


# data/tokens.cpp's lengths: kernels/cpu/rng.h's counter-based hash (splitmix64), streams kLength 1, kOutlier 2.
def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def hash64(seed, index):
    start = mix64(seed ^ 0x6A09E667F3BCC909)
    return mix64((start + (index + 1) * 0x9E3779B97F4A7C15) & MASK64)


def substream(seed, stream):
    return hash64(seed ^ 0xBB67AE8584CAA73B, stream)


def uniform01(seed, index):
    return (hash64(seed, index) >> 11) * 2.0 ** -53


def lengths(n, seed=1234, min_len=64, max_len=MAX_LEN, outlier_prob=0.08):
    """Sequence lengths 0..n-1, log-uniform [min_len, max_len] with outlier_prob at max_len, as ddplab draws them."""
    s_len, s_out = substream(seed, 1), substream(seed, 2)
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        if uniform01(s_out, i) < outlier_prob:
            out[i] = max_len
            continue
        u = uniform01(s_len, i)
        x = math.exp(math.log(min_len) + u * (math.log(max_len + 1.0) - math.log(min_len)))
        out[i] = min(max(int(x), min_len), max_len)
    return out


def plan(lens, batching, batch, world, seed):
    """[step][rank] -> sequence ids, by data/tokens.cpp's rules for sample and bucket (window 64 global batches)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lens))
    glob = batch * world
    if batching == "bucket":
        window = 64 * glob
        for k in range(0, len(order), window):
            part = order[k:k + window]
            order[k:k + window] = part[np.argsort(lens[part], kind="stable")]
    steps = []
    for k in range(0, len(order), glob):
        chunk = order[k:k + glob]
        steps.append([chunk[len(chunk) * r // world:len(chunk) * (r + 1) // world] for r in range(world)])
    if batching == "bucket":
        steps = [steps[i] for i in rng.permutation(len(steps))]
    return steps


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1234)

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, D_MODEL), nn.Embedding(MAX_LEN, D_MODEL)
            self.ln1, self.ln2, self.lnf = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
            self.attn = nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True)  # qkv [3C, C] and proj, with biases
            self.mlp = nn.Sequential(nn.Linear(D_MODEL, MLP), nn.GELU(approximate="tanh"), nn.Linear(MLP, D_MODEL))
            self.head = nn.Linear(D_MODEL, CLASSES)

        def forward(self, tokens, lens):
            S = tokens.shape[1]
            pad = torch.arange(S)[None, :] >= lens[:, None]  # [B, S], True on padding
            x = self.wte(tokens) + self.wpe(torch.arange(S))[None]
            h = self.ln1(x)
            x = x + self.attn(h, h, h, key_padding_mask=pad, need_weights=False)[0]
            x = x + self.mlp(self.ln2(x))
            x = self.lnf(x).masked_fill(pad[..., None], 0.0)
            return self.head(x.sum(1) / lens[:, None])

    model = Tiny()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()
    lens = lengths(args.epoch_size)
    steps = plan(lens, args.batching, args.batch, world, seed=1234)
    g = torch.Generator().manual_seed(rank)
    times, useful = [], []
    dist.barrier()
    for step in range(args.steps):
        t0 = time.perf_counter()
        ids = steps[step % len(steps)][rank]
        lb = torch.from_numpy(lens[ids])
        S = int(lb.max())
        tokens = torch.randint(0, VOCAB, (len(ids), S), generator=g)  # content does not change the cost
        labels = torch.randint(0, CLASSES, (len(ids),), generator=g)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(tokens, lb), labels)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
        useful.append(int(lb.sum()))
    dist.barrier()
    with open(os.path.join(args.result_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"step_ms": times, "useful": useful, "blas": blas_kernels()}, f)
    # No teardown: with Debian's torch 1.13 a rank that destroys gloo while a peer is still in a collective was seen
    # spinning forever. The process exits with everything done and written.
    sys.stdout.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batching", choices=["sample", "bucket"], default="sample")
    p.add_argument("--epoch-size", type=int, default=65536)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--result-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if "RANK" in os.environ:
        return worker(args)
    with tempfile.TemporaryDirectory() as results:
        if run_local_ranks(__file__, sys.argv[1:] + ["--result-dir", results], args.np, args.timeout,
                           "torch_ddp_tokens") != 0:
            return 1
        ranks = [json.load(open(os.path.join(results, f"rank{r}.json"))) for r in range(args.np)]
    # As ddplab's summary: global useful tokens per step over the slowest rank's mean step, warm-up left out.
    mean_ms = [sum(r["step_ms"][args.warmup:]) / (args.steps - args.warmup) for r in ranks]
    tokens_per_step = sum(sum(r["useful"][args.warmup:]) for r in ranks) / (args.steps - args.warmup)
    print(json.dumps({"np": args.np, "useful_tokens_per_s": tokens_per_step / (max(mean_ms) / 1e3),
                      "slowest_step_ms": max(mean_ms), "step_ms_by_rank": mean_ms,
                      "blas": ranks[0]["blas"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
