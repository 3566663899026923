#!/bin/bash
# The flash-mma branch's fused attention on the GPU: build, the Flash tests, the kernel bench, racecheck, ncu.
set -uo pipefail
R=$PWD; W=/tmp/wt; T0=$SECONDS
mkdir -p $W/.device && tar xzf build-flash-mma/src.tgz -C $W && ln -s $R/.device/carry $W/.device/carry && cd $W || exit 2
mkdir -p .device/root && tar -C .device/root -xzf .device/carry/ddplab-deps.tar.gz && . bench/device/env.sh .device/root
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
{ cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPLAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DDDPLAB_PYTHON="$(command -v python3)" $DDPLAB_CMAKE_ARGS && \
  cmake --build b -j16 --target test_cuda_kernels bench_cuda_kernels; } > $OUT/build.log 2>&1
echo "build rc $? at $((SECONDS - T0)) s"; grep -E "error" $OUT/build.log | head -5
timeout 60 b/tests/gpu/test_cuda_kernels --gtest_filter='*Flash*' > $OUT/test.log 2>&1
echo "test rc $? at $((SECONDS - T0)) s"; grep -E "^flash|FAILED|PASSED|Failure" $OUT/test.log | head -40
timeout 100 b/bench/gpu/bench_cuda_kernels --csv $OUT/kernels.csv > $OUT/kernels.log 2>&1
echo "bench rc $? at $((SECONDS - T0)) s"; grep -iE "attention|flash|device" $OUT/kernels.log | head -20
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
timeout 70 $CS --tool racecheck b/tests/gpu/test_cuda_kernels --gtest_filter='CudaKernels.FlashAttentionMatchesCpu' > $OUT/racecheck.log 2>&1
echo "racecheck rc $? at $((SECONDS - T0)) s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" $OUT/racecheck.log | head -5
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for k in forward backward; do
  timeout 50 $NCU --clock-control none -k regex:flash_attention_${k}_kernel -c 1 --section SpeedOfLight \
    --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    b/bench/gpu/bench_cuda_kernels --reps 3 --inner 1 > $OUT/ncu_$k.log 2>&1
  echo "ncu $k rc $? at $((SECONDS - T0)) s"
  grep -E "flash_attention_|Duration|Registers Per|Theoretical Occ|Achieved Occ|Compute \(SM\) Th|Memory Throughput|No Eligible|Local|Dynamic Shared|Bank" $OUT/ncu_$k.log | head -24
done
