#!/usr/bin/env bash
# examples/torch_train.py on the GPU machine, which has PyTorch but neither CAF nor OpenBLAS:
# libzmuon.so (with the CUDA backend) and the libraries it needs beyond glibc/libstdc++ (and
# CUDA's) are built here and carried.
#
#   examples/torch_train_gpu.sh pack     # here: build libzmuon (build/), pack .carry/embed/
#   examples/torch_train_gpu.sh          # there, from the repository root, .carry carried:
#                                        # 200 steps on cuda (if a GPU is seen) and on cpu,
#                                        # logs to $OUT (default ./out)
#
# With the device tool: run(command="bash examples/torch_train_gpu.sh", carry=[".carry"]).
# STEPS=N changes the step count; ARGS="..." adds options of torch_train.py (e.g. ARGS="--d-model
# 768 --heads 12 --layers 12 --zmuon-comm nccl"); DEVICES="cuda" runs only the given devices;
# BENCH=bench/torch_optim_step.py runs that script instead (the optimizer step in its parts).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bundle=.carry/embed/libzmuon.tar.gz

pack() {
  set -e
  # With the CUDA backend built in (zmuon's cuda compute backend on the GPU machine).
  cmake -S . -B build-cuda -G Ninja -DZMUON_CUDA=ON >/dev/null
  ninja -C build-cuda -j"${JOBS:-2}" zmuon
  local stage
  stage="$(mktemp -d)"
  mkdir -p "$stage/lib"
  cp -L build-cuda/src/embed/libzmuon.so "$stage/lib/libzmuon.so"
  ldd build-cuda/src/embed/libzmuon.so | awk '/=> \// {print $3}' | sort -u |
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
  # shellcheck disable=SC2206
  local devices=(${DEVICES:-cpu}) rc=0
  [[ -z "${DEVICES:-}" ]] &&
    python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' &&
    devices=(cuda cpu)
  for dev in "${devices[@]}"; do
    echo "== examples/torch_train.py --steps ${STEPS:-200} --device $dev (zmuon backend: cuda on cuda)"
    local backend=host
    [[ $dev == cuda ]] && backend=cuda  # zmuon's own CUDA backend beside PyTorch's
    # shellcheck disable=SC2086
    python3 "${BENCH:-examples/torch_train.py}" --steps "${STEPS:-200}" --device "$dev" \
      --zmuon-backend "$backend" ${ARGS:-} >"$out/torch_train_$dev.log" 2>&1 || rc=1
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
