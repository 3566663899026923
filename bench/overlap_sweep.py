#!/usr/bin/python3
"""Bucket size x overlap (x gradient slicing) sweep of `ddplab train`, read back from the run files.

For each setting: median over --repeats runs of the slowest rank's mean step, and rank means of backward,
comm, hidden and exposed communication, and hidden / min(backward, comm).

  bench/overlap_sweep.py [--np 2] [--link 10gbe] [--bucket-mb 0,1,5,25,100] [--slice-mb 0,1] [--repeats 3]
                         [-- extra ddplab train flags]
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


def run_once(args, ddplab, out, bucket_mb, overlap, slice_mb):
    cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "-np", str(args.np), ddplab, "train", "--quiet",
           "--steps", str(args.steps), "--link", args.link, "--bucket-mb", str(bucket_mb), "--overlap", overlap,
           "--grad-slice-mb", str(slice_mb), "--out", out] + args.extra
    subprocess.run(cmd, check=True)
    with h5py.File(out, "r") as f:
        s = json.loads(f.attrs["summary"])
    ranks = s["ranks"]
    mean = lambda k: statistics.mean(r[k] for r in ranks)
    return {"step": s["slowest_step_ms"], "backward": mean("backward_ms"), "comm": mean("comm_ms"),
            "hidden": mean("hidden_comm_ms"), "exposed": mean("exposed_comm_ms"),
            "fraction": statistics.mean(r["hidden_fraction"] for r in ranks)}


def main():
    parser = sweep_cli.Parser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--np", type=sweep_cli.positive_int, default=2)
    parser.add_argument("--link", default="10gbe")
    parser.add_argument("--bucket-mb", type=sweep_cli.sizes_mb, default="0,1,5,25,100")
    parser.add_argument("--slice-mb", type=sweep_cli.sizes_mb, default="0,1")
    parser.add_argument("--repeats", type=sweep_cli.positive_int, default=3)
    parser.add_argument("--steps", type=sweep_cli.positive_int, default=25)
    parser.add_argument("extra", nargs="*", help="flags passed to ddplab train (after --)")
    args = parser.parse_args()
    ddplab = sweep_cli.ddplab_path(parser, args.build)
    print(f"# ddplab train, {args.np} ranks, --link {args.link}, {args.steps} steps, median of {args.repeats} runs "
          f"{' '.join(args.extra)}")
    print(f"{'bucket_mb':>9} {'slice_mb':>8} {'overlap':>7} {'step_ms':>8} {'backward':>8} {'comm':>7} "
          f"{'hidden':>7} {'exposed':>7} {'hidden%':>7}")
    with tempfile.TemporaryDirectory() as work:
        for slice_mb in args.slice_mb:
            for bucket_mb in args.bucket_mb:
                for overlap in ["on", "off"]:
                    runs = [run_once(args, ddplab, os.path.join(work, f"r{i}.h5"), bucket_mb, overlap, slice_mb)
                            for i in range(args.repeats)]
                    for i in range(args.repeats):
                        os.remove(os.path.join(work, f"r{i}.h5"))
                    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                    print(f"{bucket_mb:>9} {slice_mb:>8} {overlap:>7} {med['step']:>8.2f} {med['backward']:>8.2f} "
                          f"{med['comm']:>7.2f} {med['hidden']:>7.2f} {med['exposed']:>7.2f} "
                          f"{100 * med['fraction']:>6.0f}%", flush=True)


if __name__ == "__main__":
    sys.exit(main())
