#!/usr/bin/python3
"""bench/device/gpu_gaps.py on a trace whose idle time is known: kernels on two streams overlapping, a copy, and the
CSV's name column holding commas and quotes, as libddplab_gpu_trace.so and nsys write it.

usage: check_gpu_gaps.py GPU_GAPS_PY
"""
import os
import subprocess
import sys
import tempfile

from checks import check, failures  # tests/cli/checks.py: the assertion every CLI test shares

# (start ns, duration ns, stream, name): busy 1000-2000 (two streams overlapping, one inside the other), a 3 us gap,
# busy 5000-5500, a 20 us gap, busy 25500-26500. Idle 23 us of 25.5 (written 0.025 ms: three decimals).
TRACE = [
    (1000, 800, 7, "gemm, the first"),
    (1200, 800, 13, 'nccl "allreduce"'),
    (1500, 100, 7, "inside the others"),
    (5000, 500, 7, "[CUDA memcpy Device-to-Host]"),
    (25500, 1000, 7, "after the wait"),
]


def main():
    script = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.csv")
        with open(path, "w") as f:
            f.write("gpu_trace: a line before the header, as nsys stats prints\n")
            f.write('"Start (ns)","Duration (ns)","Strm","Name"\n')
            for start, duration, stream, name in reversed(TRACE):  # out of order: the script sorts
                f.write(f'{start},{duration},{stream},"{name.replace(chr(34), chr(34) * 2)}"\n')
        run = subprocess.run([sys.executable, script, path, "2", "--steps", "5"], capture_output=True, text=True,
                             timeout=30)
        lines = run.stdout.splitlines()
        check(run.returncode == 0 and len(lines) == 3, f"exit 0 and three lines (got {run.returncode}: {run.stdout!r})")
        if len(lines) == 3:
            expected = ("idle 0.023 ms of 0.025 ms (90.2%), per step 0.005 of 0.005 ms; 2 gaps, 1 of 10 us or more; "
                        "0.001 ms per step in gaps under 10 us")
            check(lines[0] == expected, f"the idle time of the union of the streams: {lines[0]}")
            check("20.0 us  after [CUDA memcpy Device-to-Host]  before after the wait" in lines[1],
                  f"the largest gap first, with its neighbours: {lines[1]}")
            check('3.0 us  after nccl "allreduce"  before [CUDA memcpy' in lines[2],
                  f"the busy span's last activity before the next gap: {lines[2]}")
        # --against: the same trace, over 5 steps, against one of a single step in which "gemm, the first" took 800 ns
        # longer and a kernel of 300 ns ran that this one lacks; busy differs by the 800 ns less the 300.
        other = os.path.join(tmp, "other.csv")
        with open(other, "w") as f:
            f.write('"Start (ns)","Duration (ns)","Strm","Name"\n')
            f.write('0,1600,7,"gemm, the first"\n3000,300,7,"only there"\n')
        run = subprocess.run([sys.executable, script, path, "2", "--steps", "5", "--against", other],
                             capture_output=True, text=True, timeout=30)
        lines = run.stdout.splitlines()
        check(run.returncode == 0 and len(lines) == 7, f"--against: exit 0, two more lines and two rows (got "
              f"{run.returncode}: {run.stdout!r})")
        if len(lines) == 7:
            # Here, per step: busy 3500 / 5 = 700 ns, the gemm 800 / 5 = 160 ns; there: busy 1900, the gemm 1600.
            check(lines[3].startswith("busy per step 0.001 ms against 0.002 ms in ") and "(-0.001)" in lines[3],
                  f"busy per step, both: {lines[3]}")
            check(lines[5].split()[:3] == ["0.2", "1.6", "-1.4"] and lines[5].endswith("gemm, the first"),
                  f"the largest difference first: {lines[5]}")
            check(lines[6].split()[:3] == ["0.0", "0.3", "-0.3"] and "0/1" in lines[6] and
                  lines[6].endswith("only there"), f"a kernel that ran only there: {lines[6]}")
        for bad, args in [("no header", ["/dev/null"]), ("a negative top", [path, "-1"]),
                          ("no steps against", [path, "--against", other, "--against-steps", "0"]),
                          ("a missing trace", [path, "--against", os.path.join(tmp, "missing.csv")])]:
            run = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=30)
            check(run.returncode == 2 and run.stderr.startswith("gpu_gaps: ") and len(run.stderr.splitlines()) == 1,
                  f"{bad}: exit 2 and one line (got {run.returncode}: {run.stderr.strip()})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
