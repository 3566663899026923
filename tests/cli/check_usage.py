#!/usr/bin/python3
"""What a user meets first: --version, a mistyped command, the help text, the flags suite and sweep offer, an
output path checked before training, and settings that must not be accepted silently.

Cases that do not depend on each other run side by side (checks.run_all), each writing into a folder of its own, so
that its "nothing written" is its own; the checks are made in order once a batch is done.

usage: check_usage.py MPIRUN DDPLAB OLD_OPENBLAS_SHIM
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import h5py

from checks import check, failures, run_all, start_all  # tests/cli/checks.py: the assertion every CLI test shares


mpirun, ddplab, old_openblas = sys.argv[1], sys.argv[2], sys.argv[3]
SMALL = ["--hidden", "32", "--input-dim", "16", "--classes", "10", "--batch", "4"]
cases_root = tempfile.TemporaryDirectory()


def job(np_ranks, *args, timeout=120, env=None, cwd=None):
    """`mpirun -np NP ddplab ARGS`, as checks.run_all takes it."""
    return [mpirun, "-np", str(np_ranks), ddplab, *args], dict(timeout=timeout, cwd=cwd,
                                                               env=None if env is None else {**os.environ, **env})


def run(np_ranks, *args, **keywords):
    return run_all([job(np_ranks, *args, **keywords)])[0]


def case_folder():
    """An empty folder of one case's own."""
    return tempfile.mkdtemp(dir=cases_root.name)


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
# An OpenBLAS older than the CPU names a family below it (Debian's 0.3.21 names an Emerald Rapids Xeon Prescott): the
# shim makes it do so here. ddplab measures the families of the CPU's own instruction set and runs the fastest; a
# fresh cache, so that the probe runs.
flags = set(re.search(r"^flags\s*:(.*)$", open("/proc/cpuinfo").read(), re.M).group(1).split())
avx2 = {"avx2", "fma"} <= flags
# Each devices run measures GEMM for seconds: they go on beside the cases below, and are checked at the end.
blas_runs = start_all(
    [job(1, "devices"), job(1, "devices", env={"OPENBLAS_CORETYPE": "Haswell"}),
     job(1, "devices", env={"DDPLAB_BLAS_AUTO": "off"}),
     job(1, "devices", env={"DDPLAB_BLAS_AUTO": ""}),  # empty is unset, as for every setting
     job(2, "--version")] +
    ([job(1, "devices", env={"LD_PRELOAD": old_openblas, "XDG_CACHE_HOME": case_folder()})] if avx2 else []), jobs=2)

# ---- a mistyped command, an unknown option, a refused --resume; the first half of a resume; progress; help ----------
typos = [("trian", "train"), ("swep", "sweep"), ("sutie", "suite"), ("reprot", "report")]
resume_cwd, resume_folder, progress_folder = case_folder(), case_folder(), case_folder()
ck = os.path.join(resume_folder, "ck.h5")
*mistyped, nowhere_near, stepz, twice, missing, first, progress, top, train_help, suite_help, sweep_help, pigeon = \
    run_all([job(1, typo, "--steps", "2") for typo, _ in typos] + [
        job(1, "xyzzyqq"),
        job(1, "train", "--stepz", "3"),
        job(1, "train", "--batching", "bucket", "--batching", "token"),
        job(1, "train", *SMALL, "--resume", "missing.h5", cwd=resume_cwd),
        job(1, "train", *SMALL, "--steps", "4", "--checkpoint", ck, "--out", os.path.join(resume_folder, "a.h5")),
        job(1, "train", "--steps", "200", "--threads", "1", "--out", os.path.join(progress_folder, "p.h5")),
        job(1, "--help"), job(1, "train", "--help"), job(1, "suite", "lab", "--help"), job(1, "sweep", "--help"),
        job(1, "train", *SMALL, "--comm", "pigeon")])
for (typo, meant), proc in zip(typos, mistyped):
    check(refused(proc, f"unknown command '{typo}' (did you mean '{meant}'?)"),
          f"ddplab {typo}: names the word and suggests {meant} ({our_lines(proc.stderr)})")
