#!/usr/bin/env bash
# The GPU pre-flight on a GPU machine (the `device` tool; bench/device/README.md has the calls), one stage per call,
# each within 9 minutes of command time:
#   bench/device/run.sh 1   build (ninja, sm_90, the targets below), ctest -L gpu, the quick kernel benchmark,
#                           allreduce_perf (NCCL at np 1, also with -G's CUDA graphs; our ring at np 2 and 4 on the
#                           one GPU, over the ipc link to 256 MiB and the host link to 8 MiB), a 20-step 4-rank
#                           --comm ring training run and its report, a rank's injected failure ending the job
#   bench/device/run.sh 2   speed: build, ctest -L gpu, the bf16 gpt2-small step (auto, fused) and through
#                           `ddplab train` (its median step beside the harness's), the GPU's idle in the trainer's
#                           steps and the harness's, the step as one CUDA graph, the host CPU's default MLP step
#                           (ddplab's BLAS kernels and OpenBLAS's own), the full kernel benchmark, ncu's ranking of
#                           the step, PyTorch eager, torch.compile and SDPA per backend on the same shapes, ncu on our
#                           fused attention; the GPU's clocks, power and temperature sampled throughout
#   bench/device/run.sh 3   most wanted first: the ipc link's calibrations, gpt2-small's runs with ranks sharing the
#                           GPU and their predictions from one rank, a peer killed mid-run, the sanitizers; then the
#                           default MLP over an emulated link, and the older checks (bench/device/README.md)
# Whatever fails, the summary comes back: every step runs under `timeout` (its own cap, never past the stage's
# deadline) and appends its row to $OUT/summary.txt as it ends, so a call cut short still returns the rows so far.
# Logs go to $OUT (or .device/out), flat: past 8 files (what the tool brings back) all but the table and the
# archives are packed into logs.tgz at the end.
# Knobs: DDPLAB_DEADLINE_S (540: the stage's budget, from the start of the script), DDPLAB_BUILD (build-device),
# DDPLAB_CAP_SCALE (1: multiplies every step's cap, for a slower machine's rehearsal, bench/device/simulate.sh),
# DDPLAB_RING_MAX (256M: the largest size of stage 1's ring over the ipc link), DDPLAB_ONLY (a regular expression:
# run only the steps whose names match, and the build). Each is checked first: a bad value is one line and exit 2.
# shellcheck disable=SC2016,SC2030,SC2031  # DETAIL: a snippet in single quotes, evaluated after the step, with
# its own $log in a subshell
set -uo pipefail  # no -e: a failed step is a row of the table, not the end of the call
cd "$(dirname "$0")/../.." || exit 2
stage=${1:-}
[ "$stage" = 1 ] || [ "$stage" = 2 ] || [ "$stage" = 3 ] || { echo "usage: bench/device/run.sh 1|2|3" >&2; exit 2; }
# The knobs, checked before anything runs: a bad value is this one line, not an arithmetic error or an unbound
# variable halfway through the call, on device time.
refuse() { echo "bench/device/run.sh: $1" >&2; exit 2; }
[[ ${DDPLAB_DEADLINE_S:-540} =~ ^[1-9][0-9]{0,4}$ ]] ||
  refuse "DDPLAB_DEADLINE_S=$DDPLAB_DEADLINE_S: expected whole seconds, 1 to 99999"
[[ ${DDPLAB_CAP_SCALE:-1} =~ ^[1-9][0-9]?$ ]] ||
  refuse "DDPLAB_CAP_SCALE=$DDPLAB_CAP_SCALE: expected a whole number, 1 to 99 (it multiplies every step's cap)"
[[ ${DDPLAB_RING_MAX:-256M} =~ ^[1-9][0-9]*[KMGkmg]?$ ]] ||
  refuse "DDPLAB_RING_MAX=$DDPLAB_RING_MAX: expected a size as allreduce_perf's -e takes it (32M: bytes, K, M or G)"
if [ -n "${DDPLAB_ONLY:-}" ]; then
  [[ x =~ $DDPLAB_ONLY ]]
  [ $? -ne 2 ] || refuse "DDPLAB_ONLY=$DDPLAB_ONLY: not a regular expression (POSIX extended, as bash's =~ reads it)"
fi
out=${OUT:-$PWD/.device/out}
build=${DDPLAB_BUILD:-build-device}
deadline=$((SECONDS + ${DDPLAB_DEADLINE_S:-540}))
work=$build/device-work  # what must not travel back: run files, profiles
# A warm machine keeps the last call's: emptied, so that no file of an earlier call comes back as this one's.
rm -rf "$work"
mkdir -p "$out" "$work"
summary=$out/summary.txt
failed=0

row() {  # NAME RESULT SECONDS DETAIL: one line of the table, on disk at once
  printf '%-28s %-14s %5s  %s\n' "$1" "$2" "$3" "$4" | tee -a "$summary"
}
skip() { row "$1" skipped 0 "$2"; }

# step NAME LOG CAP DETAIL CMD...: runs CMD with its output appended to $out/LOG, under `timeout` for CAP seconds or
# what is left before the deadline, then appends its row; DETAIL is a shell snippet whose output (first line) is the
# row's last column, evaluated with $log set to a copy of this step's part of LOG. Sets $rc (125: not run). While
# $blocked says why (the build failed), the step is only listed.
blocked=""
step() {
  local name=$1 log=$out/$2 cap=$(($3 * ${DDPLAB_CAP_SCALE:-1})) detail=$4 left=$((deadline - SECONDS - 5))
  local t0=$SECONDS result
  shift 4
  rc=125
  [ -z "$blocked" ] || { skip "$name" "$blocked" && return; }
  # DDPLAB_ONLY (a regular expression on the step names) spends a short call on the steps it names, and the build.
  if [ -n "${DDPLAB_ONLY:-}" ] && [ "$name" != configure ] && [ "$name" != build ] && ! [[ $name =~ $DDPLAB_ONLY ]]
  then
    skip "$name" "not in DDPLAB_ONLY" && return
  fi
  if [ "$left" -lt 15 ]; then
    skip "$name" "no time left before the stage's deadline"
    failed=1 && return
  fi
  [ "$cap" -gt "$left" ] && cap=$left
  # The start time lines the step up with stage 2's samples of the GPU's clocks (gpu_monitor.csv).
  echo "== $name (at most ${cap} s, from $(date +%T)): $*" >>"$log"
  local from=$(($(wc -l <"$log") + 1))  # this step's output starts here
  timeout -k 10 "$cap" "$@" >>"$log" 2>&1
  rc=$?
  case $rc in
    0) result=ok ;;
    124 | 137) result="TIMEOUT ${cap}s" && failed=1 ;;
    *) result="FAILED ($rc)" && failed=1 ;;
  esac
  local said
  # The detail reads this step's part of the log only: several steps share a log (three ncu rows all showed the
  # first one's "Duration" on the H200).
  said=$(part=$(mktemp) && tail -n +"$from" "$log" >"$part" && log=$part && eval "$detail" 2>/dev/null | head -1
          rm -f "$part")
  if [ "$rc" -ne 0 ]; then
    { echo "--- the last lines of ${log##*/}:"; tail -n 15 "$log"; } | sed 's/^/    /'
    # Without the detail it looks for, the row says why the step failed: its first line naming an error, else its
    # first line of output (a tool's own one-line refusal: "gpu_gaps: ...: No such file or directory").
    [ -n "$said" ] || said=$(tail -n +"$from" "$log" | grep -m1 -iE "error|fail|needs a GPU|no CUDA device|abort")
    [ -n "$said" ] || said=$(tail -n +"$from" "$log" | grep -m1 -v "^$")
  fi
  row "$name" "$result" $((SECONDS - t0)) "${said:0:150}"
}

