#!/usr/bin/env python3
"""Runs allreduce_perf at one world size and checks its machine-readable output: every implementation and size
is present, #wrong is 0 in both modes, times, per-call statistics and bandwidths are consistent, the type is the
wire's, and the CSV agrees with the JSON.

usage: check_allreduce_perf.py MPIRUN ALLREDUCE_PERF NP
"""
import csv
import json
import math
import os
import subprocess
import sys
import tempfile

IMPLS = ["ring", "mpi", "mpi-raw", "ring-bf16", "ring-fp16", "ring-sharded"]  # hier needs nodes: --ranks-per-node below
WIRE = {"ring-bf16": "bfloat16", "ring-fp16": "half"}  # the rest: float


def run(mpirun, exe, np, args, workdir, tag):
    j, c = os.path.join(workdir, tag + ".json"), os.path.join(workdir, tag + ".csv")
    cmd = [mpirun, "--bind-to", "none", "-np", str(np), exe, *args, "--json", j, "--csv", c]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        # allreduce_perf exits 1 when #wrong > 0: still read what it wrote, so the failure says where.
        print(f"allreduce_perf exited {p.returncode}\n{p.stderr}")
        if not os.path.exists(j):
            sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode} and wrote no JSON")
    with open(j) as f:
        doc = json.load(f)
    with open(c) as f:
        rows = list(csv.DictReader(f))
    return doc, rows, p.stdout


def check(doc, rows, np, impls, sizes):
    errors = []
    if doc["nranks"] != np:
        errors.append(f"nranks {doc['nranks']} != {np}")
    got = {(r["impl"], r["size_bytes"]): r for r in doc["results"]}
    for impl in impls:
        for size in sizes:
            r = got.get((impl, size))
            if r is None:
                errors.append(f"{impl} {size} B missing")
                continue
            if r["type"] != WIRE.get(impl, "float"):
                errors.append(f"{impl} {size} B: type {r['type']}, the wire's is {WIRE.get(impl, 'float')}")
            for mode in ("out_of_place", "in_place"):
                m = r[mode]
                if m["wrong"] != 0:
                    errors.append(f"{impl} {size} B {mode}: #wrong {m['wrong']}")
                if not m["time_us"] > 0:
                    errors.append(f"{impl} {size} B {mode}: time {m['time_us']}")
                # time = the ranks' means averaged (-a 1, the default); per call: min, nearest-rank p50 and p99.
                means, calls = m["rank_means_us"], sorted(m["times_us"])
                if len(means) != np or abs(m["time_us"] - sum(means) / np) > 1e-9 * m["time_us"]:
                    errors.append(f"{impl} {size} B {mode}: time {m['time_us']} is not the mean of {means}")
                if len(calls) != doc["iters"]:
                    errors.append(f"{impl} {size} B {mode}: {len(calls)} per-call times, {doc['iters']} calls")
                elif (m["min_us"], m["p50_us"], m["p99_us"]) != (calls[0], calls[math.ceil(len(calls) / 2) - 1],
                                                                 calls[math.ceil(len(calls) * 0.99) - 1]):
                    errors.append(f"{impl} {size} B {mode}: min/p50/p99 {m['min_us']}/{m['p50_us']}/{m['p99_us']} "
                                  f"do not match the calls {calls}")
                algbw = size / (m["time_us"] * 1e-6) / 1e9
                if abs(m["algbw_gbs"] - algbw) > 1e-6 * max(1.0, algbw):
                    errors.append(f"{impl} {size} B {mode}: algbw {m['algbw_gbs']} != size/time {algbw}")
                bus = algbw * (2 * (np - 1) / np)
                if abs(m["busbw_gbs"] - bus) > 1e-6 * max(1.0, bus):
                    errors.append(f"{impl} {size} B {mode}: busbw {m['busbw_gbs']} != algbw*2(n-1)/n {bus}")
        if impl not in doc["avg_busbw"]:
            errors.append(f"{impl}: no average bus bandwidth")
    if len(rows) != len(doc["results"]):
        errors.append(f"CSV has {len(rows)} rows, JSON {len(doc['results'])}")
    for row in rows:
        r = got.get((row["impl"], int(row["size_bytes"])))
        same = r is not None and row["type"] == r["type"] and all(
            int(row[f"{m}_wrong"]) == r[mode]["wrong"] and
            all(abs(float(row[f"{m}_{k}"]) - r[mode][k]) <= 1e-3 + 1e-4 * r[mode][k]
                for k in ("time_us", "busbw_gbs", "min_us", "p50_us", "p99_us"))
            for m, mode in (("oop", "out_of_place"), ("ip", "in_place")))
        if not same:
            errors.append(f"CSV row disagrees with JSON: {row}")
    return errors


