#!/usr/bin/env bash
# The one command for every GPU check of the CUDA backend: test_cuda_kernels (each kernel against
# the host backend), test_engine_cuda (the whole engine on CUDA against the host backend, nccl and
# caf comms), zmuon-launch --backend cuda, bench_ns (zmuon's NS5 against the GEMM ceiling),
# bench_sm90_gemm (the own Hopper GEMM against cuBLAS) and bench/ns_torch.py
# (PyTorch's NS5 eager / torch.compile / torch.optim.Muon, and the final table), and the whole
# step traced (zmuon-bench-step --json: phases, bytes, plumbing) beside PyTorch's NS batched by
# shape (ns_torch.py --step-json: the step table, $OUT/step_table.md).
#
# The GPU machine has CUDA, CMake and PyTorch but no Boost or OpenBLAS, so the binaries are built
# on a development machine and carried:
#
#   bench/dev/gpu-check.sh pack  # here: the project with -DZMUON_CUDA=ON in build-cuda/, packed
#                                # into .carry/gpu/ (no GPU needed to build)
#   QUICK=1 bench/dev/gpu-check.sh pack   # only the kernel targets of that build
#                                # (test_cuda_kernels, bench_ns, bench_sm90_gemm), for "exec"
#                                # runs of those: the engine's CAF build is the long part
#   bench/dev/gpu-check.sh       # there, from the repository root, with .carry carried:
#                                # runs everything, logs and tables to $OUT (default ./out)
#   ONLY_STEP=1 bench/dev/gpu-check.sh   # only zmuon-bench-step, bench_ns and the tables
#   SKIP_NS=1 bench/dev/gpu-check.sh     # everything but bench_ns and the NS table
#   SKIP_NS=1 SKIP_STEP=1 bench/dev/gpu-check.sh   # also without zmuon-bench-step and the
#                                # owners' balance: the tests, the PyTorch benches (about 7 min)
#   bench/dev/gpu-check.sh exec zmuon-bench-step --table llama-1b ...   # one carried binary
#   bench/dev/gpu-check.sh profile KERNEL_REGEX COUNT BINARY ARGS...   # Nsight Compute on COUNT
#                                    # launches of the kernels matching KERNEL_REGEX (clocks left
#                                    # alone), e.g. profile sm90_gemm_kernel 4 bench_sm90_gemm
#                                    # --only "48x768, k 768" --reps 1
#   TABLES_CANDIDATES="8 32" bench/dev/gpu-check.sh   # only bench_ns --tables, once per count of
#                                    # cuBLASLt algorithms timed per shape
#   bench/dev/gpu-check.sh base REV  # here: bench_ns and bench_sm90_gemm built at git revision
#                                # REV (one with this layout: bench/cuda built by the main
#                                # project) into .carry/base/, in a worktree in build-gpu-base/
#   bench/dev/gpu-check.sh ab    # there: base and packed binaries alternating, twice each
#                                # (bench_sm90_gemm, bench_ns --variant standard, the tables;
#                                # AB="gemm variants" picks parts: all three take over 10 min;
#                                # AB=flip: the new bench_ns with and without --update-flipped,
#                                # no base binaries needed): a change between versions counts
#                                # only past the spread of each version's own two runs.
#                                # Logs ab_*.log in $OUT
#
#   bench/dev/gpu-check.sh latency   # there: zmuon.Muon.step()'s host time in its parts, its
#                                # call timeline and one step's message trace on Python's clock
#                                # (bench/torch_step_latency.py --trace, with the same .grad
#                                # tensors and with new ones each step): $OUT/step_latency*.txt
#                                # (LATENCY_ARGS: more of its arguments, e.g. "--idle-ms 40")
#
# With the device tool: run(command="bash bench/dev/gpu-check.sh", carry=[".carry"]).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bundle=.carry/gpu/gpu-check.tar.gz
unpacked=/tmp/zmuon-gpu-check  # where check and ab unpack the bundle

# The binaries a pack carries, as paths in the CUDA build: the kernel targets (QUICK=1 packs
# only these), then the engine's.
kernel_binaries=(tests/gpu/test_cuda_kernels bench/cuda/bench_ns bench/cuda/bench_sm90_gemm)
engine_binaries=(tests/gpu/test_engine_cuda tests/gpu/test_orthogonalize_cuda
  tools/zmuon-launch/zmuon-launch bench/step/zmuon-bench-step)
