"""Corpus build throughput: the bundled corpus built with 1 and with 2 Ray Data labelling workers.

Each build is `alignlab.platform.corpus.corpus.build_corpus(cfg, root, num_workers=N, progress=False)`, the
real stage, into a fresh temporary storage root (the corpus is content-addressed: a second build into
the same root would be a cache hit). Every build runs in its own child process with its own local
Ray, started first with `ray_env.ensure_ray` (as the CLI does) and timed apart from the build, so no
build inherits another's warm actors and a hung build can be stopped without touching any other Ray.
Builds are interleaved (1, 2, 2, 1, ... for `--workers 1,2`), so a change of machine load is spread
over the worker counts.

Per build:
- `build_s`: wall time of the whole `build_corpus` call (staging, tokenizer, labelling, stats, publish);
- the phases, timed by wrapping what `build_corpus` calls (nothing of it is re-implemented here):
  `stage_s` (read the source, write the documents to parquet: `_stage_documents`), `tokenizer_s`
  (`train_tokenizer`), `labelling_s` (the Ray Data pipeline from_items(parts) -> map_batches(ChunkLabeler,
  ActorPoolStrategy(size=N)), each task reading one staged part and writing its shard, which executes
  while `build_corpus` iterates the output with `Dataset.iter_rows`; summed over the train and eval
  splits, actor start-up included), `stats_s` (`_shard_stats`), and `other_s`
  (the rest: publishing, JSON, Ray Data planning);
- `tokens` (stats.json "tokens"), `documents`, `chunks` (train + eval rows); tokens/s and
  documents/s over the whole build and over the labelling phase;
- `wall_time_s` as stats.json reports it (build_corpus's own clock), and digests of what was written
  (tokenizer, token counts, shard rows sorted by (doc_id, chunk_index), shard bytes), to show that
  every worker count wrote the same corpus.

A build that does not finish within `--timeout` is stopped (SIGINT, then SIGTERM, then SIGKILL of the
child's process group) and reported as "timeout". (Labelling actors take half a CPU each, so that Ray Data
keeps a whole CPU for its own tasks on a 2-CPU machine -- docs/cluster.md#ray-data-needs-a-whole-cpu; `--ray-cpus`
starts Ray with
another logical CPU count.)

Run from the repo root (see benchmarks/README.md):
    python benchmarks/throughput/corpus_throughput.py                                  # mini preset, workers 1,2
    python benchmarks/throughput/corpus_throughput.py --max-docs-per-lang 2000 --repeats 2
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from alignlab.platform.bench import bench_args, machine_info


RESULTS = Path(__file__).resolve().parents[1] / "results" / "corpus_throughput.json"
PHASES = ("stage_s", "tokenizer_s", "labelling_s", "stats_s", "other_s")


# ---------------------------------------------------------------- machine


def machine() -> dict:
    info = machine_info.machine("ray", "pyarrow", "sentencepiece")
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3, 1)
    except (ValueError, OSError):
        pass
    return info


load_average = machine_info.load_average


def corpus_config(preset: str, max_docs_per_lang: int | None):
    from alignlab.platform.config import check_preset
    from alignlab.platform.presets import Preset

    cfg = Preset.named(check_preset(preset)).corpus
    if max_docs_per_lang is not None:
        cfg = dataclasses.replace(cfg, max_docs_per_lang=max_docs_per_lang)
    return cfg


# ---------------------------------------------------------------- one build (child process)


class PhaseTimer:
    """Wraps functions that `build_corpus` calls so that the wall time spent in each is summed."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.missing: list[str] = []

    def wrap(self, owner, attr: str, phase: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:
            self.missing.append(f"{getattr(owner, '__name__', owner)}.{attr}")
            return
        self.seconds.setdefault(phase, 0.0)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - t

        setattr(owner, attr, timed)


def corpus_digest(cdir: Path) -> dict[str, str]:
    """sha256 prefixes of what a build wrote: the tokenizer, the token counts, each split's rows sorted by
    (doc_id, chunk_index) ("rows/"), and each split's shard bytes in sorted-file-name order ("bytes/").

    Builds of one config are compared on the rows: the order in which Ray Data writes them (and so the
    bytes) can differ from build to build (see tests/test_corpus_determinism.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = {name: hashlib.sha256((cdir / name).read_bytes()).hexdigest()[:16]
           for name in ("tokenizer.model", "token_counts.npy")}
    for split in ("train", "eval"):
        files = sorted((cdir / "shards" / split).glob("*.parquet"))
        raw = hashlib.sha256()
        for f in files:
            raw.update(f.read_bytes())
        rows = hashlib.sha256()
        if files:
            table = pa.concat_tables([pq.read_table(f) for f in files])
            table = table.sort_by([("doc_id", "ascending"), ("chunk_index", "ascending")]).combine_chunks()
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
            rows.update(sink.getvalue())
        out[f"rows/{split}"] = rows.hexdigest()[:16]
        out[f"bytes/{split}"] = raw.hexdigest()[:16]
    return out


def child_build(spec: dict) -> dict:
    """Build once, as `spec` says, in this process; returns the figures."""
    import ray
    import ray.data

    import alignlab.platform.corpus.corpus as corpus
    from alignlab.platform.runtime.ray_env import ensure_ray

    cfg = corpus_config(spec["preset"], spec["max_docs_per_lang"])
    # Ray Data's parallelism comes from the staged document parts (one per `docs_per_shard` documents and
    # split): a split staged as one part is labelled by one actor whatever num_workers is.
    staged_files: dict[str, int] = {}
    stage = getattr(corpus, "_stage_documents", None)
    if stage is not None:
        def counting_stage(source, out, *args, **kwargs):
            res = stage(source, out, *args, **kwargs)
            staged_files.update({s: len(list((Path(out) / s).glob("*.parquet"))) for s in ("train", "eval")})
            return res

        corpus._stage_documents = counting_stage
    timer = PhaseTimer()
    timer.wrap(corpus, "_stage_documents", "stage_s")
    timer.wrap(corpus, "train_tokenizer", "tokenizer_s")
    timer.wrap(corpus, "_shard_stats", "stats_s")

    t = time.perf_counter()
    ensure_ray(num_cpus=spec["ray_cpus"])
    ray_init_s = time.perf_counter() - t
    ray_cpus = ray.cluster_resources().get("CPU")
    cpu0 = time.process_time()
    t = time.perf_counter()
    cdir = corpus.build_corpus(cfg, Path(spec["root"]), num_workers=spec["num_workers"], progress=False)
    build_s = time.perf_counter() - t
    driver_cpu_s = time.process_time() - cpu0
    ray.shutdown()

    stats = json.loads((cdir / "stats.json").read_text())
    # The labelling pipeline runs while build_corpus iterates its output; build_corpus times it itself.
    timer.seconds["labelling_s"] = float(stats.get("phase_seconds", {}).get("labelling", float("nan")))
    phases = {k: round(v, 2) for k, v in timer.seconds.items()}
    if not timer.missing:
        phases["other_s"] = round(build_s - sum(timer.seconds.values()), 2)
    chunks = int(sum(stats["chunks"].values()))
    row = {"num_workers": spec["num_workers"], "status": "ok", "ray_cpus": ray_cpus,
           "ray_init_s": round(ray_init_s, 2), "build_s": round(build_s, 2),
           "stats_wall_time_s": stats.get("wall_time_s"), **phases,
           "driver_cpu_s": round(driver_cpu_s, 2), "tokens": int(stats["tokens"]),
           "documents": int(stats["documents"]), "chunks": chunks, "chunks_per_split": stats["chunks"],
           "staged_document_files": staged_files or None, "corpus_id": cdir.name, "digest": corpus_digest(cdir)}
    row["tokens_per_s"] = round(row["tokens"] / build_s, 1)
    row["documents_per_s"] = round(row["documents"] / build_s, 2)
    if timer.seconds.get("labelling_s"):
        lab = timer.seconds["labelling_s"]
        row["labelling_tokens_per_s"] = round(row["tokens"] / lab, 1)
        row["labelling_documents_per_s"] = round(row["documents"] / lab, 2)
        row["labelling_chunks_per_s"] = round(chunks / lab, 1)
    if timer.missing:
        row["phases_not_timed"] = timer.missing
    return row


# ---------------------------------------------------------------- the parent


def stop(proc: subprocess.Popen) -> None:
    """Stop a child build and the Ray it started: SIGINT lets ray.init's exit hook shut its Ray down."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 30)):
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    # The child leads its own process group (start_new_session): whatever of its Ray is left goes too.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_build(spec: dict, timeout: float, workdir: Path) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"storage-w{spec['num_workers']}-", dir=workdir))
    spec = {**spec, "root": str(root)}
    out = root.with_suffix(".json")
    log = root.with_suffix(".log")
    t = time.perf_counter()
    with open(log, "w") as logf:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec), str(out)],
                                stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout)
            status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            stop(proc)
            status = f"timeout ({timeout:.0f} s)"
    process_s = round(time.perf_counter() - t, 1)
    if status == "ok" and out.exists():
        row = json.loads(out.read_text())
    else:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print(f"# build with {spec['num_workers']} worker(s): {status}; last lines of its log:\n#   "
              + "\n#   ".join(tail), flush=True)
        row = {"num_workers": spec["num_workers"], "status": status, "log_tail": tail}
    row["process_s"] = process_s
    shutil.rmtree(root, ignore_errors=True)
    return row


