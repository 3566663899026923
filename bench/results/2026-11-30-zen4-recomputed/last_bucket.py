"""The closing bucket's share of the exposed communication in the shared-GPU run files.

Usage: python3 last_bucket.py DIR   (DIR: runs.tgz of bench/results/2026-11-30-h200-shared-gpu, extracted)

Per rank, over the steady steps: backward's end (the step's start + data + forward + backward), then
  backlog = how long after it the bucket before the closing one finished (earlier buckets still queued),
  closing = the closing bucket's own time after both (its all-reduce once nothing else is ahead of it),
and the run file's exposed_comm_ms (backward's end to the update's launch) beside them.
"""
import sys

import h5py
import numpy as np

for name in ["gpt2_bf16_np2.h5", "gpt2_100mb_np2.h5", "gpt2_bf16_wire_np2.h5", "gpt2_bucketed_np2.h5",
             "gpt2_bf16_np4.h5"]:
    with h5py.File(f"{sys.argv[1]}/{name}") as f:
        steps, buckets = f["steps"], f["buckets"]
        first = 3  # the runs' --warmup-steps
        print(f"{name}: {len(buckets['bytes'])} buckets, the closing one {buckets['param_names'][-1].decode()} "
              f"{buckets['bytes'][-1] / 1e6:.1f} MB")
        for r in range(steps["step_ms"].shape[0]):
            s = slice(first, steps["step_ms"].shape[1])
            backward_end = (steps["start_ms"][r, s] + steps["data_ms"][r, s] + steps["forward_ms"][r, s] +
                            steps["backward_ms"][r, s])
            end = buckets["comm_end_ms"][r, s, :]
            backlog = np.maximum(0, end[:, -2] - backward_end)
            closing = end[:, -1] - np.maximum(backward_end, end[:, -2])
            exposed = steps["exposed_comm_ms"][r, s].mean()
            print(f"  rank {r}: step {steps['step_ms'][r, s].mean():6.2f} ms, exposed {exposed:6.2f}"
                  f" = backlog {backlog.mean():6.2f} + closing bucket {closing.mean():5.2f}"
                  f" + the rest {exposed - backlog.mean() - closing.mean():5.2f}"
                  f" (closing bucket's all-reduce {(end[:, -1] - buckets['comm_start_ms'][r, s, -1]).mean():.2f})")
