# shellcheck shell=bash
# Sourced (bash), on the GPU machine or here to test: puts the bundle that scripts/device_bundle.sh made (Debian 12's
# Open MPI, HDF5, OpenBLAS, GoogleTest, CLI11, nlohmann-json, unpacked under one folder) on the paths that the
# compilers, CMake, the dynamic linker and Open MPI read, and finds NCCL.
#   . bench/device/env.sh [ROOT]       ROOT: the unpacked bundle, default .device/root of this checkout
# Exports DDPLAB_CMAKE_ARGS for the configure step (NCCL's location when CMake cannot find it alone).

DDPLAB_DEPS=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/../../.device/root}" && pwd) || return 1
export DDPLAB_DEPS
_a=$DDPLAB_DEPS/usr/lib/x86_64-linux-gnu
DDPLAB_CMAKE_ARGS=""

# CUDA: the CMakeLists looks for /usr/local/cuda/bin/nvcc; an nvcc on the PATH wins.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi

# NCCL: the CMakeLists finds libnccl.so and nccl.h beside CUDA's own. Where they are not (the machine's CUDA may
# come without NCCL), take them from the Python wheel nvidia-nccl-cu13 (nvidia/nccl/{include,lib}), which ships only
# libnccl.so.2: name the files outright. Asked of python3 before LD_LIBRARY_PATH changes below.
_cuda=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
_any() { local f; for f; do [ -e "$f" ] && return 0; done; return 1; }  # one of the paths exists
if ! _any "$_cuda"/include/nccl.h /usr/include/nccl.h ||
   ! _any "$_cuda"/lib*/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so; then
  _nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if [ -f "$_nccl/include/nccl.h" ] && [ -f "$_nccl/lib/libnccl.so.2" ]; then
    DDPLAB_CMAKE_ARGS="-DNCCL_INCLUDE_DIR=$_nccl/include -DNCCL_LIBRARY=$_nccl/lib/libnccl.so.2"
    export LD_LIBRARY_PATH=$_nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  else
    echo "env.sh: no NCCL beside CUDA ($_cuda) nor in python3's nvidia-nccl-cu13 wheel" >&2
  fi
fi
# cuDNN (--attention cudnn): cudnn.h beside CUDA's headers, else python3's nvidia-cudnn-cu13 wheel (nvidia/cudnn/
# {include,lib}), named outright as NCCL's is. The frontend's headers travel in .deps/cudnn-frontend (carried).
if ! _any "$_cuda"/include/cudnn.h /usr/include/cudnn.h /usr/include/x86_64-linux-gnu/cudnn.h; then
  _cudnn=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if [ -f "$_cudnn/include/cudnn.h" ] && [ -f "$_cudnn/lib/libcudnn.so.9" ]; then
    DDPLAB_CMAKE_ARGS+=" -DCUDNN_INCLUDE_DIR=$_cudnn/include -DCUDNN_LIBRARY=$_cudnn/lib/libcudnn.so.9"
    export LD_LIBRARY_PATH=$_cudnn/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  else
    echo "env.sh: no cuDNN beside CUDA ($_cuda) nor in python3's nvidia-cudnn-cu13 wheel" >&2
  fi
fi
export DDPLAB_CMAKE_ARGS

# Libraries. The bundle's own (Open MPI, PMIx, HDF5, OpenBLAS) always; of the general-purpose ones in fallback/
# (libcurl, libssl, libhwloc, libgfortran, ...) only those the machine lacks, linked into fallback-used/, so that
# the machine's newer copies are not shadowed for its compilers and tools.
_used=$DDPLAB_DEPS/fallback-used
rm -rf "$_used" && mkdir -p "$_used"
_sys=$(/sbin/ldconfig -p 2>/dev/null || ldconfig -p)
for _f in "$DDPLAB_DEPS"/fallback/*.so.*; do
  _n=${_f##*/}
  grep -q "^[[:space:]]$_n (libc6,x86-64" <<<"$_sys" || ln -s "../fallback/$_n" "$_used/$_n"
done
export LD_LIBRARY_PATH=$_a:$_a/openblas-pthread:$_a/pmix2/lib:$_used${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$DDPLAB_DEPS/usr/bin:$PATH

# CMake: config packages (GTest, CLI11, nlohmann_json) and FindHDF5's fallback search (lib/<arch>/hdf5/serial,
# include/hdf5/serial) go through the prefix; FindBLAS and the CMakeLists' find_path(cblas.h) through the
# library and include paths, since Debian keeps OpenBLAS in its own subfolder. FindMPI asks the bundle's mpicc.
export CMAKE_PREFIX_PATH=$DDPLAB_DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
export CMAKE_LIBRARY_PATH=$_a/openblas-pthread${CMAKE_LIBRARY_PATH:+:$CMAKE_LIBRARY_PATH}
_i=$DDPLAB_DEPS/usr/include/x86_64-linux-gnu/openblas-pthread
export CMAKE_INCLUDE_PATH=$_i${CMAKE_INCLUDE_PATH:+:$CMAKE_INCLUDE_PATH}
export MPI_HOME=$DDPLAB_DEPS/usr

# Open MPI 4.1 and PMIx 4 were built for /usr and /usr/lib/x86_64-linux-gnu/pmix2; these move every directory they
# derive from the prefix (plugins, help files, wrapper data). Their /etc config is not read from the bundle, so
# Debian's settings in it (etc/openmpi/openmpi-mca-params.conf) are repeated as variables.
export OPAL_PREFIX=$DDPLAB_DEPS/usr PMIX_INSTALL_PREFIX=$_a/pmix2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_mtl='^ofi' OMPI_MCA_btl='^uct,openib,ofi' \
       OMPI_MCA_pml='^ucx' OMPI_MCA_osc='^ucx,pt2pt'
# The device machine's own PMIx plugin for zlib fails to load beside the bundle's libpmix (an undefined symbol, and a
# banner about compression, at every mpirun); one host's start-up data needs no compression.
export PMIX_MCA_pcompress='^zlib' PMIX_MCA_pcompress_base_silence_warning=1
# Shared memory between ranks without cross-memory attach (process_vm_readv), which sandboxes may refuse; the CUDA
# path moves its data with NCCL, so only host-side MPI messages take the extra copy.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
unset _a _i _cuda _nccl _cudnn _used _sys _f _n
unset -f _any
