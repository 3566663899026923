#!/usr/bin/env bash
# Installs what ddplab needs on Debian 12, from Debian packages. Quick and silent when all is present.
# The CUDA toolkit is not a Debian package here: when /usr/local/cuda/bin/nvcc exists the CUDA engine is built
# too, otherwise the CPU build goes on alone; with it, the cuDNN frontend's headers (PyPI, for --attention cudnn)
# are fetched into .deps/, and a failed fetch only leaves that one path out of the build.
set -euo pipefail

packages=(build-essential cmake git openmpi-bin libopenmpi-dev libhdf5-dev libopenblas-dev libgtest-dev
          libcli11-dev nlohmann-json3-dev python3 python3-h5py python3-matplotlib python3-jinja2
          chromium  # the page test (tests/cli/check_page.py) opens report.html in a headless browser
          iproute2 util-linux  # the two-host test (scripts/netns_cluster.sh)
          slurmctld slurmd slurm-client)  # Slurm on those hosts (scripts/slurm_cluster.sh), for the srun test

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

cudnn_frontend() {
  [ -x /usr/local/cuda/bin/nvcc ] || return 0
  python3 "$(dirname "$0")/fetch_cudnn_frontend.py" ||
    echo "install_deps: could not fetch the cuDNN frontend headers; building without --attention cudnn" >&2
}
[ ${#missing[@]} -eq 0 ] && { cudnn_frontend; exit 0; }

echo "install_deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# Without apt-utils (a minimal image) debconf says on stderr that it delays configuration: noise, not a problem.
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" 2> >(grep -v '^debconf: delaying' >&2) >/dev/null
echo "install_deps: done"
cudnn_frontend
