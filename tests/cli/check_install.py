#!/usr/bin/python3
"""An install that works off the source tree: `cmake --install` into a temporary prefix, the prefix moved elsewhere
(nothing may point back into the build or the source), then the installed ddplab runs a tiny suite from a folder of
its own, and its charts and page are drawn by the installed scripts (charts.log names the script that ran).

usage: check_install.py CMAKE BUILD_DIR MPIRUN
"""
import os
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
                     "share/doc/ddplab/README.md", "share/doc/ddplab/REPORTS.md"]
        missing = [p for p in installed if not os.path.isfile(os.path.join(prefix, p))]
        check(not missing, f"installed: {', '.join(installed)} (missing {missing})")
        if missing:
            return
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


if __name__ == "__main__":
    main()
    sys.exit(1 if failures else 0)
