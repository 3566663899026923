#!/bin/sh
# Every kernel source compiles for the GPUs before the default build's sm_90: sm_80 (A100, where the tensor-core
# kernels run) and sm_75 (where they compile as stubs that the launchers never reach, refusing the device first).
# Device code only (--ptx): a front-end error is what another architecture meets, and ptxas's time is saved.
# usage: compile_older_archs.sh NVCC SOURCE_DIR INCLUDE_DIR...
set -eu
nvcc=$1 src=$2
shift 2
includes=""
for dir in "$@"; do includes="$includes -isystem $dir"; done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failed=0
for cu in "$src"/kernels/cuda/*.cu; do
  for arch in 75 80; do
    # shellcheck disable=SC2086 # one word per include flag
    if ! "$nvcc" --ptx -arch=compute_$arch -std=c++17 -DDDPLAB_HAVE_CUDA=1 -I"$src" $includes "$cu" \
        -o "$out/$(basename "$cu").$arch.ptx"; then
      echo "FAIL: ${cu#"$src"/} does not compile for sm_$arch"
      failed=1
    fi
  done
done
[ "$failed" = 0 ] && echo "every kernels/cuda/*.cu compiles for sm_75 and sm_80"
exit "$failed"
