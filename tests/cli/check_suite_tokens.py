#!/usr/bin/python3
"""Runs `ddplab suite tokens` on short sequences and checks the four cases and their token statistics.

usage: check_suite_tokens.py MPIRUN DDPLAB NP
"""
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from checks import check, failures  # tests/cli/checks.py: the assertion every CLI test shares


mpirun, ddplab, np_ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
with tempfile.TemporaryDirectory() as work:
    out = os.path.join(work, "tokens")
    cmd = [mpirun, "-np", str(np_ranks), ddplab, "suite", "tokens", "--steps", "5", "--warmup-steps", "1",
           "--min-len", "8", "--max-len", "32", "--batch", "4", "--max-tokens", "96", "--epoch-size", "400",
           "--out-dir", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(proc.stdout[-2500:])
    check(proc.returncode == 0, f"suite tokens exits 0 ({proc.returncode}: {proc.stderr.strip()[-300:]})")
    if proc.returncode == 0:
        s = json.load(open(os.path.join(out, "summary.json")))
        cases = {c["case"]: c["summary"] for c in s["cases"]}
        check(list(cases) == ["uniform", "variable", "bucket", "token"], f"the four cases ({list(cases)})")
        check("loss_identical" not in s, "the token suite makes no claim about the lab's cases' losses")
        check(cases["uniform"]["padding_ratio"] == 0, "uniform lengths: no padding")
        check(cases["variable"]["padding_ratio"] > 0.2, f"variable lengths with fixed count: padding "
              f"{cases['variable']['padding_ratio']:.2f}")
        check(cases["bucket"]["padding_ratio"] < cases["variable"]["padding_ratio"] / 2, "bucketing removes padding")
        check(cases["bucket"]["mean_token_spread"] < cases["variable"]["mean_token_spread"],
              "bucketing evens out tokens across ranks")
        page_path = os.path.join(out, "report.html")
        page = open(page_path).read() if os.path.isfile(page_path) else ""
        check("<th>vs_unif</th>" in page and "identical to the baseline" not in page,
              "the page compares useful tokens/s against uniform, and makes no claim of the lab's about the loss")
        with h5py.File(os.path.join(out, "token.h5")) as f:
            padded = f["steps/padded_tokens"][:]
            check(np.all(padded[f["steps/samples"][:] > 1] <= 96), "token budget respected in every rank batch")
            check(f["steps/useful_tokens"].attrs["units"] == "tokens", "token datasets carry their units")
        with h5py.File(os.path.join(out, "variable.h5")) as f:
            check(np.all(f["steps/samples"][:] == 4), "variable: a fixed sample count per rank")
            check(json.loads(f.attrs["config"])["model"] == "tiny", "the transformer ran (tiny preset)")
print(f"token suite checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
