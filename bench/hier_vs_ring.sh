#!/usr/bin/env bash
# hier vs the flat ring vs MPI at 2 emulated nodes x 2 ranks, the inter-node link at 10gbe, 25gbe and 100gbe-ib
# (intra none), 1-256 MB: allreduce_perf's JSON per link and one table of times and ratios from the same runs.
# Expected from the bytes each NIC carries (docs/COMM.md): hier / ring -> 2/3 where the link is the bottleneck.
#   bench/hier_vs_ring.sh [BUILD_DIR] [OUT_DIR]      MAX_BYTES=4M ITERS=2 for a quick check
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-bench/results/hier_vs_ring}
max_bytes=${MAX_BYTES:-256M}
iters=${ITERS:-5}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # 4 ranks: more than this machine has cores
for link in 10gbe 25gbe 100gbe-ib; do
  echo "== inter-node $link"
  mpirun --oversubscribe --bind-to none -np 4 "$build/bench/allreduce_perf" -b 1M -e "$max_bytes" -f 2 \
    -w 1 -n "$iters" --impls ring,mpi,hier --ranks-per-node 2 --link "intra=none,inter=$link" --json "$out/$link.json"
done
/usr/bin/python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
# The link's bound on each: the bytes the busiest NIC carries over its bandwidth (docs/COMM.md), 1.5 S for the flat
# ring at 2 nodes x 2 ranks, S for hier.
lines = ["| inter link | size | ring (ms) | mpi (ms) | hier (ms) | hier / ring | mpi / ring | "
         "link's bound: ring 1.5 S/B, hier S/B (ms) |",
         "|---|---|---|---|---|---|---|---|"]
for link in ["10gbe", "25gbe", "100gbe-ib"]:
    with open(os.path.join(out, link + ".json")) as f:
        doc = json.load(f)
    bytes_per_ms = doc["links"]["inter"]["gbps"] * 1e9 / 8 / 1e3
    times = {}
    for r in doc["results"]:  # out of place: the caller's buffers, as in training
        times.setdefault(r["size_bytes"], {})[r["impl"]] = r["out_of_place"]["time_us"] / 1e3
    for size, t in sorted(times.items()):
        lines.append(f"| {link} | {size / 2**20:g} MiB | {t['ring']:.2f} | {t['mpi']:.2f} | {t['hier']:.2f} | "
                     f"{t['hier'] / t['ring']:.2f} | {t['mpi'] / t['ring']:.2f} | "
                     f"{1.5 * size / bytes_per_ms:.1f}, {size / bytes_per_ms:.1f} |")
table = "\n".join(lines) + "\n"
with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table)
print(table + f"(written to {out}/table.md)")
PY