proc = nowhere_near
check(refused(proc, "unknown command 'xyzzyqq'; commands: train, suite, sweep, devices, report, timeline"),
      f"a word near no command lists the commands ({our_lines(proc.stderr)})")

# An unknown option: named in the order typed (CLI11 2.1 reverses them).
check(refused(stepz, "unknown option --stepz, followed by 3"), f"train --stepz 3 ({our_lines(stepz.stderr)})")
check(refused(twice, "--batching given more than once (it takes one value)"),
      f"a flag given twice ({our_lines(twice.stderr)})")

# A refused --resume leaves nothing behind, not even the runs/ folder made for the default run file.
check(refused(missing, "missing.h5") and os.listdir(resume_cwd) == [],
      f"--resume missing.h5: refused, nothing left in the folder ({our_lines(missing.stderr)}, "
      f"{os.listdir(resume_cwd)})")

# Resuming from a checkpoint and saving back to it needs no --force (the --out file still does).
again = run(1, "train", *SMALL, "--steps", "6", "--resume", ck, "--checkpoint", ck, "--out",
            os.path.join(resume_folder, "b.h5"))
with h5py.File(ck, "r") as f:
    step = int(f.attrs["step"])
check(first.returncode == 0 and again.returncode == 0 and "checkpoint: " + ck + " (a resume starts at step 6)"
      in again.stdout and step == 6, f"--resume ck --checkpoint ck replaces it ({our_lines(again.stderr)})")

# Progress: at most once a second, over the interval since the last line, with elapsed time and ETA.
lines = re.findall(r"^  step (\d+)/200  ([\d.]+) ms/step  (\d+) samples/s  loss [\d.]+ \(rank 0\)  "
                   r"elapsed (\d+) s, eta (\d+) s$", progress.stdout, re.M)
# Each line's samples/s is the batch (128) over its interval's mean step.
consistent = all(abs(int(rate) - 128 / (float(ms) / 1e3)) <= 0.02 * int(rate) + 1 for _, ms, rate, _, _ in lines)
check(progress.returncode == 0 and lines and consistent,
      f"progress lines: step, interval ms/step, samples/s, loss, elapsed, eta ({progress.stdout[:400]})")

# Help.
check("MLP or a transformer" in top.stdout, "train's description names the transformer too")
check("--version" in top.stdout, "--help lists --version")
check("global batch = batch x grad-accum x ranks" in train_help.stdout, "--batch help: batch x grad-accum x ranks")
for flag in ["--out", "--checkpoint", "--resume", "--fault"]:
    check(re.search(rf"^\s+{flag}(?![\w-])", train_help.stdout, re.M) is not None, f"train offers {flag}")
for command, proc in [(["suite", "lab"], suite_help), (["sweep"], sweep_help)]:
    offered = [flag for flag in ["--out", "--checkpoint", "--checkpoint-every", "--resume", "--fault", "--fault-rank",
                                 "--fault-step"] if re.search(rf"^\s+{flag}(?![\w-])", proc.stdout, re.M)]
    check(offered == [] and re.search(r"^\s+--out-dir\b", proc.stdout, re.M) is not None,
          f"{command[0]} --help offers none of the flags it would ignore ({offered})")
# What a suite does with train's flags where it differs: its autos, and the flags its cases set themselves.
for text in ["Open MPI's default one-core binding is lifted); in a suite auto is 1 (",
             "and auto is off); in a suite auto is off (",
             "suite lab refuses it (its input cases run 0, 2 and 4 loader threads)",
             "suite lab refuses it (its zero_stage1 case shards the update",
             "suite tokens refuses it (its cases run sample, bucket and token batching)"]:
    check(text in suite_help.stdout, f"suite --help: '{text}'")
check(refused(pigeon, "--comm must be ring, mpi, hier or nccl (got 'pigeon')"), "the --comm error lists nccl")

# ---- refusals before any work: each case in a folder of its own, which must stay empty ------------------------
cases = []  # (its folder, its run as checks.run_all takes it, whether the process refused as it must, what it checks)


def refusal(np_ranks, args, text, what, **keywords):
    """`ddplab ARGS` on NP ranks refused with `text`; args(work) builds ARGS around the case's folder."""
    work = case_folder()
    cases.append((work, job(np_ranks, *args(work), **keywords), lambda proc: refused(proc, text), what))


