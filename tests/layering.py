#!/usr/bin/env python3
"""The folders are the layers: fail on an include that points up a layer.

The layers are src/CMakeLists.txt's add_subdirectory() lines, bottom-up. A file in src/LAYER/
may include the public headers ("zmuon/...") and any layer at or below its own. The public
headers (include/zmuon/) include only each other. Other libraries' headers ("caf/...") are
not ours to order. A tool (tools/TOOL/) may include every layer
and its own headers, not another tool's. Tests and benchmarks may include anything.

Usage: layering.py [--self-test] ROOT
  ROOT         the repository root; exit 1 and one line per upward include when there is one
  --self-test  first plant an upward include in a copy of ROOT and check it is reported
"""
import pathlib
import re
import shutil
import sys
import tempfile

SOURCES = ("*.hpp", "*.cpp", "*.h", "*.cu", "*.cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def layers(root):
    text = (root / "src" / "CMakeLists.txt").read_text()
    order = re.findall(r"^\s*add_subdirectory\((\w+)\)", text, re.M)
    if not order:
        raise SystemExit(f"layering: no add_subdirectory() in {root}/src/CMakeLists.txt")
    return {name: i for i, name in enumerate(order)}


def files(folder):
    for pattern in SOURCES:
        yield from folder.rglob(pattern)


def violations(root):
    rank = layers(root)
    tools = {p.name for p in (root / "tools").iterdir() if p.is_dir()}
    ours = set(rank) | tools | {"support", "bench", "tests"}  # anything else is a library's
    found = []

    def check(path, allowed):
        for line_no, target in enumerate_includes(path):
            top = target.split("/", 1)[0]
            if top == "zmuon" or top in allowed or (top not in ours and "/" in target):
                continue
            if "/" not in target and (path.parent / target).exists():
                continue  # a neighbour in the same folder
            found.append(f"{path.relative_to(root)}:{line_no}: includes \"{target}\"")

    for path in files(root / "include" / "zmuon"):
        check(path, set())
    for layer, i in rank.items():
        below = {name for name, j in rank.items() if j <= i}
        for path in files(root / "src" / layer):
            check(path, below)
    for tool in tools:
        for path in files(root / "tools" / tool):
            check(path, set(rank) | {tool})
    return found


def enumerate_includes(path):
    text = path.read_text(errors="replace")
    for m in INCLUDE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


def self_test(root):
    """A planted upward include (the lowest layer reaching the highest) must be reported."""
    rank = layers(root)
    lowest, highest = min(rank, key=rank.get), max(rank, key=rank.get)
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp)
        for part in ("src", "include", "tools"):
            shutil.copytree(root / part, copy / part)
        victim = next(iter(sorted(files(copy / "src" / lowest))))
        planted = f'#include "{highest}/planted.hpp"\n'
        victim.write_text(planted + victim.read_text())
        found = violations(copy)
        if not any(f'"{highest}/planted.hpp"' in v for v in found):
            print(f"layering self-test: an include of {highest}/ planted in {victim.name} "
                  f"({lowest}/) was not reported")
            return False
    print(f"layering self-test: an include of {highest}/ planted in src/{lowest}/ is reported")
    return True


def main(argv):
    args = [a for a in argv if a != "--self-test"]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(args[0]).resolve()
    if "--self-test" in argv and not self_test(root):
        return 1
    found = violations(root)
    for v in found:
        print(v)
    order = " < ".join(sorted(layers(root), key=layers(root).get))
    print(f"layering: {len(found)} upward include(s); layers {order}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
