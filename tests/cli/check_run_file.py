#!/usr/bin/python3
"""Runs `ddplab train` under mpirun and checks the run file against docs/RUN_FILE.md with h5py.

usage: check_run_file.py MPIRUN DDPLAB NP
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import h5py
import numpy as np

STEP_FIELDS = ["start_ms", "data_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms",
               "extra_comm_ms", "host_work_ms", "barrier_ms", "step_ms", "comm_ms", "hidden_comm_ms", "loss"]
PHASES = ["data_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms", "extra_comm_ms", "host_work_ms",
          "barrier_ms"]
ATTRS = ["schema_version", "command", "config", "command_line", "start_time_utc", "git_commit", "ddplab_version",
         "mpi_library", "hdf5_version", "blas", "blas_kernels", "cuda", "summary", "world_size", "num_steps"]

from checks import check, failures  # tests/cli/checks.py: the assertion every CLI test shares

# The page train writes beside its run file is checked on the first run, and drawn for the clipped run (its update
# chart); the other runs draw none: each page is seconds of matplotlib, and cli_report and cli_page check charts.py.
NO_PAGE = dict(os.environ, DDPLAB_TRAIN_PAGE="off")


def check_token_shards(mpirun, ddplab, np_ranks, work):
    """--data and --val-data: byte-level shards written by scripts/text_to_tokens.py, the transformer trained on one
    and validated on the other every 3 of 8 steps and after the last; the file, the header and the lines say so."""
    text = os.path.join(work, "text.txt")
    line = "The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n"
    with open(text, "w") as f:
        f.write(line * 60)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "text_to_tokens.py")
    train, val = os.path.join(work, "train.bin"), os.path.join(work, "val.bin")
    made = subprocess.run([sys.executable, script, text, "--out", train, "--val-out", val, "--val-share", "0.25"],
                          capture_output=True, text=True, timeout=60)
    check(made.returncode == 0, f"text_to_tokens.py writes the shards ({made.stderr.strip()[:200]})")
    # Bad input: one line, exit 2, and every file as it was.
    before = {name: open(os.path.join(work, name), "rb").read() for name in os.listdir(work)}
    for args, expected in [(["--out", train], f"output file {train} already exists (pass --force to overwrite)"),
                           (["--out", text, "--force"], f"output {text} is {text}, which this command reads"),
                           (["--out", os.path.join(work, "a.bin"), "--val-out", os.path.join(work, "a.bin")],
                            "--out and --val-out name the same file"),
                           (["--out", os.path.join(work, "nowhere", "a.bin")], "output folder"),
                           (["--out", os.path.join(work, "a.bin"), "--val-out", os.path.join(work, "b.bin"),
                             "--val-share", "1.5"], "--val-share must be between 0 and 1")]:
        bad = subprocess.run([sys.executable, script, text, *args], capture_output=True, text=True, timeout=60)
        check(bad.returncode == 2 and bad.stderr.count("\n") == 1 and expected in bad.stderr and
              {name: open(os.path.join(work, name), "rb").read() for name in os.listdir(work)} == before,
              f"text_to_tokens.py {' '.join(args[:2])}...: exit 2, one line naming '{expected}', nothing written "
              f"({bad.returncode}: {bad.stderr.strip()[-200:]})")
    with open(train, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        tokens = np.frombuffer(f.read(), dtype="<u2")
    size = 60 * len(line)
    check(header[0] == 20240520 and header[1] == 1 and header[2] == len(tokens) == size - int(size * 0.25),
          f"llm.c's header: magic, version 1, the count: the first 3/4 of the bytes ({header[:3]})")
    check(bytes(tokens[:9].astype(np.uint8)) == b"The quick", "one token per byte of the text")
    path = os.path.join(work, "tokens.h5")
    steps = 8
    run = subprocess.run([mpirun, "-np", str(np_ranks), ddplab, "train", "--model", "tiny", "--head", "lm", "--data",
                          train, "--val-data", val, "--val-every", "3", "--max-len", "32", "--batch", "4", "--steps",
                          str(steps), "--warmup-steps", "2", "--out", path], capture_output=True, text=True, timeout=120,
                         env=NO_PAGE)
    check(run.returncode == 0, f"train --data --val-data ({run.stderr.strip()[:300]})")
    if run.returncode != 0:
        return
    check(f"data {train} (" in run.stdout and f"validation loss on data {val} (" in run.stdout
          and "every 3 steps and after the last" in run.stdout, f"the header names both ({run.stdout[:400]!r})")
    check(run.stdout.count("  val loss ") == 2, "the progress line after steps 3 and 6 shows the validation loss")
    with h5py.File(path, "r") as f:
        val_loss = f["steps"]["val_loss"][:]
        summary = json.loads(f.attrs["summary"])
        config = json.loads(f.attrs["config"])
    validated = [s for s in range(steps) if not np.isnan(val_loss[0, s])]
    check(validated == [2, 5, 7], f"steps/val_loss after steps 2, 5 and 7 only, NaN elsewhere ({val_loss[0]})")
    check(np.array_equal(val_loss, val_loss[[0] * np_ranks], equal_nan=True), "the same on every rank")
    check(np.all(val_loss[0, validated] > 0) and val_loss[0, 7] < math.log(8192),
          f"positive, and below the uniform guess by the end ({val_loss[0, validated]})")
    check(summary["final_val_loss"] == val_loss[0, 7] and summary["final_val_step"] == 7,
          f"summary: the last validation ({summary['final_val_loss']}, step {summary['final_val_step']})")
    check(f"validation loss     {val_loss[0, 7]:.4f} after step 7 (--val-data)" in run.stdout, "the summary line")
    check(config["data"] == train and config["val_data"] == val and config["lengths"] == "fixed"
          and config["min_len"] == 32 and config["epoch_size"] == 0 and config["data_shards"].startswith("124 windows of 32 in 1 shard,"),
          f"config: the shards and their fingerprint, and the synthetic knobs as --data sets them ({config})")

    # A resume reads the same shards, wherever they now lie; a shard of another length is refused by its fingerprint.
    base = [mpirun, "-np", str(np_ranks), ddplab, "train", "--model", "tiny", "--head", "lm", "--max-len", "32",
            "--batch", "4", "--quiet"]
    checkpoint = os.path.join(work, "tokens_ck.h5")
    first = subprocess.run(base + ["--data", train, "--steps", "3", "--checkpoint", checkpoint, "--out",
                                   os.path.join(work, "first.h5")], capture_output=True, text=True, timeout=120,
                           env=NO_PAGE)
    os.makedirs(os.path.join(work, "moved"))
    moved, longer = os.path.join(work, "moved", "train.bin"), os.path.join(work, "longer.bin")
    with open(train, "rb") as f:
        shard = f.read()
    with open(moved, "wb") as f:
        f.write(shard)
    with open(longer, "wb") as f:  # one token more, the header's count with it
        f.write(struct.pack("<i", 20240520) + struct.pack("<i", 1) + struct.pack("<i", len(tokens) + 1) + shard[12:]
                + b"\x41\x00")
    resumed = subprocess.run(base + ["--data", moved, "--steps", "5", "--resume", checkpoint, "--out",
                                     os.path.join(work, "resumed.h5")], capture_output=True, text=True, timeout=120,
                             env=NO_PAGE)
    check(first.returncode == 0 and resumed.returncode == 0,
          f"a resume names the same shards from another folder ({first.stderr.strip()[:200]} {resumed.stderr.strip()[:200]})")
    other = subprocess.run(base + ["--data", os.path.join(work, "longer.bin"), "--steps", "5", "--resume", checkpoint,
                                   "--out", os.path.join(work, "other.h5")], capture_output=True, text=True, timeout=120,
                           env=NO_PAGE)
    check(other.returncode == 2 and "settings differ from the checkpoint's: data_shards (checkpoint \"124 windows"
          in other.stderr and not os.path.exists(os.path.join(work, "other.h5")),
          f"a shard of another length is refused by its fingerprint ({other.stderr.strip()[:300]})")
    for name in ("first.h5", "resumed.h5", "tokens_ck.h5"):
        if os.path.exists(os.path.join(work, name)):
            os.unlink(os.path.join(work, name))


def check_older_bucket_caps(mpirun, ddplab, np_ranks, work):
    """A checkpoint written before --last-bucket-mb, whose first_bucket_mb capped the bucket that closes backward:
    it resumes under today's name for that cap, and its old flag repeated is refused with the rename said."""
    base = [mpirun, "-np", str(np_ranks), ddplab, "train", "--input-dim", "32", "--hidden", "64", "--classes", "10",
            "--batch", "8", "--warmup-steps", "1", "--quiet"]
    checkpoint = os.path.join(work, "older_ck.h5")
    first = subprocess.run(base + ["--steps", "3", "--last-bucket-mb", "0.5", "--checkpoint", checkpoint, "--out",
                                   os.path.join(work, "older_first.h5")], capture_output=True, text=True,
                           timeout=120, env=NO_PAGE)
    check(first.returncode == 0, f"a run with a checkpoint ({first.stderr.strip()[:300]})")
    if first.returncode != 0:
        return
    with h5py.File(checkpoint, "r+") as f:  # as the version before wrote it
        config = json.loads(f.attrs["config"])
        config["first_bucket_mb"] = config.pop("last_bucket_mb")
        f.attrs["config"] = json.dumps(config)
    runs = {flag: subprocess.run(base + ["--steps", "5", flag, "0.5", "--resume", checkpoint, "--out",
                                         os.path.join(work, f"older{flag}.h5")], capture_output=True, text=True,
                                 timeout=120, env=NO_PAGE) for flag in ("--last-bucket-mb", "--first-bucket-mb")}
    check(runs["--last-bucket-mb"].returncode == 0,
          f"an older checkpoint resumes with its cap under today's name ({runs['--last-bucket-mb'].stderr[-300:]})")
    refused = runs["--first-bucket-mb"]
    check(refused.returncode == 2 and refused.stderr.count("ddplab: error:") == 1 and
          "(this checkpoint predates --last-bucket-mb: its --first-bucket-mb 0.5 is --last-bucket-mb 0.5 now)"
          in refused.stderr, f"its old flag repeated: refused, the rename said ({refused.stderr.strip()[-400:]})")
    for name in ("older_ck.h5", "older_first.h5", "older--last-bucket-mb.h5", "older--first-bucket-mb.h5"):
        if os.path.exists(os.path.join(work, name)):
            os.unlink(os.path.join(work, name))