# Suite and sweep refuse the flags of a single run.
for command in [["suite", "lab"], ["sweep"]]:
    for flag, value in [("--out", "x.h5"), ("--checkpoint", "c.h5"), ("--resume", "c.h5"), ("--fault", None)]:
        refusal(1, lambda work, command=command, flag=flag, value=value:
                [*command, "--steps", "2", flag, os.path.join(work, value) if value else "nan",
                 "--out-dir", os.path.join(work, "suite")], flag, f"{command[0]} {flag} is refused, nothing written")

# What a suite's or a sweep's runs would refuse is refused before its folder is made, before the first case.
# (HUGE_PREFETCH: --prefetch + 1 batches of 4096 x 1024 floats, 2^55 bytes, past any host's memory.)
HUGE_PREFETCH = ["--hidden", "32", "--input-dim", "1024", "--classes", "10", "--batch", "4096", "--prefetch",
                 "2147483647"]
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
        (1, ["suite", "lab"], ["--last-bucket-mb", "4"],
         "--last-bucket-mb is not a flag of suite lab: its pytorch_layout case cuts PyTorch DDP's buckets"),
        (1, ["suite", "tokens"], ["--batching", "token"], "--batching is not a flag of suite tokens"),
        (1, ["suite", "tokens"], ["--straggler-ms", "5"], "--straggler-ms is not a flag of suite tokens"),
        (1, ["suite", "tokens"], ["--prefetch", "3"], "--prefetch is not a flag of suite tokens"),
        # suite lab runs no input cases for a transformer on the CPU: their flags would be taken and ignored
        (1, ["suite", "lab"], ["--model", "tiny", "--data-cost-ms", "1"],
         "--data-cost-ms is not read by suite lab with a transformer on the CPU"),
        (1, ["suite", "tokens"], ["--model", "mlp"], "suite tokens trains a transformer"),
        # A case's or a point's own settings, checked before the first runs: the base passes each of these.
        *[(np_ranks, ["suite", "lab"], [*HUGE_PREFETCH],
           "case input_threads2 of suite lab: --prefetch must be at most ") for np_ranks in (1, 2)],
        (1, ["suite", "tokens"], ["--min-len", "300"], "--max-len must be at least 300 (got 256)"),
        (2, ["sweep"], [*SMALL, "--bucket-mb", "1,1e13", "--overlap", "on"],
         "point --bucket-mb 1e+13 --overlap on: --bucket-mb must be at most 1e+12 (got 1e+13)"),
        (1, ["sweep"], [*SMALL, "--bucket-mb", "nan"], "--bucket-mb must be a finite number (got nan)")]:
    refusal(np_ranks, lambda work, command=command, args=args:
            [*command, "--steps", "2", *args, "--out-dir", os.path.join(work, "many")], text,
            f"np={np_ranks} {command[0]} {' '.join(args)}: refused, nothing written")
# An MPMD launch can hand ranks different options of the command itself: refused on every rank before any work,
# not a hang when one rank runs cases or points the other does not.
for first_args, second_args, text in [(["sweep", "--bucket-mb", "1,5"], ["sweep", "--bucket-mb", "1"],
                                       "ranks were started with different sweep options: --bucket-mb"),
                                      (["suite", "lab"], ["suite", "tokens"],
                                       "ranks were started with different suite options: suite")]:
    work = case_folder()
    common = ["--steps", "2", "--out-dir", os.path.join(work, "many")]
    cases.append((work, ([mpirun, "-np", "1", ddplab, *first_args, *common, ":", "-np", "1", ddplab, *second_args,
                          *common], dict(timeout=120)),
                  lambda proc, text=text: proc.returncode == 2 and text in proc.stderr,
                  f"{first_args[0]}: ranks given different options refuse alike"))
# Values past what a flag can hold: one line, exit 2, not an overflow later.
for args, text in [(["--extra-allreduce-mb", "1e300"], "--extra-allreduce-mb must be at most 1e+12"),
                   (["--grad-slice-mb", "1e14"], "--grad-slice-mb must be at most 1e+12"),
                   (["--timeout-s", "1e300"], "--timeout-s must be at most")]:
    refusal(1, lambda work, args=args: ["train", *SMALL, "--steps", "2", *args, "--out", os.path.join(work, "x.h5")],
            text, f"train {' '.join(args)}: refused")
