#!/usr/bin/python3
"""ddplab vs PyTorch DDP (gloo) on the token-skew lab's `tiny` transformer: useful tokens/s at the same lengths
(log-uniform [64, 256], 8% at 256), batch per rank and batching, AdamW (bench/torch_ddp_tokens.py is the PyTorch
side). Threads: torch one per rank (OPENBLAS_NUM_THREADS=1); ddplab its --threads auto, which gives a rank that is
alone on the host a BLAS thread per core (the table names each side's kernels and threads per rank).

Runs are interleaved (ddplab, torch, ddplab, torch, ...) so that both see the same machine load; the table shows
medians and the ratio of medians per world size, in total and per rank. A torch run that fails or hangs (killed after
--timeout) is counted and left out.

No GFLOP/s column, unlike bench/vs_torch.py: the FLOPs per useful token are not a count of the shapes alone. The
attention's scores and weighted sum cost 4 x L x d_model per token of a sequence of length L (ddplab computes each
sequence's L x L block, torch the batch's padded S x S square), as much as the block's Linears (36,864 FLOPs a token
forward at d_model 48) at L ~ 190, and neither run records the sum of L^2 over the sequences it trained on. The
rate against the hardware is given instead as the host's FMA peak per core and the BLAS kernels each side ran, beside
the useful tokens/s per rank (= per core while ranks <= cores).

  bench/vs_torch_tokens.py [--build build] [--np 1,2,4] [--repeats 3] [--steps 30] [--batch 16] [--batching sample]
                           [--timeout 300]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -P and PYTHONSAFEPATH leave this dir out
import cpu_rates  # noqa: E402
import interleaved  # noqa: E402
import sweep_cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ddplab_rate(args, np_ranks, out):
    """Useful tokens/s and the BLAS kernels ("Zen x2": family x threads per rank)."""
    cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "-np", str(np_ranks),
           os.path.join(args.build, "launcher", "ddplab"), "train", "--model", "tiny", "--batch", str(args.batch),
           "--batching", args.batching, "--steps", str(args.steps), "--quiet", "--out", out]
    # No report page beside the run file: the next run would refuse to overwrite it.
    subprocess.run(cmd, check=True, env=dict(os.environ, DDPLAB_TRAIN_PAGE="off"))
    with h5py.File(out, "r") as f:
        summary = json.loads(f.attrs["summary"])
        blas = f"{f.attrs['blas'].split('core=')[-1]} x{json.loads(f.attrs['config'])['threads']}"
    os.remove(out)
    return summary["useful_tokens_per_s"], blas


def torch_rate(args, np_ranks):
    """Useful tokens/s and the BLAS kernels ("OpenBLAS Cooperlake x1"), or None when the run failed or hung."""
    result = interleaved.last_json_line([sys.executable, os.path.join(ROOT, "bench", "torch_ddp_tokens.py"), "--np",
                                         str(np_ranks), "--batch", str(args.batch), "--batching", args.batching,
                                         "--steps", str(args.steps), "--timeout", str(args.timeout)])
    return None if result is None else (result["useful_tokens_per_s"], result.get("blas", "(unknown)"))


def main():
    p = sweep_cli.Parser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--np", type=sweep_cli.world_sizes, default="1,2,4")
    p.add_argument("--repeats", type=sweep_cli.positive_int, default=3)
    p.add_argument("--steps", type=sweep_cli.positive_int, default=30)
    p.add_argument("--batch", type=sweep_cli.positive_int, default=16)
    p.add_argument("--batching", choices=["sample", "bucket"], default="sample")
    p.add_argument("--timeout", type=sweep_cli.positive_float, default=300,
                   help="seconds before a torch run counts as hung")
    args = p.parse_args()
    host = cpu_rates.Host(sweep_cli.ddplab_path(p, args.build))
    print(f"# tiny transformer, batch {args.batch}/rank, batching {args.batching}, AdamW, {args.steps} steps "
          f"(5 warm-up), {args.repeats} interleaved runs each; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print(f"# CPU {host.cpu}; {len(os.sched_getaffinity(0))} cores")
    print(f"# BLAS {host.blas}; ddplab's kernels {host.kernels}")
    print("# no GFLOP/s: the attention's FLOPs per token depend on each sequence's length (the script's docstring); "
          "BLAS: family x threads per rank")
    print(f"{'ranks':>5} {'ddplab useful tok/s':>20} {'torch useful tok/s':>19} {'ratio':>6} {'ddplab /rank':>12} "
          f"{'torch /rank':>11}  BLAS ddplab | torch  runs (ddplab | torch)")
    with tempfile.TemporaryDirectory() as work:
        for np_ranks in args.np:
            ours, theirs, failed = interleaved.alternate(
                args.repeats, lambda: ddplab_rate(args, np_ranks, os.path.join(work, "run.h5")),
                lambda: torch_rate(args, np_ranks))
            blas = ours[-1][1]
            torch_blas = theirs[-1][1] if theirs else "-"
            ours, theirs = [r[0] for r in ours], [r[0] for r in theirs]
            a = statistics.median(ours)
            b = statistics.median(theirs) if theirs else float("nan")
            runs = " ".join(f"{x:.0f}" for x in ours) + " | " + " ".join(f"{x:.0f}" for x in theirs)
            note = f"  (torch failed/hung {failed} of {args.repeats} runs)" if failed else ""
            print(f"{np_ranks:>5} {a:>20.0f} {b:>19.0f} {a / b:>6.2f} {a / np_ranks:>12.0f} {b / np_ranks:>11.0f}  "
                  f"{blas} | {torch_blas}  {runs}{note}", flush=True)
    print(f"# FMA peak {host.peak_per_core:.0f} GFLOP/s per core")


if __name__ == "__main__":
    sys.exit(main())