def check_resume_rounding_note(mpirun, ddplab, np_ranks, work):
    """A checkpoint records the BLAS kernel family its run ran; a resume whose kernels or BLAS threads differ says
    its GEMMs may round otherwise and what matches them, and one on the same says nothing."""
    base = [mpirun, "-np", str(np_ranks), ddplab, "train", "--input-dim", "32", "--hidden", "64", "--classes", "10",
            "--batch", "8", "--warmup-steps", "1"]
    checkpoint = os.path.join(work, "rounding_ck.h5")
    first = subprocess.run(base + ["--steps", "3", "--threads", "1", "--checkpoint", checkpoint, "--quiet", "--out",
                                   os.path.join(work, "rounding_first.h5")], capture_output=True, text=True,
                           timeout=120, env=NO_PAGE)
    check(first.returncode == 0, f"a run with a checkpoint ({first.stderr.strip()[:300]})")
    if first.returncode != 0:
        return
    with h5py.File(os.path.join(work, "rounding_first.h5"), "r") as f:
        kernels = f.attrs["blas_kernels"]
    with h5py.File(checkpoint, "r") as f:
        config = json.loads(f.attrs["config"])
    check(kernels.split(" ")[0] == config.get("blas_kernels") and config.get("threads") == 1,
          f"the checkpoint records the kernels its run ran ({config.get('blas_kernels')} of '{kernels}') and its "
          f"threads ({config.get('threads')})")

    def resumed(name, *flags):
        return subprocess.run(base + ["--steps", "4", "--resume", checkpoint, "--out", os.path.join(work, name)] +
                              list(flags), capture_output=True, text=True, timeout=120, env=NO_PAGE)

    def note(run):  # the header's line on rounding, "" where there is none
        lines = [l.strip() for l in run.stdout.splitlines() if "the GEMMs may round unlike the uninterrupted" in l]
        return lines[0] if lines else ""

    same, more_threads = resumed("rounding_same.h5", "--threads", "1"), resumed("rounding_threads.h5", "--threads", "2")
    with h5py.File(checkpoint, "r+") as f:  # as a run on another CPU would have written it
        config["blas_kernels"] = "Prescott"
        f.attrs["config"] = json.dumps(config)
    other_kernels = resumed("rounding_kernels.h5", "--threads", "1")
    check(same.returncode == 0 and "resumed from" in same.stdout and not note(same),
          f"a resume on the same kernels and threads says nothing of rounding ({note(same)})")
    check(more_threads.returncode == 0 and note(more_threads).startswith("its run had 1 BLAS thread a rank") and
          note(more_threads).endswith("(--threads 1 matches it)"),
          f"a resume on 2 BLAS threads names the checkpoint's 1 ({note(more_threads)})")
    check(other_kernels.returncode == 0 and "and Prescott's kernels" in note(other_kernels) and
          note(other_kernels).endswith("(OPENBLAS_CORETYPE=Prescott matches it)"),
          f"a resume on other kernels names the checkpoint's ({note(other_kernels)})")
    for name in ("rounding_ck.h5", "rounding_first.h5", "rounding_same.h5", "rounding_threads.h5",
                 "rounding_kernels.h5"):
        if os.path.exists(os.path.join(work, name)):
            os.unlink(os.path.join(work, name))


