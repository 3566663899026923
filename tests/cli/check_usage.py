#!/usr/bin/python3
"""What a user meets first: --version, a mistyped command, the help text, the flags suite and sweep offer, an
output path checked before training, and settings that must not be accepted silently.

usage: check_usage.py MPIRUN DDPLAB OLD_OPENBLAS_SHIM
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import h5py

from checks import check, failures  # tests/cli/checks.py: the assertion every CLI test shares


mpirun, ddplab, old_openblas = sys.argv[1], sys.argv[2], sys.argv[3]
# Most cases here end every rank with exit code 2. Open MPI's mpirun then waits out its kill sequence, 2 s, before
# it ends (odls_base_sigkill_timeout, 1 s per signal). That wait is mpirun's, not ddplab's: it is taken out.
os.environ["OMPI_MCA_odls_base_sigkill_timeout"] = "0"
SMALL = ["--hidden", "32", "--input-dim", "16", "--classes", "10", "--batch", "4"]


def run(np_ranks, *args, timeout=120, env=None):
    start = time.monotonic()
    proc = subprocess.run([mpirun, "-np", str(np_ranks), ddplab, *args], capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else {**os.environ, **env})
    proc.seconds = time.monotonic() - start
    return proc


def our_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("ddplab:")]


def refused(proc, text):
    """Exit 2 and exactly one 'ddplab:' line on stderr, containing text."""
    lines = our_lines(proc.stderr)
    return proc.returncode == 2 and len(lines) == 1 and text in lines[0]


# ---- version ---------------------------------------------------------------------------------------------------
version = run(1, "--version")
pattern = r"ddplab \d+\.\d+\.\d+ \(commit ([0-9a-f]{12}(-dirty)?|unknown)\)"
check(version.returncode == 0 and re.fullmatch(pattern, version.stdout.strip()) is not None,
      f"--version prints the version and commit ({version.stdout.strip()!r})")
devices = run(1, "devices")
check(devices.stdout.splitlines()[:1] == [version.stdout.strip()], "devices starts with the same version line")

# ---- the BLAS kernels: named with the reason, the user's OPENBLAS_CORETYPE and DDPLAB_BLAS_AUTO=off obeyed ----------
def kernels_of(proc):
    """devices' 'kernels <core> (<why>)' line and the core its BLAS line names ('core=<core>')."""
    named = re.search(r"^ +kernels (\w+) \((.+)\)$", proc.stdout, re.M)
    loaded = re.search(r"^  BLAS .* core=(\w+)$", proc.stdout, re.M)
    return (named.group(1), named.group(2), loaded.group(1)) if named and loaded else (None, None, None)


core, why, loaded = kernels_of(devices)
check(core is not None and core == loaded and why, f"devices names the kernels OpenBLAS runs and why ({core}, {why})")
gemm = re.search(r"^ +GEMM, .*: ([\d.]+) GFLOP/s", devices.stdout, re.M)
check(gemm is not None and float(gemm.group(1)) > 0, "devices measures the GEMM rate of the kernels in use")
alike = re.search(r"^ +GEMM, .*; measured alike, (\w+) (\d+)% of the best \(", devices.stdout, re.M)
check(alike is not None and alike.group(1) == core and 0 < int(alike.group(2)) <= 100,
      f"devices sets the kernels in use against the best family, measured alike ({alike and alike.group(0).strip()})")
core, why, loaded = kernels_of(run(1, "devices", env={"OPENBLAS_CORETYPE": "Haswell"}))
check(core == loaded == "Haswell" and why == "OPENBLAS_CORETYPE=Haswell in the environment",
      f"a user's OPENBLAS_CORETYPE wins ({core}, {why})")
core, why, loaded = kernels_of(run(1, "devices", env={"DDPLAB_BLAS_AUTO": "off"}))
check(core == loaded and why == "OpenBLAS's own pick; DDPLAB_BLAS_AUTO=off",
      f"DDPLAB_BLAS_AUTO=off keeps OpenBLAS's pick ({core}, {why})")
