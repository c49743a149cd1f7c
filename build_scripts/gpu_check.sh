#!/usr/bin/env bash
# The one GPU call: environment, GPU tests, compute-sanitizer, kernel benchmarks (with the peers when .whl is
# carried), model-level compare; prints a table of every step's result last and exits non-zero if any step failed.
# Results land in $OUT (default ./gpu_out).
#   bash build_scripts/gpu_check.sh [tests] [quantized] [long] [contract] [sanitize] [bench] [served] [small-batch] [stream] [quant-bench] [quant-speed] [crossovers]
#     [launch] [spec] [compare] [profile] [train] [accuracy] [ab]
#   (default: tests quantized long contract sanitize bench spec compare; train: the accuracy models TRAIN_MODELS from a carried
#   corpus/ into MODELS_DIR (default $OUT/models: one model's bf16 shards fill what comes back); accuracy: each of
#   ACC_MODELS from MODELS_DIR or a carried models/ on corpus/heldout/persuasion.txt, groups of states against one
#   fp32 baseline pass each, then the fp32 speculative windows). On the H200: training takes 92 s (byte-nemotron) and
#   190 s (byte-qwen); at ACC_TOKENS=131072 the first state group (10 specs) 134-178 s and the second 66-103 s per
#   model, so one device call (10 minutes at most) holds the groups of one model, not training and every accuracy run;
#   ab: benchmarks/dev/quant_speed.py in the source trees AB_TREES ("A B", e.g. `git archive` of two branches), both
#   trees' modules of AB_MODELS x AB_SPECS compiled first, rounds ABAB (benchmarks/dev/ab_trees.py). A branch's own
#   tests run with its tree's copy of this script: bash TREE/build_scripts/gpu_check.sh quantized sanitize
# Carry .whl (peer wheels + prebuilt FlashInfer modules, see trtllm_replayssm/lab/bench/flashinfer_aot.py) for the
# peers, and the pytest-xdist and execnet wheels for parallel GPU tests. The device tool returns at most 8 files from its $OUT, so write elsewhere and pack, e.g.:
#   PACK_TO=$OUT OUT=/tmp/gpu_out bash build_scripts/gpu_check.sh bench
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRTLLM_REPLAYSSM_CACHE=${TRTLLM_REPLAYSSM_CACHE:-/tmp/trtllm_replayssm_cache}
steps="${*:-tests quantized long contract sanitize bench spec compare}"
has() { [[ " $steps " == *" $1 "* ]]; }
results=()
record() {  # record NAME RC DETAIL
  results+=("$(printf '%-44s %-5s %s' "$1" "$([ "$2" = 0 ] && echo ok || echo "FAIL($2)")" "$3")")
  [ "$2" = 0 ] || failed=1
}
failed=0
# CALL_BUDGET (seconds): every step's time limit is cut to what is left of it, so that a call under a device time
# limit still ends with the table; a step with no time left is not started and records 124.
deadline=$(( $(date +%s) + ${CALL_BUDGET:-1000000} ))
bounded() {  # bounded SECONDS CMD...: timeout SECONDS, or less if the budget ends sooner
  local t=$1 left=$(( deadline - $(date +%s) - 10 )); shift
  [ "$left" -lt "$t" ] && t=$left
  if [ "$t" -le 0 ]; then echo "not started: no time left in CALL_BUDGET"; return 124; fi
  timeout "$t" "$@"
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/device.txt"
# the GPU in result file names (kernels-h100-fp32.json on an H100, kernels-h200-fp32.json on an H200, ...)
gpu=$(head -n 1 "$OUT/device.txt" | cut -d, -f1 | grep -oiE '[a-z][0-9]{3}' | head -n 1 | tr 'A-Z' 'a-z')
gpu=${gpu:-gpu}
python3 -c "import torch, cuda.bindings; from trtllm_replayssm.core.jit.compiler import nvrtc_version; \
print('torch', torch.__version__, 'cuda-bindings', cuda.bindings.__version__, 'nvrtc', nvrtc_version())"

if [ -d .whl ]; then  # peers: FlashInfer (prebuilt sm_90a mamba modules), fla-core, mamba-ssm's Triton SSU; and
  # hypothesis for the GPU property tests (tests/test_properties.py); whichever of them .whl holds
  PEERS=/tmp/replayssm_peers
  rm -rf "$PEERS"  # pip --target skips packages whose folder exists: install first, then add the AOT modules
  wheels=(.whl/*.whl)
  [ -e "${wheels[0]}" ] && python3 -m pip install --quiet --no-index --no-deps --target "$PEERS" "${wheels[@]}"
  if [ -f .whl/flashinfer_aot.tar.xz ]; then
    mkdir -p "$PEERS/flashinfer/data/aot"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
      .whl/flashinfer_aot.tar.xz "$PEERS/flashinfer/data/aot"
  fi
  export PYTHONPATH="$PEERS:$PYTHONPATH" REPLAYSSM_MAMBA_SSM_SRC="$PWD/.whl/mamba_ssm_src"
  export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer_ws FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
fi

# The GPU tests in three steps, each sized for one device call (10 minutes): `tests` (every GPU test but the two
# below), `quantized` (tests/test_quantized_gpu.py, in one process) and `long` (the serving schedules on the kernels,
# the 10,000-window drift).
LONG_TESTS=(tests/test_serving_loop.py::test_serving_loop_gpu_graphs tests/test_serving_loop.py::test_serving_loop_mtp_gpu_graphs
            tests/test_speculative_gpu.py::test_ten_thousand_windows_stay_bounded)
if has tests || has quantized || has long; then
  # The modules the test files name at module level compile first on every core (tests/test_quantized_gpu.py's 181
  # took 105 s on the H200 machine's 16 cores); with pytest-xdist (its wheel and execnet's in .whl) the tests then run on
  # TEST_WORKERS processes, one test at a time to whichever is free (a file-per-worker split left the quantized file on
  # one worker), so the modules they compile on first use (NVRTC, one core each) build side by side. The logs name
  # every test (-v), so a run stopped by its time limit still says what passed.
  # TEST_FAMILIES (e.g. mamba2): precompile only those families' modules; TEST_K: pytest -k for the three steps.
  bounded "${PRECOMPILE_TIMEOUT:-300}" python3 build_scripts/precompile_test_kernels.py \
    ${TEST_FAMILIES:+--families "$TEST_FAMILIES"} > "$OUT/precompile.log" 2>&1
  rc=$?; record "precompile test kernels" $rc "$(tail -n 1 "$OUT/precompile.log")"
  workers=()
  python3 -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-12}" --dist load)
  test_k=(); [ -n "${TEST_K:-}" ] && test_k=(-k "$TEST_K")
fi
if has tests; then
  deselect=(--ignore tests/test_quantized_gpu.py)
  for t in "${LONG_TESTS[@]}"; do deselect+=(--deselect "$t"); done
  bounded "${TESTS_TIMEOUT:-300}" python3 -m pytest -v "${workers[@]}" "${test_k[@]}" -m "gpu or kernels" "${deselect[@]}" tests \
    > "$OUT/gpu_tests.log" 2>&1
  rc=$?; record "pytest -m 'gpu or kernels' (but quantized, long)" $rc "$(tail -n 1 "$OUT/gpu_tests.log")"
fi
if has quantized; then  # one process: the file passes in 109-126 s (H100) after the precompile; 14 workers were far slower
  bounded "${QUANTIZED_TIMEOUT:-540}" python3 -m pytest -v "${test_k[@]}" -m "gpu or kernels" tests/test_quantized_gpu.py \
    > "$OUT/gpu_tests_quantized.log" 2>&1
  rc=$?; record "pytest tests/test_quantized_gpu.py" $rc "$(tail -n 1 "$OUT/gpu_tests_quantized.log")"
fi
if has long; then  # 7 tests on 3 workers
  long_workers=(); [ ${#workers[@]} -gt 0 ] && long_workers=(-n 3 --dist load)
  bounded "${LONG_TIMEOUT:-540}" python3 -m pytest -v "${long_workers[@]}" "${test_k[@]}" "${LONG_TESTS[@]}" \
    > "$OUT/gpu_tests_long.log" 2>&1
  rc=$?; record "pytest serving schedules, 10k windows" $rc "$(tail -n 1 "$OUT/gpu_tests_long.log")"
fi
if has contract; then  # corrupted slot ids and cursors under memcheck: no access outside a slot (tests/test_row_contract.py)
  log="$OUT/sanitizer-memcheck-row-contract.log"
  bounded 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest -q -m gpu tests/test_row_contract.py > "$log" 2>&1
  rc=$?; record "memcheck corrupted ids and cursors" $rc "$(grep -h 'ERROR SUMMARY' "$log" | tail -n 1) $(tail -n 1 "$log")"
fi
if has sanitize; then  # every tool on the smoke tests; racecheck also on the protocol kernel (docs/decisions.md)
  # racecheck reports hazards on the mbarrier stage protocol that it cannot model ("Racecheck reports on the
  # persistent kernels"): its steps fail only when the tests or the protocol kernel's sums do, the count is shown.
  smoke=("tests/test_mamba2_gpu.py::test_sanitizer_smoke" "tests/test_gdn_kda_gpu.py::test_sanitizer_smoke"
         "tests/test_quantized_gpu.py::test_sanitizer_smoke" "tests/test_speculative_gpu.py::test_graph_replay_equals_eager"
         "tests/test_decoder_layer_ops.py")
  # SANITIZE_TOOLS: a subset of the tools (all four with the smoke tests take longer than one device call)
  tools=" ${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck} "
  for tool in $tools; do
    for t in "${smoke[@]}"; do
      log="$OUT/sanitizer-$tool.log"
      exitcode=(--error-exitcode 9); [ "$tool" = racecheck ] && exitcode=()
      bounded 300 compute-sanitizer --tool "$tool" --report-api-errors no "${exitcode[@]}" \
        python3 -m pytest -q "$t" >> "$log" 2>&1
      rc=$?; record "$tool $(basename "${t%%::*}")" $rc "$(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$log" | tail -n 1)"
    done
  done
  for copy in bulk cp.async; do
    [[ "$tools" == *" racecheck "* ]] || break
    log="$OUT/sanitizer-racecheck-protocol-$copy.log"
    bounded 150 compute-sanitizer --tool racecheck --show-backtrace no \
      python3 benchmarks/dev/racecheck_protocol.py --copy "$copy" --tiles 8 > "$log" 2>&1
    rc=$?; record "racecheck protocol kernel ($copy)" $rc "$(grep -h 'RACECHECK SUMMARY\|ERROR SUMMARY' "$log" | tail -n 1)"
  done
fi
if has bench; then  # fp32 state at every batch first, then bf16 state at serving batches, then FP8 (separate files)
  # BENCH_ARGS narrows the fp32 and bf16 runs, e.g. "--family mamba2 --models nemotron-3-super-120b"; BENCH_BF16=0
  # skips bf16, BENCH_FP8=0 the FP8 run.
  bounded "${BENCH_TIMEOUT:-400}" python3 -m trtllm_replayssm bench kernels --state-dtype fp32 ${BENCH_ARGS:-} \
    -o "$OUT/kernels-${gpu}-fp32.json" > "$OUT/bench_fp32.log" 2>&1
  rc=$?; record "bench kernels fp32" $rc "$OUT/kernels-${gpu}-fp32.json"
  if [ "${BENCH_BF16:-1}" = 1 ]; then
    bounded "${BENCH_BF16_TIMEOUT:-200}" python3 -m trtllm_replayssm bench kernels --state-dtype bf16 --batch 64,256 \
      ${BENCH_ARGS:-} -o "$OUT/kernels-${gpu}-bf16.json" > "$OUT/bench_bf16.log" 2>&1
    rc=$?; record "bench kernels bf16" $rc "$OUT/kernels-${gpu}-bf16.json"
  fi
  if [ "${BENCH_FP8:-1}" = 1 ]; then  # shared FP8 on Super beside FlashInfer's checkpointing_ssu with its FP8 state
    bounded "${BENCH_FP8_TIMEOUT:-200}" python3 -m trtllm_replayssm bench kernels --state-dtype fp8 --family mamba2 \
      --models nemotron-3-super-120b --batch 1,8,64,256 -o "$OUT/kernels-${gpu}-fp8.json" > "$OUT/bench_fp8.log" 2>&1
    rc=$?; record "bench kernels fp8 (Super)" $rc "$OUT/kernels-${gpu}-fp8.json"
  fi
fi
# the stored specs beside fp32 and the models of the quantized-state benchmarks (quant-bench, quant-speed)
QUANT_SPECS=fp32,fp8,nvfp4,fp8/dual/fp32,nvfp4/dual/fp16
QUANT_MODELS=nemotron-3-super-120b,nemotron-3-nano-4b,qwen3.5-4b,kimi-linear-48b
if has quant-bench; then  # issue 23's small batches: every stored spec beside fp32 at batch 1 and 8, each family
  bounded "${QUANT_BENCH_TIMEOUT:-540}" python3 -m trtllm_replayssm bench kernels --no-peers \
    --state-format "$QUANT_SPECS" --batch "${QUANT_BENCH_BATCH:-1,8}" \
    --models "$QUANT_MODELS" -o "$OUT/kernels-${gpu}-quant-small.json" \
    > "$OUT/bench_quant.log" 2>&1
  rc=$?; record "bench kernels, stored specs, batch 1 and 8" $rc "$OUT/kernels-${gpu}-quant-small.json"
fi
if has quant-speed; then  # issue 23's batch 256: every stored spec beside fp32, whole cycles and non-flush steps
  bounded 200 python3 build_scripts/precompile_test_kernels.py --models "$QUANT_MODELS" --specs "$QUANT_SPECS" \
    > "$OUT/precompile_quant_speed.log" 2>&1
  rc=$?; record "precompile stored-spec modules" $rc "$(tail -n 1 "$OUT/precompile_quant_speed.log")"
  bounded "${QUANT_SPEED_TIMEOUT:-400}" python3 benchmarks/dev/quant_speed.py -o "$OUT/quant-speed-batch256-${gpu}.json" \
    --batches 256 --impls replay --phases cycle,nonflush --specs "$QUANT_SPECS" --models "$QUANT_MODELS" \
    > "$OUT/quant_speed.log" 2>&1
  rc=$?; record "quant_speed, stored specs, batch 256" $rc "$OUT/quant-speed-batch256-${gpu}.json"
fi
if has crossovers; then  # where auto switches kernels for CROSSOVER_SPECS (raw records only: the table is written where
  # the results come back, `python3 benchmarks/dev/crossover_sweep.py --from-records FILE --write-table`);
  # CROSSOVER_ARGS=--served-launch: the entries of plainly launched state kernels (the module behind upstream's conv);
  # --after-conv: those of programmatic launches behind the conv1d step (its pure-decode batches)
  cross_specs=${CROSSOVER_SPECS:-nvfp4,nvfp4/dual/fp16,fp8,fp8/dual/fp32}
  bounded "${CROSSOVER_TIMEOUT:-540}" python3 benchmarks/dev/crossover_sweep.py -o "$OUT/crossovers.json" \
    --specs "$cross_specs" --families "${CROSSOVER_FAMILIES:-mamba2,gdn,kda}" \
    --models "${CROSSOVER_MODELS:-}" --batches "${CROSSOVER_BATCHES:-1,2,4,8,16,32,64,128}" ${CROSSOVER_ARGS:-} \
    > "$OUT/crossovers.log" 2>&1
  rc=$?; record "crossover sweep $cross_specs" $rc "$(tail -n 1 "$OUT/crossovers.log")"
fi
if has served; then  # issue 25's served small batches: every family behind the module's conv1d step, with the peers
  bounded "${SERVED_TIMEOUT:-400}" python3 -m trtllm_replayssm bench kernels --state-dtype fp32 --after-conv \
    --batch "${SERVED_BATCH:-1,2,4,8,16,32,64}" -o "$OUT/kernels-served-${gpu}.json" > "$OUT/bench_served.log" 2>&1
  rc=$?; record "bench kernels, served (after the conv step)" $rc "$OUT/kernels-served-${gpu}.json"
fi
if has small-batch; then  # issue 25's batch 8: the structural floors of a non-flush step (a CTA per tile, per two
  # tiles, persistent streaming; benchmarks/dev/small_batch_probe.py), then where the shipped replay paths spend the
  # step at batch 8: whole cycles against non-flush steps per mode, and the GPU time of each kernel
  # Super's checkpoint bytes (128 heads of 64 x 128), then Qwen3.5-4B's (32 heads of 128 x 128 = 64 of 64 x 128)
  for heads in 128 64; do
    bounded "${PROBE_TIMEOUT:-150}" python3 benchmarks/dev/small_batch_probe.py \
      "$OUT/small-batch-probe-heads${heads}-${gpu}.json" --heads $heads > "$OUT/small_batch_probe_heads${heads}.log" 2>&1
    rc=$?; record "small-batch probe, $heads heads" $rc "$OUT/small-batch-probe-heads${heads}-${gpu}.json"
  done
  bounded "${PHASES_TIMEOUT:-240}" python3 benchmarks/dev/quant_speed.py --batches 8 --specs fp32 \
    --models nemotron-3-super-120b,qwen3.5-4b --impls replay,baseline --modes replay,fused --phases cycle,nonflush \
    --flush-apart 0,1 -o "$OUT/small-batch-phases-${gpu}.json" > "$OUT/small_batch_phases.log" 2>&1
  rc=$?; record "quant_speed phases, batch 8" $rc "$OUT/small-batch-phases-${gpu}.json"
  bounded 120 python3 benchmarks/dev/op_kernel_times.py nemotron-3-super-120b,qwen3.5-4b 8 fp32 \
    > "$OUT/small_batch_kernel_times.log" 2>&1
  rc=$?; record "kernel times, batch 8" $rc "$OUT/small_batch_kernel_times.log"
fi
if has stream; then  # the Mamba-2 streaming one-launch replay (Tuning.fused_heads_per_cta): its GPU tests, its heads per
  # CTA and stages behind the conv1d step beside the shipped one-launch replay, then memcheck on its smoke case
  bounded 240 python3 -m pytest -q -rA tests/test_mamba2_gpu.py -k "stream or graph or sanitizer" \
    > "$OUT/fused_stream_tests.log" 2>&1
  rc=$?; record "streaming replay GPU tests" $rc "$(tail -n 1 "$OUT/fused_stream_tests.log")"
  python3 - "$OUT/fused-stream-cases.json" "${STREAM_BATCH:-8,4,16}" <<'PY'
import json, sys
cases = []
for model, heads in (("nemotron-3-super-120b", (2, 4, 8, 16)), ("nemotron-3-nano-4b", (2, 4, 6, 12))):
    for batch in map(int, sys.argv[2].split(",")):  # STREAM_BATCH: batch 8, the target, first
        base = {"model": model, "state_dtype": "fp32", "batch": batch, "mode": "fused", "after": "conv"}
        cases.append(base)
        cases += [{**base, "tuning": {"fused_heads_per_cta": k, "stages": st}}
                  for k in heads for st in (2, 3, 4) if st <= k]
        cases.append({**base, "tuning": {"fused_heads_per_cta": 4, "stages": 2, "l2_hints": False}})
json.dump(cases, open(sys.argv[1], "w"), indent=1)
PY
  bounded 300 python3 benchmarks/dev/plan_sweep.py "$OUT/fused-stream-cases.json" > "$OUT/fused_stream_sweep.log" 2>&1
  rc=$?; record "streaming replay sweep, behind the conv step" $rc "$OUT/fused_stream_sweep.log"
  bounded 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m pytest -q \
    "tests/test_mamba2_gpu.py::test_sanitizer_smoke" -k fused > "$OUT/fused_stream_memcheck.log" 2>&1
  rc=$?; record "streaming replay memcheck" $rc "$(grep -h 'ERROR SUMMARY' "$OUT/fused_stream_memcheck.log" | tail -n 1)"
fi
if has launch; then  # batch 1 and 8: our launch variants beside the peers, alone and behind a plain kernel (the served case)
  bounded "${LAUNCH_TIMEOUT:-330}" python3 benchmarks/dev/launch_variants.py "$OUT/launch-variants-${gpu}.json" \
    --rounds "${LAUNCH_ROUNDS:-3}" > "$OUT/launch_variants.log" 2>&1
  rc=$?; record "launch variants, batch 1 and 8" $rc "$OUT/launch-variants-${gpu}.json"
fi
if has spec; then  # speculative verify (T = 4): Mamba-2 replay vs per-draft vs the FlashInfer peers, then GDN and KDA
  bounded "${SPEC_TIMEOUT:-330}" python3 -m trtllm_replayssm bench kernels --spec "${SPEC_TOKENS:-4}" --family mamba2 \
    --models nemotron-3-super-120b,nemotron-3-nano-4b --batch "${SPEC_BATCH:-1,8,64,256,512}" \
    -o "$OUT/kernels-spec-${gpu}.json" > "$OUT/bench_spec.log" 2>&1
  rc=$?; record "bench kernels --spec" $rc "$OUT/kernels-spec-${gpu}.json"
  # GDN and KDA verify (fla-core's per-draft verify beside it where .whl holds its wheel): 70 s for three models at
  # batch 1-512 on the H200 without it
  bounded "${SPEC_TIMEOUT:-330}" python3 -m trtllm_replayssm bench kernels --spec "${SPEC_TOKENS:-4}" --family gdn,kda \
    --models qwen3.5-4b,qwen3.5-122b,kimi-linear-48b --batch "${SPEC_BATCH:-1,8,64,256,512}" \
    -o "$OUT/kernels-spec-delta-${gpu}.json" > "$OUT/bench_spec_delta.log" 2>&1
  rc=$?; record "bench kernels --spec (GDN, KDA)" $rc "$OUT/kernels-spec-delta-${gpu}.json"
fi
if has compare; then  # whole 4B models, then layer slices of the 120B/122B models (COMPARE_SLICES=0 skips them)
  batches=${COMPARE_BATCH:-1,8,64,256}
  bounded "${COMPARE_TIMEOUT:-400}" python3 -m trtllm_replayssm compare nemotron-3-nano-4b qwen3.5-4b \
    --batch "$batches" --steps "${COMPARE_STEPS:-64}" -o "$OUT/compare-full" > "$OUT/compare.log" 2>&1
  rc=$?; record "compare 4B models" $rc "$OUT/compare-full/compare.json"
  if [ "${COMPARE_SLICES:-1}" = 1 ]; then
    bounded "${COMPARE_SLICES_TIMEOUT:-400}" python3 -m trtllm_replayssm compare nemotron-3-super-120b qwen3.5-122b \
      --gpu-layers 12 --batch "$batches" --steps "${COMPARE_STEPS:-64}" -o "$OUT/compare-slices" \
      > "$OUT/compare_slices.log" 2>&1
    rc=$?; record "compare 12-layer slices" $rc "$OUT/compare-slices/compare.json"
  fi
fi
if has profile; then  # Nsight Compute of one step per implementation at small batch (PROFILE_CASES: space-separated
  # MODEL:BATCH:WHAT[:ROWS], WHAT a replay mode, baseline or a peer's impl name; benchmarks/dev/ncu_step.py)
  cases="qwen3.5-4b:1:baseline qwen3.5-4b:1:fla_gdn qwen3.5-4b:8:baseline qwen3.5-4b:8:fused qwen3.5-4b:8:fla_gdn"
  for c in ${PROFILE_CASES:-$cases}; do
    IFS=: read -r model batch what rows <<< "$c"
    log="$OUT/ncu.log"
    echo "== $c" >> "$log"
    bounded 120 ncu --clock-control none --nvtx --nvtx-include "profile/" --section SpeedOfLight --section LaunchStats \
      --section Occupancy --section WarpStateStats --section SchedulerStats --print-details all \
      python3 benchmarks/dev/ncu_step.py "$model" fp32 "$batch" 1 "$what" $rows >> "$log" 2>&1
    rc=$?; record "ncu $c" $rc "$(grep -h 'Duration' "$log" | tail -n 1)"
  done
fi
MODELS_DIR=${MODELS_DIR:-$OUT/models}
if has train; then
  bounded "${TRAIN_TIMEOUT:-540}" python3 build_scripts/train_models.py --corpus corpus -o "$MODELS_DIR" \
    --models "${TRAIN_MODELS:-byte-nemotron}" --steps "${TRAIN_STEPS:-1500}" > "$OUT/train.log" 2>&1
  rc=$?; record "train ${TRAIN_MODELS:-byte-nemotron}" $rc "$(tail -n 1 "$OUT/train.log")"
  for m in "$MODELS_DIR"/*/; do [ -f "$m/train.json" ] && cp "$m/train.json" "$OUT/train-$(basename "$m").json"; done
fi
if has accuracy; then  # ACC_STATES_<family>: ';'-separated groups (one fp32 baseline pass each, results per group);
  # ACC_ARGS: more options for every run (e.g. --no-overlap); after the groups the fp32 speculative windows and the
  # fp32-activation run unless ACC_EXTRA=0
  every_state="fp32,bf16,fp16,fp16+sr,fp8,fp8/dual/fp32,nvfp4,nvfp4/dual/fp32,nvfp4/dual/fp16,nvfp4/dual/fp8;fp8+sr,fp8/dual/fp32+sr"
  mamba2_states=${ACC_STATES_MAMBA2:-$every_state}
  gdn_states=${ACC_STATES_GDN:-$every_state}
  for m in ${ACC_MODELS:-byte-nemotron}; do
    dir="$MODELS_DIR/$m"; [ -d "$dir" ] || dir="models/$m"; [ -d "$dir" ] || dir=$m  # else a preset
    states=$gdn_states; case "$m" in *nemotron*) states=$mamba2_states;; esac
    k=0
    IFS=';' read -ra groups <<< "$states"
    for g in "${groups[@]}"; do
      k=$((k + 1))
      bounded "${ACC_TIMEOUT:-400}" python3 -m trtllm_replayssm accuracy "$dir" --states "$g" \
        --tokens "${ACC_TOKENS:-131072}" --text corpus/heldout/persuasion.txt -o "$OUT/acc/$m-$k.json" ${ACC_ARGS:-} \
        >> "$OUT/accuracy.log" 2>&1
      rc=$?; record "accuracy $m $g" $rc "$OUT/acc/$m-$k.json"
    done
    [ "${ACC_EXTRA:-1}" = 1 ] || continue  # ACC_EXTRA=0: the state groups only
    bounded "${ACC_TIMEOUT:-400}" python3 -m trtllm_replayssm accuracy "$dir" --states fp32 --spec 4 \
      --mean-accept 3 --tokens "${ACC_TOKENS:-131072}" --text corpus/heldout/persuasion.txt \
      -o "$OUT/acc/$m-spec4.json" ${ACC_ARGS:-} >> "$OUT/accuracy.log" 2>&1
    rc=$?; record "accuracy $m fp32 spec T=4" $rc "$OUT/acc/$m-spec4.json"
    # fp32 activations: the rings hold fp32 records, so this run against the bf16 one prices the rings' rounding
    bounded "${ACC_TIMEOUT:-400}" python3 -m trtllm_replayssm accuracy "$dir" --states fp32 --act-dtype fp32 \
      --tokens "${ACC_TOKENS:-131072}" --text corpus/heldout/persuasion.txt -o "$OUT/acc/$m-fp32-rings.json" \
      ${ACC_ARGS:-} >> "$OUT/accuracy.log" 2>&1
    rc=$?; record "accuracy $m fp32, fp32 activations and rings" $rc "$OUT/acc/$m-fp32-rings.json"
  done
fi
if has ab; then  # AB_ARGS: quant_speed's arguments besides -o, --models and --specs; AB_KEY: ab_trees --also-key
  read -r -a ab_trees <<< "${AB_TREES:-}"
  models=${AB_MODELS:-nemotron-3-super-120b,nemotron-3-nano-4b,qwen3.5-4b}
  specs=${AB_SPECS:-fp32,nvfp4,nvfp4/dual/fp16,fp8/dual/fp32}
  if [ ${#ab_trees[@]} -ne 2 ]; then
    record "A/B of two source trees" 2 "AB_TREES: expected two source trees, got '${AB_TREES:-}'"
  else
    bounded "${AB_TIMEOUT:-540}" python3 benchmarks/dev/ab_trees.py "${ab_trees[@]}" "$OUT/ab-trees.json" \
      --rounds "${AB_ROUNDS:-2}" --precompile "$models" "$specs" --also-key "${AB_KEY:-}" -- \
      python3 benchmarks/dev/quant_speed.py -o {out} \
      --models "$models" --specs "$specs" ${AB_ARGS:---batches 256 --impls replay --phases cycle,nonflush} \
      > "$OUT/ab_trees.log" 2>&1
    rc=$?; record "A/B ${ab_trees[*]}" $rc "$OUT/ab-trees.json"
  fi
fi
for f in "$OUT"/kernels-${gpu}-*.json; do
  [ -f "$f" ] && python3 -c "import sys; from trtllm_replayssm.lab.bench.report import load_results, \
summary_markdown; print(summary_markdown(load_results(sys.argv[1])))" "$f"
done
if [ -n "${PACK_TO:-}" ]; then  # packed outside OUT first: PACK_TO may be OUT itself
  pack=$(mktemp /tmp/gpu_results.XXXXXX) && tar czf "$pack" -C "$OUT" . && mv "$pack" "$PACK_TO/gpu_results.tgz" \
    && echo "packed $OUT -> $PACK_TO/gpu_results.tgz"
fi
echo
printf '%s\n' "${results[@]}"
exit "$failed"