def main():
    mpirun, exe, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with tempfile.TemporaryDirectory() as d:
        # 8 B .. 2 MiB: recursive doubling, the ring with one and with several rounds (slices), every wire.
        sizes = [8 * 8**k for k in range(7)]  # -b 8 -e 2M -f 8: 8 B .. 2 MiB
        # 3 calls: p50 and p99 are different calls.
        doc, rows, out = run(mpirun, exe, np, ["-b", "8", "-e", "2M", "-f", "8", "-w", "1", "-n", "3",
                                               "--impls", ",".join(IMPLS)], d, "plain")
        errors = check(doc, rows, np, IMPLS, sizes)
        # More ranks than this host's cores: the header says so (as ddplab train's does), and only then.
        if ("# oversubscribed:" in out) != (np > os.cpu_count()):
            errors.append(f"np {np} on {os.cpu_count()} cores: the header's oversubscription note is "
                          f"{'there' if '# oversubscribed:' in out else 'missing'}")
        sizes_seen = sorted({r["size_bytes"] for r in doc["results"]})
        if sizes_seen != sizes:
            errors.append(f"sizes {sizes_seen}, expected {sizes}")
        # An emulated link (fast, so the test stays short): mpi applies its model, the ring the wrapper transport.
        doc, rows, _ = run(mpirun, exe, np, ["-b", "1K", "-e", "256K", "-f", "16", "-w", "1", "-n", "2",
                                             "--impls", "ring,mpi,ring-bf16", "--link", "100gbe-ib"], d, "link")
        errors += check(doc, rows, np, ["ring", "mpi", "ring-bf16"], [1024, 16384, 262144])
        if doc["link"]["name"] != "100gbe-ib" or doc["link"]["gbps"] != 100:
            errors.append(f"link not recorded: {doc['link']}")
        # Emulated nodes, every implementation: one rank per node (hier: the cross-node ring alone), and two per
        # node where np allows, with per-class links (fast, so the test stays short).
        node_impls = ["ring", "mpi", "hier"]
        for k in [1] + ([2] if np % 2 == 0 and np > 2 else []):
            doc, rows, _ = run(mpirun, exe, np, ["-b", "8", "-e", "2M", "-f", "8", "-w", "1", "-n", "3",
                                                 "--impls", ",".join(node_impls), "--ranks-per-node", str(k),
                                                 "--link", "intra=pcie4,inter=100gbe-ib"], d, f"nodes{k}")
            errors += check(doc, rows, np, node_impls, sizes)
            if doc.get("node_of_rank") != [r // k for r in range(np)]:
                errors.append(f"--ranks-per-node {k}: node_of_rank {doc.get('node_of_rank')}")
            if (doc["links"]["intra"]["name"], doc["links"]["inter"]["name"]) != ("pcie4", "100gbe-ib"):
                errors.append(f"link classes not recorded: {doc['links']}")
        # Bad nodes and links: one line, exit code 2, nothing written.
        bad = [(["--impls", "ring", "--ranks-per-node", str(np + 1)], "--ranks-per-node"),
               (["--impls", "hier"], "more than one node"),
               (["--impls", "ring", "--link", "intra=foo"], "unknown --link 'foo'"),
               (["--impls", "ring", "--link", "bogus=25gbe"], "unknown link class 'bogus'")]
        for args, says in bad:
            j = os.path.join(d, "bad.json")
            p = subprocess.run([mpirun, "--bind-to", "none", "-np", str(np), exe, *args, "--json", j],
                               capture_output=True, text=True, timeout=60)
            lines = [l for l in p.stderr.splitlines() if l.startswith("allreduce_perf")]
            if p.returncode != 2 or len(lines) != 1 or says not in lines[0] or os.path.exists(j):
                errors.append(f"{' '.join(args)}: exit {p.returncode}, stderr {p.stderr!r}")
    if errors:
        sys.exit("FAIL:\n  " + "\n  ".join(errors))
    print(f"OK: allreduce_perf np={np}: every implementation and size, #wrong = 0")


if __name__ == "__main__":
    main()