# Empty is unset, as for every setting: the choice runs, as by default.
core_empty, why_empty, _ = kernels_of(run(1, "devices", env={"DDPLAB_BLAS_AUTO": ""}))
core_default, why_default, _ = kernels_of(devices)
check((core_empty, why_empty) == (core_default, why_default),
      f"DDPLAB_BLAS_AUTO= (empty) chooses as the default does ({core_empty}, {why_empty})")
# An OpenBLAS older than the CPU names a family below it (Debian's 0.3.21 names an Emerald Rapids Xeon Prescott): the
# shim makes it do so here. ddplab measures the families of the CPU's own instruction set and runs the fastest; a
# fresh cache, so that the probe runs.
flags = set(re.search(r"^flags\s*:(.*)$", open("/proc/cpuinfo").read(), re.M).group(1).split())
if {"avx2", "fma"} <= flags:
    with tempfile.TemporaryDirectory() as cache:
        proc = run(1, "devices", env={"LD_PRELOAD": old_openblas, "XDG_CACHE_HOME": cache})
    core, why, loaded = kernels_of(proc)
    check(proc.returncode == 0 and core in {"Haswell", "Zen", "SkylakeX", "Cooperlake"} and core == loaded and
          why.startswith("probe: ") and why.endswith("; OpenBLAS detected Prescott"),
          f"an OpenBLAS that names Prescott on an AVX2 CPU: ddplab probes and runs a family of the CPU's ({core}, "
          f"{why}; loaded {loaded}, exit {proc.returncode} {proc.stderr[-300:]})")
else:
    print("skip: an OpenBLAS that names Prescott: this CPU has no AVX2+FMA, so nothing above OpenBLAS's pick to run")
check(run(2, "--version").stdout.count("ddplab ") == 1, "--version on 2 ranks prints one line")

# ---- a mistyped command ------------------------------------------------------------------------------------------
for typo, meant in [("trian", "train"), ("swep", "sweep"), ("sutie", "suite"), ("reprot", "report")]:
    proc = run(1, typo, "--steps", "2")
    check(refused(proc, f"unknown command '{typo}' (did you mean '{meant}'?)"),
          f"ddplab {typo}: names the word and suggests {meant} ({our_lines(proc.stderr)})")
proc = run(1, "xyzzyqq")
check(refused(proc, "unknown command 'xyzzyqq'; commands: train, suite, sweep, devices, report, timeline"),
      f"a word near no command lists the commands ({our_lines(proc.stderr)})")

# ---- an unknown option: named in the order typed (CLI11 2.1 reverses them) -----------------------------------------
proc = run(1, "train", "--stepz", "3")
check(refused(proc, "unknown option --stepz, followed by 3"), f"train --stepz 3 ({our_lines(proc.stderr)})")
proc = run(1, "train", "--batching", "bucket", "--batching", "token")
check(refused(proc, "--batching given more than once (it takes one value)"),
      f"a flag given twice ({our_lines(proc.stderr)})")

