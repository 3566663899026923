#!/usr/bin/python3
"""PyTorch DDP (gloo, CPU) on the same MLP, batch and optimizer as `ddplab train`: the reference ddplab is
compared against (bench/vs_torch.py). Uses Debian's python3-torch; launches its own ranks on localhost (torchrun
does not work with that package), one intra-op thread per rank.

  bench/torch_ddp.py --np 2 [--batch 128] [--steps 30] [--warmup 5] [--bucket-mb 25]
Prints one JSON line: {"np":..,"samples_per_s":..,"slowest_step_ms":..,"step_ms_by_rank":[..],"torch":..,"blas":..}
(blas: rank 0's kernels, "OpenBLAS Cooperlake x1": the family and its thread count)
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -P leaves this dir out
from torch_local_ranks import blas_kernels, run_local_ranks  # noqa: E402


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    if args.threads != "default":
        torch.set_num_threads(int(args.threads))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1234)
    layers, width = [], args.input_dim
    for _ in range(args.layers):
        layers += [nn.Linear(width, args.hidden), nn.GELU(approximate="tanh")]
        width = args.hidden
    model = nn.Sequential(*layers, nn.Linear(width, args.classes))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(rank)
    # A fresh batch every step, drawn before the clock starts (data is not what is compared). Not one batch reused:
    # the model memorizes it within ~20 steps, backward's GEMMs then run on denormal floats and slow down 20x or more
    # (measured on an Intel Xeon: backward 17 ms -> 312-545 ms by step 25; set_flush_denormal(True) restores it),
    # which is then measured instead of the training step. ddplab draws new samples every step.
    xs = torch.randn(args.steps, args.batch, args.input_dim, generator=g)
    ys = torch.randint(0, args.classes, (args.steps, args.batch), generator=g)
    times = []
    dist.barrier()
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(xs[step]), ys[step])
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    mine = sum(times[args.warmup:]) / len(times[args.warmup:])
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        slowest = max(gathered)
        print(json.dumps({"np": world, "samples_per_s": args.batch * world / (slowest / 1e3),
                          "slowest_step_ms": slowest, "step_ms_by_rank": gathered, "torch": torch.__version__,
                          "blas": blas_kernels()}),
              flush=True)
    # Leave together, then exit without teardown: with Debian's torch 1.13 a rank that tears gloo down while its peer
    # is still inside all_gather_object was seen spinning forever, and so was a rank whose DDP and process group were
    # destroyed as worker() returned (1 run in 4 here; bench/torch_ddp_tokens.py exits the same way).
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--input-dim", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--threads", default="1", help="intra-op and BLAS threads per rank: N, or default (torch's own)")
    args = p.parse_args()
    if args.threads != "default" and not (args.threads.isdigit() and int(args.threads) >= 1):
        p.error(f"--threads takes a positive count or default, got {args.threads!r}")
    if "RANK" in os.environ:
        return worker(args)
    return run_local_ranks(__file__, sys.argv[1:], args.np, 300, "torch_ddp",
                           None if args.threads == "default" else int(args.threads))


if __name__ == "__main__":
    sys.exit(main())
