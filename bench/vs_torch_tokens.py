#!/usr/bin/python3
"""ddplab vs PyTorch DDP (gloo) on the token-skew lab's `tiny` transformer: useful tokens/s at the same lengths
(log-uniform [64, 256], 8% at 256), batch per rank and batching, AdamW, 1 BLAS thread per rank
(bench/torch_ddp_tokens.py is the PyTorch side).

Runs are interleaved (ddplab, torch, ddplab, torch, ...) so that both see the same machine load; the table shows
medians and the ratio of medians per world size. A torch run that fails or hangs (killed after --timeout) is
counted and left out.

  bench/vs_torch_tokens.py [--np 1,2,4] [--repeats 3] [--steps 30] [--batch 16] [--batching sample]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -P and PYTHONSAFEPATH leave this dir out
import sweep_cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ddplab_rate(args, np_ranks, out):
    cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "-np", str(np_ranks),
           os.path.join(args.build, "launcher", "ddplab"), "train", "--model", "tiny", "--batch", str(args.batch),
           "--batching", args.batching, "--steps", str(args.steps), "--quiet", "--out", out]
    subprocess.run(cmd, check=True)
    with h5py.File(out, "r") as f:
        summary = json.loads(f.attrs["summary"])
    os.remove(out)
    return summary["useful_tokens_per_s"]


def torch_rate(args, np_ranks):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "torch_ddp_tokens.py"), "--np", str(np_ranks),
                           "--batch", str(args.batch), "--batching", args.batching, "--steps", str(args.steps),
                           "--timeout", str(args.timeout)], capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1])["useful_tokens_per_s"] if proc.returncode == 0 and lines else None


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
    sweep_cli.ddplab_path(p, args.build)
    print(f"# tiny transformer, batch {args.batch}/rank, batching {args.batching}, AdamW, {args.steps} steps "
          f"(5 warm-up), {args.repeats} interleaved runs each; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print(f"{'ranks':>5} {'ddplab useful tok/s':>20} {'torch useful tok/s':>19} {'ratio':>6}  runs (ddplab | torch)")
    with tempfile.TemporaryDirectory() as work:
        for np_ranks in args.np:
            ours, theirs, failed = [], [], 0
            for i in range(args.repeats):
                ours.append(ddplab_rate(args, np_ranks, os.path.join(work, f"r{i}.h5")))
                rate = torch_rate(args, np_ranks)
                if rate is None:
                    failed += 1
                else:
                    theirs.append(rate)
            a = statistics.median(ours)
            b = statistics.median(theirs) if theirs else float("nan")
            runs = " ".join(f"{x:.0f}" for x in ours) + " | " + " ".join(f"{x:.0f}" for x in theirs)
            note = f"  (torch failed/hung {failed} of {args.repeats} runs)" if failed else ""
            print(f"{np_ranks:>5} {a:>20.0f} {b:>19.0f} {a / b:>6.2f}  {runs}{note}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