# ---- a refused --resume leaves nothing behind, not even the runs/ folder made for the default run file ---------------
with tempfile.TemporaryDirectory() as cwd:
    proc = subprocess.run([mpirun, "-np", "1", ddplab, "train", *SMALL, "--resume", "missing.h5"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    check(refused(proc, "missing.h5") and os.listdir(cwd) == [],
          f"--resume missing.h5: refused, nothing left in the folder ({our_lines(proc.stderr)}, {os.listdir(cwd)})")

# ---- resuming from a checkpoint and saving back to it needs no --force (the --out file still does) ---------------------
with tempfile.TemporaryDirectory() as tmp:
    ck = os.path.join(tmp, "ck.h5")
    first = run(1, "train", *SMALL, "--steps", "4", "--checkpoint", ck, "--out", os.path.join(tmp, "a.h5"))
    again = run(1, "train", *SMALL, "--steps", "6", "--resume", ck, "--checkpoint", ck, "--out",
                os.path.join(tmp, "b.h5"))
    with h5py.File(ck, "r") as f:
        step = int(f.attrs["step"])
    check(first.returncode == 0 and again.returncode == 0 and "checkpoint: " + ck + " (a resume starts at step 6)"
          in again.stdout and step == 6, f"--resume ck --checkpoint ck replaces it ({our_lines(again.stderr)})")

# ---- progress: at most once a second, over the interval since the last line, with elapsed time and ETA -------------
with tempfile.TemporaryDirectory() as tmp:
    proc = run(1, "train", "--steps", "200", "--threads", "1", "--out", os.path.join(tmp, "p.h5"))
    lines = re.findall(r"^  step (\d+)/200  ([\d.]+) ms/step  (\d+) samples/s  loss [\d.]+ \(rank 0\)  "
                       r"elapsed (\d+) s, eta (\d+) s$", proc.stdout, re.M)
    # Each line's samples/s is the batch (128) over its interval's mean step.
    consistent = all(abs(int(rate) - 128 / (float(ms) / 1e3)) <= 0.02 * int(rate) + 1 for _, ms, rate, _, _ in lines)
    check(proc.returncode == 0 and lines and consistent,
          f"progress lines: step, interval ms/step, samples/s, loss, elapsed, eta ({proc.stdout[:400]})")

# ---- help ---------------------------------------------------------------------------------------------------------
top = run(1, "--help").stdout
check("MLP or a transformer" in top, "train's description names the transformer too")
check("--version" in top, "--help lists --version")
train_help = run(1, "train", "--help").stdout
check("global batch = batch x grad-accum x ranks" in train_help, "--batch help: batch x grad-accum x ranks")
for flag in ["--out", "--checkpoint", "--resume", "--fault"]:
    check(re.search(rf"^\s+{flag}(?![\w-])", train_help, re.M) is not None, f"train offers {flag}")
for command in [["suite", "lab"], ["sweep"]]:
    text = run(1, *command, "--help").stdout
    offered = [flag for flag in ["--out", "--checkpoint", "--checkpoint-every", "--resume", "--fault", "--fault-rank",
                                 "--fault-step"] if re.search(rf"^\s+{flag}(?![\w-])", text, re.M)]
    check(offered == [] and re.search(r"^\s+--out-dir\b", text, re.M) is not None,
          f"{command[0]} --help offers none of the flags it would ignore ({offered})")
proc = run(1, "train", *SMALL, "--comm", "pigeon")
check(refused(proc, "--comm must be ring, mpi, hier or nccl (got 'pigeon')"), "the --comm error lists nccl")

with tempfile.TemporaryDirectory() as work:
    # ---- suite and sweep refuse the flags of a single run ---------------------------------------------------------
    for command in [["suite", "lab"], ["sweep"]]:
        for flag, value in [("--out", os.path.join(work, "x.h5")), ("--checkpoint", os.path.join(work, "c.h5")),
                            ("--resume", os.path.join(work, "c.h5")), ("--fault", "nan")]:
            proc = run(1, *command, "--steps", "2", flag, value, "--out-dir", os.path.join(work, "suite"))
            check(refused(proc, flag) and os.listdir(work) == [],
                  f"{command[0]} {flag} is refused, nothing written ({our_lines(proc.stderr)})")

    # ---- what a suite's or a sweep's runs would refuse is refused before its folder is made, before the first case ----
    folder = os.path.join(work, "many")
    for np_ranks, command, args, text in [
            (2, ["sweep"], ["--slow-rank", "5", "--straggler-ms", "1"], "--slow-rank 5 is not a rank of this 2-rank job"),
            (1, ["sweep"], ["--bucket-mb", "1,1.0000001"], "--bucket-mb lists 1 twice"),
            (1, ["sweep"], ["--overlap", "on,on"], "--overlap lists on twice"),
            (2, ["suite", "lab"], ["--comm", "hier"], "--comm hier needs more than one node"),
            (2, ["suite", "lab"], ["--model", "tiny", "--epoch-size", "1"], "fewer sequences per epoch (--epoch-size 1) than the 2 ranks"),
            (1, ["suite", "lab"], ["--quiet"], "--quiet"),
            (1, ["suite", "lab"], ["--log-every", "2"], "--log-every"),
            (1, ["sweep"], ["--log-every", "2"], "--log-every"),
            (1, ["suite", "lab"], ["--loader-threads", "2"],
             "--loader-threads is not a flag of suite lab: its input cases run 0, 2 and 4 loader threads"),
            (1, ["suite", "lab"], ["--zero-stage", "1", "--comm", "mpi"], "--zero-stage is not a flag of suite lab"),
            (1, ["suite", "tokens"], ["--batching", "token"], "--batching is not a flag of suite tokens"),
            (1, ["suite", "tokens"], ["--straggler-ms", "5"], "--straggler-ms is not a flag of suite tokens"),
            (1, ["suite", "tokens"], ["--model", "mlp"], "suite tokens trains a transformer")]:
        proc = run(np_ranks, *command, "--steps", "2", *args, "--out-dir", folder)
        check(refused(proc, text) and os.listdir(work) == [],
              f"np={np_ranks} {command[0]} {' '.join(args)}: refused, nothing written ({our_lines(proc.stderr)})")
    # An MPMD launch can hand ranks different options of the command itself: refused on every rank before any work,
    # not a hang when one rank runs cases or points the other does not.
    for first, second, text in [(["sweep", "--bucket-mb", "1,5"], ["sweep", "--bucket-mb", "1"],
                                 "ranks were started with different sweep options: --bucket-mb"),
                                (["suite", "lab"], ["suite", "tokens"],
                                 "ranks were started with different suite options: suite")]:
        common = ["--steps", "2", "--out-dir", folder]
        proc = subprocess.run([mpirun, "-np", "1", ddplab, *first, *common, ":", "-np", "1", ddplab, *second, *common],
                              capture_output=True, text=True, timeout=120)
        check(proc.returncode == 2 and text in proc.stderr and os.listdir(work) == [],
              f"{first[0]}: ranks given different options refuse alike ({proc.returncode}: {our_lines(proc.stderr)})")
    # Values past what a flag can hold: one line, exit 2, not an overflow later.
    for args, text in [(["--extra-allreduce-mb", "1e300"], "--extra-allreduce-mb must be at most 1e+12"),
                       (["--grad-slice-mb", "1e14"], "--grad-slice-mb must be at most 1e+12"),
                       (["--timeout-s", "1e300"], "--timeout-s must be at most")]:
        proc = run(1, "train", *SMALL, "--steps", "2", *args, "--out", os.path.join(work, "x.h5"))
        check(refused(proc, text) and os.listdir(work) == [], f"train {' '.join(args)}: refused ({our_lines(proc.stderr)})")
    # Whole numbers are decimal: CLI11 alone read 010 as octal (8 steps) and 0x10 as hex; out of range is refused, not
    # clamped (--seed -1 was 2^64 - 1).
    for args, text in [(["--steps", "0x10"], "--steps: must be a whole number in decimal (got '0x10')"),
                       (["--seed", "-1"], "--seed: must be a whole number from 0 to 18446744073709551615 (got '-1')"),
                       (["--seed", "18446744073709551616"], "--seed: must be a whole number from 0 to"),
                       (["--threads", "0x2"], "--threads: must be a whole number in decimal")]:
        proc = run(1, "train", *SMALL, *args, "--out", os.path.join(work, "x.h5"))
        check(refused(proc, text) and os.listdir(work) == [], f"train {' '.join(args)}: refused ({our_lines(proc.stderr)})")
    decimal_out = os.path.join(work, "decimal.h5")
    proc = run(1, "train", *SMALL, "--steps", "010", "--warmup-steps", "1", "--quiet", "--out", decimal_out)
    steps = None
    if proc.returncode == 0:
        with h5py.File(decimal_out, "r") as f:
            steps = int(f.attrs["num_steps"])
        os.unlink(decimal_out)
    check(steps == 10, f"--steps 010 is ten steps ({steps})")
    # The smallest timeout still arms the watchdog (a hung rank ends the job), where it once rounded to off.
    proc = run(2, "train", *SMALL, "--steps", "4", "--fault", "hang", "--fault-step", "1", "--timeout-s", "1e-12",
               "--out", os.path.join(work, "hang.h5"), timeout=120)
    check(proc.returncode == 3 and "watchdog" in proc.stderr, f"--timeout-s 1e-12 arms the watchdog ({proc.returncode})")
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))
    # --force reuses a results folder; it cannot make one whose parent is missing, and says why.
    nowhere = os.path.join(work, "no", "such")
    proc = run(1, "suite", "lab", "--steps", "2", "--force", "--out-dir", nowhere)
    check(refused(proc, f"cannot create the results folder {nowhere}: No such file or directory") and
          os.listdir(work) == [], f"suite --force into a missing folder: refused with the reason ({our_lines(proc.stderr)})")

    # ---- --force replaces an output, never the file a command reads ------------------------------------------------
    read = os.path.join(work, "read.h5")
    check(run(1, "train", *SMALL, "--steps", "3", "--out", read).returncode == 0, "a run file to read")
    for args in (["timeline", read, "-o", read], ["predict", read, "--json", read], ["report", read, "--html", read]):
        proc = subprocess.run([ddplab, *args, "--force"], capture_output=True, text=True, timeout=60)
        with open(read, "rb") as f:
            hdf5 = f.read(8) == b"\x89HDF\r\n\x1a\n"
        check(refused(proc, f"output {read} is {read}, which this command reads") and hdf5,
              f"{args[0]} with its output on its input, --force: refused, the run file intact ({our_lines(proc.stderr)})")
    os.unlink(read)

    # ---- the output path, checked before the first step -------------------------------------------------------------
    # A run long enough that a check after training would time out: the refusal must come before it.
    long_run = [*SMALL, "--steps", "1000000"]
    for np_ranks in [1, 2]:
        for args, text in [(["--out", "/proc/x.h5"], "cannot write /proc/x.h5"),
                           (["--out", "/proc/x.h5", "--force"], "cannot write /proc/x.h5"),
                           (["--out", work], f"output path {work} is a folder"),
                           (["--out", work, "--force"], f"output path {work} is a folder"),
                           (["--checkpoint", "/proc/c.h5", "--out", os.path.join(work, "r.h5")],
                            "cannot write /proc/c.h5")]:
            proc = run(np_ranks, "train", *long_run, *args, timeout=60)
            check(refused(proc, text) and os.listdir(work) == [],
                  f"np={np_ranks} train {' '.join(args)}: refused before training in {proc.seconds:.2f} s "
                  f"(mpirun included), nothing left ({our_lines(proc.stderr)})")

    # ---- the files beside the run file: a snapshot (--flush-every) and train's page are replaced only with --force ----
    # A crashed run's snapshot may be all that is left of it; the page may be an earlier run's.
    snap_out = os.path.join(work, "s.h5")
    with open(snap_out + ".partial", "w") as f:
        f.write("an earlier run's snapshot")
    proc = run(1, "train", *long_run, "--flush-every", "2", "--out", snap_out, timeout=60)
    check(refused(proc, f"output file {snap_out}.partial already exists (pass --force to overwrite)") and
          sorted(os.listdir(work)) == ["s.h5.partial"], f"an existing snapshot is not replaced ({our_lines(proc.stderr)})")
    proc = run(1, "train", *SMALL, "--steps", "3", "--out", snap_out)  # no snapshot taken: the file is not ours
    check(proc.returncode == 0 and open(snap_out + ".partial").read() == "an earlier run's snapshot",
          "a run without snapshots leaves an existing .partial as it was")
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))
    proc = run(1, "train", *long_run, "--checkpoint", snap_out + ".partial", "--out", snap_out, timeout=60)
    check(refused(proc, "is the snapshot of --out") and os.listdir(work) == [],
          f"--checkpoint naming the run file's snapshot is refused ({our_lines(proc.stderr)})")
    page = os.path.join(work, "s.report.html")
    with open(page, "w") as f:
        f.write("an earlier page")
    proc = run(1, "train", *long_run, "--out", snap_out, timeout=60, env={"DDPLAB_TRAIN_PAGE": "on"})
    check(refused(proc, f"output file {page} already exists (pass --force to overwrite); it is the page") and
          os.listdir(work) == ["s.report.html"], f"an existing page is not replaced ({our_lines(proc.stderr)})")
    os.unlink(page)
    proc = run(1, "train", *long_run, "--checkpoint", page, "--out", snap_out, timeout=60,
               env={"DDPLAB_TRAIN_PAGE": "on"})
    check(refused(proc, f"--checkpoint {page} is the page train writes beside --out {snap_out}") and
          os.listdir(work) == [], f"--checkpoint naming train's page is refused ({our_lines(proc.stderr)})")
    # A run that stops early writes its page too, saying so: the page of the run its file replaced would remain.
    check(run(1, "train", *SMALL, "--steps", "4", "--out", snap_out, env={"DDPLAB_TRAIN_PAGE": "on"}).returncode == 0
          and os.path.isfile(page), "a complete run's page")
    proc = run(1, "train", *SMALL, "--steps", "6", "--fault", "nan", "--fault-step", "2", "--out", snap_out,
               "--force", env={"DDPLAB_TRAIN_PAGE": "on"})
    text = open(page).read() if os.path.isfile(page) else ""
    check(proc.returncode != 0 and f"page: {page}" in proc.stdout and "did not complete</b>" in text,
          f"a stopped run replaces the page beside its run file with its own (rc {proc.returncode}, "
          f"{[line for line in proc.stdout.splitlines() if line.startswith('page')]})")
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))

    # A check that reads one rank's own --out (against --checkpoint) refuses on every rank: that rank alone would
    # leave the others waiting in the next collective.
    ck = os.path.join(work, "ck.h5")
    ranks = [["-np", "1", ddplab, "train", *long_run, "--checkpoint", ck, "--out", out] for out in
             (os.path.join(work, "a.h5"), ck)]
    start = time.monotonic()
    proc = subprocess.run([mpirun, *ranks[0], ":", *ranks[1]], capture_output=True, text=True, timeout=60)
    check(refused(proc, "rank 1: --out and --checkpoint name the same file") and os.listdir(work) == [],
          f"rank 1's --out is its --checkpoint: every rank refuses, in {time.monotonic() - start:.2f} s "
          f"({our_lines(proc.stderr)})")

    # ---- settings that were accepted silently ---------------------------------------------------------------------
    for np_ranks in [1, 2]:
        proc = run(np_ranks, "train", *SMALL, "--steps", "2", "--slow-rank", "5", "--straggler-ms", "10")
        check(refused(proc, f"--slow-rank 5 is not a rank of this {np_ranks}-rank job"),
              f"np={np_ranks}: --slow-rank 5 refused like --fault-rank ({our_lines(proc.stderr)})")
    proc = run(1, "train", *SMALL, "--steps", "4", "--warmup-steps", "4")
    check(refused(proc, "--warmup-steps 4 leaves none of the 4 steps (--steps) to measure"),
          f"--warmup-steps >= --steps refused ({our_lines(proc.stderr)})")
    proc = run(1, "suite", "lab", "--steps", "3", "--warmup-steps", "3", "--out-dir", os.path.join(work, "s"))
    check(refused(proc, "--warmup-steps 3 leaves none") and os.listdir(work) == [],
          f"suite: --warmup-steps >= --steps refused ({our_lines(proc.stderr)})")
    out = os.path.join(work, "short.h5")
    proc = run(1, "train", *SMALL, "--steps", "2", "--out", out)  # the default warm-up (5) shrinks to fit
    check(proc.returncode == 0 and "steady state: steps 1..1 of 2" in proc.stdout,
          f"a 2-step run with the default warm-up measures its last step ({proc.stderr[-200:]})")
    os.unlink(out)
    proc = run(1, "train", *SMALL, "--steps", "2", "--link", "10gbe", "--link-gbps", "0")
    check(refused(proc, "--link-gbps must be positive (got 0)"), f"--link-gbps 0 refused ({our_lines(proc.stderr)})")
    proc = run(1, "train", *SMALL, "--steps", "2", "--link", "10gbe", "--link-gbps", "2.5", "--out", out)
    check(proc.returncode == 0 and "link 10gbe (10 us, 2.5 Gbit/s)" in proc.stdout,
          "the header shows the link as emulated, overrides applied")
    os.unlink(out)
    proc = run(1, "train", *SMALL, "--steps", "2", "--link-latency-us", "5", "--out", out)
    check(proc.returncode == 0 and "link custom (5 us, unlimited bandwidth)" in proc.stdout,
          "latency alone: the header names the link custom, its bandwidth unlimited")
    report = subprocess.run([ddplab, "report", out], capture_output=True, text=True, timeout=60)
    check("link custom (5 us, unlimited bandwidth)" in report.stdout,
          f"report names the emulated link as the header does ({report.stdout[:300]})")
    os.unlink(out)

    # ---- a resume on a host that resolves auto otherwise: the checkpoint's value, not a refusal ----------------------
    # Unbound, a lone rank with one BLAS thread has a spare core: the update runs in backward and --grad-slice-mb
    # auto is 1 MiB. Bound to one core it has none, and auto alone would be whole weights, another arithmetic.
    if (os.cpu_count() or 1) >= 2:
        ck, first, second = (os.path.join(work, n) for n in ("auto_ck.h5", "first.h5", "second.h5"))
        proc = run(1, "train", *SMALL, "--threads", "1", "--steps", "4", "--checkpoint", ck, "--out", first)
        saved = json.loads(h5py.File(ck, "r").attrs["config"]).get("grad_slice_mb") if proc.returncode == 0 else None
        resumed = subprocess.run([mpirun, "--bind-to", "core", "-np", "1", ddplab, "train", *SMALL, "--threads", "1",
                                  "--steps", "8", "--resume", ck, "--out", second], capture_output=True, text=True,
                                 timeout=120)
        stored = json.loads(h5py.File(second, "r").attrs["config"]).get("grad_slice_mb") \
            if resumed.returncode == 0 else None
        check(saved == 1 and resumed.returncode == 0 and stored == 1,
              f"resumed bound to one core, --grad-slice-mb auto takes the checkpoint's {saved} (stored {stored}; "
              f"{our_lines(resumed.stderr)})")
        for path in (ck, first, second):
            if os.path.exists(path):
                os.unlink(path)

    # ---- numbers a flag cannot mean: infinite, not a number, below an auto knob's range -----------------------------
    for args, text in [(["--lr", "inf"], "--lr must be a finite number (got inf)"),
                       (["--straggler-ms", "inf"], "--straggler-ms must be a finite number (got inf)"),
                       (["--link", "10gbe", "--link-gbps", "-5"], "--link-gbps: must not be negative"),
                       (["--link", "10gbe", "--link-latency-us", "-2"], "--link-latency-us: must not be negative"),
                       (["--link", "10gbe", "--link-gbps", "nan"], "--link-gbps: must be a finite number or auto"),
                       (["--threads", "0"], "--threads: must be at least 1")]:
        proc = run(1, "train", *SMALL, "--steps", "2", *args, "--out", out)
        check(refused(proc, text) and not os.path.exists(out), f"train {' '.join(args)} refused ({our_lines(proc.stderr)})")
    proc = run(1, "train", *SMALL, "--steps", "2", "--extra-allreduce-mb", "1e9", "--out", out)  # a petabyte
    check(proc.returncode != 0 and "out of memory: the run needs more than this host gives" in proc.stderr and
          "--extra-allreduce-mb" in proc.stderr, f"an allocation past the host's memory names it ({our_lines(proc.stderr)})")
    helped = run(1, "train", "--help").stdout
    check("{auto->" not in helped and "--threads N|auto=auto" in helped,
          "an auto knob's help shows auto, not its stand-in value")

print(f"usage checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
