#!/usr/bin/env python3
"""allreduce_perf's command line, end to end at 2 ranks, and the busbw chart drawn from its output.

- rows arrive while the benchmark runs, not all at the end;
- nccl-tests' flags: -i (step in bytes), -g/-t 1, -c, -d float, -o sum, -a 0..3 (checked against each rank's mean
  in the JSON), -J, -G (refused for host implementations); --impls picks implementations; --stat median;
- the type column is the wire's (bfloat16, half) in the table, the CSV and the JSON;
- per-call times: min/p50/p99 in the JSON and CSV, i_min/i_p99 in the table, all agreeing;
- #wrong 0 on exactly summable inputs, also over several check rounds (-c 3); -c 0 says N/A;
- bad arguments: exit 2, one line naming the flag, no MPI_ABORT banner, before any work, no file touched;
- a rank that stops in the setup or mid-run: the watchdog ends the job, exit 3, after the setup's floor or --timeout-s,
  naming the wait, and leaves no shared-memory segment;
- output files written whole (no temporaries left), an existing one kept unless --force;
- scripts/allreduce_chart.py: a PNG from the JSON and from the CSV, one-line refusals of bad input.

usage: check_allreduce_perf_cli.py MPIRUN ALLREDUCE_PERF ALLREDUCE_CHART_PY DDPLAB STOP_IN_SETUP
"""
import csv
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from checks import check, failures, fires_in_time, run_all, stalled_s  # tests/cli/checks.py: the assertion every CLI test shares


class Perf:
    def __init__(self, mpirun, exe):
        self.mpirun, self.exe = mpirun, exe

    def cmd(self, args, np=2):
        return [self.mpirun, "--bind-to", "none", "-np", str(np), self.exe, *args]

    def run(self, args, np=2, timeout=120):
        return subprocess.run(self.cmd(args, np), capture_output=True, text=True, timeout=timeout)

    def run_args(self, args, np=2, **keywords):
        """A run as checks.run_all takes it."""
        return self.cmd(args, np), keywords


def data_rows(stdout):
    """The table's rows, split into columns: impl size count type redop, then 6 per mode."""
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


def printed_equal(text, value):
    """Whether `text`, a table cell, is `value` rounded as printed (2 decimals, fewer when wide, or 1.2e+05)."""
    if "e" in text:
        return abs(float(text) - value) <= 0.06 * abs(value)
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.51 * 10 ** -decimals


def is_png(path):
    if not os.path.exists(path):
        return False
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def load(workdir, tag):
    with open(os.path.join(workdir, tag + ".json")) as f:
        doc = json.load(f)
    with open(os.path.join(workdir, tag + ".csv")) as f:
        rows = list(csv.DictReader(f))
    return doc, rows


def run_ok(perf, workdir, tag, args, np=2):
    """Runs with -J and --csv into workdir; returns (process, JSON, CSV rows)."""
    p = perf.run([*args, "-J", os.path.join(workdir, tag + ".json"), "--csv", os.path.join(workdir, tag + ".csv")], np)
    check(p.returncode == 0, f"{tag}: {' '.join(args)} exits 0 (got {p.returncode}: {p.stderr.strip()[-300:]})")
    if p.returncode != 0:
        return p, None, None
    doc, rows = load(workdir, tag)
    return p, doc, rows


