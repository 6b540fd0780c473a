"""The CUDA backend's device code in a library, read back with cuobjdump, against the build's
architecture list and against every architecture nvcc lists.

Usage: cuda_archs_check.py NVCC CUOBJDUMP LIBRARY ARCHS

ARCHS is the build's ZMUON_CUDA_ARCHS (CMake's syntax: NN-real SASS, NN-virtual PTX, NN both).
It checks that
  - each translation unit with kernels carries SASS for every real architecture of ARCHS and PTX
    for every virtual one, and nothing else, besides the own Hopper GEMM's sm_90a;
  - every architecture of `nvcc --list-gpu-arch` runs some image of the library: SASS of its
    major revision at or below its minor one, or PTX at or below it (the driver compiles PTX for
    any later device). Only the fat default list passes this; a developer's short list fails.
"""
import re
import subprocess
import sys
from collections import Counter


def capability(arch):
    """'sm_86' or 'compute_86' or '86' -> (8, 6); 'sm_90a' -> (9, 0)."""
    digits = re.search(r"(\d+)", arch).group(1)
    return int(digits[:-1]), int(digits[-1])


def wanted(archs):
    """The SASS and PTX architectures ARCHS asks for, as sets of ints (75, 120, ...)."""
    sass, ptx = set(), set()
    for entry in filter(None, archs.split(";")):
        m = re.fullmatch(r"(\d+)(-real|-virtual)?", entry)
        if not m:
            sys.exit(f"FAIL: cannot read architecture '{entry}' of '{archs}'")
        n = int(m.group(1))
        if m.group(2) != "-virtual":
            sass.add(n)
        if m.group(2) != "-real":
            ptx.add(n)
    return sass, ptx


def images(cuobjdump, library, kind):
    """The library's images of one kind ('elf' or 'ptx'): a Counter of their architecture names
    (sm_90, sm_90a, ...), one count per translation unit that carries it."""
    out = subprocess.run([cuobjdump, f"--list-{kind}", library], check=True, text=True,
                         capture_output=True).stdout
    return Counter(re.findall(r"\.(sm_\d+[a-z]?)\.(?:cubin|ptx)\b", out))


def main():
    nvcc, cuobjdump, library, archs = sys.argv[1:5]
    sass_want, ptx_want = wanted(archs)
    elf = images(cuobjdump, library, "elf")
    ptx = images(cuobjdump, library, "ptx")
    print(f"{library}: SASS {dict(sorted(elf.items()))}, PTX {dict(sorted(ptx.items()))}")
    failures = []

    # The own GEMM: sm_90a SASS in one translation unit, whatever ARCHS says.
    if elf.pop("sm_90a", 0) != 1:
        failures.append("no sm_90a image (the own Hopper GEMM)")
    sass_have = {int(a[3:]) for a in elf}
    ptx_have = {int(a[3:]) for a in ptx}
    if sass_have != sass_want:
        failures.append(f"SASS for {sorted(sass_have)}, ARCHS asks for {sorted(sass_want)}")
    if ptx_have != ptx_want:
        failures.append(f"PTX for {sorted(ptx_have)}, ARCHS asks for {sorted(ptx_want)}")
    # Every kernel file compiled for every architecture: one count each.
    units = set(elf.values()) | set(ptx.values())
    if len(units) > 1:
        failures.append(f"the translation units carry different architecture sets: {elf} {ptx}")

    listed = subprocess.run([nvcc, "--list-gpu-arch"], check=True, text=True,
                            capture_output=True).stdout.split()
    if not listed:
        failures.append("nvcc --list-gpu-arch listed nothing")
    for arch in listed:
        major, minor = capability(arch)
        by_sass = [s for s in sass_have if capability(str(s))[0] == major
                   and capability(str(s))[1] <= minor]
        by_ptx = [p for p in ptx_have if capability(str(p)) <= (major, minor)]
        how = (f"SASS sm_{max(by_sass)}" if by_sass
               else f"PTX compute_{max(by_ptx)}" if by_ptx else None)
        print(f"  {arch}: {how or 'NOT COVERED'}")
        if how is None:
            failures.append(f"{arch} (listed by nvcc) runs no image of the library")

    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
