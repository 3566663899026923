#!/usr/bin/python3
"""A disk that fills up, or turns read-only, under `ddplab train`: refused before the work when it clearly cannot
hold the run; otherwise every rank stops at the step the write failed, with exit code 5 and one line naming the
path and the system's reason, no abort, and the last complete snapshot (and checkpoint) kept readable. And a
/dev/shm too small for the shared-memory transport and the registered gradients.

usage: check_disk_faults.py MPIRUN DDPLAB ALLREDUCE_PERF

Each case runs on a small tmpfs of its own; where mounting one is not allowed (not root), the test is skipped
(exit code 77) with the reason.
"""
import os
import subprocess
import sys
import tempfile
import time

import h5py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from fault_soak import Tmpfs, fill, mount_problem, wait_for  # the soak's tmpfs and filler, shared

from checks import check, exit_code, failures, own_mpi_session, skip  # tests/cli/checks.py: every CLI test shares
SMALL = ["--input-dim", "16", "--hidden", "32", "--classes", "4", "--batch", "4", "--warmup-steps", "0", "--quiet"]


def start(mpirun, ddplab, args, np_ranks=2):
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(np_ranks), ddplab, "train"] + SMALL + args
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=own_mpi_session())


def finish(p, limit_s=120):
    out, _ = p.communicate(timeout=limit_s)
    return p.returncode, out


