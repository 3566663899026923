#!/usr/bin/env python3
"""allreduce_perf on the GPU, the plain launch and -G's CUDA graphs side by side, at one rank:

- -G N refuses, with one line and exit code 2 before any work, an implementation whose link makes the host wait at
  every ring step (gpu-ring-ipc, gpu-ring-host) or that runs on the host (checked with or without a device);
- nccl and gpu-ring-nccl each give a plain row and a "-graph" row at every size, #wrong 0 in both modes (the check
  launches a captured graph of one collective against exactly summable inputs), times per collective;
- -G alone measures nccl;
- -z 2 times every call (min and p99 from the calls; a -graph row's are its -G launches of the -n captured calls);
  -z 0, the default, queues the -n calls and waits once: the time is their mean, the per-call figures null.
Without a usable GPU the runs are refused by the device check: the test skips (exit 77) with that line as the reason.

usage: check_allreduce_perf_gpu.py MPIRUN ALLREDUCE_PERF
"""
import json
import math
import os
import subprocess
import sys
import tempfile

SKIP = 77
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(mpirun, exe, args):
    return subprocess.run([mpirun, "--bind-to", "none", "-np", "1", exe, *args], capture_output=True, text=True,
                          timeout=100)


def ours(p):
    return [line for line in p.stderr.splitlines() if line.startswith("allreduce_perf")]


def check_refusals(mpirun, exe):
    host_waits, on_host = "its link makes the host wait", "it runs on the host"
    for impl, why in (("gpu-ring-ipc", host_waits), ("gpu-ring-host", host_waits), ("ring", on_host)):
        p = run(mpirun, exe, ["-G", "4", "--impls", impl, "-b", "4", "-e", "4"])
        lines = ours(p)
        check(p.returncode == 2 and len(lines) == 1 and not p.stdout.strip() and
              lines[0].startswith(f"allreduce_perf: error: -G 4: --impls {impl} cannot be captured: {why}"),
              f"-G 4 --impls {impl}: exit 2, one line saying why (got {p.returncode}: {lines or p.stderr[-200:]})")


def times_consistent(m, iters, queued):
    """One rank: time is its mean; min and p99 are the nearest-rank statistics of the calls (of a -graph row, its
    launches), or null where the calls were queued (-z 0)."""
    calls = sorted(m["times_us"])
    mean_ok = abs(m["time_us"] - m["rank_means_us"][0]) <= 1e-9 * m["time_us"] and m["time_us"] > 0
    if queued:
        return mean_ok and not calls and m["min_us"] is None and m["p99_us"] is None
    return (len(calls) == iters and mean_ok and
            (m["min_us"], m["p99_us"]) == (calls[0], calls[math.ceil(len(calls) * 0.99) - 1]))


def check_rows(doc, labels, sizes, graph, queued):
    got = {(r["impl"], r["size_bytes"]): r for r in doc["results"]}
    missing = [(label, size) for label in labels for size in sizes if (label, size) not in got]
    check(not missing, f"a row per label {labels} and size {sizes} ({missing} missing)")
    check(doc["cuda_graph"] == graph, f"the JSON records -G {graph} (got {doc['cuda_graph']})")
    modes = ("out_of_place", "in_place")
    wrong = [(r["impl"], r["size_bytes"], m, r[m]["wrong"]) for r in doc["results"] for m in modes
             if r[m]["wrong"] != 0]
    check(not wrong, f"#wrong 0 in every row, plain and graph ({wrong})")
    # nccl-tests' -G: a -graph row times its -G launches of one graph of the -n calls.
    odd = [(r["impl"], r["size_bytes"], m) for r in doc["results"] for m in modes
           if not times_consistent(r[m], graph if r["impl"].endswith("-graph") else doc["iters"], queued)]
    check(doc["blocking"] == (0 if queued else 2), f"the JSON records -z {0 if queued else 2}")
    check(not odd, f"time, min and p99 agree with the calls in every row, -z {0 if queued else 2} ({odd})")


def main():
    mpirun, exe = sys.argv[1:3]
    check_refusals(mpirun, exe)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "graph.json")
        p = run(mpirun, exe, ["--impls", "nccl,gpu-ring-nccl", "-G", "10", "-b", "8", "-e", "1M", "-f", "32",
                              "-w", "2", "-n", "5", "-c", "2", "-z", "2", "-J", out])
        lines = ours(p)
        if p.returncode == 2 and len(lines) == 1 and lines[0].startswith("allreduce_perf: error: --impls nccl: "):
            if failures:
                sys.exit(f"{len(failures)} FAILED:\n  " + "\n  ".join(failures))
            print(f"SKIP: no usable GPU: {lines[0]}")
            sys.exit(SKIP)
        sys.stdout.write(p.stdout)
        check(p.returncode == 0, f"-G 10 --impls nccl,gpu-ring-nccl: exit 0 (got {p.returncode}: {p.stderr[-300:]})")
        if os.path.exists(out):
            with open(out) as f:
                doc = json.load(f)
            check_rows(doc, ["nccl", "nccl-graph", "gpu-ring-nccl", "gpu-ring-nccl-graph"], [8, 256, 8192, 262144],
                       10, queued=False)
            gpus = doc.get("gpus", [])
            check(len(gpus) == 1 and gpus[0].count(":") >= 2,
                  f"-J names the rank's GPU by its PCI bus id (ddplab predict reads how ranks shared GPUs): {gpus}")
            check("# -G 10: a row <impl>-graph" in p.stdout, "the header says what the -graph rows are")
        out = os.path.join(d, "graph_queued.json")  # -J never replaces a file without --force
        p = run(mpirun, exe, ["-G", "3", "-b", "4", "-e", "4", "-n", "2", "-J", out])
        if p.returncode == 0:
            with open(out) as f:
                doc = json.load(f)
            check_rows(doc, ["nccl", "nccl-graph"], [4], 3, queued=True)
            check("# -z 0: the GPU implementations' -n calls go on the stream back to back" in p.stdout,
                  "the header says -z 0 queued the calls")
        check(p.returncode == 0, f"-G 3 alone measures nccl, -z 0 (got {p.returncode}: {p.stderr[-300:]})")
    if failures:
        sys.exit(f"{len(failures)} FAILED:\n  " + "\n  ".join(failures))
    print("OK: allreduce_perf -G: CUDA graphs beside the plain launch, exact sums")


if __name__ == "__main__":
    main()
