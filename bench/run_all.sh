#!/usr/bin/env bash
# Every CPU benchmark recorded in docs/BENCHMARKS.md, in one go (about 10 minutes on the 2-core dev machine).
#   bench/run_all.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== CPU ops at the default MLP's shapes"
# Exit 1 is a finding the program prints (the kernels in use MISSED 85% of the best family's rate); any other
# failure stops the script.
"$build/bench/bench_cpu_ops" --repeats 30 || [ $? -eq 1 ]
echo "== all-reduce, 2 ranks (nccl-tests columns)"
scripts/mpirun.sh -np 2 "$build/bench/allreduce_perf" -b 8 -e 256M -f 4 -w 5 -n 20 -a 3  # -a 3: as recorded
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
