#!/usr/bin/env bash
# Installs what ddplab needs on Debian 12, from Debian packages only. Quick and silent when all is present.
# The CUDA toolkit is not a Debian package here: when /usr/local/cuda/bin/nvcc exists the CUDA engine is built
# too, otherwise the CPU build goes on alone.
set -euo pipefail

packages=(build-essential cmake git openmpi-bin libopenmpi-dev libhdf5-dev libopenblas-dev libgtest-dev
          libcli11-dev nlohmann-json3-dev python3 python3-h5py python3-matplotlib
          iproute2 util-linux)  # the last two: the two-host test (scripts/netns_cluster.sh)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install_deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"