def test_rows_arrive_while_running(perf):
    # An emulated 0.1 Gbit/s link: 1 MiB takes ~85 ms per call at 2 ranks, 12 calls (2 modes x (5 timed + 1
    # check)), so the last size runs for about a second after the first rows are measured.
    args = ["-b", "4", "-e", "1M", "-f", "512", "-w", "0", "-n", "5", "--impls", "ring", "--link", "10gbe",
            "--link-gbps", "0.1"]
    start = time.monotonic()
    p = subprocess.Popen(perf.cmd(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    arrivals = []
    for line in p.stdout:
        if line.strip() and not line.startswith("#"):
            arrivals.append((time.monotonic() - start, line.split()[1]))
    p.wait(timeout=60)
    end = time.monotonic() - start
    sizes = [s for _, s in arrivals]
    check(p.returncode == 0 and sizes == ["4", "2048", "1048576"],
          f"streaming run: exit 0 and rows for 4 B, 2 KiB, 1 MiB (got {p.returncode}, {sizes})")
    if len(arrivals) == 3:
        first, last = arrivals[0][0], arrivals[-1][0]
        check(last - first > 0.5 and end - first > 0.5,
              f"rows are printed as measured: first row at {first:.2f} s, last at {last:.2f} s, exit at {end:.2f} s")


def segments_of(pids, kind=r"[a-z]+"):
    """The shared-memory segments in /dev/shm that processes `pids` made: ddplab's names carry their creator's pid,
    /ddplab-<uid>-<kind>-<pid>-<process id>-<n> (comm/shm_segments.h)."""
    found = []
    for name in os.listdir("/dev/shm"):
        m = re.fullmatch(rf"ddplab-\d+-{kind}-(\d+)-\d+-\d+", name)
        if m and int(m.group(1)) in pids:
            found.append((name, int(m.group(1))))
    return found


def perf_ranks(exe, marker):
    """The pids of the ranks whose command line names `marker` (a file only that job names)."""
    ranks = []
    for pid in os.listdir("/proc"):
        try:
            exe_name = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
            cmdline = open(f"/proc/{pid}/cmdline").read()
        except OSError:
            continue
        if pid.isdigit() and exe_name == os.path.basename(exe) and marker in cmdline:
            ranks.append(int(pid))
    return ranks


def stopped_mid_run(perf, workdir, args):
    """Runs 2 ranks and SIGSTOPs one once the first size's row is out (the setup over, the measurement under way).
    What the job did: (exit code, stderr, the ranks' pids)."""
    marker = os.path.join(workdir, "mid_run.json")
    p = subprocess.Popen(perf.cmd([*args, "--json", marker]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks = []
    for line in p.stdout:
        if data_rows(line):
            ranks = perf_ranks(perf.exe, marker)
            if ranks:
                os.kill(min(ranks), signal.SIGSTOP)
            break
    err = ""
    try:
        err = p.communicate(timeout=90)[1]
    except subprocess.TimeoutExpired:  # the checks name it, with what the ranks said
        err = "still running after 90 s"
    finally:
        for pid in ranks:  # whatever happened, nothing is left stopped
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if p.poll() is None:  # the watchdog did not act: nor is the job left running
            p.kill()
            err += ": " + p.communicate()[1]
    return p.returncode, err, ranks


def stopped_in_setup(perf, workdir, args, stop_in_setup, stop_in="MPI_Comm_split_type"):
    """Runs 2 ranks, one of which stops itself in its first MPI_Comm_split_type (the hosts' detection, the setup's
    first collective), or its first MPI_Allreduce (the ranks' first agreement after MPI_Init, before the options are
    read; LD_PRELOAD). What the job did: (exit code, stderr)."""
    marker = os.path.join(workdir, f"in_{stop_in}.json")
    start = [perf.mpirun, "--bind-to", "none", "-np", "1", perf.exe, *args, "--json", marker, ":", "-np", "1", "-x",
             f"LD_PRELOAD={stop_in_setup}", "-x", "STOP_IN", perf.exe, *args, "--json", marker]
    try:
        p = subprocess.run(start, capture_output=True, text=True, timeout=90,
                           env={**os.environ, "OMPI_MCA_odls_base_sigkill_timeout": "1",  # the stopped rank too
                                "STOP_IN": stop_in})
        return p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        subprocess.run(["pkill", "-KILL", "-f", marker])
        return None, "still running after 90 s"


def test_watchdog_ends_a_hang(perf, workdir, stop_in_setup):
    # A rank that stops (SIGSTOP: as hung as a process gets): the others' watchdog ends the job, exit 3, naming the
    # wait it left open, instead of waiting forever: in the setup after the setup's floor (runtime/watchdog.h), in the
    # measurement after --timeout-s. The two run side by side: each is mostly waiting. (A stop between a segment's
    # naming and its unlinking, a window of two small agreements, is tests/mpi/check_watchdog.py's half_shared.)
    timeout_s, setup_floor_s = 3, 30
    args = ["-c", "0", "--timeout-s", str(timeout_s)]
    # Mid-run, most often in mpi-raw's warm-up calls (the row before it is ring's), which open no wait of their own.
    mid_run_args = ["-b", "8", "-e", "16M", "-f", "1024", "-w", "2000", "-n", "500", "--impls", "ring,mpi-raw", *args]
    setup_args = ["-b", "8", "-e", "8", "-n", "1", "-w", "1", *args]
    with ThreadPoolExecutor(3) as pool:
        in_setup = pool.submit(stopped_in_setup, perf, workdir, setup_args, stop_in_setup)
        at_start = pool.submit(stopped_in_setup, perf, workdir, setup_args, stop_in_setup, "MPI_Allreduce")
        mid_run = pool.submit(stopped_mid_run, perf, workdir, mid_run_args)
        (setup_code, setup_err), (start_code, start_err) = in_setup.result(), at_start.result()
        run_code, run_err, ranks = mid_run.result()
    for where, code, err, bound, names in (
            ("at the start", start_code, start_err, setup_floor_s, "waiting for the ranks' agreement on MPI's thread level"),
            ("in the setup", setup_code, setup_err, setup_floor_s, "waiting for allreduce_perf's setup"),
            ("mid-run", run_code, run_err, timeout_s, None)):
        check(code == 3 and fires_in_time(err, bound) and
              (names in err if names else "waiting for allreduce_perf's setup" not in err),
              f"a rank stopped {where}: the watchdog ends the job, exit 3, after {bound} s without progress, naming "
              f"{names or 'a wait of the measurement'} (exit {code}, {stalled_s(err)} s; {err[-300:]})")
    left = [name for name, _ in segments_of(ranks)]
    check(ranks and not left, f"a rank stopped mid-run: no segment of the job's is left in /dev/shm ({ranks}, {left})")


def check_modes(doc, what, aggregate):
    """time_us follows -a from each rank's mean; per-call min/p50/p99 are the nearest-rank statistics."""
    for r in doc["results"]:
        for mode in ("out_of_place", "in_place"):
            m = r[mode]
            means, calls = m["rank_means_us"], sorted(m["times_us"])
            want = {"rank0": means[0], "avg": sum(means) / len(means), "min": min(means), "max": max(means),
                    "median": calls[math.ceil(len(calls) / 2) - 1]}[aggregate]
            if abs(m["time_us"] - want) > 1e-9 * want:
                return check(False, f"{what}: {r['impl']} {r['size_bytes']} B {mode}: time {m['time_us']}, "
                                    f"expected {aggregate} {want} (rank means {means}, calls {calls})")
            if len(calls) != doc["iters"] or (m["min_us"], m["p50_us"], m["p99_us"]) != (
                    calls[0], calls[math.ceil(len(calls) / 2) - 1], calls[math.ceil(len(calls) * 0.99) - 1]):
                return check(False, f"{what}: {r['impl']} {r['size_bytes']} B {mode}: min/p50/p99 "
                                    f"{m['min_us']}/{m['p50_us']}/{m['p99_us']} vs calls {calls}")
    check(True, f"{what}: time is the {aggregate} and min/p50/p99 match the {doc['iters']} calls of every row")


def test_flags(perf, workdir):
    small = ["-b", "1K", "-e", "16K", "-f", "4", "-w", "1", "-n", "5"]
    # nccl-tests' flags at the values that apply here, and several check rounds.
    p, doc, rows = run_ok(perf, workdir, "nccl_flags",
                          [*small, "-g", "1", "-t", "1", "-d", "float", "-o", "sum", "-c", "3", "-a", "2",
                           "--impls", "ring,mpi,ring-bf16,ring-fp16"])
    if doc:
        check(doc["check_iters"] == 3 and doc["wrong"] == 0 and
              all(r[m]["wrong"] == 0 for r in doc["results"] for m in ("out_of_place", "in_place")) and
              "# Out of bounds values : 0 OK" in p.stdout,
              "-c 3: every row checked, #wrong 0 (exact sums on every wire), 'Out of bounds values : 0 OK'")
        check_modes(doc, "-a 2", "min")
        check(doc["registered"] is True and "# host buffers: registered (-R 1)" in p.stdout,
              "-R 1 by default: registered host buffers, said in the header and the JSON")
        check(doc["hot_cache"] is False and "# calls: each one call's size further along the buffers" in p.stdout,
              "by default each call moves along the buffers (nccl-tests), said in the header and the JSON")
    # -R 0: ordinary buffers, copied through the FIFOs; the sums stay exact.
    # And -z 1 (nccl-tests' meaning): a barrier after every call, inside its time; --hot-cache: every call in place.
    p, doc, rows = run_ok(perf, workdir, "unregistered",
                          [*small, "-R", "0", "-c", "1", "-z", "1", "--hot-cache", "--impls", "ring"])
    if doc:
        check(doc["hot_cache"] is True and "# calls: each on the buffers' start" in p.stdout,
              "--hot-cache: every call on the buffers' start, said in the header and the JSON")
        check(doc["registered"] is False and doc["wrong"] == 0 and "# host buffers: not registered (-R 0)" in p.stdout,
              "-R 0: ordinary host buffers, said in the header and the JSON, #wrong 0")
        check(doc["blocking"] == 1 and "; a barrier after every call, timed with it" in p.stdout,
              "-z 1: a barrier after every call, said in the header and the JSON")
        check("# ring over shm\n" in p.stdout, "-R 0: the transport line claims neither single copy nor direct "
              f"collectives: {[l for l in p.stdout.splitlines() if l.startswith('# ring over')]}")
        wire = {"ring": "float", "mpi": "float", "ring-bf16": "bfloat16", "ring-fp16": "half"}
        table = data_rows(p.stdout)
        check(len(table) == len(doc["results"]) and all(t[3] == wire[t[0]] for t in table),
              f"table's type column is the wire's: {sorted({(t[0], t[3]) for t in table})}")
        check(all(r["type"] == wire[r["impl"]] for r in doc["results"]) and
              all(r["type"] == wire[r["impl"]] for r in rows), "JSON and CSV type is the wire's too")
        # i_min and i_p99 in the table are the JSON's min_us and p99_us, as rounded for the table.
        got = {(r["impl"], r["size_bytes"]): r for r in doc["results"]}
        agree = True
        for t in table:
            r = got[(t[0], int(t[1]))]
            for mode, (i_min, i_p99) in (("out_of_place", (t[9], t[10])), ("in_place", (t[15], t[16]))):
                agree &= printed_equal(i_min, r[mode]["min_us"]) and printed_equal(i_p99, r[mode]["p99_us"])
        check(agree, "the table's i_min and i_p99 columns are the JSON's min_us and p99_us")
        check(all(abs(float(c[f"{m}_{k}"]) - got[(c["impl"], int(c["size_bytes"]))][mode][k]) < 1e-3
                  for c in rows for m, mode in (("oop", "out_of_place"), ("ip", "in_place"))
                  for k in ("min_us", "p50_us", "p99_us")), "the CSV's min/p50/p99 columns are the JSON's")
    for a, name in ((0, "rank0"), (1, "avg"), (3, "max")):
        _, doc, _ = run_ok(perf, workdir, f"a{a}", [*small, "--impls", "ring", "-a", str(a)])
        if doc:
            check(doc["aggregate"] == name, f"-a {a} recorded as {name}")
            check_modes(doc, f"-a {a}", name)
    _, doc, _ = run_ok(perf, workdir, "median", [*small, "--impls", "ring", "--stat", "median"])
    if doc:
        check(doc["stat"] == "median" and doc["aggregate"] is None, "--stat median recorded, -a as not applied")
        check_modes(doc, "--stat median", "median")

    # -i: the step in bytes, as in nccl-tests, not a choice of implementations ("unknown implementation").
    p, doc, _ = run_ok(perf, workdir, "step", ["-b", "1M", "-e", "3M", "-i", "1M", "-w", "0", "-n", "1",
                                               "--impls", "ring"])
    if doc:
        sizes = [r["size_bytes"] for r in doc["results"]]
        check(sizes == [1 << 20, 2 << 20, 3 << 20] and [int(t[1]) for t in data_rows(p.stdout)] == sizes,
              f"-b 1M -e 3M -i 1M measures 1, 2 and 3 MiB (got {sizes})")

    # --diag: before each size, rank 0's cache-line round trip to the other rank: not zero, which would mean nothing
    # was measured. Its size belongs to the bench: a few hundred ns on a quiet host, ~4 ms beside two busy threads
    # (each side waits for the other's time slice). Without --diag none.
    p, doc, _ = run_ok(perf, workdir, "diag", [*small, "--impls", "ring", "--diag"])
    p_diag = p
    if doc:
        trips = [r["round_trip_ns"] for r in doc["results"]]
        lines = [l for l in p.stdout.splitlines() if l.startswith("# cache-line round trip from rank 0")]
        check(all(len(t) == 1 and 5 < t[0] < 60e9 for t in trips) and len(lines) == len(trips) and
              "# per rank (--diag):" in p.stdout,
              f"--diag: one round trip to rank 1 before each size, in the JSON and printed ({trips})")
        # At 1 MiB the direct all-reduce runs (past the small-message threshold) with ordinary stores (2 x 1 MiB is
        # below any last-level cache): each rank counts its calls, and none streamed.
        p, _, _ = run_ok(perf, workdir, "diag_direct", ["-b", "1M", "-e", "1M", "-w", "1", "-n", "3", "--impls", "ring",
                                                         "--diag"])
        counts = [tuple(map(int, m)) for m in
                  re.findall(r"direct collectives: (\d+), of which (\d+) stored non-temporally", p.stdout)]
        # 100 untimed warm-up calls in place, then per mode 1 warm-up and 3 timed calls (and the checks'): all direct.
        check(len(counts) == 2 and all(direct >= 108 and streamed == 0 for direct, streamed in counts),
              f"--diag: each rank's direct collectives, none streamed at 1 MiB (got {counts})")
        # Each rank's vCPU steal time over each mode's timed calls: never negative, and printed per rank and
        # implementation. (Mostly 0 on a quiet host: this checks that it is gathered and shown, not its value.)
        steals = [r[m]["steal_ms"] for r in doc["results"] for m in ("out_of_place", "in_place")]
        check(all(len(s) == 2 and all(v >= 0 for v in s) for s in steals) and
              len(re.findall(r"^#    ring +shm waits .*; steal \d+ ms$", p_diag.stdout, re.M)) == 2,
              f"--diag: each rank's steal per mode in the JSON and per rank in the text ({steals[:2]}...)")
        # Every rank's memory stream rate before each size, in the JSON and printed.
        rates = [r["stream_gbps"] for r in doc["results"]]
        stream_lines = [l for l in p_diag.stdout.splitlines() if l.startswith("# memory stream per rank")]
        check(all(len(g) == 2 and all(0.1 < v < 1e4 for v in g) for g in rates) and len(stream_lines) == len(rates),
              f"--diag: each rank's memory stream rate before each size ({rates[:2]}...)")
        _, plain, _ = run_ok(perf, workdir, "nodiag", [*small, "--impls", "ring"])
        check(plain is not None and all(r["round_trip_ns"] == [] and r["in_place"]["steal_ms"] == [] and
                                        r["stream_gbps"] == [] for r in plain["results"]),
              "without --diag no round trips, steal or memory stream are measured")

    # -c 0: nothing checked, and it says so.
    p, doc, rows = run_ok(perf, workdir, "nocheck", [*small, "--impls", "ring", "-c", "0"])
    if doc:
        table = data_rows(p.stdout)
        check(all(t[8] == "N/A" and t[14] == "N/A" for t in table) and
              all(r[m]["wrong"] is None for r in doc["results"] for m in ("out_of_place", "in_place")) and
              doc["wrong"] is None and
              all(c["oop_wrong"] == "" and c["ip_wrong"] == "" for c in rows) and "not checked (-c 0)" in p.stdout,
              "-c 0: #wrong N/A in the table, null in the JSON (the total too), empty in the CSV")

    # Files: written whole, nothing left beside them; an existing result is replaced with --force alone.
    with open(os.path.join(workdir, "step.csv"), "w") as f:
        f.write("old\n")
    kept_args = ["-b", "4", "-e", "4", "-n", "1", "--impls", "ring", "--csv", os.path.join(workdir, "step.csv")]
    p = perf.run(kept_args, 2)
    with open(os.path.join(workdir, "step.csv")) as f:
        kept = f.read() == "old\n"
    check(p.returncode == 2 and "already exists (pass --force to overwrite)" in p.stderr and kept,
          f"an existing --csv file is kept without --force (got {p.returncode}: {p.stderr.strip()[-200:]})")
    run_ok(perf, workdir, "step", ["-b", "4", "-e", "4", "-n", "1", "--impls", "ring", "--force"])
    _, rows = load(workdir, "step")
    check(len(rows) == 1 and rows[0]["size_bytes"] == "4", "with --force it is replaced by the new result")
    leftovers = [f for f in os.listdir(workdir) if ".tmp" in f]
    check(not leftovers, f"no temporary files left beside the results ({leftovers})")


def test_bad_arguments(perf, workdir, ddplab):
    old = os.path.join(workdir, "old.csv")
    with open(old, "w") as f:
        f.write("an earlier result\n")
    before = sorted(os.listdir(workdir))
    cases = [
        (["-b", "4M", "-e", "1K"], "-e 1K"),
        (["-f", "1"], "-f 1"),
        (["-n", "0"], "-n 0"),
        (["-b", "1X"], "-b 1X"),
        (["-w", "-1"], "-w -1"),
        (["-c", "-1"], "-c -1"),
        (["-i", "ring"], "-i ring"),
        (["-i", "1M", "-f", "4"], "-i and -f"),
        (["-g", "2"], "-g 2"),
        (["-t", "4"], "-t 4"),
        (["-d", "bfloat16"], "-d bfloat16"),
        (["-o", "max"], "-o max"),
        (["-a", "4"], "-a 4"),
        (["-R", "2"], "-R 2"),
        (["-G", "-1"], "-G -1"),
        (["-G", "4", "--impls", "ring"], "-G 4: --impls ring cannot be captured: it runs on the host"),
        (["--stat", "median", "-a", "3"], "-a"),
        (["--impls", "ring,foo"], "--impls foo"),
        (["--impls", "mpi-raw", "--link", "10gbe"], "--impls mpi-raw"),
        (["-e", "1000G"], "-e"),
        (["-b", "1e400"], "-b 1e400: not a size"),  # a number std::stod would throw on
        (["-b", "0x10"], "-b 0x10: not a size"),
        (["-b", "7", "-e", "13"], "-b 7: not a whole number of floats (a multiple of 4 bytes)"),
        (["-b", "4", "-i", "6"], "-i 6: not a whole number of floats"),
        (["-b", "4", "-e", "4G", "-i", "4"], "-i 4 from -b 4 to -e 4G: 1073741824 sizes, at most 10000"),
        (["--impls", ""], "--impls: an empty list"),
        (["--csv", "/nonexistent/x.csv"], "--csv /nonexistent/x.csv"),
        (["-J", "/nonexistent/x.json"], "-J /nonexistent/x.json"),
        (["-J", ""], "--json: needs a path (got an empty one)"),  # a variable left unset: not "no file"
        (["--csv", workdir], f"--csv {workdir}: output path {workdir} is a folder"),
        (["-z", "3"], "-z 3: 0 (queue the calls, wait once), 1 (wait and a barrier after each) or 2 (wait after each)"),
        # train's knobs, train's words (below): 1e300 us overflowed the delay into none, 0 Gbit/s read as unlimited
        (["--link", "10gbe", "--link-latency-us", "1e300"], "--link-latency-us must be at most 1e+10 (got 1e+300)"),
        (["--link", "10gbe", "--link-gbps", "0"], "--link-gbps: must be at least 1e-06 (got 0)"),
        (["--link", "10gbe", "--link-gbps", "-5"], "--link-gbps: must be at least 1e-06 (got -5)"),
        (["--link", "intra=none,inter=10gbe", "--link-gbps", "5"], "--link-latency-us and --link-gbps apply to a single"),
        (["--ranks-per-node", "-1"], "--ranks-per-node must be at least 0 (got -1)"),
        (["--gpu-chunk-mb", "nan"], "--gpu-chunk-mb: must be a number from 0 to 4096 (got nan)"),
        (["--bogus", "1"], "unknown option --bogus, followed by 1"),
    ]
    # The default -e 256M would run for minutes: refusing within 30 s means nothing was measured first.
    # --csv names an existing file, --force or not: a refused run must not touch it, whichever check refuses.
    refusals = [perf.run_args([*args, "--csv", old, "--force"] if "--csv" not in args else args, timeout=30)
                for args, _ in cases]
    # -R is DDPLAB_LOCAL_REGISTER for the run: an environment that says otherwise is refused the same way.
    refusals.append(perf.run_args(["-R", "0", "-b", "4", "-e", "4", "-n", "1", "-w", "0", "--csv", old, "--force"], timeout=30,
                                  env={**os.environ, "DDPLAB_LOCAL_REGISTER": "1"}))
    # A GPU implementation where none can run (a build without CUDA, or no device): refused the same way, before
    # any rank enters NCCL. Where a GPU is present it runs (one rank: ncclAllReduce takes a GPU per rank).
    refusals.append(perf.run_args(["--impls", "nccl", "-b", "4", "-e", "4", "-n", "1", "-w", "0"], np=1, timeout=60))
    # -G with an emulated link on our GPU ring: the link waits on the host, which a graph's replay leaves out.
    refusals.append(perf.run_args(["-G", "2", "--impls", "gpu-ring-nccl", "--link", "10gbe", "--csv", old, "--force"], np=1,
                                  timeout=30))
    # Under -z 0 (the default) nccl's calls are queued and timed together: no call has a median.
    refusals.append(perf.run_args(["--stat", "median", "--impls", "ring,nccl", "--csv", old, "--force"], np=1, timeout=30))
    # Ranks given different command lines (an MPMD launch) would wait on each other in different collectives.
    mixed = ["-b", "8", "-e", "64", "-n", "1", "-w", "0", "--timeout-s", "5"]
    refusals.append(([perf.mpirun, "--bind-to", "none", "-np", "1", perf.exe, *mixed, "--impls", "ring,mpi", ":",
                      "-np", "1", perf.exe, *mixed, "--impls", "mpi,ring"], dict(timeout=30)))
    # A ddplab rank beside it (a launch mixing programs): both reach the same first collective, which names them.
    refusals.append(([perf.mpirun, "--bind-to", "none", "-np", "1", perf.exe, *mixed, ":", "-np", "1", ddplab, "train",
                      "--steps", "2", "--timeout-s", "5"], dict(timeout=30)))
    *flags, register, nccl, graph, queued_median, mpmd, mixed_programs = run_all(refusals)

    def our_lines(p):
        return [line for line in p.stderr.splitlines() if line.startswith("allreduce_perf")]

    for (args, expected), p in zip(cases, flags):
        ours = our_lines(p)
        ok = (p.returncode == 2 and len(ours) == 1 and ours[0].startswith("allreduce_perf: error: " + expected)
              and "MPI_ABORT" not in p.stderr and not data_rows(p.stdout) and not p.stdout.strip())
        check(ok, f"{' '.join(args)}: exit 2, one line naming '{expected}', no banner, no output, {p.seconds:.1f} s "
                  f"(got {p.returncode}: {ours or p.stderr.strip()[-200:]})")
    # The link's flags are train's knobs, declared once: `ddplab train` refuses the same values in the same words.
    for args, _ in cases:
        if args[0] not in ("--link", "--ranks-per-node"):
            continue
        train = subprocess.run([ddplab, "train", "--steps", "1", *args], capture_output=True, text=True, timeout=60)
        theirs = [line.split(" (see ")[0] for line in train.stderr.splitlines() if line.startswith("ddplab: error: ")]
        ours = [line.split(" (see ")[0] for line in
                subprocess.run(perf.cmd(["-b", "4", "-e", "4", *args]), capture_output=True, text=True,
                               timeout=60).stderr.splitlines() if line.startswith("allreduce_perf: error: ")]
        check(train.returncode == 2 and len(theirs) == 1 and len(ours) == 1 and
              theirs[0].removeprefix("ddplab: ") == ours[0].removeprefix("allreduce_perf: "),
              f"{' '.join(args)}: train's refusal, word for word ({theirs} against {ours})")
    p, ours = register, our_lines(register)
    check(p.returncode == 2 and len(ours) == 1 and
          ours[0].startswith("allreduce_perf: error: -R 0 and DDPLAB_LOCAL_REGISTER=1 disagree") and not p.stdout.strip(),
          f"-R 0 with DDPLAB_LOCAL_REGISTER=1: exit 2, one line (got {p.returncode}: {ours or p.stderr[-200:]})")
    p, ours = nccl, our_lines(nccl)
    # Refused by the build (no CUDA) or by the device check (no usable GPU), never inside NCCL.
    check(p.returncode == 0 or (p.returncode == 2 and len(ours) == 1 and "MPI_ABORT" not in p.stderr and
                                ours[0].startswith(("allreduce_perf: error: --impls nccl: no CUDA device",
                                                    "allreduce_perf: error: --impls nccl: needs a build with CUDA"))),
          f"--impls nccl without a usable GPU: exit 2, one line (got {p.returncode}: {ours or p.stderr[-200:]})")
    p, ours = graph, our_lines(graph)
    check(p.returncode == 2 and len(ours) == 1 and not p.stdout.strip() and
          ours[0].startswith(("allreduce_perf: error: -G 2 with --link 10gbe: --impls gpu-ring-nccl waits for the "
                              "emulated link on the host", "allreduce_perf: error: --impls gpu-ring-nccl: needs a build "
                              "with CUDA")),
          f"-G with --link on the GPU ring: exit 2, one line (got {p.returncode}: {ours or p.stderr[-200:]})")
    p, ours = queued_median, our_lines(queued_median)
    check(p.returncode == 2 and len(ours) == 1 and not p.stdout.strip() and
          ours[0].startswith(("allreduce_perf: error: --stat median: --impls nccl queues its calls under -z 0",
                              "allreduce_perf: error: --impls nccl: needs a build with CUDA")),
          f"--stat median with nccl under -z 0: exit 2, one line (got {p.returncode}: {ours or p.stderr[-200:]})")
    p, ours = mpmd, our_lines(mpmd)
    check(p.returncode == 2 and len(ours) == 1 and not p.stdout.strip() and
          ours[0] == "allreduce_perf: error: ranks disagree on the arguments (rank 0: -b 8 -e 64 -n 1 -w 0 "
                     "--timeout-s 5 --impls ring,mpi, rank 1: -b 8 -e 64 -n 1 -w 0 --timeout-s 5 --impls mpi,ring)",
          f"ranks with different flags: exit 2, one line naming both (got {p.returncode}: {ours or p.stderr[-200:]})")
    p, ours = mixed_programs, our_lines(mixed_programs)
    check(p.returncode == 2 and len(ours) == 1 and not p.stdout.strip() and
          re.fullmatch(r"allreduce_perf: error: ranks disagree on the subcommand: rank 0 \(host [^)]*\) runs "
                       r"allreduce_perf, rank 1 \(host [^)]*\) runs train", ours[0]) is not None,
          f"an allreduce_perf rank beside a ddplab train rank: exit 2, one line naming both, no hang (got "
          f"{p.returncode}: {ours or p.stderr[-200:]})")
    with open(old) as f:
        kept = f.read() == "an earlier result\n"
    check(kept and sorted(os.listdir(workdir)) == before, "refused runs touch no file (an existing --csv is kept)")


def test_chart(chart_py, workdir):
    # Two implementations over a few sizes, from the JSON and from the CSV of one run.
    for src in ("nccl_flags.json", "nccl_flags.csv"):
        out = os.path.join(workdir, src.replace(".", "_") + ".png")
        p = subprocess.run([sys.executable, chart_py, os.path.join(workdir, src), "-o", out],
                           capture_output=True, text=True, timeout=120)
        check(p.returncode == 0 and is_png(out) and p.stdout.strip() == out,
              f"allreduce_chart.py {src}: a PNG at {out} (got {p.returncode}: {p.stderr.strip()[-200:]})")
    # The line and its band are one statistic (per call, each timed by its slowest rank): a table whose ranks' mean
    # call beat every call's slowest rank (as ranks taking turns on cores measure) still draws its line inside.
    with open(os.path.join(workdir, "nccl_flags.json")) as f:
        doc = json.load(f)
    factor = 2 * (doc["nranks"] - 1) / doc["nranks"]
    for row in doc["results"]:
        cell = row["out_of_place"]
        cell["time_us"] = cell["min_us"] / 2
        cell["algbw_gbs"] = row["size_bytes"] / cell["time_us"] / 1e3
        cell["busbw_gbs"] = cell["algbw_gbs"] * factor
    fast_means = os.path.join(workdir, "fast_means.json")
    with open(fast_means, "w") as f:
        json.dump(doc, f)
    spec = importlib.util.spec_from_file_location("allreduce_chart", chart_py)
    chart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chart)
    points = [p for s in chart.read_results(fast_means, "out-of-place") for p in s.points]
    outside = [(size, line) for size, line, fastest, p99 in points if not p99 <= line <= fastest]
    check(points and not outside, f"allreduce_chart.py: every point of the line lies in its band ({outside[:3]})")
    # Rows whose calls were queued and timed together (-z 0's GPU rows) have no per-call times: the line is the mean
    # call, without a band, and the chart still draws.
    first = doc["results"][0]["impl"]
    for row in doc["results"]:
        if row["impl"] == first:
            for mode in ("out_of_place", "in_place"):
                row[mode].update(min_us=None, p50_us=None, p99_us=None, times_us=[])
    queued = os.path.join(workdir, "queued.json")
    with open(queued, "w") as f:
        json.dump(doc, f)
    series = {s.impl: s for s in chart.read_results(queued, "out-of-place")}
    means = [r["out_of_place"]["busbw_gbs"] for r in doc["results"] if r["impl"] == first]
    lines = [line for _, line, fastest, p99 in sorted(series[first].points) if fastest == line == p99]
    check(series[first].queued and len(lines) == len(means) and
          all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(lines, means)) and
          not any(s.queued for impl, s in series.items() if impl != first),
          f"allreduce_chart.py: queued rows draw the mean call without a band ({lines[:3]} against {means[:3]})")
    out = os.path.join(workdir, "queued.png")
    p = subprocess.run([sys.executable, chart_py, queued, "-o", out], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0 and is_png(out), f"allreduce_chart.py with queued rows: a PNG ({p.stderr.strip()[-200:]})")
    bad = os.path.join(workdir, "bad.json")
    with open(bad, "w") as f:
        f.write('{"nranks": 2}')
    for args, expected in (([os.path.join(workdir, "none.json")], "no such file"),
                           ([bad], "not allreduce_perf output"),
                           ([os.path.join(workdir, "nccl_flags.json"), "-o", "/nonexistent/c.png"], "does not exist"),
                           ([os.path.join(workdir, "nccl_flags.json"), "-o", "c.jpg"], "extension")):
        p = subprocess.run([sys.executable, chart_py, *args], capture_output=True, text=True, timeout=120)
        lines = p.stderr.strip().splitlines()
        check(p.returncode == 2 and len(lines) == 1 and expected in lines[0],
              f"allreduce_chart.py {' '.join(args)}: exit 2, one line with '{expected}' ({p.returncode}: {lines})")


def main():
    mpirun, exe, chart_py, ddplab, stop_in_setup = sys.argv[1:6]
    perf = Perf(mpirun, exe)
    with tempfile.TemporaryDirectory() as d:
        test_rows_arrive_while_running(perf)
        test_watchdog_ends_a_hang(perf, d, stop_in_setup)
        os.mkdir(os.path.join(d, "runs"))
        os.mkdir(os.path.join(d, "refused"))
        test_flags(perf, os.path.join(d, "runs"))
        test_bad_arguments(perf, os.path.join(d, "refused"), ddplab)
        test_chart(chart_py, os.path.join(d, "runs"))
    if failures:
        sys.exit(f"{len(failures)} FAILED:\n  " + "\n  ".join(failures))
    print("OK: allreduce_perf command line and chart")


if __name__ == "__main__":
    main()
