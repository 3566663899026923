#!/usr/bin/python3
"""ddplab vs PyTorch DDP (gloo) on this machine, same MLP, batch per rank and optimizer, two ways:

  one      both sides at one thread per rank: OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1 for both, ddplab
           --threads 1 --optimizer-in-backward off (its update stays on the rank's one core),
           torch.set_num_threads(1) (Debian's torch runs its GEMMs on OpenBLAS's own pool, which set_num_threads
           alone does not reach)
  default  both sides as a user runs them: neither variable set, ddplab's --threads auto, torch's own default

Runs are interleaved (ddplab, torch, ddplab, torch, ...) so that both see the same machine load; the table
shows medians and the ratio of medians per world size, each row followed by every run's samples/s in the order they
ran (so that a median can be checked, and a run that stands out seen). Beside each side's samples/s, its absolute rate: the GEMMs'
GFLOP/s in total and per rank (the MLP's GEMM FLOPs per sample, counted from the widths in ddplab's run file as
bench_step counts them: bench/cpu_rates.py) and that as a share of the FMA peak `ddplab devices` gives for the cores
the side may use (one: a core per rank; default: a core per BLAS thread), with the BLAS kernels each side ran
(ddplab's by its probe, torch's by OpenBLAS's own cpuid pick). A healthy ratio can hide both sides on slow kernels.

  bench/vs_torch.py [--build build] [--np 1,2,4] [--repeats 5] [--steps 30] [--threads one,default]
"""
import json
import math
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


PINNED = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def environment(way):
    """The environment both sides run in: thread counts pinned to 1 ("one") or left to each library ("default"). No
    report page beside ddplab's run file: it is not what is compared, and the next run would refuse to overwrite it."""
    env = {k: v for k, v in os.environ.items() if k not in PINNED} | {"DDPLAB_TRAIN_PAGE": "off"}
    if way == "one":
        env.update({k: "1" for k in PINNED})
    return env


def ddplab_rate(build, np_ranks, steps, out, way):
    """samples/s, the BLAS kernels ("Zen x1": family x threads per rank) and the GEMM FLOPs per sample."""
    cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "-np", str(np_ranks), os.path.join(build, "launcher", "ddplab"),
           "train", "--quiet", "--steps", str(steps), "--out", out]
    cmd += ["--threads", "1", "--optimizer-in-backward", "off"] if way == "one" else ["--threads", "auto"]
    subprocess.run(cmd, check=True, env=environment(way))
    with h5py.File(out, "r") as f:
        rate = json.loads(f.attrs["summary"])["samples_per_s"]
        config = json.loads(f.attrs["config"])
        blas = f"{f.attrs['blas'].split('core=')[-1]} x{config['threads']}"
    os.remove(out)
    return rate, blas, cpu_rates.mlp_gemm_flops_per_sample(cpu_rates.mlp_widths(config))


def torch_rate(np_ranks, steps, way):
    """samples/s and the BLAS kernels ("OpenBLAS Cooperlake x1"), or None when the run failed (Debian's torch 1.13
    gloo sometimes hangs when oversubscribed; torch_ddp.py kills it after 300 s)."""
    result = interleaved.last_json_line([sys.executable, os.path.join(ROOT, "bench", "torch_ddp.py"), "--np",
                                         str(np_ranks), "--steps", str(steps), "--threads",
                                         "1" if way == "one" else "default"], env=environment(way))
    return None if result is None else (result["samples_per_s"], result.get("blas", "(unknown)"))


def threads_of(blas):
    """The thread count at the end of "Zen x2" or "OpenBLAS Cooperlake x1"; 1 where there is none."""
    last = blas.rsplit(" x", 1)[-1] if blas else ""
    return int(last) if last.isdigit() else 1


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
    host = cpu_rates.Host(sweep_cli.ddplab_path(p, args.build))
    cores = len(os.sched_getaffinity(0))
    print(f"# default MLP, batch 128/rank, AdamW, {args.steps} steps (5 warm-up), {args.repeats} interleaved runs each; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print(f"# CPU {host.cpu}; {cores} cores")
    print(f"# BLAS {host.blas}; ddplab's kernels {host.kernels}")
    print("# GFLOP/s: the GEMMs' FLOPs per sample x samples/s, in total and per rank; % peak: of the FMA peak of the "
          f"cores the side may use, a core per rank x BLAS thread, at most {cores}; BLAS: family x threads per rank")
    print(f"{'threads':>7} {'ranks':>5} {'ddplab samples/s':>17} {'torch samples/s':>16} {'ratio':>6}  "
          f"{'ddplab GFLOP/s (per rank, % peak)':>33}  {'torch GFLOP/s (per rank, % peak)':>32}  BLAS ddplab | torch")
    with tempfile.TemporaryDirectory() as work:
        for way in ways:
            for np_ranks in args.np:
                ours, theirs, failed = interleaved.alternate(
                    args.repeats,
                    lambda: ddplab_rate(args.build, np_ranks, args.steps, os.path.join(work, "run.h5"), way),
                    lambda: torch_rate(np_ranks, args.steps, way))
                _, core, flops = ours[-1]
                torch_core = theirs[-1][1] if theirs else None
                ours, theirs = [r[0] for r in ours], [r[0] for r in theirs]
                a = statistics.median(ours)
                b = statistics.median(theirs) if theirs else float("nan")

                def absolute(samples_per_s, blas):
                    if math.isnan(samples_per_s):
                        return "-"  # every torch run failed
                    gflops = samples_per_s * flops / 1e9
                    used = min(cores, np_ranks * threads_of(blas))
                    return f"{gflops:.1f} ({gflops / np_ranks:.1f}, {host.percent_of_peak(gflops, used)})"

                note = f"  (torch failed/hung {failed} of {args.repeats} runs)" if failed else ""
                print(f"{way:>7} {np_ranks:>5} {a:>17.0f} {b:>16.0f} {a / b:>6.2f}  {absolute(a, core):>33}  "
                      f"{absolute(b, torch_core):>32}  {core} | {torch_core or '-'}{note}")
                runs = " ".join(f"{r:.0f}" for r in ours), " ".join(f"{r:.0f}" for r in theirs) or "-"
                print(f"#   the runs' samples/s, ddplab: {runs[0]}; torch: {runs[1]}", flush=True)
    print(f"# GEMM FLOPs per sample {flops / 1e6:.2f} M (forward and weight gradient at every layer, the input "
          f"gradient above the first, as bench_step counts them); FMA peak {host.peak_per_core:.0f} GFLOP/s per core")


if __name__ == "__main__":
    sys.exit(main())
