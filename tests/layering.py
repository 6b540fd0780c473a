#!/usr/bin/env python3
"""The folders are the layers: fail on an include that points up a layer.

The layers are src/CMakeLists.txt's add_subdirectory() lines, bottom-up. A file in src/LAYER/
may include any layer at or below its own, and the public headers ("zmuon/...") of those layers:
each public header has the layer of PUBLIC_LAYERS below (the lowest that may include it), and
includes only public headers at or below it. Other libraries' headers ("caf/...") are not ours
to order. A tool (tools/TOOL/) may include every layer and its own headers, not another tool's.
Tests and benchmarks may include anything.

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

# include/zmuon/NAME -> its layer: the lowest layer that may include it. A new public header gets
# a line here (an unlisted one is reported).
PUBLIC_LAYERS = {
    "status.hpp": "base",
    "log.hpp": "base",
    "version.hpp": "base",
    "options.hpp": "plan",
    "param.hpp": "plan",
    "call_times.hpp": "kernels",
    "memory.hpp": "kernels",
    "group_hparams.hpp": "messages",
    "rank_state.hpp": "messages",
    "tensor.hpp": "checkpoint",
    "config.hpp": "config",
    "lr_schedule.hpp": "config",
    "engine.hpp": "engine",
    "orthogonalize.hpp": "embed",
    "zmuon.h": "embed",
}
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


def public_layers(root, rank, found):
    """include/zmuon/NAME -> its layer's index; an unlisted header or unknown layer is reported."""
    out = {}
    for path in sorted(files(root / "include" / "zmuon")):
        layer = PUBLIC_LAYERS.get(path.name)
        if layer not in rank:
            found.append(f"{path.relative_to(root)}: no layer in layering.py's PUBLIC_LAYERS")
            continue
        out[path.name] = rank[layer]
    return out


def violations(root):
    rank = layers(root)
    tools = {p.name for p in (root / "tools").iterdir() if p.is_dir()}
    ours = set(rank) | tools | {"support", "bench", "tests"}  # anything else is a library's
    found = []
    public = public_layers(root, rank, found)

    def check(path, allowed, level):
        """`allowed`: the layers `path` may include; `level`: the highest public header layer."""
        for line_no, target in enumerate_includes(path):
            top = target.split("/", 1)[0]
            if top == "zmuon" and public.get(target.split("/", 1)[-1], 0) <= level:
                continue
            if top == "zmuon" and target.split("/", 1)[-1] in public:
                found.append(f"{path.relative_to(root)}:{line_no}: includes \"{target}\" "
                             f"(a public header of a higher layer)")
                continue
            if top != "zmuon" and (top in allowed or (top not in ours and "/" in target)):
                continue
            if "/" not in target and (path.parent / target).exists():
                continue  # a neighbour in the same folder
            found.append(f"{path.relative_to(root)}:{line_no}: includes \"{target}\"")

    for path in files(root / "include" / "zmuon"):
        check(path, set(), public.get(path.name, -1))
    for layer, i in rank.items():
        below = {name for name, j in rank.items() if j <= i}
        for path in files(root / "src" / layer):
            check(path, below, i)
    for tool in tools:
        for path in files(root / "tools" / tool):
            check(path, set(rank) | {tool}, len(rank))
    return found


def enumerate_includes(path):
    text = path.read_text(errors="replace")
    for m in INCLUDE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


def self_test(root):
    """Planted upward includes must be reported: the lowest layer reaching the highest layer's
    folder, and reaching the highest layer's public header."""
    rank = layers(root)
    lowest, highest = min(rank, key=rank.get), max(rank, key=rank.get)
    top_header = max(PUBLIC_LAYERS, key=lambda h: rank.get(PUBLIC_LAYERS[h], -1))
    ok = True
    for planted in (f"{highest}/planted.hpp", f"zmuon/{top_header}"):
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp)
            for part in ("src", "include", "tools"):
                shutil.copytree(root / part, copy / part)
            victim = next(iter(sorted(files(copy / "src" / lowest))))
            victim.write_text(f'#include "{planted}"\n' + victim.read_text())
            if any(f'"{planted}"' in v for v in violations(copy)):
                print(f"layering self-test: an include of {planted} planted in src/{lowest}/ "
                      "is reported")
            else:
                print(f"layering self-test: an include of {planted} planted in {victim.name} "
                      f"({lowest}/) was not reported")
                ok = False
    return ok


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