def summarize(rows: list[dict], workers: list[int]) -> dict:
    """Per worker count: the median of its finished repeats (and the min of build_s)."""
    keys = ("build_s", "ray_init_s", *PHASES, "tokens", "documents", "chunks", "tokens_per_s", "documents_per_s",
            "labelling_tokens_per_s", "labelling_documents_per_s")
    out = {}
    for w in workers:
        ok = [r for r in rows if r["num_workers"] == w and r["status"] == "ok"]
        s = {"repeats_ok": len(ok), "repeats": sum(r["num_workers"] == w for r in rows),
             "status": "ok" if ok else next(r["status"] for r in rows if r["num_workers"] == w)}
        for k in keys:
            vals = [r[k] for r in ok if r.get(k) is not None]
            if vals:
                s[k] = round(statistics.median(vals), 2)
        if ok:
            s["build_s_min"] = min(r["build_s"] for r in ok)
        out[str(w)] = s
    return out


def print_table(summary: dict) -> None:
    cols = [("workers", None, "{}"), ("build s", "build_s", "{:.1f}"), ("ray init s", "ray_init_s", "{:.1f}"),
            ("stage s", "stage_s", "{:.1f}"), ("tokenizer s", "tokenizer_s", "{:.1f}"),
            ("labelling s", "labelling_s", "{:.1f}"), ("stats s", "stats_s", "{:.1f}"),
            ("other s", "other_s", "{:.1f}"),
            ("tokens", "tokens", "{:,.0f}"), ("docs", "documents", "{:,.0f}"), ("chunks", "chunks", "{:,.0f}"),
            ("tok/s build", "tokens_per_s", "{:,.0f}"), ("docs/s build", "documents_per_s", "{:,.1f}"),
            ("tok/s labelling", "labelling_tokens_per_s", "{:,.0f}"),
            ("docs/s labelling", "labelling_documents_per_s", "{:,.1f}"), ("runs ok", None, "{}")]
    lines = [[c[0] for c in cols]]
    for w, s in summary.items():
        cells = []
        for head, key, fmt in cols:
            if head == "workers":
                cells.append(w)
            elif head == "runs ok":
                cells.append(f"{s['repeats_ok']}/{s['repeats']}" + ("" if s["status"] == "ok" else f" {s['status']}"))
            else:
                cells.append(fmt.format(s[key]) if key in s else "-")
        lines.append(cells)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(cols))]
    for j, line in enumerate(lines):
        print("| " + " | ".join(str(c).rjust(widths[i]) for i, c in enumerate(line)) + " |")
        if j == 0:
            print("|" + "|".join("-" * (wd + 2) for wd in widths) + "|")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        row = child_build(json.loads(argv[1]))
        Path(argv[2]).write_text(json.dumps(row, indent=2) + "\n")
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="mini", help="preset whose corpus settings to build (smoke, mini, paper)")
    p.add_argument("--workers", default="1,2", help="comma-separated num_workers values (Ray Data labelling actors)")
    p.add_argument("--max-docs-per-lang", type=int, default=None,
                   help="cap on documents per language (default: the preset's; mini: the whole bundled corpus)")
    p.add_argument("--repeats", type=int, default=1, help="builds per worker count (interleaved)")
    p.add_argument("--ray-cpus", type=int, default=None,
                   help="logical CPUs for each build's local Ray (default: what ensure_ray gives, os.cpu_count())")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before a build is stopped (default: 1 h for the first build, then 5x the slowest "
                        "finished build, at least 5 min)")
    bench_args.add_flags(p, out=RESULTS)
    args = p.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    if not workers or min(workers) < 1 or args.repeats < 1:
        p.error("--workers needs positive integers and --repeats >= 1")
    cfg = corpus_config(args.preset, args.max_docs_per_lang)  # validates the preset and the cap here, not in a child
    from alignlab.platform.config import to_dict

    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(os.path.abspath(__file__))] + argv)
    ray_cpus = args.ray_cpus or os.cpu_count()
    header = {"command": command, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "preset": args.preset, "max_docs_per_lang": args.max_docs_per_lang,
              "workers": workers, "repeats": args.repeats, "ray_cpus": ray_cpus, "corpus_config": to_dict(cfg),
              "load_average_start": load_average()}
    print(f"# {command}\n# {header['date']}  {header['machine']}\n# load average (1, 5, 15 min) at start: "
          f"{header['load_average_start']}", flush=True)
    order = []
    for r in range(args.repeats):
        order += [(r, w) for w in (workers if r % 2 == 0 else workers[::-1])]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="alignlab-corpus-bench-") as workdir:
        for r, w in order:
            done = [x["process_s"] for x in rows if x["status"] == "ok"]
            timeout = args.timeout or (max(300.0, 5 * max(done)) if done else 3600.0)
            if w * 0.5 > ray_cpus - 1:
                print(f"# warning: {w} labelling actors at 0.5 CPU each leave Ray Data less than a whole CPU of "
                      f"{ray_cpus}: this build may hang (stopped after {timeout:.0f} s)", flush=True)
            spec = {"preset": args.preset, "max_docs_per_lang": args.max_docs_per_lang, "num_workers": w,
                    "ray_cpus": args.ray_cpus}
            row = run_build(spec, timeout, Path(workdir))
            row["repeat"] = r
            row["load_average_after"] = load_average()
            rows.append(row)
            if row["status"] == "ok":
                print(f"workers {w} (repeat {r}): build {row['build_s']:.1f} s, labelling "
                      f"{row.get('labelling_s', float('nan')):.1f} s, {row['tokens']:,} tokens, "
                      f"{row['tokens_per_s']:,.0f} tok/s, {row['documents_per_s']:,.1f} docs/s; "
                      f"load {row['load_average_after']}", flush=True)
    summary = summarize(rows, workers)
    finished = [r["digest"] for r in rows if r["status"] == "ok"]
    same_rows = len({json.dumps({k: v for k, v in d.items() if not k.startswith("bytes/")}, sort_keys=True)
                     for d in finished}) == 1 if finished else None
    same_bytes = len({json.dumps(d, sort_keys=True) for d in finished}) == 1 if finished else None
    header["load_average_end"] = load_average()
    result = {**header, "summary": summary, "builds": rows,
              "identical_output_across_builds": same_rows, "identical_shard_bytes_across_builds": same_bytes}
    print(f"\n# medians over repeats; build = whole build_corpus call (Ray start-up excluded, in 'ray init s'); "
          f"labelling = the Ray Data pipeline (staged parts -> ChunkLabeler actors -> shard files), from stats.json")
    print_table(summary)
    if finished:
        print(f"# every finished build wrote the same corpus (tokenizer, token counts, shard rows): "
              f"{'yes' if same_rows else 'NO'}; in the same row order (same shard bytes): "
              f"{'yes' if same_bytes else 'no'}")
    print(f"# machine: {header['machine']['cpu']}, {header['machine']['cores']} cores; Ray CPUs {ray_cpus}; "
          f"date {header['date']}")
    print(f"# load average before {header['load_average_start']}, after {header['load_average_end']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"# wrote {os.path.relpath(args.out)}\n# command: {command}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
