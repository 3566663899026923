#!/usr/bin/python3
"""Samples/s of `ddplab train` (default MLP unless flags say otherwise) at several world sizes.

Each configuration runs --repeats times; the table shows the median and the spread of the global samples/s
(global batch / slowest rank's mean steady-state step), read back from each run's HDF5 file.

  bench/train_scaling.py [--build build] [--np 1,2,4] [--repeats 5] [-- extra ddplab train flags]
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


def main():
    parser = sweep_cli.Parser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--np", type=sweep_cli.world_sizes, default="1,2,4")
    parser.add_argument("--repeats", type=sweep_cli.positive_int, default=5)
    parser.add_argument("--steps", type=sweep_cli.positive_int, default=30)
    parser.add_argument("extra", nargs="*", help="flags passed to ddplab train (after --)")
    args = parser.parse_args()
    ddplab = sweep_cli.ddplab_path(parser, args.build)
    mpirun = os.path.join(ROOT, "scripts", "mpirun.sh")

    print(f"# ddplab train {' '.join(args.extra)} --steps {args.steps}; {args.repeats} runs per world size")
    print(f"{'ranks':>5} {'median samples/s':>17} {'min':>8} {'max':>8} {'step ms':>8} {'allreduce ms':>13}  per-run")
    with tempfile.TemporaryDirectory() as work:
        for np_ranks in args.np:
            rates, steps, comms = [], [], []
            for i in range(args.repeats):
                out = os.path.join(work, f"np{np_ranks}_{i}.h5")
                cmd = [mpirun, "-np", str(np_ranks), ddplab, "train", "--quiet", "--steps", str(args.steps),
                       "--out", out] + args.extra
                subprocess.run(cmd, check=True)
                with h5py.File(out, "r") as f:
                    s = json.loads(f.attrs["summary"])
                rates.append(s["samples_per_s"])
                steps.append(s["slowest_step_ms"])
                comms.append(statistics.mean(r["allreduce_ms"] for r in s["ranks"]))
            print(f"{np_ranks:>5} {statistics.median(rates):>17.0f} {min(rates):>8.0f} {max(rates):>8.0f} "
                  f"{statistics.median(steps):>8.2f} {statistics.median(comms):>13.2f}  "
                  + " ".join(f"{r:.0f}" for r in rates), flush=True)


if __name__ == "__main__":
    sys.exit(main())
