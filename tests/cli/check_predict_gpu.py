#!/usr/bin/python3
"""`ddplab predict` on a single-GPU run file (tests/unit/synthetic_gpu_run.h, written by write_synthetic_gpu_run):
2, 4 and 8 GPUs over NVLink and 2 nodes x 8 over InfiniBand, flat and hierarchical, in one call. Checks the grid
(one node up to 8 ranks, hier only across nodes), every cell beyond one GPU marked as extrapolated, one recommendation
per world size, the weak-scaling column against the JSON's own steps, and the closing bucket's exposed all-reduce
growing with the GPUs.

usage: check_predict_gpu.py WRITER DDPLAB
"""
import json
import os
import subprocess
import sys
import tempfile

from checks import check, failures  # tests/cli/checks.py: the assertion every CLI test shares

writer, ddplab = sys.argv[1], sys.argv[2]

with tempfile.TemporaryDirectory() as work:
    run, out = os.path.join(work, "gpu.h5"), os.path.join(work, "gpu.json")
    check(subprocess.run([writer, run]).returncode == 0, "the synthetic GPU run file is written")
    proc = subprocess.run([ddplab, "predict", run, "--ranks", "1,2,4,8,16", "--ranks-per-node", "8", "--link",
                           "intra=nvlink4-nccl,inter=ndr400-x8", "--comm", "ring,hier", "--bucket-mb", "5,25,100", "--update", "whole,bucket",
                           "--json", out], capture_output=True, text=True, timeout=120)
    print(proc.stdout)
    check(proc.returncode == 0, f"predict exits 0 ({proc.stderr.strip()[-300:]})")
    check("NCCL's all-reduce (--comm nccl) is modelled as the ring" in proc.stdout, "the NCCL note is printed")
    check("one-node combinations are left out" in proc.stdout, "hier on one node is left out, and said")
    mpi = subprocess.run([ddplab, "predict", run, "--ranks", "2", "--comm", "mpi"], capture_output=True, text=True,
                         timeout=60)
    check(mpi.returncode == 2 and "trained on the GPU (--device cuda), where train takes --comm nccl or ring" in
          mpi.stderr, f"--comm mpi on a GPU run: refused, one line ({mpi.stderr.strip()[-300:]})")
    j = json.load(open(out))
    rows = j["rows"]
    shapes = sorted({(r["ranks"], r["nodes"], r["comm"]) for r in rows})
    check(shapes == [(1, 1, "ring"), (2, 1, "ring"), (4, 1, "ring"), (8, 1, "ring"), (16, 2, "hier"),
                     (16, 2, "ring")], f"the grid: one node up to 8 ranks, flat and hier across 2 nodes ({shapes})")
    check(len(rows) == 6 * 3 * 2, f"every bucket cap and update for every shape ({len(rows)} rows)")
    check(all(r["extrapolated"] for r in rows if r["ranks"] > 1), "every cell beyond one GPU is marked")
    check(len(j["recommended"]) == 5, "one recommendation per world size")
    one = {(r["bucket_mb"], r["update"]): r["step_ms"] for r in rows if r["ranks"] == 1}
    for r in rows:
        check(abs(r["weak_scaling_pct"] - 100 * one[r["bucket_mb"], r["update"]] / r["step_ms"]) < 1e-6,
              f"weak scaling is one GPU's step over this one's ({r['ranks']} ranks, {r['bucket_mb']} MiB)")

    def cell(n, update, comm="ring"):
        return next(r for r in rows if r["ranks"] == n and r["bucket_mb"] == 25 and r["update"] == update
                    and r["comm"] == comm)

    exposed = [cell(n, "whole")["exposed_comm_ms"] for n in (2, 4, 8)]
    check(exposed[0] < exposed[1] < exposed[2], f"the exposed all-reduce grows with the GPUs ({exposed})")
    for n in (2, 4, 8, 16):
        whole, bucket = cell(n, "whole"), cell(n, "bucket")
        check(bucket["exposed_comm_ms"] < whole["exposed_comm_ms"] and bucket["step_ms"] < whole["step_ms"],
              f"{n} GPUs: the update per bucket hides part of the closing all-reduce "
              f"({whole['exposed_comm_ms']:.3f} -> {bucket['exposed_comm_ms']:.3f} ms)")
        check(any(e.startswith("update per bucket") for e in bucket["extrapolated"]), "and is marked")

    # Ranks taking turns on the one GPU, from the one-GPU run and an allreduce_perf file of the GPU's ring between
    # ranks sharing it (made up here: 0.37 ms per message step, 100 GB/s): each rank's compute twice as long, the
    # all-reduces after backward, every row marked.
    ipc = os.path.join(work, "ipc_np2.json")
    results = [{"impl": "gpu-ring-ipc", "size_bytes": b, "out_of_place": {"time_us": 1000 * (2 * 0.37 + b / 1e8)}}
               for b in (1 << 20, 1 << 24, 1 << 28)]
    json.dump({"nranks": 2, "link": {"name": "none"}, "results": results}, open(ipc, "w"))
    shared_json = os.path.join(work, "shared.json")
    proc = subprocess.run([ddplab, "predict", run, "--ranks", "2", "--ranks-per-gpu", "1,2", "--calibration", ipc,
                           "--json", shared_json], capture_output=True, text=True, timeout=60)
    print(proc.stdout)
    check(proc.returncode == 0, f"predict with --ranks-per-gpu exits 0 ({proc.stderr.strip()[-300:]})")
    check("per_gpu" in proc.stdout, "the table has a ranks-per-GPU column for a GPU run")
    shared = json.load(open(shared_json))
    rows = {r["ranks_per_gpu"]: r for r in shared["rows"]}
    check(sorted(r["ranks_per_gpu"] for r in shared["recommended"]) == [1, 2], "a recommendation per sharing, named")
    check(sorted(rows) == [1, 2], f"a row per sharing ({sorted(rows)})")
    one_gpu_step = one[25, "whole"]
    check(rows[2]["step_ms"] > 2 * (one_gpu_step - 0.1), f"two ranks on one GPU: over twice one GPU's step "
          f"({rows[2]['step_ms']:.2f} against {one_gpu_step:.2f} ms)")
    check(rows[2]["exposed_comm_ms"] > rows[1]["exposed_comm_ms"], "sharing, the all-reduces wait for backward's end")
    check(any("2 ranks taking turns on a GPU" in e for e in rows[2]["extrapolated"]), "and the row says so")
    several = os.path.join(work, "several.json")
    json.dump({"nranks": 2, "link": {"name": "none"},
               "results": results + [dict(results[0], impl="nccl")]}, open(several, "w"))
    proc = subprocess.run([ddplab, "predict", run, "--ranks", "2", "--calibration", several], capture_output=True,
                          text=True, timeout=60)
    check(proc.returncode == 2 and "several GPU all-reduces (gpu-ring-ipc, nccl)" in proc.stderr,
          f"a calibration of two GPU all-reduces: refused, one line ({proc.stderr.strip()[-300:]})")

sys.exit(1 if failures else 0)
