#!/usr/bin/python3
"""ddplab vs PyTorch DDP (gloo) on this machine, same MLP, batch per rank and optimizer, two ways:

  one      both sides at one thread per rank: OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1 for both, ddplab
           --threads 1 --optimizer-in-backward off (its update stays on the rank's one core),
           torch.set_num_threads(1) (Debian's torch runs its GEMMs on OpenBLAS's own pool, which set_num_threads
           alone does not reach)
  default  both sides as a user runs them: neither variable set, ddplab's --threads auto, torch's own default

Runs are interleaved (ddplab, torch, ddplab, torch, ...) so that both see the same machine load; the table
shows medians and the ratio of medians per world size.

  bench/vs_torch.py [--np 1,2,4] [--repeats 5] [--steps 30] [--threads one,default]
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


PINNED = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def environment(way):
    """The environment both sides run in: thread counts pinned to 1 ("one") or left to each library ("default")."""
    env = {k: v for k, v in os.environ.items() if k not in PINNED}
    if way == "one":
        env.update({k: "1" for k in PINNED})
    return env


def ddplab_rate(build, np_ranks, steps, out, way):
    cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "-np", str(np_ranks), os.path.join(build, "launcher", "ddplab"),
           "train", "--quiet", "--steps", str(steps), "--out", out]
    cmd += ["--threads", "1", "--optimizer-in-backward", "off"] if way == "one" else ["--threads", "auto"]
    subprocess.run(cmd, check=True, env=environment(way))
    with h5py.File(out, "r") as f:
        rate = json.loads(f.attrs["summary"])["samples_per_s"]
        blas = f.attrs["blas"].split("core=")[-1]
    os.remove(out)
    return rate, blas


def torch_rate(np_ranks, steps, way):
    """samples/s, or None when the run failed (Debian's torch 1.13 gloo sometimes hangs when oversubscribed;
    torch_ddp.py kills it after 300 s)."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "torch_ddp.py"), "--np", str(np_ranks),
                           "--steps", str(steps), "--threads", "1" if way == "one" else "default"],
                          capture_output=True, text=True, env=environment(way))
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1])["samples_per_s"] if proc.returncode == 0 and lines else None


def main():
    p = sweep_cli.Parser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--np", type=sweep_cli.world_sizes, default="1,2,4")
    p.add_argument("--repeats", type=sweep_cli.positive_int, default=5)
    p.add_argument("--steps", type=sweep_cli.positive_int, default=30)
    p.add_argument("--threads", default="one,default", help="which ways to compare: one, default, or one,default")
    args = p.parse_args()
    ways = args.threads.split(",")
    if not ways or any(w not in ("one", "default") for w in ways):
        p.error(f"--threads takes one and/or default, got {args.threads!r}")
    sweep_cli.ddplab_path(p, args.build)
    print(f"# default MLP, batch 128/rank, AdamW, {args.steps} steps (5 warm-up), {args.repeats} interleaved runs each; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print(f"{'threads':>7} {'ranks':>5} {'ddplab samples/s':>17} {'torch samples/s':>16} {'ratio':>6}  ddplab BLAS core")
    with tempfile.TemporaryDirectory() as work:
        for way in ways:
            for np_ranks in args.np:
                ours, theirs, core = [], [], ""
                failed = 0
                for i in range(args.repeats):
                    rate, core = ddplab_rate(args.build, np_ranks, args.steps, os.path.join(work, f"r{i}.h5"), way)
                    ours.append(rate)
                    theirs_rate = torch_rate(np_ranks, args.steps, way)
                    if theirs_rate is None:
                        failed += 1
                    else:
                        theirs.append(theirs_rate)
                a = statistics.median(ours)
                b = statistics.median(theirs) if theirs else float("nan")
                note = f"  (torch failed/hung {failed} of {args.repeats} runs)" if failed else ""
                print(f"{way:>7} {np_ranks:>5} {a:>17.0f} {b:>16.0f} {a / b:>6.2f}  {core}{note}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
