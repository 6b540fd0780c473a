#!/usr/bin/env bash
# `pip install .` into a fresh venv, then the parity test from outside the checkout: the installed
# package must import from the venv and load the libzmuon.so inside it.
# Usage: pip_install_check.sh ROOT WORK TORCH_VENV BUILD_DIR ZMUON_CUDA
# torch comes from TORCH_VENV through a .pth file, so nothing is downloaded twice. The backend
# builds in BUILD_DIR, the suite's own build with its ZMUON_CUDA, where libzmuon is up to date: the
# test checks the packaging, not a second compile of the engine (a user's `pip install .` builds
# in a fresh directory).
set -euo pipefail
root=$1 work=$2 torch_venv=$3 build=$4 cuda=$5
rm -rf "$work"
mkdir -p "$work/outside"
/usr/bin/python3 -m venv "$work/venv"
py="$work/venv/bin/python"
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
mine=$(purelib "$py")
purelib "$torch_venv/bin/python" >"$mine/torch_from_ci.pth"
# The backend leaves its install prefix and Python variables in BUILD_DIR's cache: put them back.
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
restore() {
  cmake -U 'SKBUILD*' -U 'Python*' -U 'Python3*' -DCMAKE_INSTALL_PREFIX="$prefix" "$build" >/dev/null
}
trap restore EXIT
CMAKE_BUILD_PARALLEL_LEVEL=2 "$py" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps --config-settings=build-dir="$build" \
  --config-settings=cmake.define.ZMUON_CUDA="$cuda" "$root"
cp "$root/tests/python/test_torch_optim.py" "$work/outside/"
cd "$work/outside"
unset PYTHONPATH ZMUON_LIBRARY
"$py" - "$mine" <<'PY'
import os, sys
import zmuon
from zmuon import _capi
package = os.path.dirname(zmuon.__file__)
library = _capi._find_library()
print(f"zmuon {zmuon.version()} "
      f"from {package}, library {library}")
assert package.startswith(sys.argv[1]), f"zmuon imported from {package}, not the venv"
assert library == os.path.join(package, "libzmuon.so"), f"library {library} is not the package's"
PY
"$py" -m unittest -v test_torch_optim.ParityWithTorch