engine_library=src/embed/libzmuon.so  # the Python package's

pack() {
  set -e
  local jobs="${JOBS:-2}" build=build-cuda binaries=("${kernel_binaries[@]}") path
  [[ -z "${QUICK:-}" ]] && binaries+=("${engine_binaries[@]}")
  # The GPU machine is Hopper: its SASS alone (and sm_90a) unless ZMUON_CUDA_ARCHS says more.
  cmake -S . -B "$build" -G Ninja -DZMUON_CUDA=ON -DZMUON_CUDA_ARCHS="${ZMUON_CUDA_ARCHS:-90-real}" \
    >/dev/null
  local targets=()
  for path in "${binaries[@]}"; do targets+=("$(basename "$path")"); done
  [[ -z "${QUICK:-}" ]] && targets+=(zmuon)
  ninja -C "$build" -j"$jobs" "${targets[@]}"
  local stage
  stage="$(mktemp -d)"
  mkdir -p "$stage/bin" "$stage/lib"
  for path in "${binaries[@]}"; do cp "$build/$path" "$stage/bin/"; done
  [[ -z "${QUICK:-}" ]] && cp -L "$build/$engine_library" "$stage/lib/libzmuon.so"
  # Every non-CUDA, non-glibc library they load (Boost.Test, OpenBLAS and its Fortran runtime).
  find "$stage/bin" "$stage/lib" -type f -exec ldd {} + | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
    grep -Ev '/(libcudart|libcublas|libcublasLt|libnccl)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  mkdir -p "$(dirname "$bundle")"
  tar -C "$stage" -czf "$bundle" bin lib
  rm -rf "$stage"
  echo "packed $(du -h "$bundle" | cut -f1) into $bundle:"
  tar -tzf "$bundle"
}

# Directories holding the CUDA libraries the binaries need, wherever this machine keeps them.
cuda_library_path() {
  local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
  local lib found
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=""
    for d in "${dirs[@]}"; do [[ -e "$d/$lib" ]] && found="$d" && break; done
    if [[ -z "$found" ]]; then
      found="$(find /usr /opt -name "$lib" -print -quit 2>/dev/null)"
      [[ -n "$found" ]] && dirs+=("$(dirname "$found")")
    fi
  done
  local IFS=:
  echo "${dirs[*]}"
}

