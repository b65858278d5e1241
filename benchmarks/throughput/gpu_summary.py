"""The summary of one call of benchmarks/throughput/gpu_checks.sh: every part's exit and seconds, and each goal's figure.

Reads the call's folder (status.tsv and the parts' JSONs), prints one table and writes it as JSON (`--out`).
Goals (issue 67; measured on the first GPU machine): the 768x3 step >= 50% MFU with the decoder counted; end to end
>= 45% MFU with <= 3% data wait; >= 2x HF end to end; three 128x2 models side by side >= 2.5x one alone. Call 2 adds
the table that settles `loss_chunk_rows` auto's rule (`pretrain.auto_loss_chunk_rows`): per vocabulary and mode, the
step with the chunked MLM loss and with the plain one, their peak memory, and what auto picks there.
    python benchmarks/throughput/gpu_summary.py LOGS_DIR --call 1 --commit abc1234 --out summary_call1.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _first(d: dict) -> dict:
    return next(iter(d.values()), {}) if isinstance(d, dict) else {}


def goals_call1(logs: Path) -> list[dict]:
    rows = []
    step = _load(next(iter(sorted(logs.glob("step_*_vocab32000.json"))), logs / "none"))
    eager = _first(step.get("models", {}))
    compiled = _first(step.get("compiled", {}))
    graphs = _first(step.get("cuda_graphs", {}))
    for label, r in (("eager", eager), ("compiled", compiled), ("compiled+graphs", graphs)):
        if r.get("alignlab_mfu") is not None or r.get("alignlab_step_ms") is not None:
            hf = eager.get("hf_tokens_per_s")
            rows.append({"figure": f"step MFU, decoder counted ({label})", "value": _pct(r.get("alignlab_mfu")),
                         "goal": ">= 50%", "ms_per_step": r.get("alignlab_step_ms"),
                         "vs_hf_step": round(r["alignlab_tokens_per_s"] / hf, 3) if hf and r.get("alignlab_tokens_per_s")
                         else None, "peak_memory_gib": r.get("max_memory_gib"),
                         "graph_breaks": r.get("graph_breaks"), "loss_chunk_rows": r.get("loss_chunk_rows")})
    if eager.get("hf_mfu") is not None or eager.get("hf_step_ms") is not None:
        rows.append({"figure": "HF BertForPreTraining step MFU (eager)", "value": _pct(eager.get("hf_mfu")),
                     "ms_per_step": eager.get("hf_step_ms"), "peak_memory_gib": None})
    e2e = _load(next(iter(sorted(logs.glob("end_to_end_*.json"))), logs / "none"))
    ray = _first(e2e.get("ray", {}))
    if ray and "error" not in ray:
        # HF's step beside the run if it ran one, else the step part's: the same vocabulary size, batch and length
        hf = _first(e2e.get("models", {})).get("hf_tokens_per_s") or eager.get("hf_tokens_per_s")
        left = ray.get("intervals_left_out") or {}
        rows.append({"figure": "end-to-end MFU (Ray Train)", "value": _pct(ray.get("steady_mfu")), "goal": ">= 45%",
                     "ms_per_step": ray.get("steady_step_ms"), "objectives": ray.get("objectives"),
                     "rows": ray.get("rows_kind"), "vocab": ray.get("vocab"), "compiled": ray.get("compiled"),
                     "real_tokens_per_step": ray.get("steady_real_tokens_per_step"), "max_epoch": ray.get("max_epoch"),
                     "compile_intervals_left_out": left.get("intervals"),
                     "compile_seconds_left_out": left.get("seconds")})
        rows.append({"figure": "end-to-end data-wait share (steady)", "value": _pct(ray.get("data_wait_fraction_steady")),
                     "goal": "<= 3%"})
        rows.append({"figure": "end to end vs HF's step", "goal": ">= 2x",
                     "value": f"{ray['steady_tokens_per_s'] / hf:.2f}x" if hf else "n/a"})
        mem = ray.get("max_memory_gib")
        rows.append({"figure": "end-to-end peak memory (Train worker)", "value": "n/a" if mem is None else f"{mem} GiB"})
        if ray.get("compiled"):
            rows.append({"figure": "end-to-end graph breaks (every width's compile)",
                         "value": "n/a" if ray.get("graph_breaks") is None else str(ray["graph_breaks"])})
    side = _load(logs / "side_by_side_128x2.json")
    if side.get("aggregate_ratio") is not None:
        copies = side["side_by_side"]["copies"]
        rows.append({"figure": f"{copies} x 128x2 side by side vs one alone", "value": f"{side['aggregate_ratio']:.2f}x",
                     "goal": ">= 2.5x"})
        # Each of K packed runs holds 1/K of the device: its device-hours are its wall hours divided by the packing.
        rows.append({"figure": "device-hours per packed run (wall / packing)",
                     "value": f"{side['side_by_side']['wall_s'] / 3600 / copies:.6f}",
                     "per_1000_steps": round(side["side_by_side"]["wall_s"] / 3600 / copies * 1000 / side["steps"], 6)})
    return rows


def corpus_rows(logs: Path) -> list[dict]:
    """The corpus the real-rows parts read (built beside the first part, or found)."""
    rows = []
    for path in sorted(logs.glob("corpus_*.json")):
        c = _load(path).get("corpus")
        if c:
            rows.append({"figure": "corpus for the real rows", "value": c["corpus_id"], "train_rows": c["train_rows"],
                         "vocab": c["vocab"], "seconds": c["built_or_found_s"]})
    return rows


def goals_call2(logs: Path) -> list[dict]:
    rows = []
    for path in sorted(logs.glob("step_*_vocab*_*.json")):
        r = _load(path)
        for kind, block in (("eager", r.get("models", {})), ("compiled", r.get("compiled", {}))):
            row = _first(block)
            if row.get("alignlab_step_ms") is not None:
                rows.append({"figure": f"{path.stem.split('_', 2)[2]} {kind}", "value": _pct(row.get("alignlab_mfu")),
                             "ms_per_step": row["alignlab_step_ms"], "peak_memory_gib": row.get("max_memory_gib"),
                             "graph_breaks": row.get("graph_breaks"), "loss_chunk_rows": row.get("loss_chunk_rows")})
    for path in sorted(logs.glob("real_rows_*.json")):
        real = _load(path).get("real_rows", {})
        for label, row in real.get("models", {}).items():
            if row.get("step_ms") is not None:
                rows.append({"figure": f"real rows {label} ({real.get('objectives')}, vocab {real.get('vocab')})",
                             "value": _pct(row.get("mfu")), "ms_per_step": row["step_ms"],
                             "real_tokens_per_s": row.get("real_tokens_per_s"),
                             "padding": row.get("padding_fraction"), "peak_memory_gib": row.get("max_memory_gib")})
    rows += chunk_table(logs)
    return rows


def chunk_table(logs: Path) -> list[dict]:
    """Per vocabulary and mode (eager, compiled): the step with the chunked MLM loss against the plain one (the parts
    `step_*_vocab<V>_chunked` and `_plain`), their peak memory, and what `loss_chunk_rows` auto picks there
    (`pretrain.auto_loss_chunk_rows`, recorded by each part). Auto chunks for memory only; the table says whether
    the plain loss is faster where auto keeps it, and what chunking costs and saves where auto chunks."""
    runs: dict[tuple, dict] = {}
    for path in sorted(logs.glob("step_*_vocab*_*.json")):
        stem = path.stem.rsplit("_", 2)
        if len(stem) != 3 or stem[2] not in ("chunked", "plain"):
            continue
        r = _load(path)
        for mode, block in (("eager", r.get("models", {})), ("compiled", r.get("compiled", {}))):
            row = _first(block)
            if row.get("alignlab_step_ms") is not None:
                runs[(stem[1], mode, stem[2])] = row
    rows = []
    for (vocab, mode, kind), chunked in sorted(runs.items()):
        plain = runs.get((vocab, mode, "plain"))
        if kind != "chunked" or plain is None:
            continue
        auto = chunked.get("auto_loss_chunk_rows")
        picks = "n/a" if auto is None else "chunked" if auto else "plain"
        faster = "chunked" if chunked["alignlab_step_ms"] < plain["alignlab_step_ms"] else "plain"
        mem_c, mem_p = chunked.get("max_memory_gib"), plain.get("max_memory_gib")
        rows.append({"figure": f"chunked pays? {vocab} {mode}",
                     "value": f"auto {picks}, faster {faster}",
                     "chunked_ms": chunked["alignlab_step_ms"], "plain_ms": plain["alignlab_step_ms"],
                     "plain_over_chunked": round(plain["alignlab_step_ms"] / chunked["alignlab_step_ms"], 3),
                     "chunked_rows": chunked.get("loss_chunk_rows"),
                     "chunked_peak_gib": mem_c, "plain_peak_gib": mem_p,
                     "auto_agrees_with_faster": None if auto is None else picks == faster})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", type=Path)
    ap.add_argument("--call", type=int, default=1)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    parts = []
    for line in (args.logs / "status.tsv").read_text().splitlines():
        name, rc, secs, limit = line.split("\t")
        parts.append({"part": name, "exit": int(rc), "seconds": int(secs), "timeout_s": int(limit),
                      "timed_out": rc in ("124", "137")})
    figures = {1: goals_call1, 2: goals_call2}.get(args.call, lambda _: [])(args.logs) + corpus_rows(args.logs)
    machine = {}
    for path in sorted(args.logs.glob("*.json")):  # the GPU parts' machine: the corpus build ran with --device cpu
        if not path.name.startswith("corpus_"):
            machine = _load(path).get("machine") or machine
    summary = {"call": args.call, "commit": args.commit, "machine": machine, "precision": "bf16",
               "parts": parts, "figures": figures, "failed": [p["part"] for p in parts if p["exit"]]}
    print(f"--- gpu_checks call {args.call}, commit {args.commit}, {machine.get('device', '?')}")
    for p in parts:
        print(f"{p['part']:32} {'TIMED OUT' if p['timed_out'] else 'exit ' + str(p['exit']):>10} "
              f"{p['seconds']:5d} s (limit {p['timeout_s']} s)")
    for name in ("cuda_tests", "ray_cuda_tests"):
        tests = args.logs / f"{name}.log"
        if tests.is_file() and tests.read_text().strip():
            print(f"{name.replace('_', ' ')}:", tests.read_text().strip().splitlines()[-1])
    print("--- figures")
    for f in figures:
        extra = ", ".join(f"{k} {v}" for k, v in f.items() if k not in ("figure", "value") and v is not None)
        print(f"{f['figure']:48} {f['value']:>14}  {extra}")
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(args.out)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
