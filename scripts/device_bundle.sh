#!/usr/bin/env bash
# Builds .device/: the Debian 12 libraries, headers and CMake files that ddplab needs and the GPU machine of the
# `device` tool lacks (Open MPI, HDF5, OpenBLAS, GoogleTest, CLI11, nlohmann-json), packed into one archive that a
# device call carries (bench/device/README.md). Run it here, on Debian 12 (bookworm); it changes nothing outside
# .device/ and installs nothing.
#   .device/debs/   the downloaded .deb files
#   .device/root/   them unpacked with dpkg -x (no maintainer scripts), pruned, checked: what env.sh points at
#   .device/carry/  ddplab-deps.tar.gz: .device/root packed; the only thing that travels (carry: .device/carry)
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
D=.device R=.device/root A=usr/lib/x86_64-linux-gnu

# The binaries are Debian 12's (glibc 2.36): they run on any x86-64 Linux with glibc >= 2.36 (Ubuntu 24.04: 2.39).
. /etc/os-release
[ "${VERSION_CODENAME:-}" = bookworm ] && [ "$(dpkg --print-architecture)" = amd64 ] ||
  { echo "device_bundle: needs Debian 12 on amd64 (this is ${PRETTY_NAME:-?})" >&2; exit 1; }

# What ddplab builds and links against (Open MPI, PMIx, HDF5, OpenBLAS, the header-only and test libraries)...
main=(
  openmpi-bin libopenmpi3 libopenmpi-dev openmpi-common libpmix2   # mpirun, libmpi, mpi.h, mpicc, help files
  libhdf5-103-1 libhdf5-dev                                         # HDF5 1.10, serial
  libopenblas0-pthread libopenblas-pthread-dev                      # libopenblas.so.0, cblas.h
  libgtest-dev libcli11-dev nlohmann-json3-dev                      # headers, static gtest, CMake config files
)
# ...and the general-purpose libraries those load, down to a base that every glibc image has (BASE below). These
# go to root/fallback, which env.sh uses only for the names that the machine lacks, so that Debian 12's copies never
# shadow the machine's newer ones (libzstd or libgmp under its gcc, say). libhdf5 needs libcurl (its S3 driver)
# and so the TLS and Kerberos libraries below it.
fallback=(
  libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libmunge2 libudev1 libgfortran5 libquadmath0 libsz2 libaec0
  libcurl4 libssl3 libbrotli1 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
  libidn2-0 libunistring2 libldap-2.5-0 libsasl2-2 libnghttp2-14 libpsl5 librtmp1
  libgnutls30 libnettle8 libhogweed6 libgmp10 libp11-kit0 libtasn1-6 libffi8 libssh2-1 libzstd1
)
# Left out on purpose: Open MPI's network transports (libfabric, UCX, PSM, verbs: ~10 MB; one node needs only
# shared memory), hwloc's optional plugins (X11, OpenCL, libxml2), ssh (mpirun starts local ranks itself),
# Fortran, Java and C++ bindings. Their plugins are deleted below.
BASE="libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 libutil.so.1 libanl.so.1
      ld-linux-x86-64.so.2 libstdc++.so.6 libgcc_s.so.1 libz.so.1"

rm -rf "$D"
mkdir -p "$D"/debs/main "$D"/debs/fallback "$D/carry" "$R/fallback"
# apt-get download warns that the _apt user cannot write to a root-owned folder: harmless (it downloads as root).
get() { (cd "$D/debs/$1" && shift && apt-get download -q "$@") 2>&1 | grep -v "unsandboxed as root" || true; }
get main "${main[@]}"; get fallback "${fallback[@]}"
[ "$(ls "$D"/debs/*/*.deb | wc -l)" -eq $((${#main[@]} + ${#fallback[@]})) ] ||
  { echo "device_bundle: a download failed (stale package lists? apt-get update)" >&2; exit 1; }
for f in "$D"/debs/main/*.deb; do dpkg -x "$f" "$R"; done
for f in "$D"/debs/fallback/*.deb; do dpkg -x "$f" "$D/tmp"; done
mv "$D"/tmp/{usr/,}lib/x86_64-linux-gnu/*.so.* "$R/fallback/"   # their libraries only, in one folder
rm -rf "$D/tmp"

# Prune what ddplab never uses: docs, Fortran, Java, static libraries (libopenblas.a alone is 58 MB) but gtest's,
# and OpenBLAS's LAPACK and reference-BLAS faces (7 MB; ddplab calls cblas_* in libopenblas.so.0).
rm -rf "$R"/usr/share/{doc,man,lintian,bug} "$R/$A"/fortran "$R/$A"/libmpi_{mpifh,usempi,java}* \
       "$R/$A"/libhdf5*fortran* "$R/$A"/openblas-pthread/{liblapack,libblas}.so*
find "$R" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' -delete

# What Debian's maintainer scripts would have made (update-alternatives): the plain MPI command names.
for c in mpirun mpiexec mpicc mpicxx mpic++; do ln -sf "$c.openmpi" "$R/usr/bin/$c"; done

# Every ELF file must find each library it needs in the bundle's library folders (env.sh puts them on
# LD_LIBRARY_PATH) or in BASE. Those that cannot (plugins for the left-out transports, liboshmem, ...) are deleted,
# repeatedly, since deleting a library can strand its users; a needed file that goes is caught by the list after.
libdirs=("$R/$A" "$R/$A/openblas-pthread" "$R/$A/pmix2/lib" "$R/fallback")
removed=()
while :; do
  have=" $BASE $(find "${libdirs[@]}" -maxdepth 1 -name '*.so*' -printf '%f ' 2>/dev/null) "
  gone=0
  while IFS= read -r f; do
    for n in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      case "$have" in *" $n "*) ;; *) removed+=("${f#"$R"/} (needs $n)"); rm -f "$f"; gone=1; break ;; esac
    done
  done < <(find "$R" -type f \( -name '*.so*' -o -path '*/bin/*' \) \
             -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
  [ $gone -eq 0 ] && break
done
find "$R" -xtype l -delete  # links to what was pruned (static, Fortran, C++ HDF5 libraries)
printf 'device_bundle: left out %d files whose libraries are not bundled:\n' "${#removed[@]}"
printf '  %s\n' "${removed[@]}" | sort | head -40

for f in usr/bin/orterun usr/bin/opal_wrapper "$A"/libmpi.so.40 "$A"/openmpi/lib/openmpi3/mca_btl_vader.so \
         "$A"/openmpi/lib/openmpi3/mca_pml_ob1.so "$A"/hdf5/serial/libhdf5.so "$A"/openblas-pthread/libopenblas.so.0 \
         "$A"/openblas-pthread/libopenblas.so usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h \
         "$A"/cmake/GTest/GTestConfig.cmake usr/share/cmake/CLI11/CLI11Config.cmake; do
  [ -e "$R/$f" ] || { echo "device_bundle: $f missing from the bundle" >&2; exit 1; }
done

tar -C "$R" -czf "$D/carry/ddplab-deps.tar.gz" .
echo "device_bundle: $(ls "$D"/debs/*/*.deb | wc -l) packages, $(du -sh "$D/debs" | cut -f1) of .deb;" \
     "unpacked $(du -sh "$R" | cut -f1); carried $(du -sh "$D/carry" | cut -f1) (.device/carry)"
