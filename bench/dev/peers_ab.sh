#!/usr/bin/env bash
# Builds of zmuon side by side on one GPU machine, alternating: bench/dev/peers.sh once per build
# and round, each run with its call timeline, then a line per run of the step's phases
# (bench/dev/trace_gaps.py --phases). Only rows of one machine compare, and between runs of one
# build the GPT-2 step moves by about 0.3 ms: two or three rounds.
#
#   PEERS_AB="base=.carry/baselib/libzmuon.so new=" bash bench/dev/peers_ab.sh   # there, .carry carried
#
# PEERS_AB: NAME=LIB[:PYTHON] pairs, LIB a libzmuon.so (empty: the packed one, gpu-check.sh
# pack), PYTHON a python/ folder of zmuon (default: this tree's); ROUNDS (default 2); PEERS_RUNS
# (default gpt2); PEERS_ONLY (default zmuon-auto); more peers_step.py arguments in PEERS_ARGS.
# Before the rounds: one run of the first build that is not kept (the machine's first run of a
# call has been the slowest), then Dion's best (dion-graph) in a process of its own, for the
# ratio (PEERS_DION=0: neither). Rows and phases go to stdout and under $OUT, the timelines there
# as a tarball.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
work=/tmp/zmuon-peers-ab
rm -rf "$work" && mkdir -p "$work"
only="${PEERS_ONLY:-zmuon-auto}"
read -r -a pairs <<<"${PEERS_AB:?"PEERS_AB: NAME=LIB pairs"}"

# One peers.sh run: TAG, the peers_step.py keys, then the build's NAME=LIB[:PYTHON] pair.
one_run() {
  local tag="$1" which="$2" pair="$3"
  local lib="${pair#*=}" python=""
  [[ $lib == *:* ]] && python="${lib#*:}" lib="${lib%%:*}"
  [[ -n $lib ]] && export ZMUON_LIBRARY="$root/$lib" || unset ZMUON_LIBRARY
  [[ -n $python ]] && export ZMUON_PYTHON="$root/$python" || unset ZMUON_PYTHON
  local start=$SECONDS
  PEERS_RUNS="${PEERS_RUNS:-gpt2}" OUT="$work/out-$tag" \
    PEERS_ARGS="--only $which --steps 20 --warmup 5 --timeline $work/$tag ${PEERS_ARGS:-}" \
    bash bench/dev/peers.sh 2>&1 | grep -E "optimizer |Error|Traceback" | sed "s/^/[$tag] /"
  echo "[$tag] the run took $((SECONDS - start)) s" >&2
}

if [[ ${PEERS_DION:-1} != 0 ]]; then
  one_run warm-up "$only" "${pairs[0]}" >/dev/null  # not kept
  rm -rf "$work/warm-up"
  one_run dion dion-graph "${pairs[0]}" | tee -a "$out/ab.md"
fi
for round in $(seq "${ROUNDS:-2}"); do
  for pair in "${pairs[@]}"; do
    one_run "${pair%%=*}-$round" "$only" "$pair" | tee -a "$out/ab.md"
  done
done
unset ZMUON_LIBRARY ZMUON_PYTHON
find "$work" -name '*.calls.json' | sort | while read -r f; do
  python3 bench/dev/trace_gaps.py --phases "$f"
done | sed "s|$work/||" | tee -a "$out/ab.md"
tar -czf "$out/timelines.tgz" -C "$work" --exclude='out-*' .
