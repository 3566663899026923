#!/usr/bin/python3
"""`ddplab report`, `ddplab timeline` and scripts/charts.py, end to end on run files written by `ddplab train`.

usage: test_report.py MPIRUN DDPLAB CHARTS_PY
"""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

from checks import check, exit_code, failures, run_all, skip, skips  # tests/cli/checks.py: every CLI test's assertion


def run(cmd, timeout=60):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def error_lines(stderr, prefix="ddplab:"):
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


def expect_usage_error(proc, expected, what):
    lines = error_lines(proc.stderr)
    ok = proc.returncode == 2 and len(lines) == 1 and expected in lines[0]
    check(ok, f"{what}: exit 2 and one line with '{expected}' (got {proc.returncode}: {proc.stderr.strip()[:300]})")


def chart_script_of(pid):
    """The pid of pid's child running charts.py, or None."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if parent == pid and b"charts.py" in f.read():
                    return int(entry)
        except (OSError, ValueError, IndexError):
            continue  # not a process, or one that ended meanwhile
    return None


def drawn_charts(tmp):
    """The charts drawn so far in the temporary folders of `report --html` under tmp."""
    return [c for d in os.listdir(tmp) if d.startswith("ddplab_page.")
            for c in (os.listdir(os.path.join(tmp, d, "charts")) if os.path.isdir(os.path.join(tmp, d, "charts"))
                      else [])]


def check_stopped_page(ddplab, run_file, work):
    """`report --html` sent SIGTERM while charts.py draws (its first chart written, so that it has its handlers): it
    ends by the signal, charts.py with it, and neither the page, its temporary nor the charts' temporary folder is
    left (charts.py, left running, wrote the page seconds later)."""
    tmp = os.path.join(work, "stop_tmp")
    os.mkdir(tmp)
    page = os.path.join(work, "stop.html")
    proc = subprocess.Popen([ddplab, "report", "--html", page, run_file], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=dict(os.environ, TMPDIR=tmp))
    charts, deadline = None, time.monotonic() + 60
    while (charts is None or not drawn_charts(tmp)) and proc.poll() is None and time.monotonic() < deadline:
        charts = chart_script_of(proc.pid)
        time.sleep(0.01)
    if charts is None or proc.poll() is not None:
        proc.kill()
        proc.wait()
        check(False, "report --html started charts.py and stopped there once it drew its first chart")
        return
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    gone = not os.path.exists(f"/proc/{charts}")
    left = [n for n in os.listdir(work) if n.startswith("stop.html")] + \
        [n for n in os.listdir(tmp) if n.startswith("ddplab_page.")]
    check(proc.returncode == -signal.SIGTERM and gone and not left,
          f"report --html stopped by SIGTERM ends by it ({proc.returncode}), charts.py with it ({gone}), "
          f"leaving nothing ({left})")


def check_trace(trace_path, run_path):
    with open(trace_path) as f:
        trace = json.load(f)  # must parse as JSON
    with h5py.File(run_path, "r") as h:
        world = int(h.attrs["world_size"])
        steps = int(h.attrs["num_steps"])
        start = h["steps/start_ms"][:]
        step_ms = h["steps/step_ms"][:]
        buckets = h["buckets/bytes"].shape[0]
    events = trace.get("traceEvents", [])
    # Rank r is process r + 1, its tracks threads 1 and 2 (Perfetto keeps pid 0 and tid 0 for the idle task).
    procs = {e["pid"] - 1: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"] - 1, e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    check(sorted(procs) == list(range(world)) and all(procs[r].startswith(f"rank {r} (") for r in procs),
          f"trace has a process per rank (pid rank + 1) named 'rank N (host)' ({procs})")
    check(all(threads.get((r, 1)) == "compute" and threads.get((r, 2)) == "communication" for r in range(world)),
          "every rank has a compute track (tid 1) and a communication track (tid 2)")
    for e in events:
        if "pid" in e and e["ph"] != "M":
            e["pid"] -= 1  # the rank, for the checks below
    timed = [e for e in events if e["ph"] in ("X", "i")]
    check(all(e["ts"] >= 0 for e in timed) and all(e["dur"] >= 0 for e in timed if e["ph"] == "X"),
          "every event has ts >= 0 and dur >= 0")
    bucket_events = [e for e in timed if e["ph"] == "X" and e.get("cat") == "bucket"]
    expected = world * steps * buckets if world > 1 else 0  # one rank reduces nothing: its buckets only get ready
    check(len(bucket_events) == expected,
          f"one event per bucket per step per rank ({len(bucket_events)} vs {expected})")
    tol = 2e-3  # us: whole nanoseconds, each half a nanosecond above its boundary
    outside = [e for e in bucket_events
               if e["ts"] < start[e["pid"], e["args"]["step"]] * 1e3 - tol or
               e["ts"] + e["dur"] > (start[e["pid"], e["args"]["step"]] + step_ms[e["pid"], e["args"]["step"]]) * 1e3 + tol]
    check(not outside, f"bucket events lie inside their step ({outside[:1]})")
    check(all(e["tid"] == 2 and "bytes" in e["args"] and "pieces" in e["args"] for e in bucket_events),
          "bucket events are on the communication track with bytes and pieces")
    phases = {(e["pid"], e["args"]["step"], e["name"]) for e in timed if e["ph"] == "X" and e.get("cat") == "phase"}
    check(all((r, s, p) in phases for r in range(world) for s in range(steps)
              for p in ("data", "forward", "backward", "exposed comm wait", "optimizer")),
          "every rank and step has its data/forward/backward/exposed comm wait/optimizer phases")


def check_time_use(path, summary):
    """The summary's overlap, idle time and bucket arrival, recomputed from the run file's datasets."""
    with h5py.File(path, "r") as h:
        steps = {name: h["steps"][name][:] for name in h["steps"]}
        ready, begin, end = (h["buckets"][name][:] for name in ("ready_ms", "comm_start_ms", "comm_end_ms"))
    first = summary["first_steady_step"]
    phases = ["data_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms", "extra_comm_ms",
              "host_work_ms", "barrier_ms"]
    for r, rank in enumerate(summary["ranks"]):
        comm = overlapped = 0.0
        for s in range(first, steps["step_ms"].shape[1]):
            edges = steps["start_ms"][r, s] + np.concatenate([[0], np.cumsum([steps[p][r, s] for p in phases])])
            compute = [(edges[1], edges[3]), (edges[4], edges[5])]  # forward + backward, optimizer
            spans = sorted((b, e) for b, e in zip(begin[r, s], end[r, s]) if e > b)
            merged = []
            for b, e in spans:
                if merged and b <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], e))
                else:
                    merged.append((b, e))
            comm += sum(e - b for b, e in merged)
            overlapped += sum(max(0.0, min(e, ce) - max(b, cb)) for b, e in merged for cb, ce in compute)
        n = steps["step_ms"].shape[1] - first
        use = rank["time_use"]
        check(math.isclose(use["comm_ms"], comm / n, rel_tol=1e-9, abs_tol=1e-9) and
              math.isclose(use["overlapped_ms"], overlapped / n, rel_tol=1e-9, abs_tol=1e-9),
              f"rank {r}: comm and the comm-compute overlap, recomputed ({use['comm_ms']}, {use['overlapped_ms']})")
        peers = np.mean([steps[p][r, first:] for p in ("exposed_comm_ms", "extra_comm_ms", "barrier_ms")], axis=0)
        check(math.isclose(use["idle"]["data_ms"], np.mean(steps["data_ms"][r, first:]), rel_tol=1e-9) and
              math.isclose(use["idle"]["peers_ms"], 3 * np.mean(peers), rel_tol=1e-9, abs_tol=1e-12),
              f"rank {r}: idle for data and for peers, recomputed ({use['idle']})")
    for k, a in enumerate(summary["bucket_arrival"]):
        last = np.argmax(ready[:, first:, k], axis=0)
        spread = np.median(ready[:, first:, k].max(axis=0) - ready[:, first:, k].min(axis=0))
        check(a["last_rank"] == int(np.bincount(last).argmax()) and math.isclose(a["spread_ms"], spread, rel_tol=1e-9),
              f"bucket {k}: the last rank and the arrival spread, recomputed ({a})")


def main():
    mpirun, ddplab, charts = sys.argv[1], sys.argv[2], sys.argv[3]
    small = ["--hidden", "64", "--input-dim", "32", "--classes", "10", "--batch", "8", "--warmup-steps", "2", "--quiet"]
    with tempfile.TemporaryDirectory() as work:
        a, b = os.path.join(work, "a.h5"), os.path.join(work, "b.h5")
        straggler, barrier = os.path.join(work, "straggler.h5"), os.path.join(work, "barrier.h5")
        busy = os.path.join(work, "busy.h5")
        trains = [
            [*small, "--steps", "6", "--out", a],
            [*small, "--steps", "6", "--bucket-mb", "0", "--overlap", "off", "--out", b],  # with a: a bucket sweep
            [*small, "--steps", "8", "--straggler-ms", "20", "--slow-rank", "1", "--out", straggler],
            [*small, "--steps", "8", "--rank0-work-ms", "15", "--barrier-every", "2", "--out", barrier],
            # A noisy neighbour on rank 1's core (its compute thread and the busy thread pinned together): compute
            # enough that the busy thread's share shows (the default MLP; the small one only waits in its all-reduce).
            ["--batch", "64", "--warmup-steps", "2", "--quiet", "--steps", "16", "--busy-threads", "1", "--slow-rank",
             "1", "--out", busy],
        ]
        for args in trains:
            proc = run([mpirun, "-np", "2", ddplab, "train", *args], timeout=120)
            check(proc.returncode == 0, f"ddplab train {' '.join(args[-2:])} (rc {proc.returncode}: {proc.stderr[:300]})")
        if failures:
            return

        # ---- report --------------------------------------------------------------------------------------------
        # Side by side: each reads its files, no more.
        report_a, report_ab, report_straggler, report_busy, report_barrier, report_json = run_all(
            [([*command, *files], dict(timeout=60)) for command, files in (
                ([ddplab, "report"], [a]), ([mpirun, "-np", "2", ddplab, "report"], [a, b]),
                ([ddplab, "report"], [straggler]), ([ddplab, "report"], [busy]), ([ddplab, "report"], [barrier]),
                ([mpirun, "-np", "2", ddplab, "report", "--json"], [straggler, a]))])
        proc = report_a
        out = proc.stdout
        print(out)
        check(proc.returncode == 0, f"report exits 0 ({proc.stderr.strip()[:300]})")
        check(f"== {a}" in out and "global throughput" in out and "final loss" in out, "report prints the summary")
        config = ("config: comm ring over shm single-copy + direct collectives, comm_dtype fp32, link none, "
                  "buckets (cap 25 MiB, first auto, last 1 MiB, within), overlap on")
        check(config in out, "report prints the config, the transport with it")
        per_rank = [s for s in out[out.find("per rank ("):out.find("per bucket (")].splitlines()[2:] if s.strip()]
        check([line.split()[0] for line in per_rank] == ["0", "1"], f"per-rank rows for ranks 0, 1 ({per_rank})")
        check("per rank (" in out and "per bucket (" in out and "fc0.weight" in out, "per-rank and per-bucket tables")
        # A plain run has no pathology: blame must not invent one. (Which benign line it prints depends on the
        # machine's load: "no rank stands out", or a rank the scheduler slowed down.)
        blame_text = out[out.find("blame:"):]
        check("blame:" in out and "straggler input" not in blame_text and "before a barrier" not in blame_text,
              "a plain run is not blamed on a straggler or a barrier")
        check("comparison" not in out, "no comparison for one file")

        proc = report_ab
        out = proc.stdout
        check(proc.returncode == 0 and out.count("== ") == 3, f"report of two files under mpirun prints once (rc "
              f"{proc.returncode}, {out.count('== ')} sections)")
        table = out[out.find("== comparison"):]
        check(any(line.split()[:2] == ["a", "2"] for line in table.splitlines()) and
              any(line.split()[:2] == ["b", "2"] for line in table.splitlines()), "comparison has one row per file")

        proc = report_straggler
        print(proc.stdout[proc.stdout.find("blame:"):])
        check("rank 1 sets the pace (straggler input)" in proc.stdout and "communication-bound" not in proc.stdout,
              "straggler run: blame names rank 1's data loading, not communication")
        # Rank 1 sleeps before its batch, so it is last to have every bucket ready, by about the sleep.
        check("last to have a bucket ready: rank 1, bucket 0 in " in proc.stdout,
              "straggler run: the report names rank 1 as last to have its buckets ready")
        check("time use per rank" in proc.stdout, "report: the time-use table")
        proc = report_busy
        print(proc.stdout[proc.stdout.find("blame:"):])
        with h5py.File(busy, "r") as f:
            first = json.loads(f.attrs["summary"])["first_steady_step"]
            cpu_wait = f["steps"]["cpu_wait_ms"][:, first:]  # [rank, step]
        counted = bool(np.all(cpu_wait >= 0))
        # Rank 0 is the control: it has no busy thread, so its cpu wait is what the rest of the host took. When that
        # is comparable to rank 1's, other work on the machine drowns the busy thread's share and no blame can name it.
        control, beside_busy = (float(np.median(cpu_wait[r])) for r in (0, 1)) if counted else (0.0, 0.0)
        check("busy_threads 1 slow_rank 1" in proc.stdout, "the report's lab line names the busy threads")
        if not counted:
            skip("the busy-threads run's blame (this kernel has no /proc/thread-self/schedstat: the cpu "
                  "wait is not counted)")
        elif control >= 0.5 * beside_busy:
            skip(f"the busy-threads run's blame (the host is busy with other work: rank 0, with no busy "
                  f"thread, waited {control:.2f} ms/step for its CPU, rank 1 beside the busy thread {beside_busy:.2f})")
        else:
            check("rank 1 sets the pace (CPU taken)" in proc.stdout and "cpu wait" in proc.stdout,
                  "busy-threads run: blame names rank 1, its CPU taken by the busy thread beside it")
        proc = report_barrier
        print(proc.stdout[proc.stdout.find("blame:"):])
        check("rank 0 sets the pace (work before a barrier)" in proc.stdout and "every 2 steps" in proc.stdout,
              "barrier run: blame names rank 0's work before the barrier every 2 steps")

        # ---- report --json ---------------------------------------------------------------------------------------
        proc = report_json
        check(proc.returncode == 0, f"report --json exits 0 under mpirun ({proc.stderr.strip()[:300]})")
        try:
            reports = json.loads(proc.stdout)  # printed once, by rank 0: one JSON document
        except ValueError as e:
            reports = []
            check(False, f"report --json prints one JSON document ({e}: {proc.stdout[:300]})")
        check(isinstance(reports, list) and [r.get("run_file") for r in reports] == [straggler, a],
              "report --json: an array with one object per file, in order")
        if len(reports) == 2:
            with h5py.File(straggler, "r") as f:
                stored = json.loads(f.attrs["summary"])
                world = int(f.attrs["world_size"])
            r = reports[0]
            check(r["summary"] == stored, "report --json: the summary is the one the run file stores")
            check(r["world_size"] == world and r["config"]["straggler_ms"] == 20, "report --json: world and config")
            first = r["blame"][0] if r["blame"] else {}
            check(first.get("cause") == "straggler input" and first.get("rank") == 1,
                  f"report --json: blame as cause and rank ({first})")
            text = report_straggler.stdout
            check(all(f"    {b['text']}" in text for b in r["blame"]), "report --json: the blame lines of the text report")
            check(len(reports[1]["summary"]["ranks"]) == 2 and "hidden_fraction" in reports[1]["summary"]["ranks"][0],
                  "report --json: per-rank means with hidden_fraction")
            use = r["summary"]["ranks"][0]["time_use"]
            ranks = r["summary"]["ranks"]
            # Idle time is the step less compute, split three ways; the straggler's sleep is rank 1's data wait.
            check(all(abs(q["time_use"]["computing_ms"] + sum(q["time_use"]["idle"].values()) - q["step_ms"]) < 1e-6
                      for q in ranks) and ranks[1]["time_use"]["idle"]["data_ms"] >= 10,
                  f"report --json: compute + idle = step, rank 1 idle for data ({use})")
            check_time_use(straggler, r["summary"])
            arrival = r["summary"]["bucket_arrival"]
            check(len(arrival) >= 1 and arrival[0]["last_rank"] == 1 and arrival[0]["spread_ms"] >= 10,
                  f"report --json: rank 1 last to have bucket 0 ready, 10+ ms after rank 0 ({arrival[:1]})")

        # ---- timeline ------------------------------------------------------------------------------------------
        trace = os.path.join(work, "a.trace.json")
        proc = run([mpirun, "-np", "2", ddplab, "timeline", a])
        check(proc.returncode == 0 and os.path.isfile(trace) and proc.stdout.count("timeline:") == 1,
              f"timeline writes FILE.trace.json by default, once (rc {proc.returncode}: {proc.stderr.strip()[:300]})")
        if os.path.isfile(trace):
            check_trace(trace, a)
            before = open(trace).read()
            expect_usage_error(run([ddplab, "timeline", a]), "already exists (pass --force to overwrite)",
                               "timeline refuses to overwrite")
            check(open(trace).read() == before, "the existing trace is left as it was")
            proc = run([ddplab, "timeline", a, "--force"])
            check(proc.returncode == 0, "timeline --force overwrites")
        # --force without the file it overwrites: refused, not taken and ignored.
        expect_usage_error(run([ddplab, "report", a, "--force"]), "--force requires --html", "report --force alone")
        expect_usage_error(run([ddplab, "predict", a, "--force"]), "--force requires --json", "predict --force alone")
        # A stored setting of the wrong type: every reader refuses the file in one line that names the key.
        bad = os.path.join(work, "bad_config.h5")
        shutil.copyfile(a, bad)
        with h5py.File(bad, "r+") as h:
            config = json.loads(h.attrs["config"])
            config["bucket_mb"] = "big"
            h.attrs["config"] = json.dumps(config)
        readers = (["report", bad], ["report", "--json", bad], ["predict", bad], ["timeline", bad], ["diff", a, bad])
        for cmd, proc in zip(readers, run_all([([ddplab, *cmd], dict(timeout=60)) for cmd in readers])):
            expect_usage_error(proc, f"cannot read run file {bad}: config bucket_mb: type must be",
                               f"{cmd[0]} of a file whose bucket_mb is a string")
        # --zero-stage 1 (every bucket of this small model on the ring, so all are sharded): the report's per-bucket
        # table gains the all-gather's time; the timeline names each bucket's reduce-scatter and draws its all-gather
        # inside the step, after backward.
        sharded = os.path.join(work, "sharded.h5")
        proc = run([mpirun, "-np", "2", "-x", "DDPLAB_SMALL_ALLREDUCE_BYTES=0", ddplab, "train", *small, "--steps", "6",
                    "--zero-stage", "1", "--out", sharded], timeout=120)
        check(proc.returncode == 0, f"ddplab train --zero-stage 1 (rc {proc.returncode}: {proc.stderr[:300]})")
        if proc.returncode == 0:
            out = run([ddplab, "report", sharded]).stdout
            check("gather_ms" in out and "comm: the reduce-scatter" in out, "report: the sharded bucket table")
            check(run([ddplab, "timeline", sharded]).returncode == 0, "timeline of the sharded run")
            with open(os.path.join(work, "sharded.trace.json")) as f:
                events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
            with h5py.File(sharded, "r") as h:
                start, step_ms = h["steps/start_ms"][:], h["steps/step_ms"][:]
                backward_end = start + h["steps/data_ms"][:] + h["steps/forward_ms"][:] + h["steps/backward_ms"][:]
                buckets = h["buckets/bytes"].shape[0]
            gathers = [e for e in events if e.get("cat") == "all-gather"]
            scatters = [e for e in events if e.get("cat") == "bucket"]
            check(len(gathers) == len(scatters) == 2 * 6 * buckets and
                  all("reduce-scatter" in e["name"] for e in scatters),
                  f"timeline: every bucket's reduce-scatter and all-gather ({len(scatters)}, {len(gathers)})")
            tol = 2e-3  # us: whole nanoseconds, each half a nanosecond above its boundary
            check(all(backward_end[e["pid"] - 1, e["args"]["step"]] * 1e3 - tol <= e["ts"] and
                      e["ts"] + e["dur"] <= (start + step_ms)[e["pid"] - 1, e["args"]["step"]] * 1e3 + tol
                      for e in gathers), "timeline: each all-gather lies after backward, inside its step")
            # Its page names the collectives its buckets chart shows (Jinja escapes the apostrophe).
            sharded_page = os.path.join(work, "sharded.html")
            proc = run([sys.executable, charts, os.path.join(work, "sharded_charts"), "--page", sharded_page,
                        sharded], timeout=120)
            page_text = open(sharded_page).read() if os.path.isfile(sharded_page) else ""
            check(proc.returncode == 0 and "each bucket&#39;s reduce-scatter and all-gather, the median steady step" in
                  page_text and "all-reduce, the median steady step" not in page_text,
                  f"the sharded run's page captions its buckets chart as reduce-scatter and all-gather "
                  f"({proc.stderr.strip()[-200:]})")

        custom = os.path.join(work, "custom.json")
        proc = run([ddplab, "timeline", straggler, "-o", custom])
        check(proc.returncode == 0 and os.path.isfile(custom), "timeline -o writes where it is told")
        if os.path.isfile(custom):
            check_trace(custom, straggler)
        # The lab's phases are events only in the steps where their feature acted.
        lab_phases = ("extra all-reduce", "host work", "barrier wait")
        with open(trace) as f:
            plain = [e for e in json.load(f)["traceEvents"] if e.get("name") in lab_phases]
        check(plain == [], f"no lab-phase events in a run without the lab's knobs ({len(plain)})")
        barrier_trace = os.path.join(work, "barrier.trace.json")
        check(run([ddplab, "timeline", barrier]).returncode == 0, "timeline of the barrier run")
        with open(barrier_trace) as f:
            lab = [e for e in json.load(f)["traceEvents"] if e.get("name") in lab_phases]
        barrier_steps = [1, 3, 5, 7]  # --barrier-every 2 over 8 steps
        seen = sorted((e["name"], e["pid"] - 1, e["args"]["step"]) for e in lab)
        want = sorted([("barrier wait", r, s) for r in (0, 1) for s in barrier_steps] +
                      [("host work", 0, s) for s in barrier_steps])
        check(seen == want, f"barrier waits on both ranks and rank 0's host work, on barrier steps only ({seen[:6]})")
        # --steps A:B: a long run's trace in part, the steps named as training counts them.
        part = os.path.join(work, "part.trace.json")
        nowhere, proc = run_all([([ddplab, "timeline", a, "-o", os.path.join(work, "no", "such", "t.json")],
                                  dict(timeout=60)),
                                 ([ddplab, "timeline", a, "--steps", "2:3", "-o", part], dict(timeout=60))])
        expect_usage_error(nowhere, "does not exist", "timeline into a missing folder")
        shown = sorted({e["args"]["step"] for e in json.load(open(part))["traceEvents"] if e.get("cat") == "step"}
                       ) if proc.returncode == 0 else []
        check(shown == [2, 3] and "steps 2..3" in proc.stdout, f"timeline --steps 2:3 holds steps 2 and 3 ({shown})")
        ranges = [("7:9", f"--steps 7:9: {a} holds steps 0..5", "timeline --steps past the run's steps"),
                  ("3:2", "--steps must be A:B with 0 <= A <= B (got '3:2')", "timeline --steps backwards"),
                  ("1:4294967297", "--steps must be A:B", "timeline --steps past what a step number holds")]
        refusals = run_all([([ddplab, "timeline", a, "--steps", steps, "-o", part, "--force"], dict(timeout=60))
                            for steps, _, _ in ranges])
        for (_, expected, what), proc in zip(ranges, refusals):
            expect_usage_error(proc, expected, what)
        os.remove(part)
        # A DDPLAB_* setting refused is refused before the file commands read or write anything.
        bad_setting = dict(os.environ, DDPLAB_BLAS_AUTO="bogus")
        for cmd, output in ((["timeline", a, "-o", part], part),
                            (["predict", a, "--json", part], part),
                            (["report", a, "--html", part + ".html"], part + ".html")):
            proc = subprocess.run([ddplab] + cmd, capture_output=True, text=True, timeout=60, env=bad_setting)
            expect_usage_error(proc, "DDPLAB_BLAS_AUTO must be on or off, got 'bogus'", f"{cmd[0]} under a bad setting")
            check(not os.path.exists(output) and "predict:" not in proc.stdout,
                  f"{cmd[0]} under a bad setting writes nothing ({proc.stdout.strip()[:200]})")
        check(not [n for n in os.listdir(work) if ".tmp." in n], "no temporary files left behind")

        # ---- bad run files ------------------------------------------------------------------------------------
        bad_dir = os.path.join(work, "bad")
        os.mkdir(bad_dir)
        empty, text, bare, no_steps = (os.path.join(bad_dir, n) for n in ("empty.h5", "text.h5", "bare.h5", "ns.h5"))
        open(empty, "w").close()
        with open(text, "w") as f:
            f.write("not a run file\n")
        with h5py.File(bare, "w") as f:
            f.attrs["hello"] = 1
        with h5py.File(no_steps, "w") as f:
            with h5py.File(a, "r") as src:
                for k, v in src.attrs.items():
                    f.attrs[k] = v
        # A time no trainer writes: printed it would read nan, and the timeline would lose the event.
        # A huge one would add up to inf, which predict's replay would step through forever.
        nan_step, inf_bucket = os.path.join(bad_dir, "nan_step.h5"), os.path.join(bad_dir, "inf_bucket.h5")
        huge_forward, pipe = os.path.join(bad_dir, "huge_forward.h5"), os.path.join(bad_dir, "pipe.h5")
        os.mkfifo(pipe)  # no writer: opening it to read would wait for one
        for path, dataset, value in ((nan_step, "steps/step_ms", math.nan), (inf_bucket, "buckets/comm_end_ms", math.inf),
                                     (huge_forward, "steps/forward_ms", 1e308)):
            shutil.copy(a, path)
            with h5py.File(path, "r+") as f:
                values = f[dataset][...]
                values.flat[1] = value
                f[dataset][...] = values
        cases = [(os.path.join(bad_dir, "missing.h5"), "No such file"), (empty, "empty file"),
                 (text, "not an HDF5 file"), (bare, "not a ddplab run file"), (no_steps, "missing"),
                 (nan_step, "steps/step_ms holds a value that is not finite (element 1)"),
                 (inf_bucket, "buckets/comm_end_ms holds a value that is not finite (element 1)"),
                 (huge_forward, "steps/forward_ms holds a value past 1e15, which no run makes (element 1)"),
                 (pipe, "is not a regular file (a pipe or a device)")]
        listing = sorted(os.listdir(bad_dir))
        reads = [(cmd, path, problem) for path, problem in cases
                 for cmd in (["report"], ["report", "--json"], ["timeline"], ["predict"])]
        *refusals, under_mpirun = run_all([([ddplab, *cmd, path], dict(timeout=60)) for cmd, path, _ in reads] +
                                          [([mpirun, "-np", "2", ddplab, "report", a, text], dict(timeout=60))])
        for (cmd, path, problem), proc in zip(reads, refusals):
            expect_usage_error(proc, f"cannot read run file {path}: ", f"{' '.join(cmd)} {os.path.basename(path)}")
            check(problem in proc.stderr and not proc.stdout, f"{' '.join(cmd)} {os.path.basename(path)} says "
                  f"'{problem}', prints nothing on stdout")
        expect_usage_error(under_mpirun, "not an HDF5 file", "report under mpirun with one bad file")
        check(sorted(os.listdir(bad_dir)) == listing, "bad input leaves no files behind")

        # ---- charts --------------------------------------------------------------------------------------------
        out_dir = os.path.join(work, "charts")
        proc = run([sys.executable, charts, out_dir, a, b], timeout=120)
        print(proc.stdout)
        check(proc.returncode == 0, f"charts.py exits 0 ({proc.stderr.strip()[-300:]})")
        for stem in ("a_breakdown", "a_step_times", "b_breakdown", "b_step_times", "throughput", "bucket_sweep"):
            for ext in ("png", "svg"):
                path = os.path.join(out_dir, f"{stem}.{ext}")
                size = os.path.getsize(path) if os.path.isfile(path) else 0
                check(size > 1000 and path in proc.stdout, f"charts.py wrote and printed {stem}.{ext} ({size} bytes)")
            png = os.path.join(out_dir, f"{stem}.png")
            with open(png, "rb") if os.path.isfile(png) else open(os.devnull, "rb") as f:
                check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{stem}.png is a PNG")
        check(not os.path.exists(os.path.join(out_dir, "update.png")),
              "no update chart where no run schedules its learning rate or clips")
        # A bucket under 1 KiB (a bucket per parameter: the first is the last layer's 40-byte bias) is sized in
        # bytes (matplotlib's SVG keeps each text as a comment).
        per_param = os.path.join(work, "per_param.h5")
        proc = run([mpirun, "-np", "2", ddplab, "train", "--steps", "3", "--warmup-steps", "1", "--input-dim", "32",
                    "--hidden", "64", "--classes", "10", "--batch", "8", "--bucket-mb", "0", "--last-bucket-mb", "0",
                    "--quiet", "--out", per_param], timeout=120)
        check(proc.returncode == 0, f"a run with a bucket per parameter trains ({proc.stderr.strip()[-200:]})")
        if proc.returncode == 0:
            run([sys.executable, charts, out_dir, per_param], timeout=120)
            with h5py.File(per_param, "r") as f:
                first_bucket = int(f["buckets/bytes"][0])
            svg_path = os.path.join(out_dir, "per_param_buckets.svg")
            svg = open(svg_path).read() if os.path.isfile(svg_path) else ""
            check(first_bucket < 1024 and f"<!-- bucket 0 all-reduce ({first_bucket} B) -->" in svg,
                  f"the bucket chart sizes a {first_bucket}-byte bucket in bytes")
        # One rank communicates nothing: its charts name no comm phase and no bucket's all-reduce.
        one_rank = os.path.join(work, "one_rank.h5")
        proc = run([ddplab, "train", "--steps", "3", "--warmup-steps", "1", "--input-dim", "32", "--hidden", "64",
                    "--classes", "10", "--batch", "8", "--quiet", "--out", one_rank])
        check(proc.returncode == 0, f"a one-rank run trains ({proc.stderr.strip()[-200:]})")
        if proc.returncode == 0:
            run([sys.executable, charts, out_dir, one_rank], timeout=120)
            breakdown, buckets = (open(p).read() if os.path.isfile(p) else "" for p in
                                  (os.path.join(out_dir, f"one_rank_{kind}.svg") for kind in ("breakdown", "buckets")))
            check("<!-- optimizer -->" in breakdown and "<!-- exposed comm -->" not in breakdown and
                  "(hidden comm) -->" not in breakdown and
                  "(1 rank: no bucket communicated) -->" in buckets and "all-reduce (" not in buckets,
                  "a one-rank run's breakdown and buckets charts name no communication")
        # The page embeds this call's charts only: a's buckets, drawn into the same folder by an earlier call on a
        # alone, are not the pair's (two files outside a suite or sweep get no bucket chart).
        run([sys.executable, charts, out_dir, a], timeout=120)
        pair_page = os.path.join(work, "pair.html")
        proc = run([sys.executable, charts, out_dir, "--page", pair_page, a, b], timeout=120)
        check(proc.returncode == 0 and os.path.isfile(pair_page) and 'alt="a_buckets"' not in open(pair_page).read(),
              f"the page leaves out a chart an earlier call left in the folder ({proc.stderr.strip()[-200:]})")
        # A run on a schedule, clipped: its learning rate and gradient norm per step.
        clipped = os.path.join(work, "clipped.h5")
        proc = run([ddplab, "train", "--steps", "6", "--warmup-steps", "1", "--input-dim", "64", "--hidden", "64",
                    "--classes", "10", "--batch", "8", "--lr-warmup", "2", "--lr-schedule", "cosine", "--grad-clip",
                    "0.1", "--quiet", "--out", clipped])
        check(proc.returncode == 0, f"a clipped run on a schedule trains ({proc.stderr.strip()[-200:]})")
        clipped_report = run([ddplab, "report", clipped]).stdout
        check(", lr_warmup 2, lr_schedule cosine (lr_final 0), grad_clip 0.1\n" in clipped_report and
              "  gradient norm       " in clipped_report and "clipped to 0.1 in " in clipped_report,
              f"report names the schedule and the clipping, and counts the clipped steps ({clipped_report[:600]})")
        update_dir = os.path.join(work, "update_charts")
        proc = run([sys.executable, charts, update_dir, clipped], timeout=120)
        png = os.path.join(update_dir, "update.png")
        check(proc.returncode == 0 and os.path.isfile(png) and os.path.getsize(png) > 1000 and png in proc.stdout,
              f"charts.py draws the update chart for it ({proc.stderr.strip()[-200:]})")
        # A clipped file from before steps/lr: its norms alone. Then the same folder over files with neither: the
        # page shows the folder's charts, so the earlier update chart must not stay behind.
        older = os.path.join(work, "older.h5")
        shutil.copy(clipped, older)
        with h5py.File(older, "r+") as f:
            del f["steps/lr"]
        proc = run([sys.executable, charts, update_dir, older], timeout=120)
        check(proc.returncode == 0 and os.path.isfile(png),
              f"the update chart of a clipped file without steps/lr ({proc.stderr.strip()[-200:]})")
        proc = run([sys.executable, charts, update_dir, a], timeout=120)
        check(proc.returncode == 0 and not os.path.exists(png), "an earlier call's update chart is removed")
        proc = run([sys.executable, charts, out_dir, text])
        check(proc.returncode == 2 and len(error_lines(proc.stderr, "charts.py:")) == 1,
              f"charts.py on a bad file: exit 2, one line ({proc.returncode}: {proc.stderr.strip()[:200]})")
        check_stopped_page(ddplab, a, work)
        # Pages of copies of a with one thing changed, and files charts.py refuses: drawn side by side, each into a
        # folder of its own, then checked in turn.
        # Outside a suite too, a run whose ranks took turns on the cores is marked so, as `ddplab report` marks it.
        crowded = os.path.join(work, "crowded.h5")
        shutil.copy(a, crowded)
        with h5py.File(crowded, "r+") as f:
            f.attrs["host_cores"] = 1  # its 2 ranks on one core
        crowded_page = os.path.join(work, "crowded.html")
        # A run stopped early says so on its page, as `ddplab report` says it.
        stopped = os.path.join(work, "stopped.h5")
        shutil.copy(a, stopped)
        with h5py.File(stopped, "r+") as f:
            f.attrs["stop_reason"] = "SIGTERM received: stopped after step 5"
        stopped_page = os.path.join(work, "stopped.html")
        # Runs of two builds and two command lines: the setup names each build and each command line (folded), not
        # the first run's alone.
        rebuilt = os.path.join(work, "rebuilt.h5")
        shutil.copy(a, rebuilt)
        with h5py.File(rebuilt, "r+") as f:
            commit, command = (v.decode() if isinstance(v, bytes) else str(v)
                               for v in (f.attrs["git_commit"], f.attrs["command_line"]))
            f.attrs["git_commit"] = "deadbeef0000"
            f.attrs["command_line"] = command + " --overlap off"
        builds_page = os.path.join(work, "builds.html")
        # A dataset cut short, a run with no step, a page into a missing folder, a report or sweep summary of another
        # shape: one line naming the problem, exit 2, before anything is written.
        cut = os.path.join(work, "cut_loss.h5")
        shutil.copy(a, cut)
        with h5py.File(cut, "r+") as f:
            loss = f["steps/loss"][:, :3]
            del f["steps/loss"]
            f["steps/loss"] = loss
        no_step = os.path.join(work, "no_step.h5")  # as a run stopped before its first step leaves it
        shutil.copy(a, no_step)
        with h5py.File(no_step, "r+") as f:
            f.attrs["num_steps"] = 0
            f.attrs["stop_reason"] = "non-finite gradient fc2.bias at step 0"
        not_a_list, no_points = os.path.join(work, "not_a_list.json"), os.path.join(work, "no_points.json")
        with open(not_a_list, "w") as f:
            json.dump("a string", f)
        with open(no_points, "w") as f:
            json.dump({"points": 5, "link": "none", "world_size": 2}, f)
        refusals = [([cut], "steps/loss has shape [2, 3], expected [2, 6]"),
                    ([no_step], "holds no completed step: non-finite gradient fc2.bias at step 0"),
                    (["--page", os.path.join(work, "no", "p.html"), a], "does not exist"),
                    (["--page", os.path.join(work, "p.html"), "--report", not_a_list, a], "is not a list"),
                    (["--sweep", no_points], "points is not a list")]
        refused_dirs = [os.path.join(work, f"refused{k}") for k in range(len(refusals))]
        draw = {"timeout": 120}
        crowded_run, crowded_report, stopped_run, builds_run, *refused_runs = run_all(
            [([sys.executable, charts, os.path.join(work, "crowded_charts"), "--page", crowded_page, crowded], draw),
             ([ddplab, "report", crowded], dict(timeout=60)),
             ([sys.executable, charts, os.path.join(work, "stopped_charts"), "--page", stopped_page, stopped], draw),
             ([sys.executable, charts, os.path.join(work, "builds_charts"), "--page", builds_page, a, rebuilt], draw)] +
            [([sys.executable, charts, folder, *args], draw) for folder, (args, _) in zip(refused_dirs, refusals)])
        proc = crowded_run
        page_text = open(crowded_page).read() if os.path.isfile(crowded_page) else ""
        check(proc.returncode == 0 and "<td>2*</td>" in page_text and
              "*: oversubscribed: the ranks took turns on the cores: this measures the machine" in page_text and
              "oversubscribed" in crowded_report.stdout,
              f"a run on fewer cores than its ranks is marked oversubscribed on its page ({proc.stderr[-200:]})")
        proc = stopped_run
        page_text = open(stopped_page).read() if os.path.isfile(stopped_page) else ""
        check(proc.returncode == 0 and "stopped did not complete</b>: SIGTERM received: stopped after step 5" in
              page_text, f"the page of a run stopped early says why ({proc.stderr[-200:]})")
        proc = builds_run
        page_text = open(builds_page).read() if os.path.isfile(builds_page) else ""
        check(proc.returncode == 0 and f"({commit})" in page_text and "rebuilt: " in page_text and
              "(deadbeef0000)" in page_text and "varies: 2 command lines" in page_text and
              "--overlap off</details>" in page_text,
              f"the setup lists both builds and both command lines ({proc.stderr[-200:]})")
        for refused_dir, (args, problem), proc in zip(refused_dirs, refusals, refused_runs):
            check(proc.returncode == 2 and proc.stderr.count("\n") == 1 and problem in proc.stderr and
                  not os.path.exists(refused_dir), f"charts.py {' '.join(map(os.path.basename, args))}: exit 2, "
                  f"one line with '{problem}', nothing written ({proc.returncode}: {proc.stderr.strip()[-300:]})")


if __name__ == "__main__":
    main()
    if failures:
        print(f"{len(failures)} check(s) failed:", *failures, sep="\n  ")
    else:
        print("all checks passed" + (f", {len(skips)} skipped" if skips else ""))
    sys.exit(exit_code())