def report(ddplab, path):
    p = subprocess.run([ddplab, "report", path], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def stopped_lines(out):
    return [l for l in out.splitlines() if l.startswith("ddplab: stopped") or l.startswith("ddplab: error")]


def leftovers(folder):
    return [n for n in os.listdir(folder) if ".tmp." in n]


def fault_mid_run(mpirun, ddplab, name, fault, extra, wait_name):
    """Starts a long run on a 2 MiB tmpfs, injects `fault` once `wait_name` appears there; returns what is left."""
    tmpfs = Tmpfs("2m")
    with tmpfs as folder:
        out = os.path.join(folder, "run.h5")
        args = ["--steps", "1500", "--data-cost-ms", "1", "--out", out] + [a.replace("DIR", folder) for a in extra]
        p = start(mpirun, ddplab, args)
        began = wait_for(os.path.join(folder, wait_name), time.monotonic() + 60)
        fill(folder) if fault == "fill" else tmpfs.remount_read_only()
        code, text = finish(p)
        lines = stopped_lines(text)
        check(began and code == 5, f"{name}: exit code 5 (got {code}) {text[-400:] if code != 5 else ''}")
        check(len(lines) == 1 and "MPI_ABORT" not in text, f"{name}: one line, no abort ({lines})")
        yield folder, out, (lines or [""])[0]
        check(not leftovers(folder), f"{name}: no temporary left ({leftovers(folder)})")


def main():
    mpirun, ddplab, allreduce_perf = sys.argv[1:4]
    if problem := mount_problem():
        skip(problem)
        return exit_code()

    # A run file that clearly cannot fit: refused before any work, one line with the path, the need and what is free.
    with Tmpfs("20k") as folder:
        out = os.path.join(folder, "run.h5")
        code, text = finish(start(mpirun, ddplab, ["--steps", "200", "--out", out]))
        lines = stopped_lines(text)
        check(code == 2 and len(lines) == 1 and f"not enough space for {out}" in lines[0] and "20.0 KiB free" in
              lines[0], f"too small a disk: exit 2, one line naming path, need and free space (code {code}, {lines})")
        check(os.listdir(folder) == [], f"too small a disk: nothing written ({os.listdir(folder)})")

    # The disk fills mid-run: the snapshot after it fails; the one before stays, and `ddplab report` reads it.
    snapshots = ["--flush-every", "50"]
    for folder, out, line in fault_mid_run(mpirun, ddplab, "disk full", "fill", snapshots, "run.h5.partial"):
        check(f"cannot write {out}.partial: No space left on device" in line and f"{out}.partial keeps steps 0.." in
              line, f"disk full: names the path and the reason ({line})")
        kept = line.rsplit("keeps steps 0..", 1)[-1]
        with h5py.File(out + ".partial", "r") as f:
            steps = int(f.attrs["num_steps"])
        check(report(ddplab, out + ".partial")[0] == 0 and kept.isdigit() and steps == int(kept) + 1 and
              steps % 50 == 0, f"disk full: ddplab report reads the snapshot, with the steps the line says "
              f"({steps}, 0..{kept})")
        check(not os.path.exists(out), "disk full: no run file claims success")

    # The folder turns read-only mid-run: the same stop, with the system's reason.
    for folder, out, line in fault_mid_run(mpirun, ddplab, "read-only", "ro", snapshots, "run.h5.partial"):
        check(f"cannot write {out}.partial: Read-only file system" in line,
              f"read-only: names the path and the reason ({line})")
        check(report(ddplab, out + ".partial")[0] == 0, "read-only: the snapshot reads")

    # The disk fills between checkpoints: the next one fails, the one before is kept whole and resumes.
    for folder, out, line in fault_mid_run(mpirun, ddplab, "checkpoint", "fill",
                                           ["--flush-every", "0", "--checkpoint", "DIR/ck.h5", "--checkpoint-every",
                                            "50"], "ck.h5"):
        ck = os.path.join(folder, "ck.h5")
        check(f"cannot save checkpoint {ck}: No space left on device" in line, f"checkpoint: names it ({line})")
        resumed = os.path.join(os.path.dirname(folder), os.path.basename(folder) + "_resumed.h5")
        code, text = finish(start(mpirun, ddplab, ["--steps", "1600", "--resume", ck, "--out", resumed,
                                                    "--flush-every", "0"]))
        check(code == 0, f"checkpoint: the one kept resumes (code {code}) {text[-300:] if code else ''}")
        if os.path.exists(resumed):
            os.unlink(resumed)

    # The checkpoint's disk fills while the run file's has room: the run stops at the checkpoint that failed (exit
    # 5, one line naming it), and the run file keeps every step before it.
    with tempfile.TemporaryDirectory() as elsewhere, Tmpfs("2m") as folder:
        out, ck = os.path.join(elsewhere, "run.h5"), os.path.join(folder, "ck.h5")
        p = start(mpirun, ddplab, ["--steps", "1500", "--data-cost-ms", "1", "--out", out, "--flush-every", "0",
                                   "--checkpoint", ck, "--checkpoint-every", "50"])
        began = wait_for(ck, time.monotonic() + 60)
        fill(folder)
        code, text = finish(p)
        lines = stopped_lines(text)
        check(began and code == 5 and len(lines) == 1 and f"cannot save checkpoint {ck}: No space left on device" in
              lines[0], f"checkpoint's disk full: exit 5, one line naming it (code {code}, {lines})")
        steps, reason = -1, ""
        if os.path.exists(out):
            with h5py.File(out, "r") as f:
                steps, reason = int(f.attrs["num_steps"]), str(f.attrs["stop_reason"])
        check(steps >= 100 and steps % 50 == 0 and "cannot save checkpoint" in reason,
              f"checkpoint's disk full: the run file keeps the steps before it, and why ({steps}, {reason!r})")

    # The disk has room for the records but not the file: the final write fails; no snapshot was taken. HDF5 keeps
    # the file whose close failed open, and its exit handler used to crash on it (every time at one rank).
    for np_ranks in (1, 2):
        with Tmpfs("12k") as folder:
            out = os.path.join(folder, "run.h5")
            code, text = finish(start(mpirun, ddplab, ["--steps", "10", "--flush-every", "0", "--out", out], np_ranks))
            lines = stopped_lines(text)
            check(code == 5 and len(lines) == 1 and f"cannot write {out}: No space left on device" in lines[0] and
                  "no snapshot was taken" in lines[0] and "MPI_ABORT" not in text,
                  f"final write, {np_ranks} rank(s): exit 5, one line naming path and reason (code {code}, {lines})")
            check(os.listdir(folder) == [], f"final write: nothing half-written ({os.listdir(folder)})")

    # The page beside a run file (scripts/report_page.py, and the token shards of text_to_tokens.py) on a full disk:
    # an error, and nothing left behind.
    from whole_file import write_whole
    with Tmpfs("12k") as folder:
        page = os.path.join(folder, "run.report.html")
        try:
            write_whole(page, "x" * (64 << 10))
            raised = ""
        except OSError as e:
            raised = str(e)
        check("No space left on device" in raised and os.listdir(folder) == [],
              f"page on a full disk: the error, and no page or temporary left ({raised!r}, {os.listdir(folder)})")

    # The outputs of the commands that read run files, on a full disk: exit 5 as a run file's, one line naming the
    # path and the reason, and nothing left behind (the page's charts.py passes its failure on).
    with tempfile.TemporaryDirectory() as elsewhere, Tmpfs("12k") as folder:
        run_file = os.path.join(elsewhere, "run.h5")
        code, text = finish(start(mpirun, ddplab, ["--steps", "4", "--out", run_file], 1))
        check(code == 0, f"a run to read ({text[-300:]})")
        fill(folder)
        before = sorted(os.listdir(folder))
        for command, output, what in ((["timeline", run_file, "-o"], "t.json", ""),
                                      (["predict", run_file, "--json"], "p.json", ""),
                                      (["report", run_file, "--html"], "p.html", "the page ")):
            path = os.path.join(folder, output)
            p = subprocess.run([ddplab, *command, path], capture_output=True, text=True, timeout=120)
            lines = stopped_lines(p.stdout + p.stderr)
            check(p.returncode == 5 and len(lines) == 1 and
                  lines[0] == f"ddplab: error: cannot write {what}{path}: No space left on device" and
                  sorted(os.listdir(folder)) == before,
                  f"{command[0]} on a full disk: exit 5, one line naming path and reason, nothing left (code "
                  f"{p.returncode}, {lines}, {sorted(os.listdir(folder))})")
        # allreduce_perf's -J: the same line and exit 5, its table still printed.
        path = os.path.join(folder, "perf.json")
        p = subprocess.run([mpirun, "--oversubscribe", "--bind-to", "none", "-np", "2", allreduce_perf, "-b", "8", "-e",
                            "64", "-n", "1", "-w", "0", "--impls", "ring", "-J", path], capture_output=True, text=True,
                           timeout=120, env=own_mpi_session())
        lines = [l for l in p.stderr.splitlines() if l.startswith("allreduce_perf")]
        check(p.returncode == 5 and lines == [f"allreduce_perf: error: cannot write {path}: No space left on device"]
              and "# Avg bus bandwidth" in p.stdout and sorted(os.listdir(folder)) == before,
              f"allreduce_perf -J on a full disk: exit 5, one line, the table kept, nothing left (code {p.returncode}, "
              f"{lines}, {sorted(os.listdir(folder))})")

    # A /dev/shm too small for the shared-memory segments (64 MiB: Docker's default), in a mount namespace of the
    # test's own: never a SIGBUS at the first write into a page tmpfs could not give. The ring's FIFOs (8 ranks) fall
    # back to MPI, every rank agreeing; the gradients' registered buffer (2 ranks, 50 MB each) falls back to ordinary
    # memory (copies), said on stderr and in the header, with every step's parameters compared across the ranks.
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "run.h5")

        def small_shm(np_ranks, model):
            return subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64M tmpfs /dev/shm && exec "$@"',
                                   "sh", mpirun, "-np", str(np_ranks), ddplab, "train", "--steps", "2",
                                   "--warmup-steps", "1", *model, "--out", out], capture_output=True, text=True,
                                  timeout=300)
        fifos = small_shm(8, ["--hidden", "64", "--batch", "8"])
        check(fifos.returncode == 0 and "comm ring over mpi" in fifos.stdout and "no room in /dev/shm" in fifos.stderr,
              f"/dev/shm too small for the FIFOs: the ring falls back to MPI (code {fifos.returncode}, "
              f"{fifos.stderr[-300:]})")
        if os.path.exists(out):
            os.unlink(out)
        grads = small_shm(2, ["--hidden", "2048", "--layers", "3", "--batch", "8", "--check-sync", "1"])
        text = grads.stdout + grads.stderr
        check(grads.returncode == 0 and "no room in /dev/shm" in grads.stderr and
              "(copies: registering the buffers failed)" in grads.stdout and "Bus error" not in text,
              f"/dev/shm too small for the gradients: they go by copy, said, and the replicas stay alike (code "
              f"{grads.returncode}, {text[-300:]})")

    print(f"{len(failures)} failure(s)")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
