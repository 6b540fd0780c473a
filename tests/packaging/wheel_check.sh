#!/usr/bin/env bash
# The release wheel, as a user on another Linux gets it: built and repaired by
# tools/wheel/build-wheel.sh, then
#   1. `auditwheel show`: the manylinux tag the symbol versions allow is the wheel's; every
#      library its ELF files need is in the wheel, a manylinux system library or one of CUDA's
#      four (cudart, cuBLAS, cuBLASLt, NCCL: the nvidia-* wheels', by soname);
#   2. its libzmuon.so's SASS and PTX (cuobjdump) against nvcc's architectures
#      (cuda_archs_check.py);
#   3. installed into a fresh venv inside a mount namespace where every Debian library it
#      carries a copy of is hidden (an empty file bound over it: loading one fails), and the
#      system's CUDA libraries too:
#      a. without torch (no nvidia-* wheels): `import zmuon` loads libzmuon_cpu.so, and
#         zmuon.newton_schulz on the CPU gives what the build tree's library gives;
#      b. with torch's venv on the path (its nvidia-* wheels): libzmuon.so, with the CUDA
#         backend, loads, and the torch parity test passes from outside the checkout.
# Usage: wheel_check.sh ROOT WORK TORCH_VENV NVCC BUILD_DIR
# The wheel's libzmuon builds in BUILD_DIR, the suite's own build with the CUDA backend, where it
# is up to date (as python_test_pip_install does); the CPU-only one in WORK/cpu.
# The mounts live in the namespace only (unshare -m as root, unshare -r -m otherwise).
set -euo pipefail
root=$1 work=$2 torch_venv=$3 nvcc=$4 build=$5
build_library="$build/src/embed/libzmuon.so"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
start=$(date +%s)
say() { echo "wheel_check [$(($(date +%s) - start)) s]: $*"; }

CUDA_BUILD="$build" "$root/tools/wheel/build-wheel.sh" "$work"
wheel=$(ls "$work"/dist/zmuon-*.whl)
tools="$work/venv"

say "1. auditwheel show"
show=$("$tools/bin/auditwheel" show "$wheel" | tr '\n' ' ' | tr -s ' ')
echo "$show"
# The symbol versions' constraint (glibc, libstdc++) gives the tag, which the wheel must carry.
# (show's own verdict is linux_x86_64: it counts the four CUDA libraries left to the nvidia-*
# wheels as outside the policy.)
tag=$(grep -o 'constrains the platform tag to "manylinux_[0-9_]*x86_64"' <<<"$show" |
  grep -o 'manylinux_[0-9_]*x86_64' || true)
[ -n "$tag" ] || { echo "FAIL: auditwheel show names no manylinux constraint"; exit 1; }
[[ $(basename "$wheel") == *"-$tag.whl" ]] || { echo "FAIL: $wheel is not tagged $tag"; exit 1; }
echo "tag: $tag"

unpacked="$work/unpacked"
rm -rf "$unpacked" && mkdir -p "$unpacked"
"$tools/bin/python" -m zipfile -e "$wheel" "$unpacked"
# Every library any ELF file of the wheel needs: inside the wheel, in the manylinux policy's
# system set, or one of CUDA's four.
system='^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|libz)\.so\.[0-9]+$|^ld-linux-x86-64\.so\.2$'
cuda='^(libcudart\.so\.13|libcublas\.so\.13|libcublasLt\.so\.13|libnccl\.so\.2)$'
bad=0
for elf in "$unpacked"/zmuon/*.so "$unpacked"/zmuon.libs/*; do
  for needed in $("$tools/bin/patchelf" --print-needed "$elf"); do
    if [ -e "$unpacked/zmuon.libs/$needed" ] || [[ $needed =~ $system ]] || [[ $needed =~ $cuda ]]; then
      continue
    fi
    echo "FAIL: $(basename "$elf") needs $needed, neither in the wheel nor a system library"
    bad=1
  done
done
[ "$bad" -eq 0 ] || exit 1
for lib in libzmuon.so libzmuon_cpu.so; do
  [ -f "$unpacked/zmuon/$lib" ] || { echo "FAIL: zmuon/$lib is not in the wheel"; exit 1; }
done
if "$tools/bin/patchelf" --print-needed "$unpacked/zmuon/libzmuon_cpu.so" | grep -Eq 'cu|nccl'; then
  echo "FAIL: libzmuon_cpu.so needs a CUDA library"; exit 1
fi
echo "the wheel's libraries need only each other, the system's and CUDA's four"

say "2. SASS and PTX of the wheel's libzmuon.so"
archs=$(sed -n 's/^ZMUON_CUDA_ARCHS:STRING=//p' "$build/CMakeCache.txt")
cuobjdump=$(find "$tools" -path '*/bin/cuobjdump' | head -1)
/usr/bin/python3 "$root/tests/packaging/cuda_archs_check.py" "$nvcc" "$cuobjdump" \
  "$unpacked/zmuon/libzmuon.so" "$archs"

say "3. in a mount namespace without the libraries the wheel carries"
# The Debian files the wheel has copies of: auditwheel names each copy after the file it copied
# with a hash inserted (libopenblasp-r0-234bd196.3.21.so), so each one is the file of that name
# among what the unrepaired libraries load.
loaded=$(ldd "$build_library" "$work"/cpu/src/embed/libzmuon.so | awk '$3 ~ /^\// {print $3}' |
  xargs -r readlink -f | sort -u)
