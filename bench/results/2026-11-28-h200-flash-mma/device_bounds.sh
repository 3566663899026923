#!/bin/bash
# The backward at 3 CTAs per SM (168 registers, 4 bytes spilled) against the committed 2 (228): tests, the bench twice each.
set -uo pipefail
R=$PWD; T0=$SECONDS
for v in 0 3; do
  W=/tmp/wt$v; src=build-flash-mma/src.tgz; [ $v = 3 ] && src=build-flash-mma/src_b3.tgz
  mkdir -p $W/.device && tar xzf $src -C $W && ln -s $R/.device/carry $W/.device/carry || exit 2
done
cd /tmp/wt0 && mkdir -p .device/root && tar -C .device/root -xzf .device/carry/ddplab-deps.tar.gz && . bench/device/env.sh .device/root
for v in 0 3; do
  cd /tmp/wt$v
  { cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPLAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DDDPLAB_PYTHON="$(command -v python3)" $DDPLAB_CMAKE_ARGS && \
    cmake --build b -j16 --target test_cuda_kernels bench_cuda_kernels; } > $OUT/build_$v.log 2>&1
  echo "build $v rc $? at $((SECONDS - T0)) s"; grep -E "error" $OUT/build_$v.log | head -5
done
cd /tmp/wt3 && timeout 60 b/tests/gpu/test_cuda_kernels --gtest_filter='*Flash*' > $OUT/test_b3.log 2>&1
echo "test b3 rc $? at $((SECONDS - T0)) s"; grep -E "FAILED|PASSED|Failure" $OUT/test_b3.log | head -5
for i in 1 2; do for v in 0 3; do
  timeout 60 /tmp/wt$v/b/bench/gpu/bench_cuda_kernels > $OUT/kernels_${v}_$i.log 2>&1
  echo "bench variant $v run $i rc $? at $((SECONDS - T0)) s"; grep -E "flash_attention" $OUT/kernels_${v}_$i.log
done; done
