#!/usr/bin/env bash
# Fuzzes the run-file reader, the checkpoint loader and the command line (docs/FUZZING.md):
#   scripts/fuzz.sh [SECONDS] [TARGET...]     SECONDS per target (default 60); TARGET: run_file checkpoint cli
# Builds the libFuzzer binaries (clang, ASan + UBSan) in build-fuzz/, runs each target for SECONDS starting from
# its committed corpus, then merges into tests/fuzz/corpus/<target>/ only the new inputs that add coverage
# (-merge=1), so the committed corpus stays small. Crashing inputs land in build-fuzz/artifacts/<target>/,
# each triaged as ours or libhdf5's. Exit code 1 if any is ours.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(run_file checkpoint cli)
build=$root/build-fuzz

cmake -S "$root" -B "$build" -DDDPLAB_FUZZ=ON -DDDPLAB_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null || exit 1
cmake --build "$build" -j"${JOBS:-2}" --target "${targets[@]/#/fuzz_}" || exit 1

# One BLAS thread: the fuzzers never multiply large matrices, and the machine may be shared.
export OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
export LSAN_OPTIONS=suppressions=$root/tests/fuzz/lsan.supp

# Reproduces an artifact and says whose bug it is: "libhdf5" when the first frame below the sanitizer, libc and
# libstdc++ is in libhdf5 (nothing we can fix; see docs/FUZZING.md), "ours" otherwise (UB, an uncaught exception,
# a crash or allocation in our code), "no-repro" when it does not crash on its own.
triage() {
  local out frame
  out=$(ASAN_OPTIONS=fast_unwind_on_malloc=0 timeout 60 "$1" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        "$2" 2>&1)
  frame=$(grep -E '^ +#[0-9]+ ' <<<"$out" | grep -vE '__interceptor|__sanitizer|__asan|__ubsan|__lsan|fuzzer::|libc\.so|libstdc\+\+|/nptl/|/stdlib/|/signal/|sysdeps|malloc|calloc|realloc|operator new' | head -1 | sed -E 's/^ +#[0-9]+ 0x[0-9a-f]+ (in )?//; s/ ?\(BuildId.*//' | cut -c1-140)
  if ! grep -qE 'ERROR:|runtime error:|terminate called' <<<"$out"; then
    echo "  no-repro $(basename "$2")"  # fork mode: an earlier input in the same process (libhdf5 heap damage?)
  elif grep -qE 'runtime error:|terminate called' <<<"$out" || ! grep -q libhdf5 <<<"$frame"; then
    echo "  ours     $(basename "$2"): $frame"
  else
    echo "  libhdf5  $(basename "$2"): $frame"
  fi
}

ours=0
for t in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_$t
  corpus=$root/tests/fuzz/corpus/$t
  found=$build/found/$t  # everything this run found worth keeping; merged into $corpus below
  artifacts=$build/artifacts/$t
  mkdir -p "$found" "$artifacts"
  dict=()
  [ -f "$root/tests/fuzz/$t.dict" ] && dict=(-dict="$root/tests/fuzz/$t.dict")
  echo "== fuzz_$t for ${seconds}s"
  # Fork mode carries on past crashes, hangs and out-of-memory kills: libhdf5 1.10 has many on damaged files,
  # and stopping at the first would leave our own code barely fuzzed. Each one is kept in $artifacts and triaged.
  # -timeout: one input may take 10 s; -rss_limit_mb/-malloc_limit_mb: allocating what a damaged file claims
  # rather than what it holds is a finding, not an out-of-memory kill of the machine.
  before=$(ls "$artifacts" | wc -l)
  "$bin" "${dict[@]}" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -max_total_time="$seconds" \
      -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$artifacts/" "$found" "$corpus" \
      > "$build/fuzz_$t.log" 2>&1
  grep -E '^#[0-9]+: cov' "$build/fuzz_$t.log" | tail -n 1
  echo "  $(( $(ls "$artifacts" | wc -l) - before )) new artifacts in $artifacts (log: $build/fuzz_$t.log)"
  for f in $(ls -t "$artifacts" | head -n $(( $(ls "$artifacts" | wc -l) - before ))); do
    line=$(triage "$bin" "$artifacts/$f")
    echo "$line"
    [[ $line == "  ours"* ]] && ours=1
  done
  # Keep the committed corpus small: only the inputs that reach new edges (-use_counters=0: hit counts do not
  # count, or every HDF5 input that loops a little differently would be kept).
  "$bin" -merge=1 -use_counters=0 "$corpus" "$found" 2>&1 | grep -E 'MERGE-OUTER: [0-9]+ new files' || true
done
exit $ours
