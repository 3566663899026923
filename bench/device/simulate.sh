#!/usr/bin/env bash
# Rehearses the device call here (Debian 12, root, no GPU needed): copies what a call sends (tracked and untracked,
# not ignored, files, .device/carry and .deps/cudnn-frontend) to a fresh folder and runs the command there, inside an overlay of / in
# which every file of the bundled packages and of their relatives that the device lacks (Open MPI, PMIx, HDF5, BLAS,
# GoogleTest, CLI11, nlohmann-json, hwloc, libcurl, ...) is deleted. So CMake, the compilers and the dynamic linker
# can only find the bundle's copies. The overlay lives in a private mount namespace: the system is not touched.
#   bench/device/simulate.sh [COMMAND]      default: bench/device/run.sh 1; $OUT is $SIM_DIR/out
# SIM_DIR (default /tmp/ddplab-sim) is emptied first: give each rehearsal its own where several share a machine.
# DDPLAB_* variables pass through (e.g. DDPLAB_CAP_SCALE=4 DDPLAB_DEADLINE_S=3600 for run.sh on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
S=${SIM_DIR:-/tmp/ddplab-sim}
case $S in /?*) ;; *) echo "simulate: SIM_DIR must be an absolute path, got '$S'" >&2; exit 2 ;; esac
# Emptied below: only a rehearsal's own folder (it holds `hidden`) or a new one.
[ ! -e "$S" ] || [ -f "$S/hidden" ] || { echo "simulate: $S exists and is no rehearsal's folder: name another" >&2; exit 2; }
cmd=${1:-bench/device/run.sh 1}
[ -f .device/carry/ddplab-deps.tar.gz ] || { echo "simulate: run scripts/device_bundle.sh first" >&2; exit 1; }

# Installed packages to hide: the bundle's and what Debian would bring with them (regex on package names).
hide='openmpi|pmix|hdf5|openblas|^libblas|^liblapack|gtest|gmock|googletest|cli11|nlohmann|hwloc|libevent|fabric|ucx|
ibverbs|libpsm|rdmacm|libnl-|munge|libudev1|gfortran|quadmath|libsz2|libaec|libcurl|libssl3|brotli|krb5|k5crypto|
com-err|keyutils|idn2|unistring|ldap|sasl2|nghttp2|psl5|rtmp|gnutls|nettle|hogweed|libgmp10|p11-kit|tasn1|libffi8|
ssh2|libzstd1'
hide=${hide//$'\n'/}
files=$(dpkg-query -W -f '${Package}\n' | grep -E "$hide" | xargs dpkg -L 2>/dev/null | sort -u)
rm -rf "$S" && mkdir -p "$S"/{root,out,repo,site/nvidia/nccl/lib}
# NCCL too, where this machine keeps it beside CUDA: the device's may have none, and env.sh then takes it from the
# Python wheel nvidia-nccl-cu13, laid out here as python3 would find it (a hard link: the overlay hides the path).
cuda=$(readlink -f /usr/local/cuda)
if [ -f "$cuda/include/nccl.h" ]; then
  files+=$'\n'$(ls -d "$cuda"/include/nccl* "$cuda"/lib*/libnccl*)
  cp -r "$cuda/include" "$S/site/nvidia/nccl/include"
  ln "$(readlink -f "$cuda"/lib*/libnccl.so.2 | head -1)" "$S/site/nvidia/nccl/lib/libnccl.so.2"
fi

echo "$files" >"$S/hidden"
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$S/repo"
cp --parents -r .device/carry "$S/repo"
[ -d .deps/cudnn-frontend ] && cp --parents -r .deps/cudnn-frontend "$S/repo"  # carried too (run's carry list)

passed=$(env | grep '^DDPLAB_' || true)  # NAME=value lines, handed to the command's clean environment
unshare -m bash -euo pipefail -c '
  S=$1 cmd=$2 passed=$3
  mount --make-rprivate /
  mount -t tmpfs tmpfs "$S/root" && mkdir -p "$S/root"/{up,work,merged}   # a tmpfs: upper must not lie under /
  mount -t overlay overlay -o "lowerdir=/,upperdir=$S/root/up,workdir=$S/root/work" "$S/root/merged"
  M=$S/root/merged
  for d in proc sys dev dev/shm; do mount --rbind "/$d" "$M/$d"; done
  for d in repo out; do mount --bind "$S/$d" "$M$S/$d"; done     # their writes go to disk, not to the tmpfs
  while IFS= read -r f; do [ -d "$M$f" ] || rm -f "$M$f"; done <"$S/hidden"   # files and links, not folders
  chroot "$M" ldconfig
  echo "simulate: hid $(wc -l <"$S/hidden") paths; running: $cmd"
  vars=() && [ -z "$passed" ] || mapfile -t vars <<<"$passed"  # none passed: no empty argument for env
  chroot "$M" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root OUT="$S/out" PYTHONPATH="$S/site" ${vars[@]+"${vars[@]}"} \
    bash -c "cd $S/repo && $cmd"
' _ "$S" "$cmd" "$passed"
