#!/usr/bin/python3
"""An install that works off the source tree: `cmake --install` into a temporary prefix, the prefix moved elsewhere
(nothing may point back into the build or the source), then the installed ddplab runs a tiny suite from a folder of
its own, and its charts and page are drawn by the installed scripts (charts.log names the script that ran).

usage: check_install.py CMAKE BUILD_DIR MPIRUN
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from checks import check, failures  # tests/cli/checks.py: the assertion every CLI test shares


def main():
    cmake, build, mpirun = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as work:
        staged = os.path.join(work, "staged")
        proc = subprocess.run([cmake, "--install", build, "--prefix", staged], capture_output=True, text=True,
                              timeout=120)
        check(proc.returncode == 0, f"cmake --install exits 0 ({proc.stderr.strip()[-300:]})")
        prefix = os.path.join(work, "moved", "ddplab")  # a relocated install finds its scripts relative to itself
        os.makedirs(os.path.dirname(prefix))
        shutil.move(staged, prefix)
        installed = ["bin/ddplab", "bin/allreduce_perf", "share/ddplab/scripts/charts.py",
                     "share/ddplab/scripts/report_page.py", "share/ddplab/scripts/report_page.html.j2",
                     "share/ddplab/scripts/allreduce_chart.py", "share/ddplab/scripts/mpirun.sh",
                     "share/doc/ddplab/README.md", "share/doc/ddplab/docs/REPORTS.md"]
        missing = [p for p in installed if not os.path.isfile(os.path.join(prefix, p))]
        check(not missing, f"installed: {', '.join(installed)} (missing {missing})")
        if missing:
            return
        # The installed README's links into docs/ lead to installed files, as they do in the source tree.
        doc_dir = os.path.join(prefix, "share", "doc", "ddplab")
        links = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", open(os.path.join(doc_dir, "README.md")).read()))
        broken = sorted(link for link in links if not os.path.isfile(os.path.join(doc_dir, link)))
        check(links and not broken, f"the installed README's {len(links)} links into docs/ resolve (broken: {broken})")
        run_dir = os.path.join(work, "elsewhere")  # not the source tree, not the build tree
        os.makedirs(run_dir)
        ddplab = os.path.join(prefix, "bin", "ddplab")
        proc = subprocess.run([mpirun, "-np", "2", ddplab, "suite", "lab", "--steps", "3", "--warmup-steps", "1",
                               "--input-dim", "16", "--hidden", "16", "--classes", "4", "--batch", "4",
                               "--straggler-ms", "2", "--extra-allreduce-mb", "0.05", "--rank0-work-ms", "2",
                               "--data-cost-ms", "0.1", "--out-dir", "suite"],
                              cwd=run_dir, capture_output=True, text=True, timeout=300)
        print(proc.stdout[-1500:])
        check(proc.returncode == 0, f"the installed ddplab runs the suite ({proc.stderr.strip()[-300:]})")
        out = os.path.join(run_dir, "suite")
        with open(os.path.join(out, "charts.log")) as f:
            script = f.readline().strip()
        expected = "# " + os.path.join(prefix, "share", "ddplab", "scripts", "charts.py")
        check(script == expected, f"the installed charts.py drew the charts ({script!r}, expected {expected!r})")
        check("charts: suite/charts/" in proc.stdout and "page: suite/report.html" in proc.stdout,
              "the suite says where its charts and page are")
        page = os.path.join(out, "report.html")
        text = open(page).read() if os.path.isfile(page) else ""
        check(text.count('<tr class="case">') == len([n for n in os.listdir(out) if n.endswith(".h5")]),
              "the page has a row per case")
        check_chart_failures(mpirun, prefix, run_dir)


def check_chart_failures(mpirun, prefix, run_dir):
    """Where charts.py fails, refuses or is missing, a run says why in one line, names a log only where one was
    written, and leaves no temporary folder but the one holding that log."""
    script = os.path.join(prefix, "share", "ddplab", "scripts", "charts.py")
    tmp = os.path.join(run_dir, "tmp")
    os.makedirs(tmp)

    def train(name):
        return subprocess.run([mpirun, "-np", "1", os.path.join(prefix, "bin", "ddplab"), "train", "--steps", "2",
                               "--warmup-steps", "1", "--input-dim", "8", "--hidden", "8", "--classes", "2",
                               "--batch", "2", "--out", name + ".h5"], cwd=run_dir, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "TMPDIR": tmp, "DDPLAB_TRAIN_PAGE": "on"})

    def page_line(proc):
        return next((line for line in proc.stdout.splitlines() if line.startswith("page: ")), "")

    with open(script, "w") as f:
        f.write("import sys\nprint('drawing went wrong')\nsys.exit(1)\n")
    proc = train("fails")
    kept = os.listdir(tmp)
    log = os.path.join(tmp, kept[0], "charts.log") if len(kept) == 1 else ""
    check(proc.returncode == 0 and page_line(proc) == f"page: not written (drawing went wrong; its log: {log})" and
          "drawing went wrong" in (open(log).read() if os.path.isfile(log) else ""),
          f"a failure of charts.py's own names its log, which is kept ({page_line(proc)!r}, {kept})")
    for name in kept:
        shutil.rmtree(os.path.join(tmp, name))

    with open(script, "w") as f:
        f.write("import sys\nprint('fails.h5: not a run file')\nsys.exit(2)\n")
    proc = train("refused")
    check(page_line(proc) == "page: not written (fails.h5: not a run file)" and os.listdir(tmp) == [],
          f"a refusal is its one line, and no folder is left ({page_line(proc)!r}, {os.listdir(tmp)})")

    os.remove(script)
    proc = train("unscripted")
    check(page_line(proc).startswith("page: not written (no scripts/charts.py beside this ddplab") and
          os.listdir(tmp) == [], f"without the scripts: why, and no folder left ({page_line(proc)!r}, {os.listdir(tmp)})")
    proc = subprocess.run([mpirun, "-np", "1", os.path.join(prefix, "bin", "ddplab"), "suite", "lab", "--steps", "2",
                           "--warmup-steps", "1", "--input-dim", "8", "--hidden", "8", "--classes", "2", "--batch", "2",
                           "--straggler-ms", "1", "--extra-allreduce-mb", "0.01", "--rank0-work-ms", "1",
                           "--data-cost-ms", "0.1", "--out-dir", "suite", "--force"],
                          cwd=run_dir, capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": tmp})
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("charts: ", "page: "))]
    check(proc.returncode == 0 and len(lines) == 2 and lines[0].startswith("charts: not drawn (no scripts/charts.py") and
          "charts.log" not in lines[1], f"the suite without the scripts says why, and names no log ({lines})")
    check(not os.path.exists(os.path.join(run_dir, "suite", "report.html")),
          "a suite reusing a folder (--force) leaves no page of the runs it replaced")
    # report --html asked for the page itself: without the scripts it fails, in one line and exit 1, not with
    # MPI_Abort's banner (rank 0 runs it alone: no other rank waits).
    page = os.path.join(run_dir, "asked.html")
    proc = subprocess.run([os.path.join(prefix, "bin", "ddplab"), "report", "--html", page,
                           os.path.join(run_dir, "suite", "weak_ws1.h5")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": tmp})
    check(proc.returncode == 1 and proc.stderr.count("\n") == 1 and "no scripts/charts.py beside this ddplab" in
          proc.stderr and not os.path.exists(page),
          f"report --html without the scripts: one line, exit 1, no page ({proc.returncode}: {proc.stderr[-400:]})")


if __name__ == "__main__":
    main()
    sys.exit(1 if failures else 0)
