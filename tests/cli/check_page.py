#!/usr/bin/python3
"""The run as one page, opened in a real headless browser (Debian's chromium): a tiny suite's report.html and a
`ddplab report --html` page render with no console message, their screenshots are not blank, and their DOM holds one
table row per case and every chart, embedded, with nothing fetched from anywhere. Skips (exit 77) with the reason
when chromium is missing.

usage: check_page.py MPIRUN DDPLAB
"""
import html
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser

import matplotlib.image
import numpy as np

from checks import check, failures  # tests/cli/checks.py: the assertion every CLI test shares

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Dom(HTMLParser):
    """What the check needs of a page: the table's case rows (first cell), the embedded charts (alt, source) and every
    address the page would load."""

    def __init__(self, text):
        super().__init__()
        self.rows, self.charts, self.loads = [], {}, []
        self._in_row, self._cell, self._first = False, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and a.get("class") == "case":
            self._in_row, self._first = True, None
        elif tag == "td" and self._in_row and self._first is None:
            self._cell = ""
        elif tag == "img":
            self.charts[a.get("alt")] = a.get("src", "")
        for key in ("src", "href"):
            if key in a and not a[key].startswith(("data:", "#")):
                self.loads.append(a[key])

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._first, self._cell = self._cell.strip(), None
            self.rows.append(self._first)
        elif tag == "tr":
            self._in_row = False