# Whole numbers are decimal: CLI11 alone read 010 as octal (8 steps) and 0x10 as hex; out of range is refused, not
# clamped (--seed -1 was 2^64 - 1).
for args, text in [(["--steps", "0x10"], "--steps: must be a whole number in decimal (got '0x10')"),
                   (["--seed", "-1"], "--seed: must be a whole number from 0 to 18446744073709551615 (got '-1')"),
                   (["--seed", "18446744073709551616"], "--seed: must be a whole number from 0 to"),
                   (["--threads", "0x2"], "--threads: must be a whole number in decimal")]:
    refusal(1, lambda work, args=args: ["train", *SMALL, *args, "--out", os.path.join(work, "x.h5")], text,
            f"train {' '.join(args)}: refused")
# --force reuses a results folder; it cannot make one whose parent is missing, and says why.
work = case_folder()
nowhere = os.path.join(work, "no", "such")
cases.append((work, job(1, "suite", "lab", "--steps", "2", "--force", "--out-dir", nowhere),
              lambda proc, nowhere=nowhere:
              refused(proc, f"cannot create the results folder {nowhere}: No such file or directory"),
              "suite --force into a missing folder: refused with the reason"))
# The output path, checked before the first step: a run long enough that a check after training would time out, so
# the refusal must come before it.
long_run = [*SMALL, "--steps", "1000000"]
for np_ranks in [1, 2]:
    for args, text in [(lambda work: ["--out", "/proc/x.h5"], lambda work: "cannot write /proc/x.h5"),
                       (lambda work: ["--out", "/proc/x.h5", "--force"], lambda work: "cannot write /proc/x.h5"),
                       (lambda work: ["--out", work], lambda work: f"output path {work} is a folder"),
                       (lambda work: ["--out", work, "--force"], lambda work: f"output path {work} is a folder"),
                       (lambda work: ["--checkpoint", "/proc/c.h5", "--out", os.path.join(work, "r.h5")],
                        lambda work: "cannot write /proc/c.h5")]:
        work = case_folder()
        cases.append((work, job(np_ranks, "train", *long_run, *args(work), timeout=60),
                      lambda proc, expected=text(work): refused(proc, expected),
                      f"np={np_ranks} train {' '.join(args(work))}: refused before training"))
# --checkpoint naming the run file's snapshot, or the page train writes beside it.
work = case_folder()
snap_out = os.path.join(work, "s.h5")
cases.append((work, job(1, "train", *long_run, "--checkpoint", snap_out + ".partial", "--out", snap_out, timeout=60),
              lambda proc: refused(proc, "is the snapshot of --out"),
              "--checkpoint naming the run file's snapshot is refused"))
work = case_folder()
page_out, page = os.path.join(work, "s.h5"), os.path.join(work, "s.report.html")
cases.append((work, job(1, "train", *long_run, "--checkpoint", page, "--out", page_out, timeout=60,
                        env={"DDPLAB_TRAIN_PAGE": "on"}),
              lambda proc, text=f"--checkpoint {page} is the page train writes beside --out {page_out}":
              refused(proc, text),
              "--checkpoint naming train's page is refused"))
# A check that reads one rank's own --out (against --checkpoint) refuses on every rank: that rank alone would leave
# the others waiting in the next collective.
work = case_folder()
rank_ck = os.path.join(work, "ck.h5")
ranks = [["-np", "1", ddplab, "train", *long_run, "--checkpoint", rank_ck, "--out", out] for out in
         (os.path.join(work, "a.h5"), rank_ck)]
cases.append((work, ([mpirun, *ranks[0], ":", *ranks[1]], dict(timeout=60)),
              lambda proc: refused(proc, "rank 1: --out and --checkpoint name the same file"),
              "rank 1's --out is its --checkpoint: every rank refuses"))
