#!/usr/bin/env bash
# The GPU path's checks in one go, for a machine with one CUDA GPU where alignlab is installed over a CUDA build of
# torch (`pip install -e ".[dev]"` after it). Run it first whenever a GPU is lent (about 8 minutes on one H100 without
# part 3, whose corpus build and compiling of four widths are not timed yet):
#   1. the CUDA tests: device placement, the training step without host syncs, FEL calculations on cuda giving the
#      CPU's numbers, pretraining under Ray Train on the GPU (prefetch thread and a collating process), and a resume
#      on the GPU restoring its state there and its CUDA random state;
#   2. the 768x3 step alone (sequence 128, batch 256, bf16), eager and compiled whole (static widths, the chunked
#      MLM loss), beside Hugging Face's BertForPreTraining, at a 32K and at the paper corpus's 111K vocabulary
#      (benchmarks/gpu_pretrain.py; MLM + NSP on synthetic full rows); at 32K also compiled and replayed as CUDA
#      graphs (PretrainConfig.cuda_graphs, off by default until this measures it);
#   3. the 768x3 step alone as a real run trains it: MLM, NSP, WHP and PAD on length-bucketed rows of the mini
#      preset's corpus (built here, with its own 8K tokenizer), made by the training loop's own code, eager and
#      compiled (static widths): ms/step, real tokens/s, padding, MFU, memory (gpu_pretrain.py --real-rows);
#   4. 768x3 end to end under Ray Train with the paper preset's input path (3 collating processes, 8 CPUs for the
#      worker): tokens/s, MFU by the one FLOP count, data wait;
#   5. three 128x2 models side by side on the one GPU against one alone (benchmarks/side_by_side.py).
# Each writes its log (and its JSON) into OUT_DIR, default benchmarks/results/gpu_checks_<commit>/. The figures
# are printed at the end; commit the folder.
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
#   bash benchmarks/gpu_checks.sh --dry-run OUT_DIR   # every part on CPU at toy sizes, side by side: catches a
#                                                     # broken command before GPU time is spent on it
#                                                     # (tests/test_gpu_checks.py)
#
# Exits non-zero if any part failed; the parts after a failed one still run.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
commit=${ALIGNLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export ALIGNLAB_COMMIT=$commit
out=${1:-benchmarks/results/gpu_checks_$commit}
mkdir -p "$out"
rc=0
pids=()
run_part() {  # run_part NAME COMMAND...: run COMMAND with its output in OUT_DIR/NAME.log, and say how it ended
  local name=$1; shift
  local t0=$SECONDS
  { echo "# $*"; echo "# commit $commit  $(date -u +%FT%TZ)"; "$@"; } > "$out/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status in $((SECONDS - t0)) s ($out/$name.log)"
  return "$status"
}
part() {  # on the GPU one after the other, each part's figures its own; in the dry run side by side (its figures
          # mean nothing, and the parts are mostly processes starting and importing: a small machine's cores idle)
  if [ "$dry" = 1 ]; then
    run_part "$@" &
    pids+=($!)
  else
    run_part "$@" || rc=1
  fi
}

if [ "$dry" = 1 ]; then
  # The same commands at toy sizes on CPU; compiling is left to tests/test_input_path.py's slow test (minutes on
  # a CPU), so --compile is dropped here.
  device=(--device cpu); big=128x2; batch=(--batch 8); steps=(--steps 1 --rounds 1 --warmup 1)
  # One collating process and two copies side by side: the same code paths as three of each, fewer processes to
  # start on a small machine.
  ray=(--ray-steps 12 --ray-rows 400 --ray-cpus 2 --cpus-per-worker 1 --ray-collate-workers 1); compile=()
  side=(--copies 2 --batch 8 --steps 2 --warmup 1); collect=(--collect-only)  # the CUDA tests are collected, not run
  # The smoke corpus (seconds to build) and the tiny model: the part's code paths, not its figures. One torch
  # thread: on a small machine busy with other work, a second one makes each of the tiny model's many small ops wait
  # for a core (its step took 10 to 850 ms on 2 cores).
  real_size=tiny; real=(--real-rows smoke --batch 8 --real-windows 1 --rounds 1); real_env=(env OMP_NUM_THREADS=1)
  part machine python -c "import platform, torch; print(platform.processor() or platform.machine(), torch.__version__)"
else
  device=(--device cuda); big=768x3; batch=(--batch 256); steps=(--steps 20 --rounds 2 --warmup 3)
  ray=(--ray-steps 400 --ray-cpus 12 --cpus-per-worker 8 --ray-collate-workers 3); compile=(--compile)
  side=(--copies 3 --batch 256 --steps 200 --warmup 10); collect=()
  real_size=768x3; real=(--real-rows mini --batch 256 --real-windows 4 --rounds 3); real_env=()
  part gpu nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
fi

part cuda_tests python -m pytest -q -p no:cacheprovider "${collect[@]}" -k "cuda or gpu or device" \
  tests/test_gpu_pretraining.py tests/test_device_placement.py tests/test_finetune.py tests/test_input_path.py \
  tests/test_exact_at_any_shape.py tests/test_linear_cross_entropy.py
for vocab in 32000 111000; do
  graphs=()  # the compiled step replayed as CUDA graphs too, once (its compile costs a minute or two)
  [ "$dry" = 0 ] && [ "$vocab" = 32000 ] && graphs=(--cuda-graphs)
  part "step_${big}_vocab$vocab" python benchmarks/gpu_pretrain.py "${device[@]}" --sizes "$big" "${batch[@]}" \
    "${steps[@]}" --vocab "$vocab" --ray-steps 0 "${compile[@]}" "${graphs[@]}" --commit "$commit" \
    --out "$out/step_${big}_vocab$vocab.json"
done
part "real_rows_$real_size" "${real_env[@]}" python benchmarks/gpu_pretrain.py "${device[@]}" --sizes "$real_size" \
  "${real[@]}" "${compile[@]}" --commit "$commit" --out "$out/real_rows_$real_size.json"
part "paper_input_path_$big" python benchmarks/gpu_pretrain.py "${device[@]}" --sizes "$big" "${batch[@]}" \
  "${steps[@]}" --no-hf "${ray[@]}" --commit "$commit" --out "$out/paper_input_path_$big.json"
part side_by_side_128x2 python benchmarks/side_by_side.py "${device[@]}" --size 128x2 "${side[@]}" \
  --commit "$commit" --out "$out/side_by_side_128x2.json"

for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
echo "--- tests"
tail -n 1 "$out/cuda_tests.log"
echo "--- the step alone (alignlab eager and compiled, HF beside it)"
grep -HE "^ *[0-9]+x[0-9]+ .*ms/step" "$out"/step_*.log | sed -E "s|^.*/step_||"
echo "--- the step alone on real length-bucketed rows, the four objectives (alignlab eager and compiled)"
grep -h "^# corpus: " "$out"/real_rows_*.log
grep -h "on real bucketed rows" "$out"/real_rows_*.log
echo "--- end to end under Ray Train (paper preset's input path)"
grep -h "Ray Train end to end" "$out"/paper_input_path_*.log | sed -E "s/; eval.json.*//"
echo "--- side by side"
grep -h "side by side give" "$out"/side_by_side_*.log
exit $rc
