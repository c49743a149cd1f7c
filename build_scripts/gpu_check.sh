#!/usr/bin/env bash
# The one GPU call (H200): environment, peers, GPU tests + compute-sanitizer, kernel benchmarks side by side with the
# peers, model-level compare; prints a short table last. Results land in $OUT (default ./gpu_out).
#   bash build_scripts/gpu_check.sh [tests] [bench] [compare]      (default: all three)
# Carry .whl (peer wheels + prebuilt FlashInfer modules, see trtllm_replayssm/bench/flashinfer_aot.py) for the peers.
# The device tool returns at most 8 files from its $OUT, so write elsewhere and pack, e.g.:
#   PACK_TO=$OUT OUT=/tmp/gpu_out bash build_scripts/gpu_check.sh bench
# Budget: a fresh H200 call takes ~45-60 s to start; tests ~2 min; bench ~4 min (FlashInfer's checkpointing_ssu
# autotuner needs ~14 s per profile at large batch); compare of the two 4B models ~2 min.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRTLLM_REPLAYSSM_CACHE=${TRTLLM_REPLAYSSM_CACHE:-/tmp/trtllm_replayssm_cache}
steps="${*:-tests bench compare}"
has() { [[ " $steps " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, cuda.bindings; from trtllm_replayssm.core.jit.compiler import nvrtc_version; \
print('torch', torch.__version__, 'cuda-bindings', cuda.bindings.__version__, 'nvrtc', nvrtc_version())"

if [ -d .whl ]; then  # peers: FlashInfer (prebuilt sm_90a mamba modules), fla-core, mamba-ssm's Triton SSU
  PEERS=/tmp/replayssm_peers
  rm -rf "$PEERS"  # pip --target skips packages whose folder exists: install first, then add the AOT modules
  python3 -m pip install --quiet --no-index --no-deps --target "$PEERS" .whl/flashinfer_python-*.whl \
    .whl/apache_tvm_ffi-*.whl .whl/fla_core-*.whl
  mkdir -p "$PEERS/flashinfer/data/aot"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
    .whl/flashinfer_aot.tar.xz "$PEERS/flashinfer/data/aot"
  export PYTHONPATH="$PEERS:$PYTHONPATH" REPLAYSSM_MAMBA_SSM_SRC="$PWD/.whl/mamba_ssm_src"
  export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer_ws FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
fi

if has tests; then
  timeout 420 python3 -m pytest -q -m "gpu or kernels" tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 15
  for t in "tests/test_mamba2_gpu.py::test_sanitizer_smoke" "tests/test_gdn_kda_gpu.py -k sanitizer_smoke" \
           "tests/test_decoder_layer_ops.py"; do
    timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
      python3 -m pytest -q $t > "$OUT/sanitizer.log" 2>&1
    echo "compute-sanitizer memcheck [$t]: rc=$? $(grep -h 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -n 1)"
  done
fi
if has bench; then  # fp32 state at every batch first, then bf16 state at serving batches (separate files)
  # BENCH_ARGS narrows the run, e.g. "--family mamba2 --models nemotron-3-super-120b"; BENCH_BF16=0 skips bf16.
  timeout "${BENCH_TIMEOUT:-400}" python3 -m trtllm_replayssm bench kernels --state-dtype fp32 ${BENCH_ARGS:-} \
    -o "$OUT/kernels-h200-fp32.json" > "$OUT/bench_fp32.log" 2>&1; echo "bench fp32 rc=$?"
  if [ "${BENCH_BF16:-1}" = 1 ]; then
    timeout "${BENCH_BF16_TIMEOUT:-200}" python3 -m trtllm_replayssm bench kernels --state-dtype bf16 --batch 64,256 \
      ${BENCH_ARGS:-} -o "$OUT/kernels-h200-bf16.json" > "$OUT/bench_bf16.log" 2>&1; echo "bench bf16 rc=$?"
  fi
  tail -n 3 "$OUT"/bench_*.log
fi
if has compare; then  # whole 4B models, then layer slices of the 120B/122B models (COMPARE_SLICES=0 skips them)
  batches=${COMPARE_BATCH:-1,8,64,256}
  timeout "${COMPARE_TIMEOUT:-400}" python3 -m trtllm_replayssm compare nemotron-3-nano-4b qwen3.5-4b \
    --batch "$batches" --steps "${COMPARE_STEPS:-64}" -o "$OUT/compare-full" > "$OUT/compare.log" 2>&1
  echo "compare rc=$?"; tail -n 25 "$OUT/compare.log"
  if [ "${COMPARE_SLICES:-1}" = 1 ]; then
    timeout "${COMPARE_SLICES_TIMEOUT:-400}" python3 -m trtllm_replayssm compare nemotron-3-super-120b qwen3.5-122b \
      --gpu-layers 12 --batch "$batches" --steps "${COMPARE_STEPS:-64}" -o "$OUT/compare-slices" \
      > "$OUT/compare_slices.log" 2>&1
    echo "compare slices rc=$?"; tail -n 25 "$OUT/compare_slices.log"
  fi
fi
for f in "$OUT"/kernels-h200-*.json; do
  [ -f "$f" ] && python3 -c "import sys; from trtllm_replayssm.lab.bench.report import load_results, \
summary_markdown; print(summary_markdown(load_results(sys.argv[1])))" "$f"
done
if [ -n "${PACK_TO:-}" ]; then tar czf "$PACK_TO/gpu_results.tgz" -C "$OUT" . && echo "packed $OUT -> $PACK_TO"; fi
exit 0
