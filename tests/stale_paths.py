#!/usr/bin/env python3
"""Fail on a comment that names a file of ours that does not exist (a path left by a move).

A comment's word that looks like one of our files ("engine/impl.hpp", "src/kernels/compute.hpp",
"test_plan.cpp", "bench/dev/gpu-check.sh") must name a file or folder of the tree: as written
from the repository root, from src/, include/ or tests/, from the commenting file's folder, or,
for a bare file name, any file of that name. Comments are C/C++ `//` and `/* */` text, Python and
CMake `#` text, and the docs' Markdown (docs/, README.md).

Usage: stale_paths.py [--self-test] ROOT
  ROOT         the repository root; exit 1 and one line per stale path when there is one
  --self-test  first plant a stale path in a copy of ROOT and check it is reported
"""
import pathlib
import re
import shutil
import sys
import tempfile

FOLDERS = ("src", "include", "tools", "tests", "bench", "python", "examples", "cmake", ".ci")
SOURCE = {".hpp", ".cpp", ".h", ".c", ".cu", ".cuh", ".py", ".cmake", ".sh"}
NAMED = {".hpp", ".cpp", ".h", ".c", ".cu", ".cuh", ".py", ".sh", ".md", ".cmake"}
WORD = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+(\.[a-z]+))(?![\w/])")
LINE_COMMENT = {".py": "#", ".cmake": "#", ".sh": "#"}
# Other projects' files that our comments cite (DeepSpeed's, Dion's, NCCL's) and a tool's output.
EXTERNAL = {
    "deepspeed/runtime/lr_schedules.py", "lr_schedules.py", "monitor/config.py",
    "runtime/zero/config.py", "offload_config.py", "deepspeed/runtime/fp16/loss_scaler.py",
    "normuon.py", "include/nccl.h", "OUT/step_table.md",
}


def comments(path):
    """(line number, comment text) of `path`."""
    text = path.read_text(errors="replace")
    if path.suffix == ".md":
        for no, line in enumerate(text.splitlines(), 1):
            yield no, line
        return
    marker = LINE_COMMENT.get(path.suffix, "//")
    if path.name == "CMakeLists.txt":
        marker = "#"
    in_block = False
    for no, line in enumerate(text.splitlines(), 1):
        if marker == "//":
            if in_block or "/*" in line:
                in_block = "*/" not in line.split("/*", 1)[-1]
                yield no, line
                continue
        at = line.find(marker)
        if at >= 0:
            yield no, line[at + len(marker):]


def sources(root):
    for folder in FOLDERS:
        for path in (root / folder).rglob("*"):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix in SOURCE or path.name == "CMakeLists.txt":
                yield path
    yield from (root / "docs").glob("*.md")
    yield root / "README.md"
    yield root / "CMakeLists.txt"


def stale(root):
    names = {p.name for folder in FOLDERS + ("docs",) for p in (root / folder).rglob("*")}
    names |= {p.name for p in root.iterdir()}
    found = []
    for path in sources(root):
        if not path.exists():
            continue
        for no, text in comments(path):
            for m in WORD.finditer(text):
                word, ext = m.group(1), m.group(2)
                url = "://" in text[max(0, m.start() - 8):m.start() + 3]
                if ext not in NAMED or word in EXTERNAL or url:
                    continue
                if "/" not in word:
                    if word not in names:
                        found.append(f"{path.relative_to(root)}:{no}: names {word}")
                    continue
                bases = (root, root / "src", root / "include", root / "tests", path.parent)
                if not any((b / word).exists() for b in bases):
                    found.append(f"{path.relative_to(root)}:{no}: names {word}")
    return found


def self_test(root):
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp)
        for part in FOLDERS + ("docs",):
            if (root / part).exists():
                shutil.copytree(root / part, copy / part)
        for name in ("README.md", "CMakeLists.txt"):
            shutil.copy(root / name, copy / name)
        victim = copy / "src" / "CMakeLists.txt"
        planted = "engine/" + "planted_gone.cpp"  # split: this file's own text names no path
        victim.write_text(f"# see {planted}\n" + victim.read_text())
        if not any(planted in v for v in stale(copy)):
            print(f"stale-paths self-test: a planted {planted} was not reported")
            return False
    print(f"stale-paths self-test: a planted {planted} is reported")
    return True


def main(argv):
    args = [a for a in argv if a != "--self-test"]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(args[0]).resolve()
    if "--self-test" in argv and not self_test(root):
        return 1
    found = stale(root)
    for v in found:
        print(v)
    print(f"stale paths: {len(found)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
