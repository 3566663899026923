#!/usr/bin/python3
"""A real multi-host run: two hosts made of namespaces on this machine (scripts/netns_cluster.sh,
docs/MULTIHOST.md), 2 ranks each, launched by Open MPI through an rsh agent, TCP between the hosts over a veth pair.
- Each host has its own hostname and sees only its loopback and veth addresses (no route anywhere else).
- allreduce_perf: the ring, hier (its nodes: the two hosts) and MPI give exact sums at awkward counts.
- ddplab train: the run file names both hosts, ranks 0-1 on the first; the ring goes over shared memory within a
  host and MPI across; every rank's losses equal bit for bit those of the same run on one host (the ring adds in
  the same order whatever carries the bytes).
- a /dev/shm too small for the gradients on one host: its ranks go by copy, the other host's keep single copy, and
  the run completes with the replicas alike (hosts that fail to register stay in step with hosts that do not).
Exits 77 (ctest: skipped) with the reason when namespaces cannot be made here. The hosts are taken down on every
way out; should this script be killed outright, they kill their own processes when their lifetime runs out.

usage: check_two_hosts.py MPIRUN DDPLAB ALLREDUCE_PERF NETNS_CLUSTER_SH
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

import h5py

SKIPPED = 77
LIFETIME_S = 300  # the ctest timeout: the hosts never outlive the test by much
TIMEOUT_S = 120   # per command; a hung rank is killed by `down`

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(cmd, what):
    print("$ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        check(False, f"{what} ends within {TIMEOUT_S} s")
        return None
    sys.stdout.write(p.stdout)
    check(p.returncode == 0, f"{what} exits 0 (got {p.returncode}: {p.stderr.strip()[-600:]})")
    return p if p.returncode == 0 else None


def check_hosts(cluster_sh, cluster, hosts):
    for i, host in enumerate(hosts):
        look = "set -e; cat /proc/sys/kernel/hostname; ip -o addr show; echo ROUTES; ip route show; ip -6 route show"
        p = run([cluster_sh, "exec", cluster, host, "sh", "-c", look], f"a look at {host}")
        if p is None:
            continue
        lines = p.stdout.splitlines()
        check(lines[0] == host, f"{host}: hostname {lines[0]}")
        addrs = sorted(tuple(line.split()[1:4:2]) for line in lines[1:lines.index("ROUTES")])
        want = sorted([("lo", "127.0.0.1/8"), ("lo", "::1/128"), ("veth0", f"10.77.0.{i + 1}/24")])
        check(addrs == want, f"{host}: addresses {addrs} are loopback and its veth's only")
        routes = lines[lines.index("ROUTES") + 1:]
        check(len(routes) == 1 and routes[0].startswith("10.77.0.0/24 dev veth0"),
              f"{host}: one route, to the other host ({routes})")


def check_allreduce_perf(cluster_sh, cluster, allreduce_perf, work):
    # Counts 1 (fewer elements than ranks), 32770, 65539 (odd) and 98308: past a ring slice, uneven shards.
    out = os.path.join(work, "allreduce.json")
    p = run([cluster_sh, "mpirun", cluster, "-np", "4", "--bind-to", "none", allreduce_perf, "-b", "4",
             "-e", "393232", "-i", "131076", "-w", "1", "-n", "2", "-c", "2", "--impls", "ring,hier,mpi",
             "--json", out], "allreduce_perf on 2 hosts x 2 ranks")
    if p is None:
        return
    with open(out) as f:
        doc = json.load(f)
    check(doc["nranks"] == 4, f"allreduce_perf: 4 ranks (got {doc['nranks']})")
    seen = {(r["impl"], r["count"]) for r in doc["results"]}
    want = {(impl, count) for impl in ("ring", "hier", "mpi") for count in (1, 32770, 65539, 98308)}
    check(seen == want, f"allreduce_perf: every implementation at every count ({sorted(want - seen)} missing)")
    for impl in ("ring", "hier", "mpi"):
        wrong = [(r["count"], mode, r[mode]["wrong"]) for r in doc["results"] if r["impl"] == impl
                 for mode in ("out_of_place", "in_place") if r[mode]["wrong"] != 0]
        check(not wrong, f"{impl}: exact sums at every count, out of place and in place, 2 checked calls each "
                         f"(count, mode, #wrong: {wrong})")


def train(cmd_prefix, ddplab, path, what, extra=()):
    # --check-sync: the ranks' parameters are compared every 4 steps; the run stops if they drift apart.
    return run(cmd_prefix + [ddplab, "train", "--steps", "8", "--batch", "16", "--warmup-steps", "2",
                             "--input-dim", "64", "--hidden", "128", "--classes", "10", "--bucket-mb", "0.05",
                             "--last-bucket-mb", "0.05", "--check-sync", "4", "--out", path, *extra], what)


def check_train(mpirun, ddplab, cluster_sh, cluster, hosts, work):
    two = os.path.join(work, "two_hosts.h5")
    p = train([cluster_sh, "mpirun", cluster, "-np", "4", "--bind-to", "none"], ddplab, two,
              "ddplab train on 2 hosts x 2 ranks")
    if p is None:
        return
    # Each rank has one peer on its host (shared memory) and two on the other (MPI over TCP).
    transport = "shm single-copy within node (1 peer) + mpi across nodes (2 peers)"
    check(f"comm ring over {transport} " in p.stdout, f"the header says the ring runs over {transport}")
    one = os.path.join(work, "one_host.h5")
    one_host = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", "4"]
    if train(one_host, ddplab, one, "ddplab train on this host, 4 ranks") is None:
        return
    with h5py.File(two) as f, h5py.File(one) as g:
        names = [h.decode() for h in f["hostnames"][()]]
        check(names == [hosts[0]] * 2 + [hosts[1]] * 2, f"run file hostnames {names}: ranks 0-1 on {hosts[0]}, "
                                                        f"2-3 on {hosts[1]}")
        check(f.attrs["transport"] == transport, f"run file transport '{f.attrs['transport']}'")
        nodes = list(f["node"][()])
        check(nodes == [0, 0, 1, 1], f"run file nodes {nodes}: the hosts are the nodes")
        same = (f["steps/loss"][()] == g["steps/loss"][()]).all()
        check(same, "every rank's losses on 2 hosts equal bit for bit those on one host")
    # The hierarchical all-reduce groups ranks by host: it refuses one node, so training with it proves 2 nodes.
    hier = os.path.join(work, "two_hosts_hier.h5")
    if train([cluster_sh, "mpirun", cluster, "-np", "4", "--bind-to", "none"], ddplab, hier,
             "ddplab train --comm hier on 2 hosts x 2 ranks", ["--comm", "hier"]) is not None:
        with h5py.File(hier) as f, h5py.File(two) as g:
            close = abs(f["steps/loss"][()] - g["steps/loss"][()]).max() < 1e-4
            check(close, "hier's losses match the ring's within 1e-4 (sums in another order)")


def check_small_shm_on_one_host(cluster_sh, cluster, hosts, ddplab, work):
    # 32 MiB on the second host: its FIFOs fit, its two ranks' 50 MB of registered gradients do not. Last of the
    # checks: the small /dev/shm stays until `down`. --timeout-s: hosts out of step would hang in a collective.
    if run([cluster_sh, "exec", cluster, hosts[1], "mount", "-o", "remount,size=32M", "/dev/shm"],
           f"{hosts[1]}: a 32 MiB /dev/shm") is None:
        return
    p = run([cluster_sh, "mpirun", cluster, "-np", "4", "--bind-to", "none", ddplab, "train", "--steps", "3",
             "--warmup-steps", "1", "--batch", "8", "--hidden", "2048", "--layers", "3", "--check-sync", "1",
             "--timeout-s", "20", "--out", os.path.join(work, "small_shm.h5")],
            f"ddplab train on 2 hosts x 2 ranks, {hosts[1]}'s /dev/shm too small for the gradients")
    if p is None:
        return
    by_copy = sorted(int(r) for r in re.findall(r"rank (\d+): RegisteredBuffer: .*no room in /dev/shm", p.stderr))
    check(by_copy == [2, 3], f"{hosts[1]}'s ranks, and only they, say their gradients go by copy (ranks {by_copy})")
    transport = "shm single-copy within node (1 peer) + mpi across nodes (2 peers)"
    check(f"comm ring over {transport} " in p.stdout, f"{hosts[0]}'s rank 0 keeps single copy ({transport})")


def on_a_cluster(cluster_sh, body):
    """Makes a cluster (`CLUSTER_SH up DIR LIFETIME`), runs body(cluster_dir, hosts, work_dir) and takes the cluster
    down on every way out. Returns the test's exit code: 77 with the reason where the cluster cannot be made here."""
    # ctest's timeout and Ctrl-C end us with a signal: unwind, so that `finally` takes the hosts down.
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda signum, frame: sys.exit(128 + signum))
    script = os.path.basename(cluster_sh)
    # In /tmp itself, whatever TMPDIR says: the daemons' sockets live below the cluster's folder, and a socket's path
    # may not pass 107 bytes.
    with tempfile.TemporaryDirectory(prefix="ddplab-cluster-", dir="/tmp") as work:
        cluster = os.path.join(work, "cluster")
        try:
            try:
                up = subprocess.run([cluster_sh, "up", cluster, str(LIFETIME_S)], capture_output=True, text=True,
                                    timeout=90)
            except subprocess.TimeoutExpired:  # killed half-way: `down` below takes what it made
                check(False, f"{script} up ends within 90 s")
                return 1
            if up.returncode == SKIPPED:
                print("SKIPPED: " + up.stderr.strip())
                return SKIPPED
            check(up.returncode == 0, f"{script} up exits 0 ({up.stdout.strip()} {up.stderr.strip()})")
            if up.returncode != 0:
                return 1
            print(up.stdout.strip())
            with open(os.path.join(cluster, "hostfile")) as f:
                hosts = [line.split()[0] for line in f]
            body(cluster, hosts, work)
        finally:
            down = subprocess.run([cluster_sh, "down", cluster], capture_output=True, text=True, timeout=60)
            check(down.returncode == 0 and not os.path.exists(cluster),
                  f"{script} down leaves no process and no file ({down.stderr.strip()})")
    print("FAILED: " + "; ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


def main():
    mpirun, ddplab, allreduce_perf, cluster_sh = sys.argv[1:5]
    os.environ["MPIRUN"] = mpirun  # the same Open MPI on two hosts as on one

    def checks(cluster, hosts, work):
        check_hosts(cluster_sh, cluster, hosts)
        check_allreduce_perf(cluster_sh, cluster, allreduce_perf, work)
        check_train(mpirun, ddplab, cluster_sh, cluster, hosts, work)
        check_small_shm_on_one_host(cluster_sh, cluster, hosts, ddplab, work)

    return on_a_cluster(cluster_sh, checks)


if __name__ == "__main__":
    sys.exit(main())
