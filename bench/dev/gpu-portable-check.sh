#!/usr/bin/env bash
# The GPU half of the portability checks (the CPU half is ctest's packaging_wheel):
#   1. the cuBLAS-only path (what every non-Hopper device runs) forced on a Hopper GPU, against
#      the sm_90a path: Newton-Schulz's results (test_cuda_kernels' newton_schulz/own_gemm_*
#      and own_gemm: the own GEMM against the same call on cuBLAS only, within bf16 noise),
#      then the step time of both
#      (zmuon-bench-step with and without --cublas-only: GPT-2 124M and Llama 1B tables), and
#      bench_ns --tables (its cuBLAS-only column);
#   2. the release wheel installed for this machine's Python (pip --target, so its own torch and
#      that torch's nvidia-* wheels), training GPT-2 small on CUDA with
#      zmuon.Muon and no backend setting, from outside the checkout (wheel_gpt2_cuda.py).
#
# Here (no GPU needed):
#   bench/dev/gpu-check.sh pack && tools/wheel/build-wheel.sh &&
#     mkdir -p .carry/wheel && cp build/wheel/dist/zmuon-*.whl .carry/wheel/
# There, with .carry carried: bash bench/dev/gpu-portable-check.sh   (logs in $OUT or ./out)
#   PARTS="cublas" or PARTS="wheel" runs one half; WHEEL_ARGS adds wheel_gpt2_cuda.py arguments
#   (e.g. WHEEL_ARGS='--config {"zmuon":{"backend":"cuda"}}' where the tensors' device is not
#   yet read).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
parts=" ${PARTS:-cublas wheel} "
status=0

if [[ $parts == *" cublas "* ]]; then
  run() {  # name, then the gpu-check.sh exec arguments
    local name="$1"
    shift
    echo "== $name"
    bash bench/dev/gpu-check.sh exec "$@" 2>&1 | tee "$out/portable_$name.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  }
  run own_vs_cublas test_cuda_kernels --run_test='newton_schulz/own_gemm_*:own_gemm' \
    --log_level=message
  for table in gpt2-124m llama-1b; do
    run "step_${table}_sm90a" zmuon-bench-step --table "$table" --steps 10
    run "step_${table}_cublas" zmuon-bench-step --table "$table" --steps 10 --cublas-only
  done
  run ns_tables bench_ns --tables --reps 20
fi

if [[ $parts == *" wheel "* ]]; then
  echo "== the wheel, GPT-2 small on CUDA"
  wheel=$(ls .carry/wheel/zmuon-*.whl 2>/dev/null | head -1)
  if [[ -z $wheel ]]; then
    echo "gpu-portable-check: no .carry/wheel/zmuon-*.whl: build it here (see the header)" >&2
    status=1
  else
    # Installed into a directory of its own on this machine's Python (whose torch may live in
    # its user site, which a venv would not see), run from outside the checkout.
    site=/tmp/zmuon-wheel-site
    rm -rf "$site" /tmp/zmuon-wheel-outside && mkdir -p /tmp/zmuon-wheel-outside
    python3 -m pip install -q --no-deps --no-index --target "$site" "$wheel" &&
      cp bench/dev/wheel_gpt2_cuda.py /tmp/zmuon-wheel-outside/ &&
      (cd /tmp/zmuon-wheel-outside && unset ZMUON_LIBRARY && export PYTHONPATH="$site" ZMUON_WHEEL_SITE="$site" &&
        python3 wheel_gpt2_cuda.py ${WHEEL_ARGS:-}) 2>&1 | tee "$out/portable_wheel.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
fi
exit $status