tool() {  # the path of a CUDA tool, or nothing
  command -v "$1" 2>/dev/null || ls /usr/local/cuda/bin/"$1" /opt/nvidia/nsight-compute/*/"$1" 2>/dev/null | head -1
}

# ---- the machine, the bundle, the build ----------------------------------------------------------------------------
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>/dev/null | head -1)
: >"$summary"
echo "ddplab device stage $stage: ${gpu:-no GPU found}; $(nproc) cores; logs in $out" | tee -a "$summary"
row step result s detail

# The bundle travels packed (.device/carry); unpack it once per machine. Without it every step would fail at
# configure (no MPI, HDF5 or GTest): the call stops here, saying so. A failed unpack leaves no .device/root, so
# that the next call on this machine unpacks again.
tarball=.device/carry/ddplab-deps.tar.gz
if [ ! -d .device/root ] || [ "$tarball" -nt .device/root ]; then
  [ -f "$tarball" ] || { row bundle FAILED 0 "no $tarball: the call must carry .device/carry"; exit 1; }
  rm -rf .device/root && mkdir -p .device/root
  if ! said=$(tar -C .device/root -xzf "$tarball" 2>&1); then
    rm -rf .device/root
    row bundle FAILED 0 "unpacking $tarball: $(grep -m1 . <<<"$said")"
    exit 1
  fi
  touch .device/root
fi
glibc=$(ldd --version | head -1 | awk '{print $NF}')  # Debian 12's binaries need 2.36 or newer
if [ "$(printf '%s\n' 2.36 "$glibc" | sort -V | head -1)" != 2.36 ]; then
  row bundle FAILED 0 "glibc $glibc here, the bundle needs >= 2.36 (Debian 12)"
  exit 1
fi
. bench/device/env.sh .device/root

if [ "$stage" != 3 ]; then  # what the build and the runs see, with the bundle's paths set
  {
    nvidia-smi -q || true
    for c in "uname -srm" "lscpu | grep -E '^(Model name|CPU family|Model):'" "ldd --version" "nvcc --version" \
             "cmake --version" "g++ --version" nproc \
             "python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'"; do
      echo "\$ $c"; eval "$c" 2>&1 | head -4
    done
    for t in compute-sanitizer ncu nsys; do echo "$t: $(tool $t)"; done
    echo "glibc $glibc; bundle $DDPLAB_DEPS; NCCL: ${DDPLAB_CMAKE_ARGS:-beside CUDA}"
  } >"$out/machine.txt" 2>&1
fi

# Stage 1 builds what ctest -L gpu and its runs need; stage 2 what it runs (on a warm machine: nothing new).
targets="ddplab allreduce_perf bench_cuda_kernels test_cuda_ops test_cuda_kernels test_mlp_cuda test_transformer_cuda
         test_nccl_allreduce test_cuda_trainer test_ring_cuda"  # ctest -L gpu's tests, and the runs'
[ "$stage" = 2 ] && targets+=" bench_transformer_cuda"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
# The python3 on the PATH (there, the one with numpy, h5py and PyTorch) runs the tests' Python checks.
# shellcheck disable=SC2086  # DDPLAB_CMAKE_ARGS holds separate -D arguments
step configure build.log 120 'grep -o "CUDA engine ON.*" "$log" | tail -1' \
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDDPLAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DDDPLAB_PYTHON="$(command -v python3)" $DDPLAB_CMAKE_ARGS
[ "$rc" -eq 0 ] || blocked="configure failed"
# The GPU's idle gaps need CUPTI, which the configure may not have found (bench/gpu/CMakeLists.txt).
[ "$stage" = 2 ] && grep -qs "ddplab_gpu_trace" "$build/build.ninja" "$build/Makefile" && targets+=" ddplab_gpu_trace"
# shellcheck disable=SC2086
step build build.log 420 'echo "$(grep -c "warning:" "$log") warnings; $(grep -c "^\[" "$log") build steps"' \
  cmake --build "$build" -j "$(nproc)" --target $targets
[ "$rc" -eq 0 ] || blocked=${blocked:-"the build failed"}
mpirun=(mpirun --bind-to none --oversubscribe)

# ---- stage 1 --------------------------------------------------------------------------------------------------------
if [ "$stage" = 1 ]; then
  # What the machine is, as a user sees it first: the CPU's kernels, the GPU, and its table of timed GEMM algorithms
  # (the problems stage 2 timed, where stage 1 runs on the same machine after it).
  step "ddplab devices" train.log 30 'grep -m1 "GEMM algorithms" "$log" || grep -m1 "CUDA" "$log"' \
    "${mpirun[@]}" -np 1 "$build/launcher/ddplab" devices
  # In parallel (one GPU, 16 cores): the tests are small, and a test that hangs holds one slot, not the stage.
  step "ctest -L gpu" ctest.log 200 \
    'echo "$(grep -E "tests passed|tests failed" "$log" | tail -1); $(grep -c "(Skipped)" "$log") skipped"' \
    ctest --test-dir "$build" -L gpu --output-on-failure -j 8
  # The detail says whether cuBLASLt fused the bf16 bias+GELU (bench_cuda_kernels names the path it timed).
  step "kernels --quick" kernels.log 90 \
    'c=$(grep -m1 -o "cudaMemcpy device-to-device.*GB/s" "$log") && echo "$c; bf16 bias+GELU: $(grep -m1 -o \
      "matmul_bias_gelu_forward (bf16, [a-z ]*)" "$log" | grep -o "fused\|our epilogue")"' \
    "$build/bench/gpu/bench_cuda_kernels" --quick
  step "allreduce nccl np1 -z 0" allreduce.log 90 \
    'grep -E "^nccl +(8|67108864) " "$log" | awk "{print \$2 \" B \" \$6 \" us\"}" | paste -sd" "' \
    "${mpirun[@]}" -np 1 "$build/bench/allreduce_perf" -b 8 -e 256M --impls nccl
  # The plain launch beside -G's CUDA graphs (the -n 20 calls captured once, launched 20 times), each call waited
  # for (-z 2, no barrier between: nccl-tests' numbering): at small
  # sizes the graph rows show the collective without the per-call launch and host wait. The row above queues its
  # calls and waits once (-z 0, nccl-tests' default).
  step "allreduce graphs np1 -z 2" allreduce.log 90 \
    'grep -E "^[a-z-]*nccl[a-z-]* +8 " "$log" | awk "{print \$1, \$6 \" us\"}" | paste -sd" "' \
    "${mpirun[@]}" -np 1 "$build/bench/allreduce_perf" -b 8 -e 256M --impls nccl,gpu-ring-nccl -G 20 -z 2
  # Our ring on device buffers, np ranks sharing the one GPU (NCCL refuses that). The host link stops at 8 MiB: it
  # reaches its ~0.33 GB/s by then, and its sizes up to 256 MiB took 116 of the 247 s of a stage-1 call
  # (bench/results/2026-11-30-h200-collectives/allreduce.log), figures no doc quotes.
  for np in 2 4; do
    step "allreduce gpu-ring np$np" allreduce.log 120 \
      'grep "Avg bus bandwidth" "$log" | tail -1 | sed "s/# Avg bus bandwidth *: //"' \
      "${mpirun[@]}" -np $np "$build/bench/allreduce_perf" -b 8 -e "${DDPLAB_RING_MAX:-256M}" -w 3 -n 10 \
      --impls gpu-ring-ipc
    step "allreduce gpu-ring-host np$np" allreduce.log 60 \
      'grep "Avg bus bandwidth" "$log" | tail -1 | sed "s/# Avg bus bandwidth *: //"' \
      "${mpirun[@]}" -np $np "$build/bench/allreduce_perf" -b 8 -e 8M -w 3 -n 10 --impls gpu-ring-host
  done
  # What the host link's MPI hop can do on this machine: MPI_Allreduce and our ring on host buffers.
  step "allreduce host mpi np2" allreduce.log 60 \
    'grep "Avg bus bandwidth" "$log" | tail -2 | sed "s/# Avg bus bandwidth *: //" | paste -sd" "' \
    "${mpirun[@]}" -np 2 "$build/bench/allreduce_perf" -b 64K -e 64M -f 4 -w 3 -n 10 --impls mpi,ring
  step "train ring np4, 20 steps" train.log 120 'grep "ms mean (the slowest" "$log" | tail -1' \
    "${mpirun[@]}" -np 4 "$build/launcher/ddplab" train --device cuda --comm ring --steps 20 \
    --out "$work/train_ring_np4.h5" --force
  if [ "$rc" -ne 0 ] && [ -z "$blocked" ]; then
    skip "report of that run" "$([ "$rc" = 125 ] && echo "the run did not run" || echo "the run failed")"
  else
    step "report of that run" train.log 30 'grep -A2 "^  per rank (steady" "$log" | tail -1' \
      "$build/launcher/ddplab" report "$work/train_ring_np4.h5"
  fi
  # One GPU through `ddplab train` as a user runs it: --comm nccl (its header once threw: the CPU's collectives were
  # asked for the link), gpt2-small in bf16 with the default --attention auto (the header names what it chose).
  step "train nccl gpt2 bf16 np1" train.log 90 'grep "attention\|ms mean (the slowest" "$log" | tail -2 | tr "\n" " "' \
    "${mpirun[@]}" -np 1 "$build/launcher/ddplab" train --device cuda --comm nccl --model gpt2-small --head lm \
    --precision bf16 --lengths fixed --max-len 1024 --batch 8 --steps 12 --out "$work/train_nccl_gpt2.h5" --force
  # The default MLP on one GPU through NCCL: what `ddplab predict` models the MLP on 2, 4 and 8 GPUs from.
  step "train nccl mlp np1" train.log 40 'grep "ms mean (the slowest" "$log" | tail -1' \
    "${mpirun[@]}" -np 1 "$build/launcher/ddplab" train --device cuda --comm nccl --steps 30 --warmup-steps 10 \
    --out "$work/train_nccl_mlp.h5" --force
  # The MLP on more GPUs than the call has, from that run (on the host; the cells past one node marked as
  # extrapolated): one node of 2, 4 and 8 over NVLink, and 2 nodes x 8 over 400 Gb/s InfiniBand per GPU, flat and
  # hierarchical. The gpt2-small file's own prediction is recomputed from runs.tgz the same way (docs/PREDICT.md).
  step "predict mlp 8gpu from np1" train.log 20 \
    'grep -E "^recommended.* (8|16) ranks" "$log" | sed -E "s/^recommended \(.* ([0-9]+) ranks.*: ([0-9.]+ ms\/step).*/\1 ranks \2/" | tr "\n" " "' \
    bash -c '"$1" predict "$2" --ranks 1,2,4,8 --link nvlink4-nccl --bucket-mb 1,5,25 &&
             "$1" predict "$2" --ranks 16 --ranks-per-node 8 --link intra=nvlink4-nccl,inter=ndr400-x8 \
               --comm ring,hier --bucket-mb 1,5,25' _ "$build/launcher/ddplab" "$work/train_nccl_mlp.h5"
  # A rank that fails ends the whole job, at once, with its reason (the error path of CudaBackend's destructor).
  step "fault throw ring np2" train.log 60 'grep "error on rank 1" "$log" | tail -1' \
    bash -c 'said=$("$@" 2>&1); code=$?; echo "$said"; [ $code -ne 0 ] && grep -q "injected fault" <<<"$said"' _ \
    "${mpirun[@]}" -np 2 "$build/launcher/ddplab" train --device cuda --comm ring --steps 20 --fault throw \
    --fault-rank 1 --fault-step 5 --out "$work/fault.h5" --force
  # The lab as `make demo` runs it, on two of the host's cores: the 2-vCPU hosts the CPU figures come from, with
  # this machine's CPU (a Xeon of family 6 model 207 so far, on which OpenBLAS names Prescott). The row gives
  # weak_ws1's step with the BLAS kernels ddplab chose (the suite's header and `ddplab devices` say which).
  step "cpu: lab np4 on 2 cores" cpu.log 90 'grep -m1 "^  weak_ws1 " "$log" | tr -s " "' \
    taskset -c 0,1 "${mpirun[@]}" -np 4 "$build/launcher/ddplab" suite lab --device cpu --out-dir "$work/lab" --force
  # The stage's run files, for `ddplab report` and `ddplab predict`.
  (cd "$work" && tar -czf "$out/runs.tgz" ./train_*.h5 2>/dev/null)
fi

# ---- stage 2: speed ------------------------------------------------------------------------------------------------
# The bf16 gpt2-small step and what decides it, most wanted first (a deadline cuts from the end): the GPU tests, our
# step with the default attention (cuDNN's where it loads) and with our fused one, the trainer as a user runs it, the
# kernel benchmark, ncu's ranking of the default step's kernels, the peers (PyTorch eager, SDPA alone per backend,
# torch.compile), ncu on our fused attention's kernels.
if [ "$stage" = 2 ]; then
  step "ctest -L gpu" ctest.log 120 \
    'echo "$(grep -E "tests passed|tests failed" "$log" | tail -1); $(grep -c "(Skipped)" "$log") skipped"' \
    ctest --test-dir "$build" -L gpu --output-on-failure -j 8
  bt=("$build/bench/gpu/bench_transformer_cuda" --precision bf16 --steps 20 --warmup 5)
  # The GPU's clocks, power and temperature every 0.5 s through the timed steps, as they ran (the clocks are not
  # locked): a figure taken at a lower SM clock, or under a power or thermal cap, shows there beside its step's start
  # time in the logs. Stopped at the end of the stage; its row sums it up.
  monitor=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv \
      -lms 500 >"$out/gpu_monitor.csv" 2>&1 &
    monitor=$!
    trap '[ -z "$monitor" ] || kill "$monitor" 2>/dev/null' EXIT  # a call cut short leaves no sampler behind
  else
    skip "gpu monitor" "no nvidia-smi"
  fi
  # The first run times each GEMM's cuBLASLt candidates in its warm-up (--gemm-algo timed, the default) and keeps the
  # answers in the host's cache, which every later process reads; then the same step on the heuristic's first answers.
  step "step bf16 auto" models.log 40 'grep -E "^bf16|GEMM algorithms" "$log" | tail -2 | paste -sd" "' \
    "${bt[@]}" --csv "$out/step_auto.csv"
  step "step bf16 heuristic GEMM" models.log 40 'grep -E "^bf16" "$log" | tail -1' \
    "${bt[@]}" --gemm-algo heuristic --csv "$out/step_heuristic.csv"
  step "step bf16 fused" models.log 40 'grep -E "^bf16" "$log" | tail -1' \
    "${bt[@]}" --attention fused --csv "$out/step_fused.csv"
  # The price of --deterministic on: cuDNN's deterministic attention backward (dQ from a dS workspace, no atomics),
  # and ours (dQ from per-key-block shares).
  step "step bf16 deterministic" models.log 40 'grep -E "^bf16" "$log" | tail -1' \
    "${bt[@]}" --deterministic --csv "$out/step_deterministic.csv"
  step "step fused deterministic" models.log 40 'grep -E "^bf16" "$log" | tail -1' \
    "${bt[@]}" --attention fused --deterministic --csv "$out/step_fused_deterministic.csv"
  # The real trainer (one rank, NCCL, the run file written): it prints its steady-state mean and median step; the
  # harness gives the median of its steps, so the next step sets the trainer's median (the run file's summary) and
  # mean beside the harness's median.
  step "train gpt2 bf16 nccl np1" models.log 60 'grep -m2 "attention\|ms mean (the slowest" "$log" | tr "\n" " "' \
    "${mpirun[@]}" -np 1 "$build/launcher/ddplab" train --device cuda --comm nccl --model gpt2-small --head lm \
    --precision bf16 --lengths fixed --max-len 1024 --batch 8 --steps 40 --warmup-steps 10 \
    --out "$work/train_gpt2_bf16.h5" --force
  if [ "$rc" -ne 0 ] && [ -z "$blocked" ]; then
    skip "train gpt2 median vs harness" "$([ "$rc" = 125 ] && echo "the run did not run" || echo "the run failed")"
  else
    step "train gpt2 median vs harness" models.log 20 'grep -m1 "^trainer median" "$log"' \
      python3 bench/device/trainer_median.py "$work/train_gpt2_bf16.h5" "$out/step_auto.csv"
  fi
  # Where that trainer leaves the GPU idle (1.10x the harness's step with cuDNN's attention; the machine has no nsys):
  # CUPTI's record of steps 20-24 (libddplab_gpu_trace.so), the largest gaps named by the activities around them.
  # -x: the rank alone loads the tracer (an mpirun that touched CUDA would write its own, empty, trace over it).
  trace_lib=$(realpath -q "$build/bench/gpu/libddplab_gpu_trace.so")
  if [ -n "$blocked" ] || [ -f "$trace_lib" ]; then  # blocked: step says why
    step "trainer's GPU idle gaps" models.log 60 'grep -m1 "^idle" "$log"' \
      bash -c '"$@" && python3 bench/device/gpu_gaps.py "'"$work"'/gpu_trace.csv" 15 --steps 5' _ \
      "${mpirun[@]}" -np 1 -x DDPLAB_GPU_TRACE="$work/gpu_trace.csv" -x CUDA_INJECTION64_PATH="$trace_lib" \
      "$build/launcher/ddplab" train --device cuda --comm nccl --model gpt2-small --head lm \
      --precision bf16 --lengths fixed --max-len 1024 --batch 8 --steps 30 --warmup-steps 10 --profile-steps 20:24 \
      --out "$work/train_trace.h5" --force
    # The same for the harness's 20 timed steps: they run back to back with the host ahead (the first after a
    # synchronize), so their idle is what the stream itself leaves (memsets, a host wait inside a library call), the
    # trainer's floor.
    step "harness's GPU idle gaps" models.log 30 'grep "^idle" "$log" | tail -1' \
      bash -c 'env DDPLAB_GPU_TRACE="'"$work"'/harness_trace.csv" CUDA_INJECTION64_PATH="'"$trace_lib"'" "$@" &&
        python3 bench/device/gpu_gaps.py "'"$work"'/harness_trace.csv" 10 --steps 20' _ \
      "${bt[@]}" --profile
    # Then whether the trainer's longer step is that idle or slower kernels, and which: each kernel's time per step in
    # the two traces.
    step "trainer against harness" models.log 20 'grep "^busy per step" "$log" | tail -1' \
      python3 bench/device/gpu_gaps.py "$work/gpu_trace.csv" 20 --steps 5 --against "$work/harness_trace.csv" \
      --against-steps 20
  else
    skip "GPU idle gaps" "no libddplab_gpu_trace.so (CUPTI not found at configure)"
  fi
  # The same step captured once as a CUDA graph and replayed: what the host's launches cost it, beside the stream's.
  # A process of its own, so that a library that refuses the capture cannot cost the rows above.
  step "step bf16 auto as a graph" models.log 40 'grep "as one CUDA graph" "$log" | tail -1' \
    "${bt[@]}" --graph --csv "$out/step_graph.csv"
  # Batches of every length: bucket batching over lengths 64-1024, each step as long as its longest row, so cuDNN's
  # attention meets a new S in most steps. Its graphs specialised to each shape, then dynamic-shape graphs sharing
  # their kernels (DDPLAB_CUDNN_SHAPES): the builds' cost (the run's "cuDNN attention:" line) and the steps'.
  for shapes in static dynamic; do
    step "train gpt2 bucket lengths, $shapes shapes" models.log 45 \
      'echo "$(grep "^cuDNN attention:" "$log" | tail -1); $(grep "ms mean (the slowest" "$log" | tail -1 | tr -s " ")"' \
      env DDPLAB_CUDNN_SHAPES=$shapes "${mpirun[@]}" -x DDPLAB_CUDNN_SHAPES -np 1 "$build/launcher/ddplab" train \
      --device cuda --comm nccl --model gpt2-small --head lm --precision bf16 --batching bucket \
      --lengths loguniform --min-len 64 --max-len 1024 --batch 8 --steps 40 --warmup-steps 10 \
      --out "$work/train_gpt2_bucket_$shapes.h5" --force
    [ -f "$work/train_gpt2_bucket_$shapes.h5" ] && cp "$work/train_gpt2_bucket_$shapes.h5" "$out/"
  done
  # The host's CPU, for the CPU side's speed (docs/BENCHMARKS.md, "CPU speed on each host kind"): the H200 machines
  # seen so far are Intel Xeons, family 6 model 207, on which OpenBLAS names Prescott. The default MLP on one BLAS
  # thread with the kernels ddplab chooses (the header says which and why), then with OpenBLAS's own pick.
  step "cpu: devices" cpu.log 30 'grep -m1 "kernels" "$log"' "${mpirun[@]}" -np 1 "$build/launcher/ddplab" devices
  for auto in on off; do
    step "cpu: MLP, BLAS auto $auto" cpu.log 40 \
      'echo "$(grep -m1 -o "BLAS kernels [A-Za-z0-9]*" "$log"): $(grep -m1 -o "step *[0-9.]* ms mean" "$log" | tr -s " ")"' \
      "${mpirun[@]}" -np 1 -x DDPLAB_BLAS_AUTO=$auto "$build/launcher/ddplab" train --threads 1 --steps 30 \
      --warmup-steps 10 --out "$work/cpu_mlp_blas_$auto.h5" --force
  done
  # Our kernels at the step's shapes (every attention, the GEMMs and their epilogues, the memory-bound kernels), then
  # every launch of one default step ranked by GPU time. The ranking leaves the caches as the step leaves them
  # (--cache-control none): ncu's default empties them before each kernel, which times a small kernel that reads its
  # producer's output from L2 as if it read it from memory.
  step "kernels (full)" kernels.log 120 \
    'c=$(grep -m1 -o "cudaMemcpy device-to-device.*GB/s" "$log") && echo "$c; $(grep -m1 -o "memory-bound rows at[^:]*: [0-9]*" "$log")"' \
    "$build/bench/gpu/bench_cuda_kernels" --csv "$out/kernels.csv"
  ncu=$(tool ncu)
  app=("$build/bench/gpu/bench_transformer_cuda" --precision bf16 --warmup 2 --steps 1 --profile)
  if [ -n "$ncu" ]; then
    step "ncu: rank the step" ncu.log 90 'grep -m1 "^top:" "$log"' \
      bash -c '"$@" > "'"$work"'/launches.csv" && python3 bench/device/top_kernels.py "'"$work"'/launches.csv" 12' _ \
      "$ncu" --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum \
      --csv --page raw --print-units base --print-kernel-base function "${app[@]}"
  else
    skip "ncu" "not found (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute)"
  fi
  # The peers on the same shapes (they need no build of ours), and our fused attention's kernels in full.
  if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    blocked="" step "torch eager bf16" models.log 60 'grep -E "^bf16" "$log" | tail -1' \
      python3 bench/gpu/torch_transformer_step.py --precision bf16 --steps 20 --warmup 5 --csv "$out/torch_eager.csv"
    # The detail: cuDNN's forward/backward ms by events, then by its kernels' device time (the second table).
    blocked="" step "torch SDPA per backend" models.log 40 \
      'echo "cudnn fwd/bwd ms, events then kernels: $(grep -E "^cudnn " "$log" | awk "{print \$2 \"/\" \$4}" | paste -sd" ")"' \
      python3 bench/gpu/torch_attention.py --csv "$out/torch_attention.csv"
    blocked="" step "torch.compile bf16" models.log 150 'grep -E "^bf16" "$log" | tail -1' \
      python3 bench/gpu/torch_transformer_step.py --precision bf16 --steps 20 --warmup 5 --compile \
      --csv "$out/torch_compile.csv"
  else
    skip "torch steps" "no PyTorch with CUDA in python3"
  fi
  if [ -n "$ncu" ]; then
    for dir in forward backward; do
      step "ncu: fused $dir" ncu.log 60 'grep -m1 "Duration" "$log"' \
        bash -c '"$@" && "'"$ncu"'" --import "'"$work/ncu_flash_$dir"'.ncu-rep" --page details' _ \
        "$ncu" --clock-control none --profile-from-start off --kernel-name "regex:flash_attention_${dir}_kernel" \
        --launch-count 1 --set full --import-source yes -o "$work/ncu_flash_$dir" "${app[@]}" --attention fused
    done
    # LayerNorm backward, the step's largest kernel of ours under 80% of a copy of its bytes (51% of its size's on
    # 2026-12-04, with DRAM 33% busy): where its warps wait (the stall reasons, per source line) and what its memory
    # does, before it is reshaped again.
    step "ncu: layernorm backward" ncu.log 40 'grep -m1 "Duration" "$log"' \
      bash -c '"$@" && "'"$ncu"'" --import "'"$work/ncu_layernorm_backward"'.ncu-rep" --page details' _ \
      "$ncu" --clock-control none --profile-from-start off --kernel-name regex:layernorm_backward_kernel \
      --launch-count 1 --set full --import-source yes -o "$work/ncu_layernorm_backward" "${app[@]}"
    if ls "$work"/ncu_*.ncu-rep >/dev/null 2>&1; then  # the reports themselves, if they fit the 16 MiB a file
      (cd "$work" && tar -czf "$out/ncu-reports.tar.gz" ncu_*.ncu-rep)
      [ "$(stat -c %s "$out/ncu-reports.tar.gz")" -le $((15 << 20)) ] ||
        { rm "$out/ncu-reports.tar.gz"; echo "ncu reports over 15 MiB: left in $work" | tee -a "$summary"; }
    fi
  fi
  if [ -n "$monitor" ]; then
    kill "$monitor" 2>/dev/null
    wait "$monitor" 2>/dev/null
    monitor=""
    said=$(awk -F', ' 'NR > 1 && $2 + 0 > 0 {
             n++; sm = $2 + 0; mem = $3 + 0; w = $4 + 0; c = $5 + 0
             if (n == 1 || sm < sm_lo) sm_lo = sm; if (sm > sm_hi) sm_hi = sm; if (n == 1 || mem < mem_lo) mem_lo = mem
             if (w > w_hi) w_hi = w; if (c > c_hi) c_hi = c }
           END { if (n) printf "%d samples: SM %d-%d MHz, memory from %d MHz, power to %.0f W, to %d C\n",
                              n, sm_lo, sm_hi, mem_lo, w_hi, c_hi }' "$out/gpu_monitor.csv")
    if [ -n "$said" ]; then
      row "gpu monitor" ok 0 "$said"
    else
      row "gpu monitor" "FAILED" 0 "no samples: $(grep -m1 . "$out/gpu_monitor.csv")" && failed=1
    fi
  fi
  # The trainer's np 1 run file: what `ddplab predict` models more GPUs from (docs/PREDICT.md).
  [ -f "$work/train_gpt2_bf16.h5" ] && cp "$work/train_gpt2_bf16.h5" "$out/"
fi

# ---- stage 3 --------------------------------------------------------------------------------------------------------
# What stages 1 and 2 leave open, most wanted first (a deadline cuts from the end; the recipe's 200 s call on a fresh
# machine has ~135 s after its build): the ipc link's calibrations, gpt2-small's DDP runs with ranks sharing the GPU
# and their predictions from one rank, a peer killed mid-run, the sanitizers on the kernels' tests; then the default
# MLP over an emulated link and its predictions, memcheck over the ops' and models' tests, why each skipped GPU test
# skipped, replicas compared bitwise, the sweep and the lab suite at 4 ranks, and ncu on the fused attention's
# backward in a steady-state training step (--profile-steps).
if [ "$stage" = 3 ]; then
  rm -f "$work"/ipc_*.json  # a failed step below must leave no earlier call's file for predict to read
  for mb in 4 64; do  # each exchange's fixed cost on a GPU shared by the ranks is paid once per chunk
    step "gpu-ring-ipc np2 chunk $mb" allreduce.log 45 'grep "Avg bus bandwidth" "$log" | tail -1' \
      "${mpirun[@]}" -np 2 "$build/bench/allreduce_perf" -b 1M -e 256M -f 4 -w 2 -n 5 --impls gpu-ring-ipc \
      --hot-cache --gpu-chunk-mb $mb -J "$work/ipc_np2_chunk$mb.json"
  done
  # The 4 ranks' all-reduce on the shared GPU: with the one above, what `ddplab predict --ranks-per-gpu` times the
  # shared runs' all-reduces with (below). --hot-cache: each call on the same buffers, as a bucket is reduced right
  # after backward wrote it (docs/PREDICT.md).
  step "gpu-ring-ipc np4" allreduce.log 45 'grep "Avg bus bandwidth" "$log" | tail -1' \
    "${mpirun[@]}" -np 4 "$build/bench/allreduce_perf" -b 1M -e 256M -f 4 -w 2 -n 5 --impls gpu-ring-ipc \
    --hot-cache -J "$work/ipc_np4.json"
  step "gpt2-small bf16 ring np2" train.log 60 'grep -m1 "ms mean (the slowest" "$log"' \
    "${mpirun[@]}" -np 2 "$build/launcher/ddplab" train --device cuda --comm ring --model gpt2-small \
    --precision bf16 --head lm --lengths fixed --max-len 1024 --batch 8 --steps 10 --warmup-steps 3 \
    --out "$work/gpt2_bf16_np2.h5" --force
  # The closing bucket on a shared GPU (docs/BENCHMARKS.md, "Predictions for the next call"): the same run with a
  # bf16 wire, then with each bucket's update behind its own all-reduce; and a peer killed mid-run.
  gpt2_ipc=("$build/launcher/ddplab" train --device cuda --comm ring --ring-link ipc --model gpt2-small
            --precision bf16 --head lm --lengths fixed --max-len 1024 --batch 8 --steps 10 --warmup-steps 3 --force)
  gpt2_np2=("${mpirun[@]}" -np 2 "${gpt2_ipc[@]}")
  # One rank alone on the GPU: what `ddplab predict --ranks-per-gpu` predicts the 2- and 4-rank runs from.
  step "gpt2-small bf16 ring ipc np1" train.log 40 'grep -m1 "ms mean (the slowest" "$log"' \
    "${mpirun[@]}" -np 1 "${gpt2_ipc[@]}" --out "$work/gpt2_bf16_np1.h5"
  step "gpt2-small bf16 ring ipc np2, bf16 wire" train.log 60 'grep -m1 "ms mean (the slowest" "$log"' \
    "${gpt2_np2[@]}" --comm-dtype bf16 --out "$work/gpt2_bf16_wire_np2.h5"
  step "gpt2-small bf16 ring ipc np2, update by bucket" train.log 60 'grep -m1 "ms mean (the slowest" "$log"' \
    "${gpt2_np2[@]}" --optimizer-in-backward on --out "$work/gpt2_bucketed_np2.h5"
  # What `ddplab predict` recommends from the 25 MiB run on a shared GPU: fewer buckets, each paying the switches.
  step "gpt2-small bf16 ring ipc np2, 100 MiB buckets" train.log 60 'grep -m1 "ms mean (the slowest" "$log"' \
    "${gpt2_np2[@]}" --bucket-mb 100 --out "$work/gpt2_100mb_np2.h5"
  # The 2-rank run's exposed wait, split: the buckets still finishing when backward ended, wte's own all-reduce.
  step "gpt2-small bf16 ring np2: exposed split" train.log 20 'grep -m1 "a step: " "$log"' \
    "$build/launcher/ddplab" report "$work/gpt2_bf16_np2.h5"
  # Four ranks on the GPU: with np 1's and np 2's runs, what sharing costs the compute and each all-reduce.
  step "gpt2-small bf16 ring ipc np4" train.log 90 'grep -m1 "ms mean (the slowest" "$log"' \
    "${mpirun[@]}" -np 4 "${gpt2_ipc[@]}" --out "$work/gpt2_bf16_np4.h5"
  # Those runs predicted from the one-rank run and the all-reduces measured above (docs/PREDICT.md, "Another number of
  # ranks on the GPU"); the measured runs' steps are in train.log beside them.
  # At 2 ranks from both chunks' calibrations: the 4 MiB one times many exchanges a size (docs/PREDICT.md), and the
  # settings the 2-rank runs above tried.
  for file in ipc_np2_chunk64 ipc_np2_chunk4 ipc_np4; do
    cal="$work/$file.json" n=2 && [ "$file" = ipc_np4 ] && n=4
    chunk=${file#ipc_np?} && chunk=${chunk#_}
    step "predict np$n from np1${chunk:+ $chunk}" train.log 20 'grep -m1 -E "^none +'"$n"' " "$log"' \
      "$build/launcher/ddplab" predict "$work/gpt2_bf16_np1.h5" --ranks $n --ranks-per-gpu $n --calibration "$cal" \
      --bucket-mb 25,100 --comm-dtype fp32,bf16 --update whole,bucket
  done
  # A rank killed (SIGKILL) at step 10 of 2 and of 4 sharing the GPU: the job ends in seconds naming it, and the
  # snapshot taken at step 10 (--flush-every 5) is left for `ddplab report` to read.
  for n in 2 4; do
    victim=$((n - 1))
    # The step passes only where the job failed for the kill: mpirun's line naming the victim's signal.
    step "dead peer ring ipc np$n (must fail in time)" train.log 40 'grep -m1 "exited on signal" "$log"' \
      bash -c 'log=$("$@" 2>&1); rc=$?; echo "$log"
               [ $rc -ne 0 ] && grep -q "rank '"$victim"' .*exited on signal" <<<"$log"' \
      dead_peer "${mpirun[@]}" -np $n "$build/launcher/ddplab" train --device cuda --comm ring \
      --ring-link ipc --steps 40 --fault kill --fault-rank $victim --fault-step 10 --timeout-s 20 --flush-every 5 \
      --out "$work/dead_peer_np$n.h5" --force
    step "dead peer np$n: the snapshot left" train.log 20 'grep -m1 "status:" "$log"' \
      "$build/launcher/ddplab" report "$work/dead_peer_np$n.h5.partial"
  done
  # compute-sanitizer over the kernels' tests: memcheck, and racecheck on the kernels with shared memory.
  sanitizer=$(tool compute-sanitizer)
  t=$build/tests/gpu
  if [ -n "$sanitizer" ]; then
    # Less the tests that provoke a CUDA API error on purpose (a refused launch, an allocation past the GPU's memory),
    # which memcheck counts as errors.
    step "memcheck kernels" sanitizer.log 90 'grep -m1 "ERROR SUMMARY" "$log"' \
      "$sanitizer" --tool memcheck --error-exitcode 3 "$t/test_cuda_kernels" --gtest_brief=1 \
      --gtest_filter='-*PastTheSharedMemoryIsRefused*'
    # The kernels with shared memory: LayerNorm backward, the cross-entropy's block reductions, bias_backward, and the
    # fused attention's tiles (its smallest test: two sequences, three blocks, causal).
    step "racecheck kernels" sanitizer.log 90 'grep "RACECHECK SUMMARY\|ERROR SUMMARY" "$log" | tail -1' \
      "$sanitizer" --tool racecheck --racecheck-report hazard --error-exitcode 3 "$t/test_cuda_kernels" \
      --gtest_brief=1 \
      --gtest_filter='*LayerNorm*:*SoftmaxCrossEntropy*:CudaKernels.GemmFp32MatchesCpu:*BiasBackward*:*FlashAttentionIsDeterministic*'
  else
    skip "compute-sanitizer" "not found (PATH, /usr/local/cuda/bin)"
  fi
  # An emulated link on the GPU ring (--link): the default MLP alone on the GPU, then 2 and 4 ranks sharing it over an
  # emulated 10 GbE, each predicted from the one-rank run; and 2 ranks' sweep, every point predicted from its first.
  # Each prediction twice: from the link's latency alone, and with a calibration of the same ring over the same
  # emulated link on the shared GPU at sizes 64x apart, which measures what every message step costs there (the ranks'
  # turns on the GPU) where the MLP's two buckets, 7.9 and 4 MiB, are too alike to fit it.
  mlp_ipc=("$build/launcher/ddplab" train --device cuda --comm ring --ring-link ipc --steps 30 --warmup-steps 10 --force)
  step "mlp ring ipc np1" train.log 30 'grep -m1 "ms mean (the slowest" "$log"' \
    "${mpirun[@]}" -np 1 "${mlp_ipc[@]}" --out "$work/mlp_np1.h5"
  for n in 2 4; do
    step "gpu-ring-ipc np$n, 10gbe" allreduce.log 30 'grep "Avg bus bandwidth" "$log" | tail -1' \
      "${mpirun[@]}" -np $n "$build/bench/allreduce_perf" -b 256K -e 16M -f 4 -w 2 -n 5 --impls gpu-ring-ipc \
      --hot-cache --link 10gbe -J "$work/ipc_10gbe_np$n.json"
    step "mlp ring ipc np$n, 10gbe" train.log 40 'grep -m1 "ms mean (the slowest" "$log"' \
      "${mpirun[@]}" -np $n "${mlp_ipc[@]}" --link 10gbe --out "$work/mlp_10gbe_np$n.h5"
    step "predict mlp np$n 10gbe from np1" train.log 20 'grep -m1 -E "^10gbe +'"$n"' " "$log"' \
      "$build/launcher/ddplab" predict "$work/mlp_np1.h5" --ranks $n --ranks-per-gpu $n --link 10gbe
    step "predict mlp np$n 10gbe from np1, calibrated" train.log 20 'grep -m1 -E "^10gbe +'"$n"' " "$log"' \
      "$build/launcher/ddplab" predict "$work/mlp_np1.h5" --ranks $n --ranks-per-gpu $n --link 10gbe \
      --calibration "$work/ipc_10gbe_np$n.json"
  done
  step "sweep mlp ring np2 10gbe --predict, calibrated" train.log 90 'grep -m1 "^|error|" "$log"' \
    "${mpirun[@]}" -np 2 "$build/launcher/ddplab" sweep --device cuda --comm ring --ring-link ipc --link 10gbe \
    --predict --calibration "$work/ipc_10gbe_np2.json" --bucket-mb 1,5,25 --overlap on,off --steps 12 \
    --warmup-steps 4 --out-dir "$work/sweep_10gbe_np2" --force
  # The same cells predicted from the sweep's first run alone (its table has them measured).
  step "predict the sweep's cells uncalibrated" train.log 20 'grep -m1 -E "^10gbe +2 .* 1 +auto" "$log"' \
    "$build/launcher/ddplab" predict "$work/sweep_10gbe_np2/predict_from.h5" --bucket-mb 1,5,25 --overlap on,off
  # memcheck over the ops' and the models' tests (their kernels are the ones checked above).
  if [ -n "$sanitizer" ]; then
    step "memcheck ops" sanitizer.log 30 'grep "ERROR SUMMARY" "$log" | tail -1' \
      "$sanitizer" --tool memcheck --error-exitcode 3 "$t/test_cuda_ops" --gtest_brief=1
    step "memcheck models" sanitizer.log 90 'grep "ERROR SUMMARY" "$log" | tail -1' \
      bash -c 'for t; do "'"$sanitizer"'" --tool memcheck --error-exitcode 3 "$t" --gtest_brief=1 \
               --gtest_filter="*/fp32:*/bf16:*Device*-*TooLargeForTheGpu*" || exit; done' _ \
      "$t/test_mlp_cuda" "$t/test_transformer_cuda"
  fi
  step "ctest -L gpu -V" ctest.log 120 'echo "$(grep -E "tests passed|tests failed" "$log" | tail -1); $(grep -c "\[  SKIPPED \] [A-Z]" "$log") gtest skips"' \
    ctest --test-dir "$build" -L gpu -V -j 8
  ddplab=("${mpirun[@]}" -np 4 "$build/launcher/ddplab")
  step "check-sync ring np4" train.log 60 'grep -m1 "ms mean (the slowest" "$log"' \
    "${ddplab[@]}" train --device cuda --comm ring --steps 20 --check-sync 1 --out "$work/check_sync_np4.h5" --force
  step "sweep ring np4" train.log 90 'grep -m1 -i "best" "$log"' \
    "${ddplab[@]}" sweep --device cuda --comm ring --steps 12 --warmup-steps 4 --out-dir "$work/sweep_np4" --force
  # What `make demo` runs on a GPU machine: the lab's cases, 4 ranks sharing the GPU over the ring's ipc link.
  step "suite lab --device cuda np4" train.log 150 'grep -m1 "^summary:" "$log"' \
    "${ddplab[@]}" suite lab --device cuda --out-dir "$work/suite_lab" --force
  ncu=$(tool ncu)
  # Our fused attention's backward inside a steady-state training step (`ddplab train --profile-steps`), as a user
  # profiles it.
  [ -n "$ncu" ] && step "ncu: fused bwd, step 4" ncu.log 90 'grep -m1 "Duration" "$log"' \
    "${mpirun[@]}" -np 1 "$ncu" --clock-control none --profile-from-start off \
    --kernel-name regex:flash_attention_backward_kernel \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    "$build/launcher/ddplab" train --device cuda --model gpt2-small --precision bf16 --attention fused --head lm \
    --lengths fixed \
    --max-len 1024 --batch 8 --steps 6 --warmup-steps 2 --profile-steps 4:4 --out "$work/ncu_run.h5" --force
  # The partial file a killed run leaves (<out>.partial) comes back too: it must hold the steps before the kill.
  (cd "$work" && tar -czf "$out/runs.tgz" ./*.h5 ./*.partial ./*.json sweep_np4 sweep_10gbe_np2 suite_lab 2>/dev/null)
fi

# At most 8 files come back: past that, whatever the stage wrote, everything but the table and the archives travels
# as one more archive (stage 2 on a GPU always needs it: its CSVs and profiles).
if [ "$(find "$out" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  (cd "$out" && tar -czf logs.tgz --exclude=summary.txt --exclude='*.tgz' --exclude='*.tar.gz' ./* &&
    find . -maxdepth 1 -type f ! -name '.*' ! -name summary.txt ! -name '*.tgz' ! -name '*.tar.gz' -delete) ||
    { row "pack logs" FAILED 0 "tar: the files past 8 may not come back" && failed=1; }
fi
echo "stage $stage: $((SECONDS)) s; files: $(cd "$out" && ls | paste -sd' ')" | tee -a "$summary"
exit $failed
