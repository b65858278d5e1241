#!/usr/bin/env bash
# The GPU path's checks in one go, for a machine with one CUDA GPU where alignlab is installed over a CUDA build of
# torch (`pip install -e ".[dev]"` after it):
#   1. the CUDA tests: device placement, the training step without host syncs, FEL calculations on cuda giving the
#      CPU's numbers, pretraining under Ray Train on the GPU (prefetch thread and a collating process), and a resume
#      on the GPU restoring its state there and its CUDA random state;
#   2. benchmarks/gpu_pretrain.py at 768x3 and 128x2 (sequence 128, global batch 256, bf16): the step alone and the
#      run end to end under Ray Train, with the collation in 3 collating processes;
#   3. the same end-to-end run at 768x3 with the collation on the prefetch thread (the default), for comparison.
# Each writes its log (and gpu_pretrain.py its JSON) into OUT_DIR, default benchmarks/results/gpu_checks_<commit>/.
# The end-to-end figures (ms/step, tokens/s, MFU, data wait) are printed at the end; commit the folder.
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
#
# Exits non-zero if any part failed; the parts after a failed one still run.
set -uo pipefail
cd "$(dirname "$0")/.."
commit=${ALIGNLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export ALIGNLAB_COMMIT=$commit
out=${1:-benchmarks/results/gpu_checks_$commit}
mkdir -p "$out"
rc=0
part() {  # part NAME COMMAND...: run COMMAND with its output in OUT_DIR/NAME.log, and say how it ended
  local name=$1; shift
  local t0=$SECONDS
  { echo "# $*"; echo "# commit $commit  $(date -u +%FT%TZ)"; "$@"; } > "$out/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status in $((SECONDS - t0)) s ($out/$name.log)"
  [ "$status" -eq 0 ] || rc=1
}

part gpu nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
part cuda_tests python -m pytest -q -p no:cacheprovider -k "cuda or gpu or device" \
  tests/test_gpu_pretraining.py tests/test_device_placement.py tests/test_finetune.py tests/test_input_path.py \
  tests/test_exact_at_any_shape.py
common=(--no-hf --steps 5 --rounds 1 --warmup 2 --ray-steps 400 --commit "$commit")
part gpu_pretrain_collate3 python benchmarks/gpu_pretrain.py --sizes 768x3,128x2 "${common[@]}" \
  --ray-collate-workers 3 --out "$out/gpu_pretrain_collate3.json"
part gpu_pretrain_thread python benchmarks/gpu_pretrain.py --sizes 768x3 "${common[@]}" \
  --out "$out/gpu_pretrain_thread.json"

echo "--- tests"
tail -n 1 "$out/cuda_tests.log"
echo "--- end to end under Ray Train (collate3: 3 collating processes; thread: the prefetch thread)"
grep -H "Ray Train end to end" "$out"/gpu_pretrain_*.log | sed -E "s/; eval.json.*//"
exit $rc
