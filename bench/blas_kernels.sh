#!/usr/bin/env bash
# OpenBLAS's kernel families on this host, side by side (docs/BENCHMARKS.md, "OpenBLAS's kernels chosen by what the
# CPU can run"), for a quiet machine (about 2 minutes at 8 rounds on 2 cores):
#   - every family the CPU can run (the ones `ddplab devices` measures) and OpenBLAS's own pick, ROUNDS rounds in
#     turn, each round: the probe's GEMMs (`ddplab --openblas-kernel-probe`: a 1024 -> 1024 layer at batch 128,
#     forward and both backward GEMMs, one thread) and the default MLP's step (`ddplab train --threads 1 --steps 20`)
#     with OPENBLAS_CORETYPE set to the family; and the step as ddplab runs it, nothing set;
#   - per family the median (min-max) of each, against the FMA peak and against the fastest family;
#   - the goal: the kernels ddplab chose within 10% of the fastest family, by the probe's median and by the step's.
# Exits 1 when the goal is missed, 2 on bad arguments. Compare its figures only with figures from this same run.
#   bench/blas_kernels.sh [BUILD_DIR] [ROUNDS]      (defaults: build, 8)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-8}
ddplab=$build/launcher/ddplab
[[ -x "$ddplab" ]] || { echo "blas_kernels.sh: $ddplab not built (cmake --build $build)" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "blas_kernels.sh: ROUNDS must be a positive integer, got '$rounds'" >&2; exit 2; }
if [[ -n "${OPENBLAS_CORETYPE:-}" || "${DDPLAB_BLAS_AUTO:-on}" != on ]]; then
  echo "blas_kernels.sh: unset OPENBLAS_CORETYPE and DDPLAB_BLAS_AUTO: the run compares ddplab's own choice" >&2
  exit 2
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DDPLAB_TRAIN_PAGE=off
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "# blas_kernels.sh $(date -u +%FT%TZ) on $(hostname), $rounds rounds"
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg) (should be near 0)"
"$ddplab" devices > "$work/devices.txt"
sed -n -e 's/^  CPU /# CPU /p' -e 's/^  BLAS /# BLAS /p' -e 's/^        \(kernels\|GEMM\)/#   \1/p' "$work/devices.txt"
# The families devices measured ("... of the best (Haswell 103, Zen 102, ...)") and OpenBLAS's own pick.
families=$(sed -n 's/.*of the best (\(.*\))$/\1/p' "$work/devices.txt" | tr ',' '\n' | awk '{print $1}')
own=$(DDPLAB_BLAS_AUTO=off "$ddplab" --openblas-kernel-probe | awk '{print $1}')
chosen=$(sed -n 's/^        kernels \([A-Za-z0-9]*\).*/\1/p' "$work/devices.txt")
families=$(printf '%s\n%s\n' "$families" "$own" | awk 'NF && !seen[$0]++')
[[ -n "$families" && -n "$chosen" ]] || { echo "blas_kernels.sh: could not read the families from ddplab devices" >&2; exit 1; }
echo "# families: $(echo $families); OpenBLAS's own pick: $own; ddplab's: $chosen"

step_ms() { sed -n 's/^  step  *\([0-9.]*\) ms mean (the slowest rank.*/\1/p' "$1"; }
for ((r = 1; r <= rounds; r++)); do
  for f in $families; do
    OPENBLAS_CORETYPE=$f "$ddplab" --openblas-kernel-probe >> "$work/probe.txt"
    OPENBLAS_CORETYPE=$f "$ddplab" train --threads 1 --steps 20 --out "$work/run.h5" > "$work/train.txt"
    echo "$f $(step_ms "$work/train.txt")" >> "$work/step.txt"
    # The MLP's widths and batch ("MLP 1024-1024x2-1000 (3.12M params), 1 rank x batch 128"): its GEMMs' flops.
    sed -nE 's/.*MLP ([0-9]+)-([0-9]+)x([0-9]+)-([0-9]+) .*, 1 rank x batch ([0-9]+).*/\1 \2 \3 \4 \5/p' \
      "$work/train.txt" > "$work/model.txt"
    rm -f "$work/run.h5"
  done
  "$ddplab" train --threads 1 --steps 20 --out "$work/run.h5" > "$work/train.txt"
  echo "ddplab $(step_ms "$work/train.txt")" >> "$work/step.txt"
  rm -f "$work/run.h5"
done

peak=$(sed -n 's/.*FMA peak \([0-9.]*\) GFLOP\/s.*/\1/p' "$work/devices.txt")
/usr/bin/python3 - "$work" "$chosen" "$own" "${peak:-0}" <<'EOF'
import statistics, sys
sys.path.insert(0, "bench")
import cpu_rates
work, chosen, own, peak = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
inputs, hidden, layers, classes, batch = map(int, open(f"{work}/model.txt").read().split())
# The GEMMs' flops per step, as bench_step counts them (bench/cpu_rates.py: not 6 x params x batch, which made this
# "lower bound" exceed the probe's own rate).
flop_step = batch * cpu_rates.mlp_gemm_flops_per_sample([inputs] + [hidden] * layers + [classes])
def read(name):
    d = {}
    for line in open(f"{work}/{name}"):
        k, v = line.split()
        d.setdefault(k, []).append(float(v))
    return d
probe, step = read("probe.txt"), read("step.txt")
med = {k: statistics.median(v) for k, v in probe.items()}
smed = {k: statistics.median(v) for k, v in step.items()}
best_probe = max(med.values())
best_step = min(v for k, v in smed.items() if k != "ddplab")
print(f"{'family':<26} {'probe GFLOP/s (min-max)':>24} {'% peak':>6} {'/best':>5}   "
      f"{'step ms (min-max)':>22} {'GFLOP/s':>7} {'/best':>5}")
for k in sorted(smed, key=lambda k: smed[k]):
    name = {"ddplab": "as ddplab runs it"}.get(k, k)
    name += " (OpenBLAS's pick)" if k == own else " (ddplab's pick)" if k == chosen else ""
    p, s = probe.get(k), step[k]
    probe_cells = (f"{med[k]:6.1f} ({min(p):.1f}-{max(p):.1f})", f"{100 * med[k] / peak:5.0f}%" if peak else "-",
                   f"{med[k] / best_probe:5.2f}") if p else ("-", "-", "-")
    print(f"{name:<26} {probe_cells[0]:>24} {probe_cells[1]:>6} {probe_cells[2]:>5}   "
          f"{f'{smed[k]:.2f} ({min(s):.2f}-{max(s):.2f})':>22} {flop_step / smed[k] / 1e6:7.1f} {best_step / smed[k]:5.2f}")
ok_probe = med[chosen] >= 0.9 * best_probe
ok_step = best_step / smed["ddplab"] >= 0.9
print(f"goal: ddplab's kernels ({chosen}) within 10% of the fastest family: probe {med[chosen] / best_probe:.2f}, "
      f"step as run {best_step / smed['ddplab']:.2f} -> {'met' if ok_probe and ok_step else 'NOT met'}")
print(f"(medians of the rounds; step GFLOP/s: the GEMMs' {flop_step / 1e9:.3f} GFLOP a step over the whole step, a "
      "lower bound on the GEMMs' own rate; /best: against the fastest family's median, 1.00 = the fastest)")
sys.exit(0 if ok_probe and ok_step else 1)
EOF
