#!/bin/bash
# Re-predicts the 12:06 H200 call's shared-GPU runs from its committed files with this tree's `ddplab predict`:
# the steps each run measured, and what its one-rank run predicts for it with the calibration the call wrote.
# Usage: predict_calibration_rows.sh DDPLAB_BINARY
set -euo pipefail
ddplab=$(realpath "$1")
here=$(cd "$(dirname "$0")/.." && pwd)/2026-12-04b-h200-shared-gpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for part in mlp-sanitizers gpt2 gpt2-np4; do
  mkdir -p "$work/$part" && tar xzf "$here/$part/runs.tgz" -C "$work/$part"
done
step() {  # the predicted step of the run's own bucket setting, ms
  rm -f "$work/p.json"
  "$ddplab" predict "$@" --json "$work/p.json" >/dev/null || exit 1
  python3 -c "import json; print('%.2f' % json.load(open('$work/p.json'))['rows'][0]['step_ms'])"
}
measured() {  # the run's mean step, as its summary gives it (the slowest rank's)
  "$ddplab" report "$1" 2>/dev/null | awk '/^  step  /{print $2; exit}'
}
row() {  # name, run measured, then predict's arguments
  local name=$1 run=$2
  shift 2
  local m p
  m=$(measured "$run")
  p=$(step "$@")
  printf '%-44s measured %7s  predicted %7s  %+6.1f%%\n' "$name" "$m" "$p" "$(python3 -c "print(($p / $m - 1) * 100)")"
}
cd "$work"
row "mlp np2, 10gbe, calibrated" mlp-sanitizers/mlp_10gbe_np2.h5 mlp-sanitizers/mlp_np1.h5 --ranks 2 --ranks-per-gpu 2 \
  --link 10gbe --calibration mlp-sanitizers/ipc_10gbe_np2.json
row "mlp np4, 10gbe, calibrated" mlp-sanitizers/mlp_10gbe_np4.h5 mlp-sanitizers/mlp_np1.h5 --ranks 4 --ranks-per-gpu 4 \
  --link 10gbe --calibration mlp-sanitizers/ipc_10gbe_np4.json
row "gpt2-small bf16 np2, calibrated (64 MiB chunk)" gpt2/gpt2_bf16_np2.h5 gpt2/gpt2_bf16_np1.h5 --ranks 2 \
  --ranks-per-gpu 2 --calibration gpt2/ipc_np2_chunk64.json
row "gpt2-small bf16 np4, calibrated" gpt2/gpt2_bf16_np4.h5 gpt2-np4/gpt2_bf16_np1.h5 --ranks 4 --ranks-per-gpu 4 \
  --calibration gpt2-np4/ipc_np4.json
echo "the sweep's cells (mlp np2 10gbe) from its first run, calibrated:"
"$ddplab" predict mlp-sanitizers/sweep_10gbe_np2/predict_from.h5 --bucket-mb 1,5,25 --overlap on,off \
  --calibration mlp-sanitizers/ipc_10gbe_np2.json --json sweep.json >/dev/null
python3 - <<'PY'
import json, statistics
measured = {(p["bucket_mb"], p["overlap"]): p["step_ms"]
            for p in json.load(open("mlp-sanitizers/sweep_10gbe_np2/summary.json"))["points"]}
errors = []
for r in json.load(open("sweep.json"))["rows"]:
    key = (float(r["bucket_mb"]), r["overlap"] if isinstance(r["overlap"], str) else ("on" if r["overlap"] else "off"))
    if key in measured:
        e = (r["step_ms"] / measured[key] - 1) * 100
        errors.append(abs(e))
        print("  bucket %4g MiB, overlap %-3s measured %7.2f  predicted %7.2f  %+6.1f%%" % (*key, measured[key], r["step_ms"], e))
print("  |error| median %.1f%%, max %.1f%%" % (statistics.median(errors), max(errors)))
PY