def browse(page, work, *flags):
    """chromium --headless on a file with --dump-dom or --screenshot (without either it stays open); returns (stdout,
    its console lines)."""
    profile = tempfile.mkdtemp(dir=work)  # a fresh profile: nothing from another run, nothing left in $HOME
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *flags,
                           "file://" + os.path.abspath(page)], capture_output=True, text=True, timeout=180)
    return proc.stdout, [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


def check_page(page, work, cases, charts, what):
    """One page: rendered without console messages, not blank, its rows and charts in the DOM."""
    shot = os.path.join(work, os.path.basename(page) + ".png")
    with ThreadPoolExecutor(2) as pool:  # two browsers side by side: each waits on its start-up most of the time
        screenshot = pool.submit(browse, page, work, f"--screenshot={shot}", "--window-size=1280,3000")
        dumped = pool.submit(browse, page, work, "--dump-dom")
        (_, console), (dom_text, _) = screenshot.result(), dumped.result()
    check(not console, f"{what}: no console message ({console[:3]})")
    pixels = matplotlib.image.imread(shot)[..., :3] if os.path.isfile(shot) else np.zeros((1, 1, 3))
    check(pixels.shape[0] > 100 and float(pixels.std()) > 0.05, f"{what}: the screenshot is not blank "
                                                               f"(std {float(pixels.std()):.3f})")
    dom = Dom(dom_text)
    check(dom.rows == cases, f"{what}: one table row per case, in order ({dom.rows})")
    missing = [c for c in charts if not dom.charts.get(c, "").startswith("data:image/svg+xml;base64,")]
    check(not missing, f"{what}: every chart embedded as SVG ({len(dom.charts)}; missing {missing})")
    check(not dom.loads, f"{what}: nothing to fetch ({dom.loads[:3]})")
    return dom_text


def main():
    if not CHROMIUM:
        print("SKIP: no chromium (scripts/install_deps.sh installs Debian's)")
        sys.exit(77)
    mpirun, ddplab = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as work:
        # The suite runs while the detector itself is checked: a page that logs to the console is caught.
        out = os.path.join(work, "suite")
        suite = subprocess.Popen([mpirun, "-np", "2", ddplab, "suite", "lab", "--steps", "4", "--warmup-steps", "1",
                                  "--input-dim", "16", "--hidden", "16", "--classes", "4", "--batch", "4",
                                  "--straggler-ms", "5", "--extra-allreduce-mb", "0.1", "--rank0-work-ms", "5",
                                  "--data-cost-ms", "0.2", "--out-dir", out], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        probe = os.path.join(work, "probe.html")
        with open(probe, "w") as f:
            f.write('<!DOCTYPE html><html><body><script>console.error("probe")</script></body></html>')
        check(browse(probe, work, "--dump-dom")[1], "a console message is seen (the check can fail)")

        try:
            stdout, stderr = suite.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            suite.kill()
            stdout, stderr = suite.communicate()
        proc = subprocess.CompletedProcess(suite.args, suite.returncode, stdout, stderr)
        check(proc.returncode == 0, f"suite exits 0 ({proc.returncode}: {proc.stderr.strip()[-300:]})")
        page = os.path.join(out, "report.html")
        check(f"page: {page}" in proc.stdout, "the suite names its page")
        if not os.path.isfile(page):
            return
        summary = json.load(open(os.path.join(out, "summary.json")))
        cases = [c["case"] for c in summary["cases"]]
        pathologies = [c["case"] for c in summary["cases"] if c["group"] not in ("weak", "strong")]
        charts = (["throughput", "loss", "weak_scaling", "strong_scaling", "weak_ws2_buckets"] +
                  [f"{c}_{kind}" for c in pathologies for kind in ("breakdown", "step_times")])
        dom = check_page(page, work, cases, charts, "suite page")
        blame = [line for c in summary["cases"] if c["group"] not in ("weak", "strong") for line in c.get("blame", [])]
        shown = [line for line in blame if html.escape(line, quote=False) in dom]  # as the DOM serializes text
        check(blame and shown == blame, f"the page shows every pathology's blame line ({len(shown)} of {len(blame)})")
        check("straggler.trace.json" in dom and "ui.perfetto.dev" in dom, "the page names the timeline and Perfetto")
        host = socket.gethostname()
        check(f"{host} (2 ranks)" in dom, f"the setup names the launch's host and ranks ({host} (2 ranks))")

        # `report --html` on two of the suite's files; bad input refused before any work.
        files = [os.path.join(out, f"{c}.h5") for c in ("straggler", "weak_ws2")]
        two = os.path.join(work, "two.html")
        proc = subprocess.run([ddplab, "report", "--html", two, *files], capture_output=True, text=True, timeout=300)
        check(proc.returncode == 0 and os.path.isfile(two), f"report --html writes the page ({proc.stderr[-300:]})")
        if os.path.isfile(two):
            dom = check_page(two, work, ["straggler", "weak_ws2"],
                             ["straggler_breakdown", "weak_ws2_breakdown"], "report --html page")
            check("rank 1 sets the pace" in dom or "rank 0 sets the pace" in dom, "report --html shows the blame")
            check(">n/a" in dom or "n/a:" in dom, "what does not apply reads n/a")
        # Two runs of one name each keep their own charts; a loss that went non-finite reads so, and the page is
        # still written.
        nan_run = os.path.join(work, "other", "straggler.h5")
        os.makedirs(os.path.dirname(nan_run))
        proc = subprocess.run([ddplab, "train", "--steps", "4", "--warmup-steps", "1", "--input-dim", "16", "--hidden",
                               "16", "--classes", "4", "--batch", "4", "--optimizer", "sgd", "--lr", "1e30",
                               "--skip-nonfinite", "--out", nan_run], capture_output=True, text=True, timeout=300)
        check(proc.returncode == 0 and "final loss          not finite (nan)" in proc.stdout,
              f"a run whose loss is NaN says so ({proc.returncode}: {proc.stdout[-300:]}{proc.stderr[-300:]})")
        same = os.path.join(work, "same_name.html")
        proc = subprocess.run([ddplab, "report", "--html", same, files[0], nan_run], capture_output=True, text=True,
                              timeout=300)
        check(proc.returncode == 0, f"report --html of a NaN run writes the page ({proc.stderr[-300:]})")
        if os.path.isfile(same):
            dom = check_page(same, work, ["straggler", "straggler_2"],
                             ["straggler_breakdown", "straggler_2_breakdown"], "page of two runs of one name")
            check("not finite" in dom, "the NaN run's final loss reads 'not finite'")
            svgs = [v for k, v in Dom(dom).charts.items() if k.startswith("straggler")]
            check(len(set(svgs)) == len(svgs), "runs of one name show their own charts")
        for args, reason in ((["--html", two], "already exists"),
                             (["--html", os.path.join(work, "no", "p.html")], "does not exist"),
                             (["--html", os.path.join(work, "x.html"), "--json"], "excludes")):
            before = sorted(os.listdir(work))
            proc = subprocess.run([ddplab, "report", *args, files[0]], capture_output=True, text=True, timeout=60)
            check(proc.returncode == 2 and reason in proc.stderr and sorted(os.listdir(work)) == before,
                  f"report {' '.join(args[:1])}: refused ({reason}), nothing written ({proc.stderr.strip()})")


if __name__ == "__main__":
    main()
    sys.exit(1 if failures else 0)
