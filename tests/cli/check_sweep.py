#!/usr/bin/python3
"""Runs `ddplab sweep` on a small model: one run file per grid point, a summary naming the best point, and the
overlap-off points with no hidden communication. The results folder's name holds quotes, a space and a `$(...)`:
the charts are drawn from an argument list, not through a shell.

usage: check_sweep.py MPIRUN DDPLAB NP
"""
import json
import os
import subprocess
import sys
import tempfile

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


mpirun, ddplab, np_ranks = sys.argv[1], sys.argv[2], sys.argv[3]
with tempfile.TemporaryDirectory() as work:
    out = os.path.join(work, "it's a \"sweep\" $(touch pwned)")
    cmd = [mpirun, "-np", np_ranks, ddplab, "sweep", "--bucket-mb", "0,0.01,100", "--overlap", "on,off",
           "--first-bucket-mb", "0", "--steps", "5", "--warmup-steps", "1", "--input-dim", "32", "--hidden", "64",
           "--classes", "10", "--batch", "8", "--link", "10gbe", "--out-dir", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(proc.stdout[-2000:])
    check(proc.returncode == 0, f"sweep exits 0 ({proc.returncode}: {proc.stderr.strip()[-300:]})")
    if proc.returncode == 0:
        names = sorted(os.listdir(out))
        want = sorted([f"bucket{b}_overlap_{o}.h5" for b in ["0", "0.01", "100"] for o in ["on", "off"]] +
                      ["summary.csv", "summary.json", "charts", "charts.log"])
        check(names == want, f"files {names}")
        s = json.load(open(os.path.join(out, "summary.json")))
        check(len(s["points"]) == 6, "6 grid points")
        for p in s["points"]:
            if p["overlap"] == "off":
                check(all(r["hidden_comm_ms"] == 0 for r in p["summary"]["ranks"]), f"{p['bucket_mb']}/off hides nothing")
        best = min(s["points"], key=lambda p: p["summary"]["slowest_step_ms"])
        check(s["best"] == {"bucket_mb": best["bucket_mb"], "overlap": best["overlap"]}, "best is the fastest point")
        check("best: --bucket-mb" in proc.stdout, "best setting printed")
        charts = os.listdir(os.path.join(out, "charts"))
        check("bucket_sweep.png" in charts and os.path.getsize(os.path.join(out, "charts", "bucket_sweep.png")) > 0,
              f"the bucket-sweep chart is drawn ({sorted(charts)[:4]}...)")
        check(not os.path.exists("pwned") and not os.path.exists(os.path.join(work, "pwned")),
              "nothing in the folder's name was run")
    bad = subprocess.run([mpirun, "-np", np_ranks, ddplab, "sweep", "--overlap", "maybe", "--out-dir",
                          os.path.join(work, "bad")], capture_output=True, text=True, timeout=60)
    check(bad.returncode == 2 and "--overlap takes on and/or off" in bad.stderr and not os.path.exists(
        os.path.join(work, "bad", "summary.json")), "a bad --overlap value is refused with exit code 2")
print(f"sweep checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