hide=()
for copied in "$unpacked"/zmuon.libs/*; do
  name=$(basename "$copied" | sed -E 's/-[0-9a-f]{8}\././')
  path=$(awk -v n="$name" '{k = $0; sub(/.*\//, "", k)} k == n {print; exit}' <<<"$loaded")
  [ -n "$path" ] || { echo "FAIL: $name (copied into the wheel) is not loaded by the build's"; exit 1; }
  hide+=("$path")
done
# The system's CUDA libraries: only the nvidia-* wheels may provide them.
while read -r path; do hide+=("$(readlink -f "$path")"); done < <(
  ldconfig -p | awk '/lib(cudart|cublas|cublasLt|nccl)\.so/ {print $NF}' | sort -u)
printf '%s\n' "${hide[@]}" | sort -u >"$work/hidden.txt"
echo "hidden: $(tr '\n' ' ' <"$work/hidden.txt")"
[ "$(wc -l <"$work/hidden.txt")" -ge 4 ] || { echo "FAIL: too few libraries to hide"; exit 1; }

# The reference: newton_schulz through the build tree's library (Debian's numpy), before hiding.
reference="$work/ns_reference.json"
PYTHONPATH="$root/python" ZMUON_LIBRARY="$build_library" /usr/bin/python3 \
  "$root/tests/packaging/ns_digest.py" >"$reference"

touch "$work/empty"
namespace=(unshare -m)
[ "$(id -u)" -eq 0 ] || namespace=(unshare -r -m)  # a user namespace where root may not
"${namespace[@]}" bash -s -- "$root" "$work" "$wheel" "$torch_venv" "$reference" <<'INNER'
set -euo pipefail
root=$1 work=$2 wheel=$3 torch_venv=$4 reference=$5
while read -r path; do mount --bind "$work/empty" "$path"; done <"$work/hidden.txt"
# Every hidden library really fails to load here (the check can fail).
while read -r path; do
  if /usr/bin/python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$path" 2>/dev/null; then
    echo "FAIL: $path still loads inside the namespace"; exit 1
  fi
done <"$work/hidden.txt"

# The unrepaired wheel (the build's libraries as they link Debian's) fails to import here.
raw_venv="$work/venv-raw"
rm -rf "$raw_venv" && /usr/bin/python3 -m venv "$raw_venv"
"$raw_venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-index "$work"/raw/zmuon-*.whl
if (cd / && "$raw_venv/bin/python" -c "import zmuon" 2>/dev/null); then
  echo "FAIL: the unrepaired wheel imports: the hidden libraries are not what it needs"; exit 1
fi
echo "the unrepaired wheel does not import here, as it must not"

venv="$work/venv-user"
rm -rf "$venv" "$work/outside" && mkdir -p "$work/outside"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-index "$wheel"
cd "$work/outside"
unset PYTHONPATH ZMUON_LIBRARY

echo "== a. no CUDA libraries anywhere: the CPU library"
# numpy alone from the torch venv (a wheel with its own BLAS), without torch and its nvidia-*.
numpy_only="$work/numpy-only"
rm -rf "$numpy_only" && mkdir -p "$numpy_only"
torch_purelib=$("$torch_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for d in "$torch_purelib"/numpy "$torch_purelib"/numpy.libs; do
  [ -e "$d" ] && ln -s "$d" "$numpy_only/"
done
PYTHONPATH="$numpy_only" "$venv/bin/python" - "$reference" "$root/tests/packaging/ns_digest.py" <<'PY'
import json, os, subprocess, sys
import zmuon
from zmuon import _capi
print("loaded", _capi.library_path, "| CUDA library not loaded:", _capi.cuda_missing)
assert os.path.basename(_capi.library_path) == "libzmuon_cpu.so", _capi.library_path
assert _capi.cuda_missing and ".so" in _capi.cuda_missing, _capi.cuda_missing
got = json.loads(subprocess.run([sys.executable, sys.argv[2]], check=True, text=True,
                                capture_output=True).stdout)
want = json.loads(open(sys.argv[1]).read())
# The same code on the same OpenBLAS (the wheel's is a copy): equal but for the BLAS threads'
# split, far below NS's own error (~1e-2).
worst = max(abs(a - b) for a, b in zip(got, want))
assert len(got) == len(want) and worst <= 1e-5, f"newton_schulz: worst difference {worst}"
print(f"newton_schulz: {len(got)} values, worst difference from the build tree's {worst:.1e}")
PY

echo "== b. torch's venv with its nvidia-* wheels: the CUDA library, the parity test"
purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$torch_purelib" >"$purelib/torch_from_ci.pth"
"$venv/bin/python" - <<'PY'
import os
import zmuon
from zmuon import _capi
print("loaded", _capi.library_path, "| cuda_missing:", _capi.cuda_missing)
assert os.path.basename(_capi.library_path) == "libzmuon.so", _capi.cuda_missing
maps = open("/proc/self/maps").read()
for lib in ("libcublas.so.13", "libnccl.so.2"):
    where = [l.split()[-1] for l in maps.splitlines() if l.endswith(lib)]
    assert where and all("/nvidia/" in w for w in where), f"{lib} from {where}"
    print(lib, "from", where[0])
PY
cp "$root/tests/python/test_torch_optim.py" "$work/outside/"
"$venv/bin/python" -m unittest -v test_torch_optim.ParityWithTorch
INNER
say "passed ($(du -h "$wheel" | cut -f1) wheel)"