# Settings that were accepted silently.
for np_ranks in [1, 2]:
    refusal(np_ranks, lambda work: ["train", *SMALL, "--steps", "2", "--slow-rank", "5", "--straggler-ms", "10"],
            f"--slow-rank 5 is not a rank of this {np_ranks}-rank job", f"np={np_ranks}: --slow-rank 5 refused like "
            "--fault-rank")
refusal(1, lambda work: ["train", *SMALL, "--steps", "4", "--warmup-steps", "4"],
        "--warmup-steps 4 leaves none of the 4 steps (--steps) to measure", "--warmup-steps >= --steps refused")
refusal(1, lambda work: ["suite", "lab", "--steps", "3", "--warmup-steps", "3", "--out-dir", os.path.join(work, "s")],
        "--warmup-steps 3 leaves none", "suite: --warmup-steps >= --steps refused")
refusal(1, lambda work: ["train", *SMALL, "--steps", "2", "--link", "10gbe", "--link-gbps", "0"],
        "--link-gbps: must be at least 1e-06 (got 0)", "--link-gbps 0 refused")
# Numbers a flag cannot mean: infinite, not a number, below an auto knob's range.
for args, text in [(["--lr", "inf"], "--lr must be a finite number (got inf)"),
                   (["--straggler-ms", "inf"], "--straggler-ms must be a finite number (got inf)"),
                   (["--link", "10gbe", "--link-gbps", "-5"], "--link-gbps: must be at least 1e-06 (got -5)"),
                   (["--link", "10gbe", "--link-latency-us", "-2"], "--link-latency-us: must not be negative"),
                   (["--link", "10gbe", "--link-gbps", "nan"], "--link-gbps: must be a finite number or auto"),
                   (["--threads", "0"], "--threads: must be at least 1")]:
    refusal(1, lambda work, args=args: ["train", *SMALL, "--steps", "2", *args, "--out", os.path.join(work, "x.h5")],
            text, f"train {' '.join(args)} refused")

for (work, _, ok, what), proc in zip(cases, run_all([case[1] for case in cases])):
    check(ok(proc) and os.listdir(work) == [],
          f"{what} ({proc.seconds:.2f} s, mpirun included; {proc.returncode}: {our_lines(proc.stderr)}; left: "
          f"{os.listdir(work)})")

# ---- runs that go on: decimal steps, the smallest timeout, --force on an input, snapshots and pages beside the run
# file, the emulated link's header, an allocation past the host's memory, auto in help --------------------------------
decimal_out = os.path.join(case_folder(), "decimal.h5")
hang_out = os.path.join(case_folder(), "hang.h5")
read = os.path.join(case_folder(), "read.h5")
# A crashed run's snapshot may be all that is left of it; the page may be an earlier run's.
snap_work = case_folder()
snap_out = os.path.join(snap_work, "s.h5")
with open(snap_out + ".partial", "w") as f:
    f.write("an earlier run's snapshot")
page_work = case_folder()
page_out, page = os.path.join(page_work, "s.h5"), os.path.join(page_work, "s.report.html")
with open(page, "w") as f:
    f.write("an earlier page")
stopped_work = case_folder()
stopped_out, stopped_page = os.path.join(stopped_work, "s.h5"), os.path.join(stopped_work, "s.report.html")
short = os.path.join(case_folder(), "short.h5")
emulated, latency = os.path.join(case_folder(), "emulated.h5"), os.path.join(case_folder(), "latency.h5")
petabyte = os.path.join(case_folder(), "petabyte.h5")
(decimal, hang, read_run, kept_snapshot, kept_page, complete, short_run, emulated_run, latency_run, oom,
 helped) = run_all([
     job(1, "train", *SMALL, "--steps", "010", "--warmup-steps", "1", "--quiet", "--out", decimal_out),
     # The smallest timeout still arms the watchdog (a hung rank ends the job), where it once rounded to off.
     job(2, "train", *SMALL, "--steps", "4", "--fault", "hang", "--fault-step", "1", "--timeout-s", "1e-12",
         "--out", hang_out),
     job(1, "train", *SMALL, "--steps", "3", "--out", read),
     job(1, "train", *long_run, "--flush-every", "2", "--out", snap_out, timeout=60),
     job(1, "train", *long_run, "--out", page_out, timeout=60, env={"DDPLAB_TRAIN_PAGE": "on"}),
     job(1, "train", *SMALL, "--steps", "4", "--out", stopped_out, env={"DDPLAB_TRAIN_PAGE": "on"}),
     job(1, "train", *SMALL, "--steps", "2", "--out", short),  # the default warm-up (5) shrinks to fit
     job(1, "train", *SMALL, "--steps", "2", "--link", "10gbe", "--link-gbps", "2.5", "--out", emulated),
     job(1, "train", *SMALL, "--steps", "2", "--link-latency-us", "5", "--out", latency),
     # A 3M x 3M hidden weight, 36 TB: refused before the model is built, naming the flags that size it
     job(1, "train", "--input-dim", "16", "--classes", "10", "--batch", "4", "--hidden", "3000000", "--layers", "2",
         "--steps", "2", "--out", petabyte),
     job(1, "train", "--help")])

