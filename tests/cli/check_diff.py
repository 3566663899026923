#!/usr/bin/python3
"""`ddplab diff`, end to end on run files written by `ddplab train`: two runs of one setting differ by nothing beyond
the noise (at a step the scheduler cannot move by 2%), a bucket-size change is named as exposed communication, a straggler as its data loading; the losses the
same bit for bit where only time changed, and named from the first step where another learning rate moves them;
--json; bad input.

usage: check_diff.py MPIRUN DDPLAB
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import h5py

from checks import check, exit_code, failures, run_all, skip  # tests/cli/checks.py: the assertion every CLI test shares


def run(cmd, timeout=60):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def verdict(stdout):
    lines = [line for line in stdout.splitlines() if line.strip().startswith("verdict: ")]
    return lines[0].strip()[len("verdict: "):] if len(lines) == 1 else f"(no single verdict line in: {stdout[-500:]})"


# The phases a host's own speed moves: between two runs trained one after the other, a change of load on shared cores
# moves these by more than a setting does, and diff rightly calls it a difference.
COMPUTE = {"forward", "backward", "optimizer", "compute"}


def host_moved(diff_json):
    """The compute phases diff resolved apart, where those alone differ (else None): a host that changed speed."""
    apart = {m["name"] for m in diff_json["metrics"] if m["beyond_noise"]} - {"step"}
    return sorted(apart) if apart and apart <= COMPUTE else None


def expect_usage_error(proc, expected, what):
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ddplab:")]
    ok = proc.returncode == 2 and len(lines) == 1 and expected in lines[0] and proc.stdout == ""
    check(ok, f"{what}: exit 2, one line with '{expected}', nothing on stdout (got {proc.returncode}: "
              f"{proc.stderr.strip()[:300]})")


def main():
    mpirun, ddplab = sys.argv[1], sys.argv[2]
    # Six hidden layers, 33 MiB of gradients, over an emulated 1 Gbit/s link that takes ~280 ms to carry them: the
    # link is the bottleneck, so the step ends when the link has carried every bucket, and it ends earlier by as much
    # as the link starts earlier. At 25 MiB the first bucket closes ~3/4 through backward; at 5 MiB after one
    # layer, ~30 ms sooner here, which diff must name as exposed communication. The link sleeps rather than works,
    # so the ranks' compute on two cores stays out of it. The same setting run twice is the noise rule's test: the
    # small model's 0.03 ms step is below what a busy host's scheduler resolves (one run's ranks once took 0.16 ms a
    # step where the other's took 0.02, in every step), and that difference is real, just not the setting's.
    model = ["--layers", "6", "--link", "1gbe", "--warmup-steps", "2", "--steps", "12", "--quiet"]
    small = ["--hidden", "64", "--input-dim", "32", "--classes", "10", "--batch", "8", "--warmup-steps", "2",
             "--steps", "12", "--quiet"]
    with tempfile.TemporaryDirectory() as work:
        path = {name: os.path.join(work, name + ".h5")
                for name in ("same1", "b25", "b25_again", "b5", "strag", "lr", "one_rank")}
        trains = [
            [*model, "--bucket-mb", "25", "--out", path["b25"]],
            [*model, "--bucket-mb", "25", "--out", path["b25_again"]],
            [*model, "--bucket-mb", "5", "--out", path["b5"]],
            [*small, "--out", path["same1"]],
            # 40 ms: past what a loaded host scatters the steps by (a 10 ms straggler fell under diff's noise bound
            # of 12.6 ms beside two busy threads and a build).
            [*small, "--straggler-ms", "40", "--slow-rank", "1", "--out", path["strag"]],
            [*small, "--lr", "0.01", "--out", path["lr"]],
        ]
        # One rank with the two ranks' global batch (the small model's --batch 8, twice).
        one_rank = [*small, "--out", path["one_rank"]]
        one_rank[one_rank.index("--batch") + 1] = "16"
        # The same on variable-length sequences (below). These runs are compared by their losses alone, not their
        # times: they train side by side. The runs diff times train one at a time.
        lm = {"one": os.path.join(work, "lm_one.h5"), "two": os.path.join(work, "lm_two.h5")}
        lm_args = ["--model", "tiny", "--head", "lm", "--lengths", "uniform", "--min-len", "4", "--max-len", "48",
                   "--batch", "3", "--steps", "5", "--warmup-steps", "1", "--quiet"]
        lm_runs = ((1, "2", lm["one"]), (2, "1", lm["two"]))
        proc, *lm_trains = run_all([([mpirun, "-np", "1", ddplab, "train", *one_rank], dict(timeout=120))] +
                                   [([mpirun, "-np", str(ranks), ddplab, "train", *lm_args, "--grad-accum", accum,
                                      "--out", out], dict(timeout=120)) for ranks, accum, out in lm_runs])
        check(proc.returncode == 0, f"ddplab train at one rank, --batch 16 (rc {proc.returncode}: {proc.stderr[:300]})")
        for args in trains:
            proc = run([mpirun, "-np", "2", ddplab, "train", *args], timeout=120)
            check(proc.returncode == 0,
                  f"ddplab train {' '.join(args[-4:])} (rc {proc.returncode}: {proc.stderr[:300]})")
        if failures:
            return

        # Every diff, side by side: each reads its two files.
        diff = [ddplab, "diff"]
        missing, not_run = os.path.join(work, "missing.h5"), os.path.join(work, "notes.h5")
        with open(not_run, "w") as f:
            f.write("not a run file\n")
        commands = {
            "same setting": diff + [path["b25"], path["b25_again"]],
            "same setting json": diff + ["--json", path["b25"], path["b25_again"]],
            "same file": diff + [path["same1"], path["same1"]],
            "lr": diff + [path["same1"], path["lr"]],
            "buckets under mpirun": [mpirun, "-np", "2", *diff, path["b25"], path["b5"]],
            "buckets": diff + [path["b25"], path["b5"]],
            "buckets json": diff + ["--json", path["b25"], path["b5"]],
            "straggler": diff + [path["same1"], path["strag"]],
            "one rank json": diff + ["--json", path["one_rank"], path["same1"]],
            "lm json": diff + ["--json", lm["one"], lm["two"]],
            "missing": diff + [path["same1"], missing],
            "not a run": diff + [not_run, path["same1"]],
            "one file": diff + [path["same1"]],
        }
        diffs = dict(zip(commands, run_all([(argv, dict(timeout=60)) for argv in commands.values()])))

        proc = diffs["same setting"]
        print(proc.stdout)
        check(proc.returncode == 0, f"diff exits 0 ({proc.stderr.strip()[:300]})")
        check("config: the same" in proc.stdout, "two runs of one setting: the same config (out left aside)")
        moved = host_moved(json.loads(diffs["same setting json"].stdout))
        if not verdict(proc.stdout).startswith("no difference beyond noise") and moved:
            skip(f"two runs of one setting: no difference beyond noise (the host changed speed between them: only "
                 f"{', '.join(moved)} apart; {verdict(proc.stdout)})")
        else:
            check(verdict(proc.stdout).startswith("no difference beyond noise"),
                  f"two runs of one setting: no difference beyond noise ({verdict(proc.stdout)})")
        check("  loss: bit for bit the same on every rank, steps 0..11\n" in proc.stdout,
              "two runs of one setting: the same losses, bit for bit")
        proc = diffs["same file"]
        check(proc.returncode == 0 and verdict(proc.stdout).startswith("no difference beyond noise"),
              "the same file twice: no difference")
        # The first step runs before any update, so another learning rate moves the losses from step 1 on.
        proc = diffs["lr"]
        line = [l for l in proc.stdout.splitlines() if l.startswith("  loss: ")]
        check(len(line) == 1 and line[0].startswith("  loss: differ from step 1 (rank 0: A ") and
              line[0].endswith(" over steps 0..11"),
              f"another learning rate: the losses differ from step 1 on ({line})")

        proc = diffs["buckets under mpirun"]
        print(proc.stdout)
        text = verdict(proc.stdout)
        check(proc.stdout.count("verdict:") == 1, "diff under mpirun prints once")
        check("bucket_mb 25.0 -> 5.0" in text, f"25 -> 5 MiB buckets: the verdict names the setting ({text})")
        d = json.loads(diffs["buckets json"].stdout)
        step = d["metrics"][0]
        # Whatever the step's noise, the phase the setting moves is resolved: the link carries the smaller first
        # bucket ~30 ms sooner, and the exposed wait scatters by a ms or two (the compute on shared cores, which
        # blurs the whole step, happens outside it).
        exposed = next(m for m in d["metrics"] if m["name"] == "exposed comm")
        # Unless the exposed wait itself scatters by more than a third of the effect (a host busy with other work:
        # its bound reached ~20 ms beside two busy threads), when the honest answer is "not beyond noise". A
        # difference resolved the wrong way fails either way.
        exposed_bound = d["noise_rule"]["spreads"] * math.hypot(exposed["a"]["spread_ms"], exposed["b"]["spread_ms"])
        if not exposed["beyond_noise"] and exposed_bound > 10:
            skip(f"less exposed comm with 5 MiB buckets (on this host diff resolves the exposed wait only beyond "
                 f"{exposed_bound:.1f} ms: {exposed})")
        else:
            check(exposed["beyond_noise"] and exposed["delta_ms"] < -10,
                  f"25 -> 5 MiB buckets: diff resolves less exposed comm ({exposed})")
        # On a host busy with other work the step scatters by more than the bucket size's effect, and the honest
        # verdict is "no difference beyond noise": the effect is only required where the runs are quiet, or where diff
        # resolved a difference anyway (it must then be the right one).
        # The smallest difference diff can call beyond noise is its own rule's bound, k x sqrt(sA^2 + sB^2).
        bound = d["noise_rule"]["spreads"] * math.hypot(step["a"]["spread_ms"], step["b"]["spread_ms"])
        noise = bound / step["a"]["median_ms"]
        # The verdict names the phases that moved most, largest first: a host that changed speed between the two runs
        # can move compute by more than the setting moves the exposed wait (which the check above resolves on its own).
        compute_moved = any(m["beyond_noise"] for m in d["metrics"] if m["name"] in COMPUTE)
        faster_by_exposed = text.startswith("B is ") and " faster: exposed comm -" in text
        if noise > 0.05 and text.startswith("no difference beyond noise"):
            skip(f"the exposed-comm verdict (on this host diff can only resolve differences above "
                  f"{100 * noise:.0f}% of the step, more than the bucket size's effect; the verdict says: {text})")
        elif compute_moved and not faster_by_exposed:
            skip(f"the exposed-comm verdict (the host changed speed between the runs: compute moved beyond noise; "
                 f"the verdict says: {text})")
        else:
            check(faster_by_exposed, f"25 -> 5 MiB buckets: B is faster by its exposed communication ({text})")

        proc = diffs["straggler"]
        print(proc.stdout)
        text = verdict(proc.stdout)
        check(text.startswith("B is ") and " slower: data +" in text and "straggler_ms 0.0 -> 40.0" in text,
              f"a straggler: B is slower by its data loading, the straggler named ({text})")
        check("  loss: bit for bit the same on every rank" in proc.stdout,
              "a straggler moves time, not the losses: bit for bit the same")

        # DDP's equivalence from the run files: two ranks of 8 against one rank of 16, the same global batch, compared
        # on the mean over ranks; the sums' order differs, so within float rounding (accumulated over 12 steps).
        d = json.loads(diffs["one rank json"].stdout)["loss"]
        check(d["compared"] and d["rank_means"] and d["steps"] == 12 and d["max_relative"] < 1e-5,
              f"one rank against two with the same global batch: the mean losses within rounding ({d})")

        # The same on variable-length sequences, where the ranks' shards hold different numbers of predicted tokens:
        # one rank of two micro-batches against two ranks of one (the same batches), on the global-batch loss, each
        # rank's loss weighted by its terms.
        for (ranks, _, _), proc in zip(lm_runs, lm_trains):
            check(proc.returncode == 0, f"lm run at {ranks} rank(s) (rc {proc.returncode}: {proc.stderr[:300]})")
        if os.path.exists(lm["one"]) and os.path.exists(lm["two"]):
            d = json.loads(diffs["lm json"].stdout)["loss"]
            check(d["compared"] and d["rank_means"] and d["steps"] == 5 and d["max_relative"] < 1e-5,
                  f"variable lengths, one rank against two: the global-batch losses within rounding ({d})")
            with h5py.File(lm["two"]) as f:
                loss, terms = f["steps/loss"][:, -1], f["steps/loss_terms"][:, -1]
                final = json.loads(f.attrs["summary"])["final_loss"]
            weighted = float((loss * terms).sum() / terms.sum())
            check(terms[0] != terms[1] and math.isclose(final, weighted, rel_tol=1e-12) and
                  not math.isclose(final, float(loss.mean()), rel_tol=1e-6),
                  f"final_loss weighs the ranks by their loss terms {terms.tolist()}: {final} = {weighted}, "
                  f"not the plain mean {loss.mean()}")

        # ---- --json ----------------------------------------------------------------------------------------------
        proc = diffs["buckets json"]
        try:
            d = json.loads(proc.stdout)
        except ValueError as e:
            d = {}
            check(False, f"diff --json prints one JSON document ({e}: {proc.stdout[:300]})")
        if d:
            text = verdict(diffs["buckets"].stdout)
            check(d["verdict"] == text, "diff --json: the text's verdict")
            check([c["key"] for c in d["config_changes"]] == ["bucket_mb"] and d["config_changes"][0]["a"] == 25,
                  f"diff --json: the one setting that changed ({d['config_changes']})")
            # The noise rule, recomputed from the medians and spreads the JSON gives, for every metric and bucket.
            rule = d["noise_rule"]

            def beyond(a, b):
                diff = abs(b["median_ms"] - a["median_ms"])
                apart = (min(a["steps"], b["steps"]) >= rule["apart_samples"] and
                         (b["min_ms"] > a["max_ms"] or b["max_ms"] < a["min_ms"]))
                return diff > rule["floor_ms"] and (
                    diff > rule["spreads"] * math.hypot(a["spread_ms"], b["spread_ms"]) or apart)

            check(all(m["beyond_noise"] == beyond(m["a"], m["b"]) and
                      abs(m["delta_ms"] - (m["b"]["median_ms"] - m["a"]["median_ms"])) < 1e-9 for m in d["metrics"]),
                  "diff --json: each metric's difference and its call against the noise rule, recomputed")
            check(d["metrics"][0]["name"] == "step" and rule["spreads"] == 3 and
                  abs(rule["floor_ms"] - max(0.05, 0.02 * max(d["metrics"][0]["a"]["median_ms"],
                                                              d["metrics"][0]["b"]["median_ms"]))) < 1e-9,
                  f"diff --json: the step first, the floor 2% of the longer median step ({rule})")
            check(not d["same_buckets"] and not any(b["beyond_noise"] for b in d["buckets"]) and
                  d["buckets"][-1]["a"] is None,
                  "diff --json: buckets cut differently (fewer at 25 MiB) are listed, not compared")
            # Two ranks add their gradients in either order alike, whatever the buckets: the same losses.
            check(d["loss"]["compared"] and d["loss"]["bit_for_bit"] and d["loss"]["steps"] == 12 and
                  d["loss"]["first_difference"] is None,
                  f"diff --json: another bucket size, the same losses bit for bit ({d['loss']})")

        # ---- bad input -------------------------------------------------------------------------------------------
        expect_usage_error(diffs["missing"], "cannot read run file", "a missing file")
        expect_usage_error(diffs["not a run"], "cannot read run file", "not a run file")
        proc = diffs["one file"]
        check(proc.returncode == 2 and proc.stdout == "", f"one file: exit 2 ({proc.returncode}: {proc.stderr[:200]})")


if __name__ == "__main__":
    main()
    sys.exit(exit_code())