def main():
    mpirun, ddplab, np_ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    steps, batch = 8, 16
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "run.h5")
        # 64-128-128-10: parameters of 32768, 512, 65536, 512, 5120, 40 bytes. Caps of 0.05 MiB (52429 bytes):
        # closing bucket fc0.weight+fc0.bias (33280), then from the end fc2.bias..fc1.bias (5672) | fc1.weight.
        cmd = [mpirun, "-np", str(np_ranks), ddplab, "train", "--steps", str(steps), "--batch", str(batch),
               "--warmup-steps", "2", "--input-dim", "64", "--hidden", "128", "--classes", "10",
               "--bucket-mb", "0.05", "--last-bucket-mb", "0.05", "--out", path]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        print(proc.stdout)
        check(proc.returncode == 0, f"ddplab train exits 0 (got {proc.returncode}: {proc.stderr.strip()[:300]})")
        check(f"run file: {path}" in proc.stdout, "summary names the run file")
        check("global throughput" in proc.stdout and "slowest rank" in proc.stdout, "summary printed on rank 0")
        page = os.path.join(work, "run.report.html")
        check(f"page: {page}" in proc.stdout, "train names its page")
        check(sorted(os.listdir(work)) == ["run.h5", "run.report.html"],
              f"only the run file and its page are left ({os.listdir(work)})")
        if proc.returncode != 0:
            return

        # --threads auto (the default): without mpirun and unbound, a rank gets every core it may use; the config
        # stores the number, the header says it.
        if np_ranks == 1:
            auto_path = os.path.join(work, "auto.h5")
            alone = subprocess.run(cmd[cmd.index(ddplab):cmd.index("--out") + 1] + [auto_path], capture_output=True,
                                   text=True, timeout=120, env=NO_PAGE)
            cores = len(os.sched_getaffinity(0))
            check(alone.returncode == 0 and f"{cores} BLAS thread" in alone.stdout,
                  f"--threads auto: {cores} BLAS thread(s) in the header of a run without mpirun")
            if alone.returncode == 0:
                with h5py.File(auto_path, "r") as f:
                    threads = json.loads(f.attrs["config"])["threads"]
                    check(threads == cores, f"--threads auto stored as {cores} (got {threads})")
                os.unlink(auto_path)
            # A reader that stops early (`ddplab train | head -1`): the run and its page are still written, and
            # the run exits 0; a SIGPIPE at the summary killed it before its page.
            piped_path = os.path.join(work, "piped.h5")
            piped = subprocess.Popen(cmd[cmd.index(ddplab):cmd.index("--out") + 1] + [piped_path],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            piped.stdout.close()
            piped_rc = piped.wait(timeout=120)
            piped_files = sorted(n for n in os.listdir(work) if n.startswith("piped."))
            check(piped_rc == 0 and piped_files == ["piped.h5", "piped.report.html"],
                  f"standard output closed at once: exit 0 with the run and its page written "
                  f"(got {piped_rc}, {piped_files}: {piped.stderr.read().decode()[:300]!r})")
            for name in piped_files:
                os.unlink(os.path.join(work, name))
            # Under mpirun: Open MPI binds a job of 1 or 2 ranks to one core each unless told otherwise. --threads
            # auto lifts that default (a lone rank gets every core, as under torchrun); an explicit --bind-to core
            # is kept.
            if cores >= 2:
                probe = subprocess.run([mpirun, "-np", "1", sys.executable, "-c",
                                        "import os; print(len(os.sched_getaffinity(0)))"],
                                       capture_output=True, text=True, timeout=60)
                check(probe.returncode == 0 and probe.stdout.split(), f"mpirun -np 1 runs a probe ({probe.stderr[-200:]})")
                bound_by_default = probe.returncode == 0 and int((probe.stdout.split() or ["0"])[-1]) < cores
                for bind, threads, lifted in [([], cores, bound_by_default), (["--bind-to", "core"], 1, False)]:
                    mpi_auto = subprocess.run([mpirun, "-np", "1"] + bind + cmd[cmd.index(ddplab):cmd.index("--out") + 1]
                                              + [auto_path], capture_output=True, text=True, timeout=120, env=NO_PAGE)
                    what = f"mpirun -np 1 {' '.join(bind)}".strip()
                    check(mpi_auto.returncode == 0 and f", {threads} BLAS thread" in mpi_auto.stdout,
                          f"--threads auto under {what}: {threads} BLAS thread(s) in the header")
                    check(("Open MPI's default binding (" in mpi_auto.stdout) == lifted,
                          f"under {what} the header {'says' if lifted else 'does not say'} the binding was lifted")
                    if os.path.exists(auto_path):
                        os.unlink(auto_path)

        # DDPLAB_COMM_TRANSPORT=mpi turns the table's shm entry away: the header and the file name MPI, and why.
        mpi_path = os.path.join(work, "mpi.h5")
        env = dict(NO_PAGE, DDPLAB_COMM_TRANSPORT="mpi")
        mpi_cmd = cmd[:cmd.index("--out") + 1] + [mpi_path]
        mpi = subprocess.run(mpi_cmd, capture_output=True, text=True, timeout=120, env=env)
        check(mpi.returncode == 0 and "comm ring over mpi (" in mpi.stdout, "DDPLAB_COMM_TRANSPORT=mpi: the ring over mpi")
        if mpi.returncode == 0:
            with h5py.File(mpi_path, "r") as f:
                want = "mpi (shm: DDPLAB_COMM_TRANSPORT=mpi)"
                check(f.attrs.get("transport") == want, f"transport attribute {want!r} (got {f.attrs.get('transport')!r})")
            os.unlink(mpi_path)

        # --grad-clip: the header says the cap; each step's norm is in the file, the same on every rank, and the
        # summary counts the steps it clipped; the progress line shows it. Without it the norms are 0.
        clip_path = os.path.join(work, "clip.h5")
        clip = subprocess.run(cmd[:cmd.index("--out")] + ["--grad-clip", "0.05", "--log-every", "4", "--lr-warmup", "2",
                                                          "--lr-schedule", "cosine", "--out", clip_path],
                              capture_output=True, text=True, timeout=120)
        check(clip.returncode == 0 and "gradient norm clipped at 0.05" in clip.stdout and "grad norm " in clip.stdout,
              f"--grad-clip 0.05: the header and progress lines say it ({clip.stderr.strip()[:200]})")
        if clip.returncode == 0:
            with h5py.File(clip_path, "r") as f:
                norms = f["steps"]["grad_norm"][:]
                summary = json.loads(f.attrs["summary"])
                check(norms.shape == (np_ranks, steps) and f["steps"]["grad_norm"].attrs.get("units") == "L2 norm",
                      f"steps/grad_norm: shape {norms.shape}, units 'L2 norm'")
                check(np.all(norms > 0) and np.all(norms == norms[0]), f"every rank the same positive norm ({norms})")
                clipped = int(np.sum(norms[0] > 0.05))
                check(summary["clipped_steps"] == clipped and summary["final_grad_norm"] == norms[0, -1],
                      f"summary: {clipped} clipped steps, the last norm (got {summary['clipped_steps']}, "
                      f"{summary['final_grad_norm']})")
                check(f"clipped to 0.05 in {clipped} of {steps} steps" in clip.stdout, "the summary line counts them")
                # --lr-warmup 2 --lr-schedule cosine over --lr 1e-3: llm.c's schedule, step by step, on every rank.
                lr = f["steps"]["lr"][:]
                want = [1e-3 * (s + 1) / 2 if s < 2 else 1e-3 * 0.5 * (1 + math.cos(math.pi * (s - 2) / (steps - 2)))
                        for s in range(steps)]
                check(np.allclose(lr, [want] * np_ranks, rtol=1e-6, atol=0),
                      f"steps/lr follows the schedule ({lr[0]} against {want})")
                printed = f"  lr {lr[0][3]:.3g}  "  # --log-every 4: the line after step index 3
                check(", lr 0.001 over 2 warm-up steps, then cosine to 0" in clip.stdout and printed in clip.stdout,
                      f"the header says the schedule, the progress line the rate ({printed.strip()!r})")
            for name in ("clip.h5", "clip.report.html"):
                os.unlink(os.path.join(work, name))
        # A warm-up longer than the run: the header says where the rate ends, not a cosine the run never reaches.
        long_path = os.path.join(work, "long.h5")
        long = subprocess.run(cmd[cmd.index(ddplab):cmd.index("--out")] + ["--lr-warmup", str(steps + 2),
                                                                           "--lr-schedule", "cosine", "--out", long_path],
                              capture_output=True, text=True, timeout=120, env=NO_PAGE)
        ends = f"{1e-3 * steps / (steps + 2):g}"
        check(long.returncode == 0 and f"over {steps + 2} warm-up steps (longer than the run: it ends at {ends})"
              in long.stdout and "cosine" not in long.stdout.splitlines()[0],
              f"a warm-up longer than the run: the header says where the rate ends ({long.stdout[:300]!r})")
        if os.path.exists(long_path):
            os.unlink(long_path)

        check_token_shards(mpirun, ddplab, np_ranks, work)
        check_older_bucket_caps(mpirun, ddplab, np_ranks, work)
        check_resume_rounding_note(mpirun, ddplab, np_ranks, work)

        with h5py.File(path, "r") as f:
            check(np.all(f["steps"]["grad_norm"][:] == 0), "no norm taken without --grad-clip")
            check(np.all(np.isnan(f["steps"]["val_loss"][:])), "no validation loss without --val-data")
            check(np.all(f["steps"]["lr"][:] == np.float32(1e-3)), "no schedule: every step at --lr")
            for a in ATTRS:
                check(a in f.attrs, f"attribute {a}")
            check(f.attrs["schema_version"] == 3, "schema_version 3")
            check(f.attrs.get("gemm_algorithms") == "", "gemm_algorithms empty on the CPU (cuBLASLt's choice on the GPU)")
            check(f.attrs.get("attention_graphs") == "", "attention_graphs empty on the CPU (cuDNN's builds on the GPU)")
            check(f.attrs["world_size"] == np_ranks, "world_size matches mpirun -np")
            check(f.attrs["num_steps"] == steps, "num_steps matches --steps")
            config = json.loads(f.attrs["config"])
            check(config["batch"] == batch and config["steps"] == steps and config["hidden"] == 128
                  and "hidden_dim" not in config, "config JSON holds the flags, keyed by their names")
            check(len(f["hostnames"]) == np_ranks and all(h for h in f["hostnames"].asstr()[:]), "hostnames by rank")
            check("gpus" not in f, "no gpus dataset in a CPU run")
            check(str(f.attrs["start_time_utc"]).endswith("Z"), "start time in UTC ISO 8601")
            # One node: the ring's messages go through shared memory, and the header and the file say so.
            # With a peer, the gradients are registered: single copy (comm/shm_transport.h), and with every rank on
            # one host they take the direct all-reduce.
            shm = "shm" if np_ranks == 1 else "shm single-copy + direct collectives"
            check(f.attrs.get("transport") == shm, f"transport attribute '{shm}' (got {f.attrs.get('transport')!r})")
            check(f"comm ring over {shm} (" in proc.stdout, "the header names the transport")

            d = {k: f["steps"][k][:] for k in STEP_FIELDS}
            for k in STEP_FIELDS:
                check(d[k].shape == (np_ranks, steps), f"steps/{k} shape {d[k].shape}")
                check(np.all(np.isfinite(d[k])), f"steps/{k} finite")
            for k in STEP_FIELDS[1:-1]:
                check(np.all(d[k] >= 0), f"steps/{k} non-negative")
            phases = sum(d[k] for k in PHASES)
            check(np.allclose(phases, d["step_ms"], rtol=1e-6, atol=1e-3), "phases add up to step_ms")
            for k in ("extra_comm_ms", "host_work_ms", "barrier_ms"):  # this run has no lab knob
                check(np.all(d[k] == 0), f"steps/{k}: exactly 0 in a run without its lab knob ({d[k].max()})")
            check(np.all(d["hidden_comm_ms"] <= d["comm_ms"] + 1e-9), "hidden comm <= comm")
            # What the host took (runtime/cpu_taken.h): ms, or -1 where this kernel does not count it. With more ranks
            # than cores, every rank's compute thread must have waited for a CPU.
            for k in ["steal_ms", "cpu_wait_ms"]:
                taken = f["steps"][k][:]
                check(taken.shape == (np_ranks, steps) and f["steps"][k].attrs.get("units") == "ms",
                      f"steps/{k}: shape {taken.shape}, units ms")
                check(np.all((taken >= 0) | (taken == -1)), f"steps/{k}: ms or -1 (not counted)")
            wait = f["steps"]["cpu_wait_ms"][:]
            if np_ranks > (os.cpu_count() or 1) and np.all(wait >= 0):
                check(np.all(wait.sum(axis=1) > 0), f"{np_ranks} ranks on {os.cpu_count()} cores: every rank waited "
                      f"for a CPU (cpu_wait_ms per rank {wait.sum(axis=1)})")

            b = f["buckets"]
            nb = len(b["count"])
            check(nb == 3, f"3 buckets for caps of 0.05 MiB (got {nb})")
            check(list(b["first_piece"][:]) == [0, 3, 4] and list(b["last_piece"][:]) == [2, 3, 5],
                  f"bucket spans in ready order ({list(b['first_piece'][:])}..{list(b['last_piece'][:])})")
            # The buckets span the gradient buffer: every parameter once, each starting on a 16-float boundary
            # (model/mlp.h), so at most 15 floats of gap before each of the 5 after the first.
            params = 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10
            check(params <= int(b["count"][:].sum()) <= params + 15 * 5, "buckets cover every parameter once")
            check(np.all(b["bytes"][:] == 4 * b["count"][:]), "bucket bytes = 4 x count")
            names = list(b["param_names"].asstr()[:])
            check(names == ["fc2.bias,fc2.weight,fc1.bias", "fc1.weight", "fc0.bias,fc0.weight"],
                  f"bucket contents {names}")
            ready, start, end = (b[k][:] for k in ["ready_ms", "comm_start_ms", "comm_end_ms"])
            for name, arr in [("ready_ms", ready), ("comm_start_ms", start), ("comm_end_ms", end)]:
                check(arr.shape == (np_ranks, steps, nb), f"buckets/{name} shape {arr.shape}")
            check(np.all(ready <= start) and np.all(start <= end), "bucket ready <= comm start <= comm end")
            step_begin = d["start_ms"][:, :, None]
            step_end = (d["start_ms"] + d["data_ms"] + d["forward_ms"] + d["backward_ms"] + d["exposed_comm_ms"])[:, :, None]
            check(np.all(ready >= step_begin) and np.all(end <= step_end + 1e-3), "bucket times inside their step")
            comm_sum = (end - start).sum(axis=2)
            check(np.allclose(comm_sum, d["comm_ms"], rtol=1e-9, atol=1e-9), "steps/comm_ms = sum of bucket times")
            check(np.all(np.diff(d["start_ms"], axis=1) >= d["step_ms"][:, :-1] - 1e-3),
                  "steps start after the previous one ended")
            check(np.all(d["start_ms"][:, 0] >= 0) and np.all(d["start_ms"][:, 0] < 5000), "first step starts near t0")
            check(np.all(d["loss"] > 0) and d["loss"][:, 0].mean() > math.log(10) * 0.5, "loss is a sane cross-entropy")
            check(d["loss"][:, -1].mean() < d["loss"][:, 0].mean(), "loss goes down")

            s = json.loads(f.attrs["summary"])
            # Counts are stored as integers, and their steady means are whole when every step counts the same.
            check(f["steps"]["samples"].dtype.kind == "i" and f["steps"]["skipped"].dtype.kind == "i",
                  "counts stored as integers (steps/samples, steps/skipped)")
            check(all(rank["samples"] == batch for rank in s["ranks"]),
                  f"summary: samples per step exactly {batch} ({[rank['samples'] for rank in s['ranks']]})")
            step_means = d["step_ms"][:, 2:].mean(axis=1)
            check(s["slowest_rank"] == int(np.argmax(step_means)), "summary: slowest rank")
            check(math.isclose(s["slowest_step_ms"], step_means.max(), rel_tol=1e-9), "summary: slowest mean step")
            check(math.isclose(s["samples_per_s"], batch * np_ranks / (step_means.max() / 1e3), rel_tol=1e-9),
                  "summary: global samples/s")
            spread = (d["step_ms"][:, 2:].max(axis=0) - d["step_ms"][:, 2:].min(axis=0)).mean()
            check(math.isclose(s["mean_spread_ms"], spread, rel_tol=1e-9, abs_tol=1e-12), "summary: rank spread")


main()
print(f"run file checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
