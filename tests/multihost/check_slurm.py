#!/usr/bin/python3
"""The README's Slurm lines on two hosts: Slurm (scripts/slurm_cluster.sh) on the namespace hosts of
scripts/netns_cluster.sh, a slurmd on each, srun --mpi=pmix starting ddplab's ranks through PMIx.
- ddplab train, 2 nodes x 2 tasks: the ring over shared memory within a host and MPI across; the run file names both
  hosts, ranks 0-1 on the first; every rank's losses equal bit for bit those of the same run started by mpirun on
  the same two hosts.
- --cpus-per-task 1 and a task a node: each rank runs as many BLAS threads as Slurm gave it CPUs (1 of its host's 2).
- A refusal: one line, exit 2, from all four ranks at once.
- suite lab, as the README starts it: every case runs, the summary and the page are written.
Exits 77 (ctest: skipped) with the reason when the hosts cannot be made here or Slurm is not installed. The hosts,
and Slurm's daemons with them, are taken down on every way out.

usage: check_slurm.py MPIRUN DDPLAB SLURM_CLUSTER_SH NETNS_CLUSTER_SH
"""
import json
import os
import subprocess
import sys

import h5py

from check_two_hosts import TIMEOUT_S, check, failures, on_a_cluster, run, train

SRUN = ["--mpi=pmix", "-N", "2", "--ntasks-per-node", "2", "--cpus-per-task", "1"]
SMALL = ["--batch", "8", "--input-dim", "32", "--hidden", "64", "--classes", "4"]


def check_train(slurm_sh, netns_sh, cluster, ddplab, hosts, work):
    # One BLAS thread a rank under both launchers: srun binds each rank to its one CPU, mpirun leaves them unbound.
    by_srun = os.path.join(work, "srun.h5")
    p = train([slurm_sh, "srun", cluster, *SRUN], ddplab, by_srun, "srun: ddplab train on 2 nodes x 2 tasks",
              ["--threads", "1"])
    if p is None:
        return
    transport = "shm single-copy within node (1 peer) + mpi across nodes (2 peers)"
    check(f"comm ring over {transport} " in p.stdout, f"the header says the ring runs over {transport}")
    by_mpirun = os.path.join(work, "mpirun.h5")
    if train([netns_sh, "mpirun", cluster, "-np", "4", "--bind-to", "none"], ddplab, by_mpirun,
             "mpirun: the same run on the same 2 hosts", ["--threads", "1"]) is None:
        return
    with h5py.File(by_srun) as f, h5py.File(by_mpirun) as g:
        names = [h.decode() for h in f["hostnames"][()]]
        check(names == [hosts[0]] * 2 + [hosts[1]] * 2, f"run file hostnames {names}: ranks 0-1 on {hosts[0]}, "
                                                        f"2-3 on {hosts[1]}")
        check((f["steps/loss"][()] == g["steps/loss"][()]).all(),
              "every rank's losses under srun equal bit for bit those under mpirun")


def check_cpus_per_task(slurm_sh, cluster, ddplab, work):
    # One task a node bound to one of its host's 2 CPUs: unbound, a rank would take both.
    p = run([slurm_sh, "srun", cluster, "--mpi=pmix", "-N", "2", "--ntasks-per-node", "1", "--cpus-per-task", "1",
             ddplab, "train", "--steps", "3", "--warmup-steps", "1", *SMALL, "--out", os.path.join(work, "c1.h5")],
            "srun --cpus-per-task 1: ddplab train on 2 nodes x 1 task")
    if p is not None:
        header = p.stdout.splitlines()[0]
        check("1 BLAS thread per rank" in header, f"a rank runs a BLAS thread per CPU Slurm gave it: {header!r}")


def check_refusal(slurm_sh, cluster, ddplab):
    try:
        p = subprocess.run([slurm_sh, "srun", cluster, *SRUN, ddplab, "train", "--batch", "0"], capture_output=True,
                           text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        check(False, f"srun: a refusal ends within {TIMEOUT_S} s")
        return
    said = [line for line in (p.stdout + p.stderr).splitlines() if line.startswith("ddplab: error:")]
    check(p.returncode == 2 and len(said) == 1 and "--batch" in said[0],
          f"srun: --batch 0 refused in one line naming it, exit 2 (got {p.returncode}: {said})")


def check_suite(slurm_sh, cluster, ddplab, work):
    out = os.path.join(work, "lab")
    p = run([slurm_sh, "srun", cluster, *SRUN, ddplab, "suite", "lab", "--steps", "3", "--warmup-steps", "1",
             *SMALL, "--out-dir", out], "srun: ddplab suite lab on 2 nodes x 2 tasks")
    if p is None:
        return
    with open(os.path.join(out, "summary.json")) as f:
        cases = json.load(f)["cases"]
    check(len(cases) >= 10 and all(c.get("world_size") for c in cases),
          f"suite lab: every case ran ({len(cases)} cases)")
    check(os.path.exists(os.path.join(out, "report.html")), "suite lab: the page is written")


def print_daemon_logs(cluster):
    """The last lines each of Slurm's daemons and munged wrote: where a failed srun says only "Unspecified error"."""
    for name in sorted(os.listdir(cluster)):
        if name.endswith(".log") and name.startswith(("slurm", "munged")):
            with open(os.path.join(cluster, name), errors="replace") as f:
                print(f"--- {name}, last lines:\n" + "".join(f.readlines()[-15:]), flush=True)


def main():
    mpirun, ddplab, slurm_sh, netns_sh = sys.argv[1:5]
    os.environ["MPIRUN"] = mpirun  # the same Open MPI under mpirun as under srun

    def checks(cluster, hosts, work):
        check_train(slurm_sh, netns_sh, cluster, ddplab, hosts, work)
        check_cpus_per_task(slurm_sh, cluster, ddplab, work)
        check_refusal(slurm_sh, cluster, ddplab)
        check_suite(slurm_sh, cluster, ddplab, work)
        if failures:
            print_daemon_logs(cluster)

    return on_a_cluster(slurm_sh, checks)


if __name__ == "__main__":
    sys.exit(main())
