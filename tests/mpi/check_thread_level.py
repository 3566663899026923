#!/usr/bin/python3
"""The MPI thread-level check end to end (runtime/mpi_init.h): a library that gives less than MPI_THREAD_MULTIPLE is
refused on every rank before any work, with exit code 2 and one line from rank 0 naming the level it gave; with
MPI_THREAD_MULTIPLE the program goes on.

usage: check_thread_level.py MPIRUN THREAD_LEVEL_PROBE
"""
import subprocess
import sys

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(mpirun, probe, level):
    p = subprocess.run([mpirun, "--bind-to", "none", "-np", "2", probe, level], capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


def main():
    mpirun, probe = sys.argv[1], sys.argv[2]
    for level, name in [("single", "MPI_THREAD_SINGLE"), ("funneled", "MPI_THREAD_FUNNELED"),
                        ("serialized", "MPI_THREAD_SERIALIZED")]:
        code, out, err = run(mpirun, probe, level)
        lines = [line for line in err.splitlines() if "thread_level_probe: error:" in line]
        check(f"got {name}" in out, f"{level}: the library gave {name} (stdout: {out.strip()!r})")
        check(code == 2, f"{level}: exit code 2 (got {code})")
        check(len(lines) == 1 and f"provides {name}" in lines[0] and "need MPI_THREAD_MULTIPLE" in lines[0],
              f"{level}: one line, from rank 0, naming the level: {lines}")
        check("went on" not in out, f"{level}: no rank went on")
    code, out, err = run(mpirun, probe, "multiple")
    check(code == 0 and "went on: 2 ranks" in out and "error" not in err,
          f"multiple: goes on (code {code}, {out.strip()!r}, {err.strip()[-200:]!r})")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