steps = None
if decimal.returncode == 0:
    with h5py.File(decimal_out, "r") as f:
        steps = int(f.attrs["num_steps"])
check(steps == 10, f"--steps 010 is ten steps ({steps})")
check(hang.returncode == 3 and "watchdog" in hang.stderr, f"--timeout-s 1e-12 arms the watchdog ({hang.returncode})")

# --force replaces an output, never the file a command reads.
check(read_run.returncode == 0, "a run file to read")
commands = (["timeline", read, "-o", read], ["predict", read, "--json", read], ["report", read, "--html", read])
for args, proc in zip(commands, run_all([([ddplab, *args, "--force"], dict(timeout=60)) for args in commands])):
    with open(read, "rb") as f:
        hdf5 = f.read(8) == b"\x89HDF\r\n\x1a\n"
    check(refused(proc, f"output {read} is {read}, which this command reads") and hdf5,
          f"{args[0]} with its output on its input, --force: refused, the run file intact ({our_lines(proc.stderr)})")

# The files beside the run file: a snapshot (--flush-every) and train's page are replaced only with --force.
check(refused(kept_snapshot, f"output file {snap_out}.partial already exists (pass --force to overwrite)") and
      sorted(os.listdir(snap_work)) == ["s.h5.partial"],
      f"an existing snapshot is not replaced ({our_lines(kept_snapshot.stderr)})")
proc = run(1, "train", *SMALL, "--steps", "3", "--out", snap_out)  # no snapshot taken: the file is not ours
check(proc.returncode == 0 and open(snap_out + ".partial").read() == "an earlier run's snapshot",
      "a run without snapshots leaves an existing .partial as it was")
check(refused(kept_page, f"output file {page} already exists (pass --force to overwrite); it is the page") and
      os.listdir(page_work) == ["s.report.html"], f"an existing page is not replaced ({our_lines(kept_page.stderr)})")
# A run that stops early writes its page too, saying so: the page of the run its file replaced would remain.
check(complete.returncode == 0 and os.path.isfile(stopped_page), "a complete run's page")
proc = run(1, "train", *SMALL, "--steps", "6", "--fault", "nan", "--fault-step", "2", "--out", stopped_out, "--force",
           env={"DDPLAB_TRAIN_PAGE": "on"})
text = open(stopped_page).read() if os.path.isfile(stopped_page) else ""
check(proc.returncode != 0 and f"page: {stopped_page}" in proc.stdout and "did not complete</b>" in text,
      f"a stopped run replaces the page beside its run file with its own (rc {proc.returncode}, "
      f"{[line for line in proc.stdout.splitlines() if line.startswith('page')]})")

check(short_run.returncode == 0 and "steady state: steps 1..1 of 2 (1 warm-up step left out)" in short_run.stdout
      and "few measured steps: one hiccup decides the figures (--steps 10 or more measures 5)" in short_run.stdout,
      f"a 2-step run with the default warm-up measures its last step, and says it is few ({short_run.stdout[-400:]})")
check(emulated_run.returncode == 0 and "link 10gbe (10 us, 2.5 Gbit/s)" in emulated_run.stdout,
      "the header shows the link as emulated, overrides applied")
check(latency_run.returncode == 0 and "link custom (5 us, unlimited bandwidth)" in latency_run.stdout,
      "latency alone: the header names the link custom, its bandwidth unlimited")
