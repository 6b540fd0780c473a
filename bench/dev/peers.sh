#!/usr/bin/env bash
# zmuon's optimizer step beside torch.optim.Muon + AdamW and Dion's Muon (bench/peers_step.py) on
# the three models of the comparison: GPT-2-small untied, the same under FSDP2 world 1, and the
# Llama-1B shape. Dion comes from a `fetch github:microsoft/dion` snapshot, copied into .carry/
# (ignored by git) and carried to the GPU machine; it is never committed.
#
#   bench/dev/peers.sh dion [MIRROR]   # here: Dion's package into .carry/dion (MIRROR: the git
#                                      # directory fetch returned)
#   bench/dev/gpu-check.sh pack        # here: libzmuon with the CUDA backend, into .carry/gpu/
#   bench/dev/peers.sh                 # there, with .carry carried: prints the table and leaves it under $OUT
#   PEERS_RUNS: which of the three runs ("gpt2 gpt2-fsdp llama1b", the default); PEERS_ARGS: more
#   peers_step.py arguments (e.g. "--only zmuon-auto,dion-graph --profile $OUT/profile");
#   ZMUON_LIBRARY and ZMUON_PYTHON: another libzmuon.so and python/ folder (a base build's, for
#   an A/B in one session; the default: the packed library and this tree's package)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

if [[ ${1:-} == dion ]]; then
  mirror="${2:-/work/.mirror/microsoft+dion/repo}"
  rm -rf .carry/dion && mkdir -p .carry/dion
  git --git-dir="$mirror" archive HEAD dion | tar -x -C .carry/dion
  git --git-dir="$mirror" log -1 --format='%h %ci' >.carry/dion/REVISION
  echo "Dion $(cat .carry/dion/REVISION) in .carry/dion/"
  exit 0
fi

out="${OUT:-$root/out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
work=/tmp/zmuon-peers
rm -rf "$work" && mkdir -p "$work"
tar -C "$work" -xzf .carry/gpu/gpu-check.tar.gz
# cuBLAS and NCCL wherever that machine keeps them: the toolkit's and the pip wheels' folders
# first, a search of /usr and /opt (minutes on a cold disk) only where neither has one; found once
# per machine.
libdirs=/tmp/zmuon-peers-libdirs
if [[ ! -s $libdirs ]]; then
  cuda_dirs=/usr/local/cuda/lib64
  wheels="$(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib")
    for p in nvidia.__path__ for d in sorted(os.listdir(p))))' 2>/dev/null)"
  for lib in libcublas.so.13 libnccl.so.2; do
    found=""
    for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $wheels; do
      [[ -e $dir/$lib ]] && found="$dir/$lib" && break
    done
    [[ -z $found ]] && found="$(find /usr /opt -name "$lib" -print -quit 2>/dev/null)"
    [[ -n "$found" ]] && cuda_dirs+=":$(dirname "$found")"
  done
  echo "$cuda_dirs" >"$libdirs"
fi
cuda_dirs="$(cat "$libdirs")"
export LD_LIBRARY_PATH="$work/lib:$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ZMUON_LIBRARY="${ZMUON_LIBRARY:-$work/lib/libzmuon.so}" PYTHONPATH="${ZMUON_PYTHON:-$root/python}"
echo "Dion $(cat .carry/dion/REVISION 2>/dev/null)" | tee "$out/peers.md"
status=0
for run in ${PEERS_RUNS:-gpt2 gpt2-fsdp llama1b}; do
  args="--model ${run%-fsdp}"
  [[ $run == *-fsdp ]] && args+=" --fsdp"
  # shellcheck disable=SC2086
  timeout "${PEERS_TIMEOUT:-300}" python3 bench/peers_step.py $args --dion .carry/dion \
    --markdown "$out/peers.md" ${PEERS_ARGS:-} 2>&1 | grep -v -E 'Warning|warn\(|^\s*$'
  [[ ${PIPESTATUS[0]} -ne 0 ]] && status=1
done
cat "$out/peers.md"
exit $status
