#!/usr/bin/env bash
# Five of the CPU benchmarks in docs/BENCHMARKS.md, in one go (about 10 minutes on the 2-core dev machine): the ops
# at the default MLP's shapes, the all-reduce, training throughput, bucket size x overlap, and against PyTorch DDP.
# The per-host checks (bench/cpu_speed.sh, bench/blas_kernels.sh) and the rest run on their own, as BENCHMARKS.md says.
#   bench/run_all.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -le 1 ] || { echo "run_all.sh: usage: bench/run_all.sh [BUILD_DIR]" >&2; exit 2; }
build=${1:-build}
for exe in bench/bench_cpu_ops bench/allreduce_perf launcher/ddplab; do  # what it runs, checked before any run
  [[ -x "$build/$exe" ]] || { echo "run_all.sh: $build/$exe not built (cmake --build $build)" >&2; exit 2; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== CPU ops at the default MLP's shapes"
# Exit 1 is a finding the program prints (the kernels in use MISSED 85% of the best family's rate); any other
# failure stops the script.
"$build/bench/bench_cpu_ops" --repeats 30 || [ $? -eq 1 ]
echo "== all-reduce, 2 ranks (nccl-tests columns)"
scripts/mpirun.sh -np 2 "$build/bench/allreduce_perf" -b 8 -e 256M -f 4 -w 5 -n 20 -a 3 --hot-cache  # as recorded
echo "== training throughput, ws = 1, 2, 4"
bench/train_scaling.py --build "$build" --repeats 5
echo "== bucket size x overlap, 2 ranks, emulated 10 GbE"
bench/overlap_sweep.py --build "$build" --np 2 --link 10gbe --repeats 3
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "== ddplab vs PyTorch DDP (gloo)"
  bench/vs_torch.py --build "$build" --repeats 5
else
  echo "== ddplab vs PyTorch DDP: skipped (apt-get install python3-torch to run it)"
fi