report = subprocess.run([ddplab, "report", latency], capture_output=True, text=True, timeout=60)
check("link custom (5 us, unlimited bandwidth)" in report.stdout,
      f"report names the emulated link as the header does ({report.stdout[:300]})")

# ---- a resume on a host that resolves auto otherwise: the checkpoint's value, not a refusal ----------------------
# Unbound, a lone rank with one BLAS thread has a spare core: the update runs in backward and --grad-slice-mb
# auto is 1 MiB. Bound to one core it has none, and auto alone would be whole weights, another arithmetic.
if (os.cpu_count() or 1) >= 2:
    work = case_folder()
    auto_ck, first_out, second_out = (os.path.join(work, n) for n in ("auto_ck.h5", "first.h5", "second.h5"))
    proc = run(1, "train", *SMALL, "--threads", "1", "--steps", "4", "--checkpoint", auto_ck, "--out", first_out)
    saved = json.loads(h5py.File(auto_ck, "r").attrs["config"]).get("grad_slice_mb") if proc.returncode == 0 else None
    resumed = subprocess.run([mpirun, "--bind-to", "core", "-np", "1", ddplab, "train", *SMALL, "--threads", "1",
                              "--steps", "8", "--resume", auto_ck, "--out", second_out], capture_output=True, text=True,
                             timeout=120)
    stored = json.loads(h5py.File(second_out, "r").attrs["config"]).get("grad_slice_mb") \
        if resumed.returncode == 0 else None
    check(saved == 1 and resumed.returncode == 0 and stored == 1,
          f"resumed bound to one core, --grad-slice-mb auto takes the checkpoint's {saved} (stored {stored}; "
          f"{our_lines(resumed.stderr)})")

check(oom.returncode == 2 and "parameters, whose values and gradients take at least" in oom.stderr and
      "--hidden" in oom.stderr, f"a model past the host's memory is refused, naming its flags ({our_lines(oom.stderr)})")
check("{auto->" not in helped.stdout and "--threads N|auto=auto" in helped.stdout,
      "an auto knob's help shows auto, not its stand-in value")

# ---- devices: the version; the BLAS kernels named with the reason, OPENBLAS_CORETYPE, DDPLAB_BLAS_AUTO=off obeyed
devices, haswell, auto_off, auto_empty, version_np2, *old = blas_runs()
check(devices.stdout.splitlines()[:1] == [version.stdout.strip()], "devices starts with the same version line")


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
core, why, loaded = kernels_of(haswell)
check(core == loaded == "Haswell" and why == "OPENBLAS_CORETYPE=Haswell in the environment",
      f"a user's OPENBLAS_CORETYPE wins ({core}, {why})")
core, why, loaded = kernels_of(auto_off)
check(core == loaded and why == "OpenBLAS's own pick; DDPLAB_BLAS_AUTO=off",
      f"DDPLAB_BLAS_AUTO=off keeps OpenBLAS's pick ({core}, {why})")
# Empty is unset, as for every setting: the choice runs, as by default.
core_empty, why_empty, _ = kernels_of(auto_empty)
core_default, why_default, _ = kernels_of(devices)
check((core_empty, why_empty) == (core_default, why_default),
      f"DDPLAB_BLAS_AUTO= (empty) chooses as the default does ({core_empty}, {why_empty})")
if avx2:
    proc = old[0]
    core, why, loaded = kernels_of(proc)
    check(proc.returncode == 0 and core in {"Haswell", "Zen", "SkylakeX", "Cooperlake"} and core == loaded and
          why.startswith("probe: ") and why.endswith("; OpenBLAS detected Prescott"),
          f"an OpenBLAS that names Prescott on an AVX2 CPU: ddplab probes and runs a family of the CPU's ({core}, "
          f"{why}; loaded {loaded}, exit {proc.returncode} {proc.stderr[-300:]})")
else:
    print("skip: an OpenBLAS that names Prescott: this CPU has no AVX2+FMA, so nothing above OpenBLAS's pick to run")
check(version_np2.stdout.count("ddplab ") == 1, "--version on 2 ranks prints one line")

cases_root.cleanup()
print(f"usage checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
