#!/usr/bin/env python3
"""Where the GPU sat idle in an nsys capture: its kernels and copies merged into busy time, the gaps between ranked.

  nsys stats --report cuda_gpu_trace --format csv FILE.nsys-rep > trace.csv
  bench/device/gpu_gaps.py trace.csv [TOP] [--steps N] [--against OTHER.csv [--against-steps M]]

Prints one line "idle X ms of Y ms (Z%), per step ..." and the TOP largest gaps, each with the activity that ended
before it and the one that started after it: a gap behind a host wait (a stream synchronize, an MPI call) or a slow
launch shows as the GPU idle between two names. The line also gives the idle time in gaps under 10 us: many short
gaps are a host that launches no faster than the GPU runs, a few long ones a host that waits. With several streams,
busy means any stream busy.

--against OTHER.csv: then each kernel's (and copy's) GPU time per step here against OTHER's (M steps), the TOP largest
differences first, and the busy time per step of both: whether a slower step is idle time or slower kernels, and
which (a trainer's step against the bench harness's, say).
"""
import argparse
import csv
import sys


def die(message):
    print(f"gpu_gaps: {message}", file=sys.stderr)
    sys.exit(2)


def activities(path):
    """(start ns, end ns, name) of every kernel and copy, from nsys's CSV (lines before its header skipped)."""
    try:
        with open(path, newline="") as f:
            lines = f.read().splitlines()
    except OSError as e:
        die(f"{path}: {e.strerror}")
    header = next((i for i, line in enumerate(lines) if "Start" in line and "Duration" in line), None)
    if header is None:
        die(f"{path}: no CSV header with Start and Duration columns (nsys stats --report cuda_gpu_trace --format csv)")
    rows = list(csv.DictReader(lines[header:]))
    columns = rows[0].keys() if rows else []
    start = next((c for c in columns if c.startswith("Start")), None)
    duration = next((c for c in columns if c.startswith("Duration")), None)
    name = next((c for c in columns if c.strip() == "Name"), None)
    if not rows or not start or not duration or not name:
        die(f"{path}: no activity rows")
    return sorted((int(float(r[start])), int(float(r[start])) + int(float(r[duration])), r[name]) for r in rows)


def gaps(acts):
    """(busy ns, span ns, [(gap ns, name before, name after)])."""
    busy, out = 0, []
    end, before = acts[0][0], None
    for start, finish, name in acts:
        if start > end and before is not None:
            out.append((start - end, before, name))
        if finish > end:
            busy += finish - max(start, end)
            end, before = finish, name
    return busy, end - acts[0][0], out


def per_step(acts, steps):
    """{name: (GPU ns per step, launches per step)}: what each kernel or copy costs a step, summed over its launches."""
    total, launches = {}, {}
    for start, finish, name in acts:
        total[name] = total.get(name, 0) + finish - start
        launches[name] = launches.get(name, 0) + 1
    return {name: (total[name] / steps, launches[name] / steps) for name in total}


def compare(acts, steps, other_path, other_steps, top):
    other = activities(other_path)
    here, there = per_step(acts, steps), per_step(other, other_steps)
    busy_here, busy_there = gaps(acts)[0] / steps, gaps(other)[0] / other_steps
    print(f"busy per step {busy_here / 1e6:.3f} ms against {busy_there / 1e6:.3f} ms in {other_path} "
          f"({(busy_here - busy_there) / 1e6:+.3f}); kernel and copy time per step, the largest differences first:")
    print(f"  {'here us':>9} {'there us':>9} {'diff us':>9} {'launches':>13}  name")
    names = sorted(set(here) | set(there), key=lambda n: -abs(here.get(n, (0, 0))[0] - there.get(n, (0, 0))[0]))
    for name in names[:top]:
        (t_here, n_here), (t_there, n_there) = here.get(name, (0, 0)), there.get(name, (0, 0))
        print(f"  {t_here / 1e3:9.1f} {t_there / 1e3:9.1f} {(t_here - t_there) / 1e3:+9.1f} "
              f"{n_here:6.4g}/{n_there:<6.4g}  {short(name)}")


def short(name, width=60):
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("top", nargs="?", type=int, default=10)
    ap.add_argument("--steps", type=int, default=1, help="steps in the capture, for the per-step figures")
    ap.add_argument("--against", metavar="OTHER", help="another trace: each kernel's time per step against its")
    ap.add_argument("--against-steps", type=int, default=1, help="steps in OTHER")
    args = ap.parse_args()
    if args.top < 0 or args.steps < 1 or args.against_steps < 1:
        die("TOP must be >= 0, and --steps and --against-steps >= 1")
    acts = activities(args.trace)
    busy, span, found = gaps(acts)
    idle = span - busy
    small = sum(g for g, _, _ in found if g < 10_000)  # a host a few launches behind, rather than waiting
    print(f"idle {idle / 1e6:.3f} ms of {span / 1e6:.3f} ms ({100 * idle / max(span, 1):.1f}%), per step "
          f"{idle / 1e6 / args.steps:.3f} of {span / 1e6 / args.steps:.3f} ms; {len(found)} gaps, "
          f"{sum(g >= 10_000 for g, _, _ in found)} of 10 us or more; {small / 1e6 / args.steps:.3f} ms per step in "
          f"gaps under 10 us")
    for gap, before, after in sorted(found, reverse=True)[: args.top]:
        print(f"  {gap / 1e3:9.1f} us  after {short(before)}  before {short(after)}")
    if args.against:
        compare(acts, args.steps, args.against, args.against_steps, args.top)


if __name__ == "__main__":
    main()
