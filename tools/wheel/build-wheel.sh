#!/usr/bin/env bash
# The release wheel: libzmuon with the CUDA backend for every architecture of cmake/cuda.cmake,
# and beside it libzmuon_cpu.so without it (python/zmuon/_capi.py loads that one where CUDA's
# libraries are missing); auditwheel then copies in what they link outside the manylinux
# policy's system libraries (CAF core/io/openssl, OpenSSL, OpenBLAS and its Fortran runtime, ...)
# and tags the wheel manylinux. CUDA's own libraries (cudart, cuBLAS, cuBLASLt, NCCL) stay out:
# they come from the nvidia-* wheels torch installs, found at run time.
#
# Usage: tools/wheel/build-wheel.sh [WORK]      (default build/wheel)
#   WORK/venv   the pinned tools (tools/wheel/requirements.txt), kept while the pins match
#   WORK/cpu    the CPU-only libzmuon's CMake build; WORK/cuda the wheel's (scikit-build-core)
#   WORK/dist   the repaired wheel, the artifact a release publishes
# Env: JOBS (default 2), ZMUON_CUDA_ARCHS (default: cmake/cuda.cmake's list), CUDA_BUILD (an
#   existing CMake build directory with the CUDA backend to build the wheel's libzmuon in, in
#   place of WORK/cuda: ctest's packaging_wheel passes the suite's own, so that nothing compiles
#   twice; its cache is put back afterwards).
# Needs the Debian packages .ci/deps installs and nvcc; no GPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$(mkdir -p "${1:-$root/build/wheel}" && cd "${1:-$root/build/wheel}" && pwd)"
jobs="${JOBS:-2}"
venv="$work/venv"
start=$(date +%s)
say() { echo "build-wheel [$(($(date +%s) - start)) s]: $*"; }

# The tools, pinned.
pins="$root/tools/wheel/requirements.txt"
want="$(sha256sum "$pins" | cut -d' ' -f1)"
if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  say "tools venv $venv"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$pins"
  echo "$want" >"$venv/.requirements.sha256"
fi

# libzmuon without the CUDA backend (the same flags as any Release build: ccache serves it).
say "CPU-only libzmuon in $work/cpu"
cmake -S "$root" -B "$work/cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZMUON_CUDA=OFF >/dev/null
cmake --build "$work/cpu" -j"$jobs" --target zmuon
cpu_library="$(readlink -f "$work/cpu/src/embed/libzmuon.so")"

# The wheel, with the CUDA backend (required: a release wheel without it would be wrong).
cuda_build="${CUDA_BUILD:-$work/cuda}"
say "pip wheel (CUDA backend on) in $cuda_build"
rm -rf "$work/raw" "$work/dist"
archs=()
[ -n "${ZMUON_CUDA_ARCHS:-}" ] && archs=("--config-settings=cmake.define.ZMUON_CUDA_ARCHS=$ZMUON_CUDA_ARCHS")
if [ -n "${CUDA_BUILD:-}" ]; then
  # Another build's directory: put back what scikit-build-core leaves in its cache.
  prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$cuda_build/CMakeCache.txt")
  mode=$(sed -n 's/^ZMUON_CUDA:STRING=//p' "$cuda_build/CMakeCache.txt")
  restore() {
    cmake -U 'SKBUILD*' -U 'Python*' -U 'Python3*' -U ZMUON_WHEEL_CPU_LIBRARY \
      -DCMAKE_INSTALL_PREFIX="$prefix" -DZMUON_CUDA="${mode:-AUTO}" "$cuda_build" >/dev/null
  }
  trap restore EXIT
fi
CMAKE_BUILD_PARALLEL_LEVEL="$jobs" "$venv/bin/pip" wheel -q --disable-pip-version-check \
  --no-build-isolation --no-deps -w "$work/raw" \
  --config-settings=build-dir="$cuda_build" \
  --config-settings=cmake.define.ZMUON_CUDA=ON \
  --config-settings=cmake.define.ZMUON_WHEEL_CPU_LIBRARY="$cpu_library" \
  "${archs[@]}" "$root"

# CUDA's libraries are left to the nvidia-* wheels (by soname).
say "auditwheel repair"
cuda_libs=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2)
excludes=()
for lib in "${cuda_libs[@]}"; do excludes+=(--exclude "$lib"); done
PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair -w "$work/dist" "${excludes[@]}" "$work"/raw/zmuon-*.whl
"$venv/bin/auditwheel" show "$work"/dist/zmuon-*.whl
say "done: $(ls "$work"/dist/zmuon-*.whl) ($(du -h "$work"/dist/zmuon-*.whl | cut -f1))"
