#!/usr/bin/env bash
# On a GPU machine (the `device` tool; bench/device/README.md), in one go: unpack the dependency bundle, configure
# and build with CUDA for sm_90, run the GPU tests, the GPU kernel benchmark and the models' step benchmarks (ours and
# PyTorch's), and print one summary table.
# Logs and CSVs go to $OUT (what the tool brings back: at most 8 files), or .device/out elsewhere.
#   bench/device/run.sh
# Knobs: DDPLAB_BUILD (build folder, build-device), DDPLAB_TARGETS (default: all), DDPLAB_CTEST (ctest's selection,
# default "-L gpu"; "" runs every test), DDPLAB_BENCH (bench_cuda_kernels' arguments: default none, the full run,
# ~1 min; "--quick" for a smoke test).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/.device/out}
build=${DDPLAB_BUILD:-build-device}
mkdir -p "$out"
rows=()   # "step<TAB>result<TAB>seconds<TAB>detail", printed at the end

# step NAME LOG CMD...: runs CMD with its output in $out/LOG, records a row, never stops the script.
step() {
  local name=$1 log=$out/$2 t0=$SECONDS rc=0
  shift 2
  echo "== $name: $*" | tee -a "$log"
  "$@" >>"$log" 2>&1 || rc=$?
  last_rc=$rc
  rows+=("$name"$'\t'"$([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)")"$'\t'"$((SECONDS - t0))"$'\t')
  [ $rc -eq 0 ] || tail -n 30 "$log"
}
note() { rows[${#rows[@]}-1]+=$1; }   # the detail column of the last row

# The machine, first: what the rest ran on.
{
  nvidia-smi -q || true
  for c in "uname -srm" "ldd --version" "nvcc --version" "cmake --version" "g++ --version" nproc; do
    echo "\$ $c"; $c 2>&1 | head -4 || true
  done
} >"$out/machine.txt" 2>&1
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)

# The bundle travels packed (.device/carry); unpack it once per machine.
tarball=.device/carry/ddplab-deps.tar.gz
if [ ! -d .device/root ] || [ "$tarball" -nt .device/root ]; then
  rm -rf .device/root && mkdir -p .device/root && tar -C .device/root -xzf "$tarball" && touch .device/root
fi
# Debian 12's binaries need glibc 2.36 or newer.
glibc=$(ldd --version | head -1 | awk '{print $NF}')
[ "$(printf '%s\n' 2.36 "$glibc" | sort -V | head -1)" = 2.36 ] ||
  { echo "run.sh: glibc $glibc here, the bundle needs >= 2.36 (Debian 12)" | tee "$out/summary.txt"; exit 1; }
. bench/device/env.sh .device/root
echo "glibc $glibc, bundle: $DDPLAB_DEPS, ${DDPLAB_CMAKE_ARGS:-NCCL beside CUDA}"

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
# The python3 on the PATH (there, the one with numpy and h5py), not /usr/bin's, runs the tests' Python checks.
# shellcheck disable=SC2086  # DDPLAB_CMAKE_ARGS holds separate -D arguments
step configure build.log cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDDPLAB_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DDDPLAB_PYTHON="$(command -v python3)" $DDPLAB_CMAKE_ARGS
note "$(grep -o 'CUDA engine ON.*' "$out/build.log" | head -1)"
if [ "$last_rc" -eq 0 ]; then
  # shellcheck disable=SC2086
  step build build.log cmake --build "$build" -j "$(nproc)" ${DDPLAB_TARGETS:+--target $DDPLAB_TARGETS}
  note "$(grep -c -i 'warning:' "$out/build.log" || true) warnings"
fi

if [ "${last_rc:-1}" -eq 0 ]; then
  # shellcheck disable=SC2086
  step "ctest ${DDPLAB_CTEST--L gpu}" ctest.log ctest --test-dir "$build" ${DDPLAB_CTEST--L gpu} \
       --output-on-failure --timeout 300
  note "$(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)"
  note "; $(grep -c '\*\*\*Skipped' "$out/ctest.log" || true) skipped"
  b=$build/bench/gpu/bench_cuda_kernels
  if [ -x "$b" ]; then
    # shellcheck disable=SC2086
    step bench_cuda_kernels bench.log "$b" ${DDPLAB_BENCH:-} --csv "$out/gpu_kernels.csv"
    note "$(grep -m1 -o 'cudaMemcpy device-to-device.*GB/s' "$out/bench.log" || true)"
  fi
  a=$build/bench/allreduce_perf
  if [ -x "$a" ]; then  # NCCL on GPU buffers at ws=1, nccl-tests' columns
    step "allreduce_perf nccl np1" allreduce.log mpirun -np 1 "$a" -b 8 -e 256M --impls nccl
    note "$(grep -m1 'Avg bus bandwidth' "$out/allreduce.log" || true)"
    # Our ring on GPU buffers: np 2 and 4 share the one GPU (ipc and host links; NCCL refuses that).
    for np in 2 4; do
      step "allreduce_perf gpu-ring np$np" allreduce.log mpirun --oversubscribe -np $np "$a" -b 8 -e 256M \
           --impls gpu-ring-ipc,gpu-ring-host
      note "$(grep 'Avg bus bandwidth' "$out/allreduce.log" | tail -1 || true)"
    done
  fi
  d=$build/launcher/ddplab
  if [ -x "$d" ]; then  # --comm ring with four ranks on one GPU: trains, and the run file says how
    step "ddplab train ring np4" models.log mpirun --oversubscribe -np 4 "$d" train --device cuda --comm ring \
         --steps 60 --out "$build/train_ring_np4.h5"  # $out holds at most 8 files: logs only
    note "$(tail -n 1 "$out/models.log")"
  fi
  # The models' training steps, fp32/tf32/bf16, into one log (the tool brings back 8 files): the default MLP, then
  # gpt2-small (tokens/s, MFU), then PyTorch eager on the same two for the side-by-side.
  m=$build/bench/gpu/bench_mlp_cuda
  if [ -x "$m" ]; then
    step bench_mlp_cuda models.log "$m"
  fi
  t=$build/bench/gpu/bench_transformer_cuda
  if [ -x "$t" ]; then
    step bench_transformer_cuda models.log "$t"
    note "$(grep -E '^bf16' "$out/models.log" | tail -1)"
  fi
  if python3 -c 'import torch' 2>/dev/null; then
    step torch_mlp_step models.log python3 bench/gpu/torch_mlp_step.py
    step torch_transformer_step models.log python3 bench/gpu/torch_transformer_step.py
    note "$(grep -E '^bf16' "$out/models.log" | tail -1)"
  fi
fi

# One table: each step, its result, its time, and the line that says most about it.
{
  echo
  echo "ddplab on the device: ${gpu:-no GPU found}; $(nproc) cores; logs in $out"
  printf '%-26s %-12s %6s  %s\n' step result seconds detail
  for r in "${rows[@]}"; do
    IFS=$'\t' read -r s res sec det <<<"$r"
    printf '%-26s %-12s %6s  %s\n' "$s" "$res" "$sec" "$det"
  done
} | tee "$out/summary.txt"
for r in "${rows[@]}"; do case $r in *$'\t'FAILED*) exit 1 ;; esac; done
