#!/usr/bin/env bash
# examples/torch_train.py on the GPU machine, which has PyTorch but neither CAF nor OpenBLAS:
# libzmuon.so and the libraries it needs beyond glibc/libstdc++ (and CUDA's) are built here and
# carried.
#
#   examples/torch_train_gpu.sh pack     # here: build libzmuon (build/), pack .carry/embed/
#   examples/torch_train_gpu.sh          # there, from the repository root, .carry carried:
#                                        # 200 steps on cuda (if a GPU is seen) and on cpu,
#                                        # logs to $OUT (default ./out)
#
# With the device tool: run(command="bash examples/torch_train_gpu.sh", carry=[".carry"]).
# STEPS=N changes the step count.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bundle=.carry/embed/libzmuon.tar.gz

pack() {
  set -e
  cmake -S . -B build -G Ninja >/dev/null
  ninja -C build -j"${JOBS:-2}" zmuon
  local stage
  stage="$(mktemp -d)"
  mkdir -p "$stage/lib"
  cp -L build/embed/libzmuon.so "$stage/lib/libzmuon.so"
  ldd build/embed/libzmuon.so | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
    grep -Ev '/(libcudart|libcublas|libcublasLt|libnccl)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  mkdir -p "$(dirname "$bundle")"
  tar -C "$stage" -czf "$bundle" lib
  rm -rf "$stage"
  echo "packed $(du -h "$bundle" | cut -f1) into $bundle:"
  tar -tzf "$bundle"
}

run() {
  local out="${OUT:-$root/out}" lib
  mkdir -p "$out"
  lib="$(mktemp -d)"
  tar -C "$lib" -xzf "$bundle" || { echo "no $bundle: run '$0 pack' first and carry .carry"; exit 2; }
  export LD_LIBRARY_PATH="$lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  export ZMUON_LIBRARY="$lib/lib/libzmuon.so" PYTHONPATH="$root/python" PYTHONUNBUFFERED=1
  local devices=(cpu) rc=0
  python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' &&
    devices=(cuda cpu)
  for dev in "${devices[@]}"; do
    echo "== examples/torch_train.py --steps ${STEPS:-200} --device $dev"
    python3 examples/torch_train.py --steps "${STEPS:-200}" --device "$dev" >"$out/torch_train_$dev.log" 2>&1 || rc=1
    grep '^#' "$out/torch_train_$dev.log"
    tail -3 "$out/torch_train_$dev.log"
  done
  exit $rc
}

case "${1:-run}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: $0 [pack|run]"; exit 2 ;;
esac