# The packed bundle into $unpacked (bin/, lib/), its libraries on LD_LIBRARY_PATH.
unpack() {
  local work="$unpacked"
  rm -rf "$work" && mkdir -p "$work"
  if [[ ! -f "$bundle" ]]; then
    echo "gpu-check: $bundle missing: run 'bench/dev/gpu-check.sh pack' here and carry .carry" >&2
    return 1
  fi
  tar -C "$work" -xzf "$bundle"
  export LD_LIBRARY_PATH="$work/lib:$(cuda_library_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# ns_torch.py --interleave with the unpacked libzmuon.so, cut at $1 seconds; the rest are its
# arguments.
interleave() {
  local limit="$1"
  shift
  ZMUON_LIBRARY="$unpacked/lib/libzmuon.so" PYTHONPATH="$root/python" timeout "$limit" \
    python3 bench/ns_torch.py --interleave "$@"
}

# bench/torch_step_latency.py with the unpacked libzmuon.so on the GPU, both ways of .grad.
latency() {
  local out="${OUT:-$root/out}" status=0
  mkdir -p "$out"
  unpack || return 1
  for grads in same fresh; do
    local extra=() log="$out/step_latency.txt"
    [[ $grads == fresh ]] && extra=(--fresh-grads) && log="$out/step_latency_fresh_grads.txt"
    echo "== bench/torch_step_latency.py --device cuda --trace ${extra[*]}"
    # shellcheck disable=SC2086
    ZMUON_LIBRARY="$unpacked/lib/libzmuon.so" PYTHONPATH="$root/python" timeout 200 \
      python3 bench/torch_step_latency.py --device cuda --trace "${extra[@]}" ${LATENCY_ARGS:-} \
      >"$log" 2>&1
    [[ $? -ne 0 ]] && status=1
    grep -E "median|one step|one traced" "$log"
  done
  return $status
}

check() {
  local out="${OUT:-$root/out}"
  mkdir -p "$out"
  export PYTHONUNBUFFERED=1
  local work="$unpacked"
  unpack || return 1
  if [[ $# -gt 0 && $1 == --profile ]]; then  # profile: ncu over one carried binary
    local kernels="$2" count="$3" bin="$4"
    shift 4
    ncu --clock-control none --kernel-name "regex:$kernels" --launch-count "$count" \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section SchedulerStats --section WarpStateStats --section Occupancy \
      "$work/bin/$bin" "$@"
    return
  fi
  if [[ $# -gt 0 ]]; then  # exec: one carried binary with its arguments
    local bin="$1"
    shift
    "$work/bin/$bin" "$@"
    return
  fi

  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv >"$out/nvidia-smi.csv" 2>&1
  cat "$out/nvidia-smi.csv"
  if ldd "$work"/bin/* | grep -q 'not found'; then
    echo "gpu-check: unresolved libraries:" && ldd "$work"/bin/* | grep 'not found'
  fi

  local bench="$work/bin/bench_ns"
  "$bench" --help >/dev/null 2>&1
  if [[ $? -ne 2 ]]; then  # 2 is its usage exit; anything else means it cannot start
    echo "gpu-check: the carried bench_ns does not start here (ldd $bench)" >&2
    return 1
  fi

  local status=0 rc
  if [[ -n "${TABLES_CANDIDATES:-}" ]]; then
    # Only the parameter tables, group by group, once per cuBLASLt candidate count asked for.
    for c in $TABLES_CANDIDATES; do
      echo "== bench_ns --tables, ZMUON_GEMM_CANDIDATES=$c"
      ZMUON_GEMM_CANDIDATES="$c" timeout 300 "$bench" --tables --reps 20 2>&1 |
        tee -a "$out/bench_tables.log"
      [[ ${PIPESTATUS[0]} -ne 0 ]] && status=1
    done
    return $status
  fi
  if [[ -z "${ONLY_STEP:-}" ]]; then
    for test in test_cuda_kernels test_engine_cuda test_orthogonalize_cuda; do
      echo "== $test"
      timeout 300 "$work/bin/$test" --log_level=message --report_level=short \
        2>&1 | tee "$out/$test.log"
      rc=${PIPESTATUS[0]}
      echo "$test: exit $rc"
      [[ $rc -ne 0 ]] && status=1
    done

    echo "== zmuon from Python (libzmuon with the CUDA backend, PyTorch's tensors)"
    for script in tests/python/test_newton_schulz.py tests/python/gpu_newton_schulz_check.py \
        tests/python/gpu_torch_parity.py tests/python/gpu_rules_check.py \
        tests/python/gpu_torch_device.py; do
      ZMUON_LIBRARY="$work/lib/libzmuon.so" PYTHONPATH="$root/python" timeout 300 \
        python3 "$script" 2>&1 | tee -a "$out/python_newton_schulz.log" | tail -n 5
      rc=${PIPESTATUS[0]}
      echo "$script: exit $rc"
      [[ $rc -ne 0 ]] && status=1
    done

    echo "== zmuon.Muon in a PyTorch step beside torch.optim.Muon + AdamW (GPT-2 small), and"
    echo "   under FSDP2 (one process, nccl, CUDA tensors)"
    ZMUON_LIBRARY="$work/lib/libzmuon.so" PYTHONPATH="$root/python" timeout 300 \
      python3 bench/torch_optim_step.py --device cuda --steps 25 2>&1 |
      tee "$out/torch_optim_step.log" | tail -n 12
    [[ ${PIPESTATUS[0]} -ne 0 ]] && status=1 && echo "torch_optim_step.py: exit non-zero"
    # The step time without the check for writes outside zmuon (the figure before it).
    ZMUON_LIBRARY="$work/lib/libzmuon.so" PYTHONPATH="$root/python" timeout 300 \
      python3 bench/torch_optim_step.py --device cuda --steps 25 --write-check off 2>&1 |
      tee "$out/torch_optim_step_no_write_check.log" | tail -n 3
    [[ ${PIPESTATUS[0]} -ne 0 ]] && status=1 && echo "torch_optim_step.py --write-check off: exit non-zero"
    ZMUON_LIBRARY="$work/lib/libzmuon.so" PYTHONPATH="$root/python" timeout 300 \
      torchrun --nproc-per-node 1 bench/torch_fsdp2_step.py --device cuda --steps 20 2>&1 |
      grep -v '^W1' | tee "$out/torch_fsdp2_step.log" | tail -n 6
    [[ ${PIPESTATUS[0]} -ne 0 ]] && status=1 && echo "torch_fsdp2_step.py: exit non-zero"
    # The tensor-parallel placement (TP 1 x FSDP2 1) beside plain FSDP2.
    ZMUON_LIBRARY="$work/lib/libzmuon.so" PYTHONPATH="$root/python" timeout 300 \
      torchrun --nproc-per-node 1 bench/torch_fsdp2_step.py --device cuda --steps 20 --tp 1 2>&1 |
      grep -v '^W1' | tee "$out/torch_fsdp2_step_tp.log" | tail -n 3
    [[ ${PIPESTATUS[0]} -ne 0 ]] && status=1 && echo "torch_fsdp2_step.py --tp 1: exit non-zero"

    echo "== zmuon-launch on the GPU"
    for comm in "nccl --ranks 1" "caf --ranks 4"; do
      echo "-- zmuon-launch --backend cuda --comm $comm --steps 30"
      # shellcheck disable=SC2086
      timeout 120 "$work/bin/zmuon-launch" --backend cuda --comm $comm --steps 30 \
        2>&1 | tee -a "$out/zmuon_launch.log" | sed -n '1,3p;$p'
      rc=${PIPESTATUS[0]}
      echo "exit $rc"
      [[ $rc -ne 0 ]] && status=1
    done
  fi

  if [[ -n "${SKIP_STEP:-}" ]]; then
    echo "== zmuon-bench-step and the owners' balance skipped (SKIP_STEP set)"
  fi
  [[ -z "${SKIP_STEP:-}" ]] && echo "== zmuon-bench-step (the whole step through the engine, traced)"
  # Each run prints its phases, bytes (trace against plan, and DeepSpeed's scheme), plumbing
  # share and each backend call's device time (--call-times), and writes
  # $out/step_<table>_w<world>.json for the table after bench_ns, and beside it the median step's
  # backend calls as a Perfetto timeline (.timeline.json). The world-1 runs repeat with
  # --ns-variant standard (the default, auto, runs Gram on cuda) beside them; those write
  # step_<table>_w<world>_standard.json and stay out of the PyTorch table.
  local step_jsons=()
  local step_runs=("gpt2-124m 1 nccl 6 auto" "gpt2-124m 1 nccl 6 standard" "gpt2-124m 4 caf 3 auto"
    "llama-1b 1 nccl 4 auto" "llama-1b 1 nccl 4 standard")
  [[ -n "${SKIP_STEP:-}" ]] && step_runs=()
  for args in "${step_runs[@]}"; do
    local table world comm steps variant
    read -r table world comm steps variant <<<"$args"
    local json="$out/step_${table}_w${world}.json"
    [[ $variant != auto ]] && json="$out/step_${table}_w${world}_${variant}.json"
    echo "-- zmuon-bench-step --table $table --world $world --comm $comm --steps $steps --ns-variant $variant"
    timeout 420 "$work/bin/zmuon-bench-step" --table "$table" --world "$world" --comm "$comm" \
      --steps "$steps" --ns-variant "$variant" --device-grads --call-times --json "$json" \
      --timeline "${json%.json}.timeline.json" 2>&1 \
      | tee -a "$out/bench_step.log" | grep -v '^rank [1-9]'
    rc=${PIPESTATUS[0]}
    [[ $rc -ne 0 ]] && status=1 && echo "zmuon-bench-step: exit $rc"
    [[ -f "$json" && $variant == auto ]] && step_jsons+=("$json")
  done

  local owner_tables=(gpt2-124m llama-1b)
  [[ -n "${SKIP_STEP:-}" ]] && owner_tables=()
  [[ -z "${SKIP_STEP:-}" ]] && echo "== NS load balance of the owners at world 8 (target <= 1.15), one rank at a time"
  for table in "${owner_tables[@]}"; do
    timeout 300 "$work/bin/zmuon-bench-step" --ns-owners --table "$table" --world 8 \
      --compute cuda --steps 10 --json "$out/owners_${table}_w8.json" 2>&1 | tee -a "$out/owners.log"
    [[ ${PIPESTATUS[0]} -ne 0 ]] && status=1 && echo "zmuon-bench-step --ns-owners: exit non-zero"
  done

  if [[ -z "${ONLY_STEP:-}" ]]; then
    echo "== zmuon-launch, 2 node processes, nccl (the rendezvous hands out the NCCL id)"
    # With one GPU, NCCL must refuse two ranks on it: both nodes exit non-zero, naming it, no hang.
    timeout 120 "$work/bin/zmuon-launch" --local-nodes 2 --ranks-per-node 1 --backend cuda \
      --comm nccl --steps 3 2>&1 | tail -n 6
    echo "exit ${PIPESTATUS[0]} (with one GPU: non-zero expected)"

    echo "== zmuon-launch, 2 node processes, comm auto on one GPU, a checkpoint saved and resumed"
    # Both nodes bring the same GPU: the rendezvous makes no NCCL id and the job runs on caf.
    rm -rf "$work/ckpt_nodes"
    for args in "--steps 3 --save-checkpoint $work/ckpt_nodes --every 3" \
      "--steps 5 --resume $work/ckpt_nodes"; do
      # shellcheck disable=SC2086
      timeout 120 "$work/bin/zmuon-launch" --local-nodes 2 --ranks-per-node 1 --backend cuda \
        $args 2>&1 | grep -E "comm|resumed|step +[35] |exit|rror"
      rc=${PIPESTATUS[0]}
      echo "exit $rc"
      [[ $rc -ne 0 ]] && status=1
    done
  fi

  if [[ -n "${SKIP_NS:-}" ]]; then
    echo "== bench_ns and the NS table skipped (SKIP_NS set)"
  else
    echo "== bench_ns"
    timeout 240 "$bench" --json "$out/bench_ns.json" 2>&1 | tee "$out/bench_ns.log"
    rc=${PIPESTATUS[0]}
    [[ $rc -ne 0 ]] && status=1 && echo "bench_ns: exit $rc"

    echo "== bench_ns: NS variants (standard vs gram, NS5 and Polar Express)"
    for args in "--schedule ns5" "--schedule polar_express" "--schedule polar_express --gram-restart 0"; do
      # shellcheck disable=SC2086
      timeout 120 "$bench" --reps 10 $args 2>&1 | tee -a "$out/bench_ns.log"
      rc=${PIPESTATUS[0]}
      [[ $rc -ne 0 ]] && status=1 && echo "bench_ns $args: exit $rc"
    done

    echo "== bench_sm90_gemm: the own Hopper GEMM against cuBLAS on the NS products"
    timeout 120 "$work/bin/bench_sm90_gemm" 2>&1 | tee "$out/bench_sm90_gemm.log"
    rc=${PIPESTATUS[0]}
    [[ $rc -ne 0 ]] && status=1 && echo "bench_sm90_gemm: exit $rc"

    if [[ -f "$out/bench_ns.json" && -z "${SKIP_TORCH:-}" ]]; then
      echo "== ns_torch.py"
      timeout 420 python3 bench/ns_torch.py --zmuon "$out/bench_ns.json" --out "$out/ns_table.md" \
        2>&1 | tee "$out/ns_torch.log" | grep -v -E '^\s*$|Warning|warn\(' 
      rc=${PIPESTATUS[0]}
      [[ $rc -ne 0 ]] && status=1 && echo "ns_torch.py: exit $rc"
      echo "== ns_torch.py --interleave: zmuon.newton_schulz and eager NS5 alternating, one process"
      interleave 420 --out "$out/ns_interleave.md" 2>&1 |
        tee "$out/ns_interleave.log" | grep -v -E '^\s*$|Warning|warn\('
      rc=${PIPESTATUS[0]}
      [[ $rc -ne 0 ]] && status=1 && echo "ns_torch.py --interleave: exit $rc"
    fi
  fi

  if [[ ${#step_jsons[@]} -gt 0 ]]; then
    echo "== the whole step: zmuon beside PyTorch's NS batched by shape (ns_torch.py --step-json)"
    local with_ns=()
    [[ -f "$out/bench_ns.json" ]] && with_ns=(--zmuon "$out/bench_ns.json")
    timeout 300 python3 bench/ns_torch.py --step-json "${step_jsons[@]}" "${with_ns[@]}" \
      --out "$out/step_table.md" 2>&1 | tee "$out/step_torch.log" | grep -v -E '^\s*$|Warning|warn\('
    rc=${PIPESTATUS[0]}
    [[ $rc -ne 0 ]] && status=1 && echo "ns_torch.py --step-json: exit $rc"
  fi

  echo "== summary"
  if [[ -z "${ONLY_STEP:-}" ]]; then
    grep -E 'relative error|SKIPPED|failure|error:|No errors|Test module' \
      "$out/test_cuda_kernels.log" | tail -n 60
    grep -E 'relative|NS per|error|No errors|Test module' "$out/test_engine_cuda.log"
  fi
  [[ -f "$out/ns_table.md" ]] && cat "$out/ns_table.md"
  [[ -f "$out/ns_interleave.md" ]] && cat "$out/ns_interleave.md"
  [[ -f "$out/step_table.md" ]] && cat "$out/step_table.md"
  return $status
}

# Here: the two A/B binaries at revision $1, the project built in a worktree of its own.
base() {
  set -e
  local rev="${1:?usage: bench/dev/gpu-check.sh base REV}" tree=build-gpu-base/tree
  git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
  git worktree prune
  git worktree add --detach "$tree" "$rev" >/dev/null
  cmake -S "$tree" -B build-gpu-base/build -G Ninja -DZMUON_CUDA=ON >/dev/null
  ninja -C build-gpu-base/build -j"${JOBS:-2}" bench_ns bench_sm90_gemm
  mkdir -p .carry/base
  cp build-gpu-base/build/bench/cuda/bench_ns build-gpu-base/build/bench/cuda/bench_sm90_gemm \
    .carry/base/
  git -C "$tree" log -1 --format='%h %s' >.carry/base/REVISION
  echo "base: $(cat .carry/base/REVISION) in .carry/base/"
}

# There: base (.carry/base) against new (the packed bundle), alternating, two runs each.
ab() {
  local out="${OUT:-$root/out}"
  mkdir -p "$out"
  local parts=" ${AB:-gemm variants tables} "
  if [[ $parts != " flip " ]] &&
    [[ ! -x .carry/base/bench_ns || ! -x .carry/base/bench_sm90_gemm ]]; then
    echo "gpu-check ab: .carry/base/ has no binaries: run 'bench/dev/gpu-check.sh base REV' here" >&2
    return 1
  fi
  echo "base: $(cat .carry/base/REVISION 2>/dev/null), new: the packed bundle"
  local work=/tmp/zmuon-gpu-ab
  rm -rf "$work" && mkdir -p "$work/base"
  cp .carry/base/bench_ns .carry/base/bench_sm90_gemm "$work/base/" 2>/dev/null
  local status=0 round version bin
  run_pair() {  # $1 log name, $2 binary, $3 rows to print, rest: its arguments
    local log="$out/ab_$1.log" binary="$2" rows="$3"
    shift 3
    for round in 1 2; do
      for version in base new; do
        bin="../../zmuon-gpu-ab/base/$binary"
        [[ $version == new ]] && bin="$binary"
        echo "== $version, round $round: $binary $*" | tee -a "$log"
        check "$bin" "$@" 2>&1 | tee -a "$log" | grep -E "$rows"
        [[ ${PIPESTATUS[0]} -ne 0 ]] && status=1 && echo "exit non-zero"
      done
    done
  }
  [[ $parts == *" gemm "* ]] && run_pair gemm bench_sm90_gemm "case|sym|full|update|X'=" --reps 30
  [[ $parts == *" variants "* ]] && run_pair variants bench_ns "x[0-9]" --variant standard --reps 20
  [[ $parts == *" tables "* ]] && ZMUON_GEMM_CANDIDATES=8 run_pair tables bench_ns \
    "ceiling|gpt2-124m  |llama|x 768 x|2048x2048" --tables --reps 20
  if [[ $parts == *" flip "* ]]; then  # the new bench_ns alone: NS's update layout, both ways
    for round in 1 2; do
      for flag in "" --update-flipped; do
        echo "== round $round: bench_ns --sym 256 --reps 20 $flag" | tee -a "$out/ab_flip.log"
        check bench_ns --sym 256 --reps 20 $flag 2>&1 | tee -a "$out/ab_flip.log" |
          grep -E "x[0-9]|flipped"
      done
    done
  fi
  return $status
}

case "${1:-check}" in
  pack) pack ;;
  base) shift && base "$@" ;;
  ab) ab ;;
  check) check ;;
  exec) shift && check "$@" ;;
  profile) shift && check --profile "$@" ;;
  latency) latency ;;
  *) echo "usage: bench/dev/gpu-check.sh [pack|base REV|check|ab|latency|exec BINARY ARGS...|profile REGEX COUNT BINARY ARGS...]" >&2; exit 2 ;;
esac
