#!/usr/bin/python3
"""Emulated nodes in `ddplab train` (docs/COMM.md: topology): bad nodes and links refused before any work; a 2 x 2
run whose inter-node link (1gbe) dominates exposed comm at small buckets, measured against the same run with the
inter-node link off; the run file's nodes and link classes, the blame naming the link, the timeline grouping ranks
by node; --comm hier training.

usage: check_topology.py MPIRUN DDPLAB
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

import h5py

from checks import check, cpu_waited_ms, exit_code, failures, skip  # tests/cli/checks.py: the assertion every CLI test shares


mpirun, ddplab = sys.argv[1], sys.argv[2]
# An MLP of 1.6 MB of gradients in 256 KiB buckets: at 1gbe the ring's 1.5 x 1.6 MB cross each NIC in ~19 ms, five
# times what this machine's own transport takes (~3.5 ms/step exposed without the link, measured alone), so the
# margin survives a shared machine; a small batch keeps compute short.
TRAIN = ["train", "--steps", "10", "--warmup-steps", "3", "--hidden", "512", "--input-dim", "256", "--classes", "10",
         "--batch", "16", "--bucket-mb", "0.25", "--last-bucket-mb", "0.25", "--ranks-per-node", "2", "--quiet"]


def run(*args, np_ranks=4, timeout=180):
    return subprocess.run([mpirun, "--bind-to", "none", "-np", str(np_ranks), ddplab, *args], capture_output=True,
                          text=True, timeout=timeout)


def refused(proc, text):
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ddplab:")]
    return proc.returncode == 2 and len(lines) == 1 and text in lines[0]


with tempfile.TemporaryDirectory() as work:
    # ---- bad input: one line, exit 2, nothing written -------------------------------------------------------------
    bad = os.path.join(work, "bad.h5")
    for args, says in [(["--ranks-per-node", "3"], "--ranks-per-node 3 does not divide the 4 ranks"),
                       (["--comm", "hier"], "--comm hier needs more than one node"),
                       (["--link", "intra=foo"], "unknown --link 'foo'"),
                       (["--link", "bogus=25gbe"], "unknown link class 'bogus'"),
                       (["--link", "intra=none,inter=10gbe", "--link-gbps", "5"], "apply to a single --link preset")]:
        proc = run("train", "--steps", "2", *args, "--out", bad)
        check(refused(proc, says) and not os.path.exists(bad),
              f"{' '.join(args)}: one line naming it, exit 2, no file "
              f"({proc.returncode}, {proc.stderr.strip()[:200]!r})")

    # ---- the inter-node link dominates exposed comm -----------------------------------------------------------------
    # Each setting twice, alternating, and the better run of each compared: the machine is shared, and a burst of
    # load slows the run it lands on, not the link's floor.
    exposed, waited, reports = {}, 0.0, []
    for attempt, inter in enumerate(["1gbe", "none", "1gbe", "none"]):
        path = os.path.join(work, f"inter_{inter}_{attempt}.h5")
        proc = run(*TRAIN, "--link", f"intra=none,inter={inter}", "--out", path)
        check(proc.returncode == 0, f"2 x 2 run, inter {inter} ({proc.stderr.strip()[-300:]!r})")
        if proc.returncode != 0:
            continue
        with h5py.File(path, "r") as f:
            steady = f["steps"]["exposed_comm_ms"][:, 3:]
            exposed[inter] = min(exposed.get(inter, 1e9), statistics.median(steady.mean(axis=0)))
            check(list(f["node"][:]) == [0, 0, 1, 1], f"run file: node of each rank {list(f['node'][:])}")
            links = json.loads(f.attrs["links"])
            check(links["intra"]["name"] == "none" and links["inter"]["name"] == inter and
                  links["inter"]["gbps"] == (1 if inter == "1gbe" else 0), f"run file: link classes {links}")
            check("shm single-copy within node (1 peer) + mpi across nodes (2 peers)" in f.attrs["transport"],
                  f"run file: the transport of each hop ({f.attrs['transport']!r})")
        waited = max(waited, cpu_waited_ms(path))  # what the host took from the ranks
        if inter == "1gbe":
            reports.append(subprocess.run([ddplab, "report", path], capture_output=True, text=True, timeout=60).stdout)
        if attempt == 0:
            report = reports[0]
            check("topology: 2 nodes (node of each rank 0,0,1,1), links intra none, inter 1gbe" in report,
                  "the report shows the nodes and links")
            trace_path = os.path.join(work, "trace.json")
            subprocess.run([ddplab, "timeline", path, "-o", trace_path], capture_output=True, timeout=60)
            with open(trace_path) as t:
                events = json.load(t)
            events = events["traceEvents"] if isinstance(events, dict) else events
            names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
            order = sorted(names, key=lambda pid: [e["args"]["sort_index"] for e in events
                                                   if e.get("name") == "process_sort_index" and e["pid"] == pid][0])
            check([names[p].split(" (")[0] for p in order] ==
                  ["node 0 / rank 0", "node 0 / rank 1", "node 1 / rank 2", "node 1 / rank 3"],
                  f"the timeline groups ranks by node ({[names[p] for p in order]})")
    # The blame names the link where every rank waits for it alike; one rank starved of a CPU (4 ranks on shared
    # cores) breaks "alike" in the run it lands on: the better of the two runs is asked.
    named = [("exposed comm on the inter-node link (1gbe, shared by 2 ranks per NIC)" in r) for r in reports]
    if reports and not any(named) and waited > 8:
        skip(f"the blame names the inter-node link (in neither run; the ranks waited {waited:.1f} ms per step for a "
             f"CPU)")
    else:
        check(any(named), f"the blame names the inter-node link ({named})")
    if len(exposed) == 2:
        # ~19 ms more per step at 1gbe; asserted: at least twice, and 8 ms more (generous: the machine is shared).
        link_adds_ms, asserted_ms = 19, 8
        # Where the ranks wait longer than that for a CPU in every step, or the run without a link already exposes
        # more comm than the link adds (every message waiting for its receiver's comm thread to get a CPU), the
        # host's other work, not the link, sets the exposed comm, and the check says so instead.
        figures = f"exposed comm {exposed['1gbe']:.1f} ms/step with inter 1gbe vs {exposed['none']:.1f} with none"
        holds = exposed["1gbe"] > 2 * exposed["none"] and exposed["1gbe"] - exposed["none"] > asserted_ms
        if not holds and (waited > asserted_ms or exposed["none"] > link_adds_ms):
            skip(f"the link's share ({figures}): the ranks waited {waited:.1f} ms per step for a CPU")
        else:
            check(holds, f"{figures}; the ranks waited {waited:.1f} ms per step for a CPU")

    # ---- --comm hier trains ---------------------------------------------------------------------------------------
    path = os.path.join(work, "hier.h5")
    proc = run(*TRAIN, "--comm", "hier", "--link", "intra=none,inter=100gbe-ib", "--out", path)
    check(proc.returncode == 0, f"--comm hier at 2 x 2 ({proc.stderr.strip()[-300:]!r})")
    if proc.returncode == 0:
        with h5py.File(path, "r") as f:
            check(f.attrs["transport"].startswith("shm single-copy within node (1 peer) + mpi across nodes (1 peer)"),
                  f"hier's hops: {f.attrs['transport']!r}")

print(f"{len(failures)} check(s) failed" if failures else "OK")
sys.exit(exit_code())
