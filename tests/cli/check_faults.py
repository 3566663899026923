#!/usr/bin/python3
"""Injects each fault of docs/RELIABILITY.md into `ddplab train` under mpirun and checks the exit code, the
message, the time to exit and what is left on disk.

usage: check_faults.py MPIRUN DDPLAB PERTURBED_COS STOP_IN_SETUP (the two LD_PRELOAD libraries beside it)
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np

from checks import check, failures, fires_in_time, own_mpi_session, stalled_s  # tests/cli/checks.py: the assertion every CLI test shares
# Open MPI's own wait between the signals of its kill sequence, which the tests' environment takes out: a job whose
# ranks are stopped by signal gets it, as a job under a batch scheduler does, and so does a job a rank aborts, where
# the checks read what the other ranks say before mpirun ends them.
OPEN_MPI_KILL_SEQUENCE = {"OMPI_MCA_odls_base_sigkill_timeout": "1"}
SMALL = ["--input-dim", "32", "--hidden", "64", "--classes", "4", "--batch", "8", "--warmup-steps", "0", "--quiet"]


class Job:
    """`mpirun -np NP ddplab train SMALL ARGS`, or the command line `cmd`, under a time limit."""

    def __init__(self, mpirun, ddplab, np_ranks, args, limit_s=120, env=None, cmd=None):
        self.cmd = cmd or [mpirun, "--bind-to", "none", "-np", str(np_ranks), ddplab, "train"] + SMALL + args
        self.env = own_mpi_session(dict(os.environ, **(env or {})))  # jobs run side by side
        self.limit_s = limit_s

    @classmethod
    def of(cls, cmd, limit_s=120):
        """A job of any command line."""
        return cls(None, None, 0, [], limit_s, cmd=cmd)

    def run(self):
        start = time.monotonic()
        try:
            p = subprocess.run(self.cmd, capture_output=True, text=True, timeout=self.limit_s, env=self.env)
            self.code, self.stdout, self.stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            self.code, self.stdout, self.stderr = None, "", f"timed out after {self.limit_s} s: {e}"
        self.out = self.stdout + self.stderr
        self.seconds = time.monotonic() - start
        return self


def run_side_by_side(jobs, at_once=4):
    """Job.run of every job, `at_once` at a time: for jobs that do not depend on each other and whose checks do not
    time them. Each job is mostly process start-up, which leaves the cores idle when they run one at a time."""
    with ThreadPoolExecutor(at_once) as pool:
        list(pool.map(Job.run, jobs))
    return jobs


def steps_in(path):
    with h5py.File(path, "r") as f:
        return int(f.attrs["num_steps"]), str(f.attrs["stop_reason"]), f["steps/loss"][:], f["steps/skipped"][:]


def main():
    mpirun, ddplab, perturbed_cos, stop_in_setup = sys.argv[1:5]
    with tempfile.TemporaryDirectory() as work:
        out = lambda name: os.path.join(work, name)

        # A rank that hangs and a rank killed: each job alone, as its time to exit is checked.
        # A rank that hangs: its peers' watchdog aborts the job within the timeout (plus a quarter), naming what
        # they waited for; the snapshot of the steps flushed before the hang survives, readable.
        j = Job(mpirun, ddplab, 3, ["--steps", "1000", "--fault", "hang", "--fault-rank", "1", "--fault-step", "6",
                                    "--timeout-s", "3", "--flush-every", "2", "--out", out("hang.h5")],
                env=OPEN_MPI_KILL_SEQUENCE).run()
        check(j.code not in (None, 0), f"hang: the job ends non-zero (code {j.code}, {j.seconds:.1f} s)")
        check(fires_in_time(j.out, 3) and j.seconds < 3 * 1.25 + 30,
              f"hang: the watchdog fires after 3 s and before a quarter more, 3 s of slack ({stalled_s(j.out)} s); the job ends "
              f"with it ({j.seconds:.1f} s, start-up included)")
        check("watchdog: no progress" in j.out and "at step 6" in j.out, "hang: the watchdog names the step")
        # The direct all-reduce waits for each peer's arrival; the ring's receive, on rank 1's right, for its message.
        check(re.search(r"watchdog: .*(recv from|the arrival of) rank 1\b", j.out) is not None,
              "hang: and the peer it waited for, rank 1")
        check(not os.path.exists(out("hang.h5")), "hang: no complete run file claims success")
        if os.path.exists(out("hang.h5.partial")):
            n, reason, _, _ = steps_in(out("hang.h5.partial"))
            check(n == 6 and "snapshot" in reason, f"hang: the snapshot holds the 6 flushed steps (has {n})")
        else:
            check(False, "hang: the snapshot <out>.partial exists")

        # A rank killed with SIGKILL: the others exit non-zero promptly, and the message names the lost rank.
        j = Job(mpirun, ddplab, 3, ["--steps", "1000", "--fault", "kill", "--fault-rank", "2", "--fault-step", "4",
                                    "--timeout-s", "10", "--out", out("kill.h5")], env=OPEN_MPI_KILL_SEQUENCE).run()
        check(j.code not in (None, 0), f"kill: the job ends non-zero (code {j.code})")
        check(j.seconds < 10 * 1.25 + 30, f"kill: within the timeout, start-up included ({j.seconds:.1f} s)")
        check("rank 2" in j.out, "kill: the output names rank 2")

        # The faults that are checked by exit code, message and files, and the runs the later checks compare against:
        # side by side, then checked in turn.
        tiny = ["--model", "tiny", "--steps", "2", "--quiet"]

        def replicas(name, preload):
            return [mpirun, "--bind-to", "none", "-np", "1", ddplab, "train", *tiny, "--out", out(name), ":",
                    "-np", "1", *preload, ddplab, "train", *tiny, "--out", out(name)]

        schedule = ["--lr-warmup", "5", "--lr-schedule", "cosine", "--lr-final", "0.1", "--grad-clip", "0.5"]
        ring_only = {"DDPLAB_SMALL_ALLREDUCE_BYTES": "0"}  # no bucket of this small model is all-reduced whole
        jobs = {
            "throw": Job(mpirun, ddplab, 2, ["--steps", "1000", "--fault", "throw", "--fault-rank", "1",
                                             "--fault-step", "3", "--out", out("throw.h5")],
                         env=OPEN_MPI_KILL_SEQUENCE),
            "nan": Job(mpirun, ddplab, 2, ["--steps", "10", "--fault", "nan", "--fault-rank", "1", "--fault-step", "4",
                                           "--out", out("nan.h5")]),
            "nan_first": Job(mpirun, ddplab, 2, ["--steps", "10", "--fault", "nan", "--fault-rank", "1",
                                                 "--fault-step", "0", "--out", out("nan_first.h5")]),
            "nan_in_backward": Job(mpirun, ddplab, 2, ["--steps", "10", "--fault", "nan", "--fault-rank", "1",
                                                       "--fault-step", "4", "--optimizer-in-backward", "on",
                                                       "--out", out("nan_in_backward.h5")]),
            "nan_in_backward_np1": Job(mpirun, ddplab, 1, ["--steps", "10", "--fault", "nan", "--fault-step", "4",
                                                           "--optimizer-in-backward", "on",
                                                           "--out", out("nan_in_backward_np1.h5")]),
            "skip": Job(mpirun, ddplab, 2, ["--steps", "10", "--fault", "nan", "--fault-rank", "1", "--fault-step", "4",
                                            "--skip-nonfinite", "--out", out("skip.h5")]),
            "diverge": Job(mpirun, ddplab, 2, ["--steps", "10", "--fault", "diverge", "--fault-rank", "1",
                                               "--fault-step", "2", "--check-sync", "3", "--out", out("div.h5")]),
            # Replicas that start apart (one rank's libm rounds otherwise, through LD_PRELOAD), and the same launch
            # without it.
            "apart": Job.of(replicas("apart.h5", ["-x", f"LD_PRELOAD={perturbed_cos}"])),
            "alike": Job.of(replicas("alike.h5", [])),
            # A rank stopped in the run's setup (SIGSTOP in its first MPI_Comm_split_type, through LD_PRELOAD),
            # under a --timeout-s below the setup's floor of 30 s.
            "setup_stopped": Job(None, None, 0, [], env=OPEN_MPI_KILL_SEQUENCE, cmd=[
                mpirun, "--bind-to", "none", "-np", "1", ddplab, "train", *tiny, "--timeout-s", "2", "--out",
                out("setup_stopped.h5"), ":", "-np", "1", "-x", f"LD_PRELOAD={stop_in_setup}", ddplab, "train", *tiny,
                "--timeout-s", "2", "--out", out("setup_stopped.h5")]),
            # A rank stopped at the start, in its first MPI_Allreduce (the ranks' agreement on MPI's thread level,
            # before the command line is read): the watchdog's start-up wait, with the same floor.
            "start_stopped": Job(None, None, 0, [], env=dict(OPEN_MPI_KILL_SEQUENCE, STOP_IN="MPI_Allreduce"), cmd=[
                mpirun, "--bind-to", "none", "-np", "1", ddplab, "train", *tiny, "--out", out("start_stopped.h5"),
                ":", "-np", "1", "-x", f"LD_PRELOAD={stop_in_setup}", "-x", "STOP_IN", ddplab, "train", *tiny, "--out",
                out("start_stopped.h5")]),
            # Ranks started with different settings (an MPMD launch).
            "mpmd": Job.of([
                mpirun, "--bind-to", "none", "-np", "1", ddplab, "train"] + SMALL + ["--steps", "3", "--out",
                out("mpmd.h5"), ":", "-np", "1", ddplab, "train"] + SMALL + ["--steps", "3", "--lr", "0.01", "--out",
                                                                            out("mpmd.h5")]),
            # A DDPLAB_* knob that differs between ranks (each reads its own environment).
            "knob": Job.of([
                mpirun, "--bind-to", "none", "-np", "1", "-x", "DDPLAB_SMALL_ALLREDUCE_BYTES=0", ddplab, "train"] +
                SMALL + ["--steps", "3", "--out", out("knob.h5"), ":", "-np", "1", ddplab, "train"] + SMALL +
                ["--steps", "3", "--out", out("knob.h5")]),
            "full": Job(mpirun, ddplab, 2, ["--steps", "40", "--out", out("full.h5")] + schedule),
            "z0": Job(mpirun, ddplab, 3, ["--steps", "12", "--out", out("z0.h5")], env=ring_only),
            "z1": Job(mpirun, ddplab, 3, ["--steps", "12", "--out", out("z1.h5"), "--zero-stage", "1"], env=ring_only),
            "z1a": Job(mpirun, ddplab, 3, ["--steps", "6", "--out", out("z1a.h5"), "--zero-stage", "1",
                                           "--checkpoint", out("zck.h5")], env=ring_only),
            "every": Job(mpirun, ddplab, 2, ["--steps", "6", "--checkpoint", out("every.ck.h5"), "--checkpoint-every",
                                             "2", "--flush-every", "3", "--out", out("every.h5")]),
            "nan_z1": Job(mpirun, ddplab, 3, ["--steps", "10", "--fault", "nan", "--fault-rank", "1", "--fault-step",
                                              "4", "--zero-stage", "1", "--out", out("nan_z1.h5")], env=ring_only),
            "skip_z1": Job(mpirun, ddplab, 3, ["--steps", "10", "--fault", "nan", "--fault-rank", "1", "--fault-step",
                                               "4", "--zero-stage", "1", "--skip-nonfinite",
                                               "--out", out("skip_z1.h5")], env=ring_only),
            # Stopped within the warm-up (5 steps by default), at one rank.
            "nan_warmup": Job.of([
                ddplab, "train", *SMALL[:8], "--steps", "10", "--fault", "nan", "--fault-step", "3", "--out",
                out("nan_warmup.h5")]),
            # --comm hier: a checkpoint on 2 nodes of 2, for the resumes at the end.
            "hier": Job(mpirun, ddplab, 4, ["--comm", "hier", "--ranks-per-node", "2", "--steps", "2", "--out",
                                            out("hier.h5"), "--checkpoint", out("hier.ck.h5")]),
        }
        run_side_by_side(list(jobs.values()))
        # What reads their files: the second half of a resume, the reports and a diff.
        jobs["z1b"] = Job(mpirun, ddplab, 3, ["--steps", "12", "--out", out("z1b.h5"), "--zero-stage", "1",
                                              "--resume", out("zck.h5")], env=ring_only)
        readers = [[ddplab, "report", out("nan_warmup.h5")], [ddplab, "report", out("nan_first.h5")],
                   [ddplab, "diff", out("nan_first.h5"), out("nan.h5")], [ddplab, "report", out("skip.h5")],
                   [ddplab, "report", out("every.h5")], [ddplab, "report", out("full.h5")]]
        _, report_nan_warmup, report_nan_first, diff_nan_first, report_skip, report_every, report_full = \
            run_side_by_side([jobs["z1b"]] + [Job.of(argv, limit_s=60) for argv in readers])

        # A rank that throws: it names itself and aborts the job.
        j = jobs["throw"]
        check(j.code not in (None, 0) and "error on rank 1" in j.out, f"throw: rank 1 names itself (code {j.code})")

        # A NaN in a gradient: every rank stops at that step with exit code 4, naming step and tensor; the run
        # file holds the steps before it. With --skip-nonfinite the step is skipped and marked, and training goes on.
        j = jobs["nan"]
        check(j.code == 4, f"nan: exit code 4 (got {j.code})")
        check("non-finite gradient fc2.bias at step 4" in j.out, "nan: names the tensor and the step")
        n, reason, loss, _ = steps_in(out("nan.h5"))
        check(n == 4 and "non-finite" in reason and np.isfinite(loss).all(), f"nan: run file keeps steps 0-3 ({n})")
        # Stopped within the warm-up (5 steps by default): the figures are the last step's, and train and report
        # both say so.
        t, r = jobs["nan_warmup"], report_nan_warmup
        check("no steady state: stopped within the warm-up, figures from step 2" in t.stdout and
              "no steady state (stopped within the warm-up: figures from step 2)" in r.stdout,
              f"nan within the warm-up: said by train and report ({t.stdout[-300:]}{r.stdout[:300]})")
        # Stopped in its first step: the run file holds no step but says why; `report` reads it and says so, and
        # the analyses that need steps refuse it in one line.
        j = jobs["nan_first"]
        n, reason, _, _ = steps_in(out("nan_first.h5"))
        check(j.code == 4 and n == 0 and "at step 0" in reason, f"nan at step 0: a run file of no step ({j.code}, {n})")
        r = report_nan_first
        check(r.code == 0 and "no step completed" in r.stdout and "status: non-finite gradient" in r.stdout,
              f"nan at step 0: report says no step completed, and why ({r.code}: {r.stdout[-300:]}{r.stderr})")
        r = diff_nan_first
        check(r.code == 2 and "holds no completed step: non-finite" in r.stderr and r.stderr.count("\n") == 1,
              f"nan at step 0: diff refuses in one line ({r.code}: {r.stderr})")
        # The same with the update in backward: the step still stops there, and says the finite gradients were applied.
        j = jobs["nan_in_backward"]
        check(j.code == 4 and "non-finite gradient fc2.bias at step 4; stopped with the finite gradients already "
              "applied in backward" in j.out, f"nan, update in backward: stops and says so (code {j.code})")
        n, _, _, _ = steps_in(out("nan_in_backward.h5"))
        check(n == 4, f"nan, update in backward: run file keeps steps 0-3 ({n})")
        # At one rank each piece is checked on the optimizer thread, before its update.
        j = jobs["nan_in_backward_np1"]
        check(j.code == 4 and "non-finite gradient fc2.bias at step 4; stopped with the finite gradients" in j.out,
              f"nan, update in backward, np 1: stops and says so (code {j.code})")
        with h5py.File(out("nan_in_backward_np1.h5"), "r") as f:
            config = json.loads(f.attrs["config"])
        check(config["grad_slice_mb"] == 1 and config["optimizer_in_backward"] == "on",
              f"--grad-slice-mb auto is stored resolved: 1 with the update in backward (got {config['grad_slice_mb']})")
        j = jobs["skip"]
        n, reason, loss, skipped = steps_in(out("skip.h5"))
        check(j.code == 0 and n == 10 and reason == "", f"skip-nonfinite: runs to the end (code {j.code})")
        check(skipped[:, 4].tolist() == [1, 1] and skipped.sum() == 2, "skip-nonfinite: step 4 marked skipped")
        report = report_skip.stdout
        check("skipped steps       1, the first at step 4" in report,
              f"skip-nonfinite: the report says how many steps were skipped ({report[:400]})")
        with h5py.File(out("skip.h5"), "r") as f:
            check(json.loads(f.attrs["summary"])["skipped_steps"] == 1, "skip-nonfinite: the summary counts it")

        # Replicas that diverge: --check-sync stops every rank, naming the first differing parameter.
        j = jobs["diverge"]
        check(j.code == 4 and "replicas diverged at step 2: parameter fc0.weight" in j.out,
              f"diverge: named at the first check (code {j.code})")

        # Replicas that start apart (one rank's libm rounds otherwise, through LD_PRELOAD): stopped before the first
        # step, naming the first parameter; the same launch without it trains.
        for perturbed, want, name in ((True, 4, "apart"), (False, 0, "alike")):
            p = jobs[name]
            said = "replicas differ before the first step: parameter wte is not the same on every rank" in p.stderr
            check(p.code == want and said == perturbed and os.path.exists(out(name + ".h5")) != perturbed,
                  f"replicas {'apart' if perturbed else 'alike'} at the start: exit {want}"
                  f"{', wte named, no run file' if perturbed else ''} (code {p.code}: {p.stderr.strip()[-300:]})")

        # A rank stopped in the setup: the others' watchdog ends the job, naming the setup, after the setup's floor
        # of 30 s (the steps' --timeout-s 2 would have ended it early) and before it plus a quarter. It runs beside
        # other jobs: the wall time, start-up included, is only bounded below.
        j = jobs["setup_stopped"]
        check(j.code == 3 and "waiting for the run's setup" in j.stderr and fires_in_time(j.stderr, 30) and
              j.seconds >= 30,
              f"stopped in the setup: exit 3, the setup named, after 30 s ({j.code}, watchdog {stalled_s(j.stderr)} "
              f"s, {j.seconds:.1f} s in all: {j.stderr.strip()[-400:]})")

        j = jobs["start_stopped"]
        check(j.code == 3 and "waiting for the ranks' agreement on MPI's thread level" in j.stderr and
              fires_in_time(j.stderr, 30) and not os.path.exists(out("start_stopped.h5")),
              f"stopped at the start: exit 3, the agreement named, after 30 s, nothing written ({j.code}, watchdog "
              f"{stalled_s(j.stderr)} s: {j.stderr.strip()[-400:]})")

        # Ranks started with different settings (an MPMD launch): refused before training, each field named.
        p = jobs["mpmd"]
        check(p.code == 2 and 'lr (rank 0: 0.001, rank 1: 0.01)' in p.stderr,
              f"config mismatch: exit 2, names lr with both values (code {p.code})")
        check(not os.path.exists(out("mpmd.h5")), "config mismatch: nothing written")
        # A DDPLAB_* knob that differs between ranks (each reads its own environment): the ranks would cut buffers or
        # pick algorithms differently. Refused before any work, naming the knob and both values.
        p = jobs["knob"]
        check(p.code == 2 and "different settings: DDPLAB_SMALL_ALLREDUCE_BYTES (rank 0: 0, rank 1: unset)"
              in p.stderr and not os.path.exists(out("knob.h5")),
              f"knob mismatch: exit 2, names the knob and both values, nothing written (code {p.code}) "
              f"{p.stderr[-300:]}")

        # SIGTERM to the ranks (what a batch scheduler sends): they stop at a step boundary, write the run file and
        # a checkpoint, exit 128+15; the checkpoint resumes to the same losses as an uninterrupted run. On a learning
        # rate schedule, clipped: the resumed steps take the schedule up at their step, with nothing saved for it.
        full = jobs["full"]
        check(full.code == 0, "uninterrupted reference run")
        args = ["--steps", "40", "--data-cost-ms", "10", "--flush-every", "5", "--out", out("sig.h5"),
                "--checkpoint", out("ck.h5")] + schedule
        job = Job(mpirun, ddplab, 2, args, env=OPEN_MPI_KILL_SEQUENCE)
        p = subprocess.Popen(job.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job.env)
        deadline = time.monotonic() + 60
        while not os.path.exists(out("sig.h5.partial")) and time.monotonic() < deadline:  # training is under way
            time.sleep(0.05)
        # The ranks only (mpirun's children): a SIGTERM to mpirun too would have it run its kill sequence, a second
        # SIGTERM a second later, which ends a rank still writing its run file and checkpoint.
        subprocess.run(["pkill", "-TERM", "-P", str(p.pid), "-f", "--", "--out " + out("sig.h5")])
        _, err = p.communicate(timeout=60)
        check(p.returncode != 0 and "SIGTERM received" in err, f"SIGTERM: stops non-zero (code {p.returncode})")
        if os.path.exists(out("sig.h5")):
            n, reason, loss, _ = steps_in(out("sig.h5"))
            check(0 < n < 40 and reason.startswith("SIGTERM"), f"SIGTERM: run file with the {n} steps done")
            _, _, full_loss, _ = steps_in(out("full.h5"))
            j = Job(mpirun, ddplab, 2, ["--steps", "40", "--out", out("resumed.h5"), "--resume", out("ck.h5")] +
                    schedule).run()
            check(j.code == 0, f"resume after SIGTERM runs (code {j.code}) {j.out[-300:] if j.code else ''}")
            if j.code == 0:
                with h5py.File(out("resumed.h5"), "r") as f:
                    first = int(f.attrs["first_step"])
                    resumed = f["steps/loss"][:]
                check(first == n and np.array_equal(np.concatenate([loss, resumed], axis=1), full_loss),
                      "resume: the loss curve equals the uninterrupted run's, bit for bit")
                # Its report and timeline count steps as training does: on from the checkpoint's.
                report = subprocess.run([ddplab, "report", out("resumed.h5")], capture_output=True, text=True,
                                        timeout=60).stdout
                trace_path = out("resumed.trace.json")
                subprocess.run([ddplab, "timeline", out("resumed.h5"), "-o", trace_path], capture_output=True,
                               timeout=60)
                steps = [e["args"]["step"] for e in json.load(open(trace_path))["traceEvents"]
                         if e.get("cat") == "step" and e["pid"] == 1] if os.path.exists(trace_path) else []
                check(f"steps {n}..39 (resumed at {n})" in report and steps == list(range(n, 40)),
                      f"resume: report and timeline number the steps {n}..39 ({report[:200]}, {steps[:2]}...)")
        else:
            check(False, "SIGTERM: run file written")

        # --zero-stage 1, the sharded update: the replicated update's loss curve, bit for bit; a checkpoint gathers
        # every rank's share of the optimizer state, so the run resumed from it goes on along the same curve.
        zero = {}
        for name in ("z0", "z1", "z1a", "z1b"):
            j = jobs[name]
            check(j.code == 0, f"zero-stage {name} runs (code {j.code}) {j.out[-300:] if j.code else ''}")
            zero[name] = steps_in(out(name + ".h5"))[2] if j.code == 0 else None
        if all(v is not None for v in zero.values()):
            check(np.array_equal(zero["z1"], zero["z0"]), "zero-stage 1: the loss curve of zero-stage 0, bit for bit")
            # One host: the replicated update's all-reduce and the sharded update's reduce-scatter and all-gather
            # are all direct collectives, and both records say so.
            with h5py.File(out("z0.h5"), "r") as f0, h5py.File(out("z1.h5"), "r") as f1:
                names = (f0.attrs["transport"], f1.attrs["transport"])
            check(names == ("shm single-copy + direct collectives",) * 2,
                  f"zero-stage 0 and 1: both take the direct collectives on one host ({names})")
            check(np.array_equal(np.concatenate([zero["z1a"], zero["z1b"]], axis=1), zero["z0"]),
                  "zero-stage 1: resumed from its checkpoint, the same curve, bit for bit")
        # Checkpoints and snapshots take wall time between steps, in no step's record: counted in the file and the
        # summary. 6 steps: checkpoints after 2 and 4 and at the end, a snapshot after 3 (none after the last step).
        j = jobs["every"]
        writes = (-1, -1)
        if j.code == 0:
            with h5py.File(out("every.h5"), "r") as f:
                writes = (int(f.attrs["file_writes"]), int(f.attrs["file_writes_us"]))
        said = report_every.stdout
        check(j.code == 0 and writes[0] == 4 and writes[1] > 0 and "file writes         4 (checkpoints, snapshots)" in said,
              f"file writes: 4 counted, in the file and the summary (code {j.code}, {writes})")
        said = report_full.stdout
        with h5py.File(out("full.h5"), "r") as f:
            check(int(f.attrs["file_writes"]) == 0 and "file writes" not in said and "final loss" in said,
                  "file writes: none, none said")

        # A NaN in a gradient: one rank owns the poisoned element and sees it; the ranks agree on the verdict and on
        # the tensor, so every rank stops at that step naming it; with --skip-nonfinite every rank skips it.
        j = jobs["nan_z1"]
        check(j.code == 4 and "non-finite gradient fc2.bias at step 4; stopped before the update" in j.out,
              f"nan, zero-stage 1: stops at the step, naming the tensor (code {j.code}) {j.out[-300:]}")
        j = jobs["skip_z1"]
        n, _, _, skipped = steps_in(out("skip_z1.h5")) if j.code == 0 else (0, "", None, np.zeros((3, 1)))
        check(j.code == 0 and n == 10 and skipped[:, 4].tolist() == [1, 1, 1] and skipped.sum() == 3,
              f"skip-nonfinite, zero-stage 1: every rank skips step 4 alone (code {j.code})")

        # Ctrl-C: SIGINT to mpirun, which sends SIGTERM to the ranks after odls_base_sigkill_timeout seconds (3 here)
        # and SIGKILL as long again: the ranks stop in between and leave a complete run file.
        job = Job(mpirun, ddplab, 2, ["--steps", "100000", "--data-cost-ms", "2", "--flush-every", "5",
                                      "--out", out("ctrlc.h5")], env={"OMPI_MCA_odls_base_sigkill_timeout": "3"})
        p = subprocess.Popen(job.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job.env)
        deadline = time.monotonic() + 60
        while not os.path.exists(out("ctrlc.h5.partial")) and time.monotonic() < deadline:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        ok = os.path.exists(out("ctrlc.h5")) and steps_in(out("ctrlc.h5"))[1].startswith("SIGTERM")
        check(p.returncode != 0 and ok, f"Ctrl-C under mpirun: non-zero (code {p.returncode}), run file complete")

        # Resume refusals: other settings, a truncated file, not a checkpoint. Exit 2, nothing written. And a
        # checkpoint from before a knob existed lacks its key: it ran as the knob's default, so it resumes with the
        # default and refuses another value, naming the knob (--grad-accum's key stands for a knob added later). A
        # config attribute that is no JSON object (here empty) cannot say what the checkpoint ran with: refused, not
        # taken for leave to compare nothing. And --comm hier sums within each node first: a resume must run on the
        # checkpoint's nodes, as found (0 takes the hosts). Other nodes are refused, naming them; the same nodes resume.
        # Side by side, each with a run file of its own.
        with open(out("ck.h5"), "rb") as f, open(out("trunc.h5"), "wb") as g:
            g.write(f.read(4096))
        with open(out("ck.h5"), "rb") as f, open(out("old.ck.h5"), "wb") as g:
            g.write(f.read())
        with h5py.File(out("old.ck.h5"), "r+") as f:
            config = json.loads(f.attrs["config"])
            del config["grad_accum"]
            f.attrs["config"] = json.dumps(config)
        with open(out("ck.h5"), "rb") as f, open(out("blank.ck.h5"), "wb") as g:
            g.write(f.read())
        with h5py.File(out("blank.ck.h5"), "r+") as f:
            f.attrs["config"] = ""
        refusals = [("settings", ["--resume", out("ck.h5"), "--lr", "0.01"]),
                    ("truncated", ["--resume", out("trunc.h5")]),
                    ("not a checkpoint", ["--resume", out("full.h5")]),
                    # Another shape of model: named by its settings, not by the first tensor that differs.
                    ("another model", ["--resume", out("ck.h5"), "--layers", "3"]),
                    # A cosine decays over --steps: another run length, another learning rate at each step.
                    ("another length of its cosine", ["--resume", out("ck.h5"), "--steps", "50"])]
        refused = [out(f"refused{k}.h5") for k in range(len(refusals) + 1)]
        refusal_jobs = [Job(mpirun, ddplab, 2, ([] if "--steps" in extra else ["--steps", "40"]) + ["--out", path] +
                            schedule + extra) for (_, extra), path in zip(refusals, refused)]
        old_resumed = Job(mpirun, ddplab, 2, ["--steps", "40", "--out", out("old_resumed.h5"), "--resume",
                                              out("old.ck.h5")] + schedule)
        old_refused = Job(mpirun, ddplab, 2, ["--steps", "40", "--out", refused[-1], "--resume", out("old.ck.h5"),
                                              "--grad-accum", "2"] + schedule)
        blank_refused = Job(mpirun, ddplab, 2, ["--steps", "40", "--out", out("refused.h5"), "--resume",
                                                out("blank.ck.h5")] + schedule)
        hier_resumes = [("1", 2), ("2", 0)]  # ranks per node, the exit code
        hier_resumed = [Job(mpirun, ddplab, 4, ["--comm", "hier", "--ranks-per-node", per_node, "--steps", "4",
                                                "--resume", out("hier.ck.h5"),
                                                "--out", out(f"hier_resumed{per_node}.h5")])
                        for per_node, _ in hier_resumes]
        run_side_by_side(refusal_jobs + [old_resumed, old_refused, blank_refused] + hier_resumed)
        for (name, _), path, j in zip(refusals, refused, refusal_jobs):
            lines = [l for l in j.out.splitlines() if l.startswith("ddplab: error")]
            check(j.code == 2 and len(lines) == 1 and "checkpoint" in lines[0] and not os.path.exists(path)
                  and (name != "another model" or "settings differ from the checkpoint's: layers (" in lines[0])
                  and (name != "another length of its cosine" or "steps (checkpoint 40, now 50)" in lines[0]),
                  f"resume refuses {name}: exit 2, one line, nothing written ({lines[:1]})")
        j = old_resumed
        check(j.code == 0, f"a checkpoint without a later knob's key resumes with its default (code {j.code}) "
                           f"{j.out[-300:] if j.code else ''}")
        j = old_refused
        check(j.code == 2 and "grad_accum (checkpoint 1, now 2)" in j.out,
              f"... and refuses another value of it, naming it (code {j.code}) {j.out[-300:]}")

        # An empty config.
        j = blank_refused
        lines = [l for l in j.out.splitlines() if l.startswith("ddplab: error")]
        check(j.code == 2 and len(lines) == 1 and "config attribute is not valid JSON" in lines[0]
              and not os.path.exists(out("refused.h5")),
              f"resume refuses an empty config: exit 2, one line, nothing written (code {j.code}) {lines[:1]}")

        # --comm hier: other nodes refused, naming them; the same nodes resume.
        j = jobs["hier"]
        check(j.code == 0, f"hier: a checkpoint on 2 nodes of 2 (code {j.code}) {j.out[-300:] if j.code else ''}")
        for (per_node, code), j in zip(hier_resumes, hier_resumed):
            check(j.code == code and (code == 0 or "node_of_rank (checkpoint [0,0,1,1], now [0,1,2,3])" in j.out),
                  f"hier: a resume on nodes of {per_node} exits {code} (code {j.code}) {j.out[-300:] if j.code else ''}")

    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
