#!/usr/bin/env bash
# hier vs the flat ring vs MPI at 2 emulated nodes x 2 ranks, the inter-node link at 10gbe, 25gbe and 100gbe-ib
# (intra none), 1-256 MB: allreduce_perf's JSON per link and one table of times and ratios from the same runs.
# Expected from the bytes each NIC carries (docs/COMM.md): hier / ring -> 2/3 where the link is the bottleneck.
#   bench/hier_vs_ring.sh [BUILD_DIR] [OUT_DIR]      MAX_BYTES=4M ITERS=2 for a quick check
# OUT_DIR (default bench/results/<date>-hier-vs-ring) must not hold a run already; the machine goes in machine.txt.
# Bad arguments: one line and exit 2, before any run.
set -euo pipefail
cd "$(dirname "$0")/.."
refuse() { echo "hier_vs_ring.sh: $1" >&2; exit 2; }
[ $# -le 2 ] || refuse "usage: bench/hier_vs_ring.sh [BUILD_DIR] [OUT_DIR]"
build=${1:-build}
out=${2:-bench/results/$(date -u +%F)-hier-vs-ring}
max_bytes=${MAX_BYTES:-256M}
iters=${ITERS:-5}
[[ -x "$build/bench/allreduce_perf" ]] || refuse "$build/bench/allreduce_perf not built (cmake --build $build)"
# At least -b's 1M: bytes, or with K, M or G.
[[ $max_bytes =~ ^([1-9][0-9]*)([KMGkmg]?)$ ]] || refuse "MAX_BYTES=$max_bytes: expected a size such as 4M or 256M"
case ${BASH_REMATCH[2]} in [Kk]) shift_by=10 ;; [Mm]) shift_by=20 ;; [Gg]) shift_by=30 ;; *) shift_by=0 ;; esac
((${#BASH_REMATCH[1]} <= 6 && BASH_REMATCH[1] << shift_by >= 1 << 20)) ||
  refuse "MAX_BYTES=$max_bytes: expected 1M or more (-b's size), at most 6 digits"
[[ $iters =~ ^[1-9][0-9]{0,5}$ ]] || refuse "ITERS=$iters: expected a whole number of timed calls, 1 or more"
[ ! -e "$out/table.md" ] || refuse "$out already holds a run (table.md): name another OUT_DIR or remove it"
mkdir -p "$out" || refuse "cannot create $out"
{
  echo "# hier_vs_ring.sh $(date -u +%FT%TZ) on $(hostname); $(nproc) cores"
  uname -srm
  lscpu | grep -E '^(Model name|CPU family|Model|NUMA node\(s\)):'
} >"$out/machine.txt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # 4 ranks: more than this machine has cores
for link in 10gbe 25gbe 100gbe-ib; do
  echo "== inter-node $link"
  mpirun --oversubscribe --bind-to none -np 4 "$build/bench/allreduce_perf" -b 1M -e "$max_bytes" -f 2 \
    -w 1 -n "$iters" --impls ring,mpi,hier --ranks-per-node 2 --link "intra=none,inter=$link" --json "$out/$link.json" \
    --force  # a rerun into the same day's folder replaces its results
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
with open(os.path.join(out, "table.md.tmp"), "w") as f:  # whole or not at all
    f.write(table)
os.replace(os.path.join(out, "table.md.tmp"), os.path.join(out, "table.md"))
print(table + f"(written to {out}/table.md)")
PY
