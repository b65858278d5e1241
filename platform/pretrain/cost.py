"""What a pretraining run will compute before it runs: its FLOPs by the one count (`throughput.batch_flops`), for
`alignlab plan` and the study layout's packing rule. The record of what a run did compute is `throughput.summary`."""
from __future__ import annotations

from alignlab.platform.encoder.registry import objective_class
from alignlab.platform.runtime.throughput import batch_flops


def expected_run_flops(cfg, vocab_size: int) -> float:
    """The FLOPs a pretraining run of `cfg` (a PretrainConfig) makes, before any batch exists (`alignlab plan`):
    `batch_flops` of every step with full rows (each of its `batch_size` rows `seq_len_at(step)` real tokens long,
    the most a row holds) and each objective's expected head FLOPs on them (`Objective.expected_head_flops`, at a
    `vocab_size` vocabulary). Padding makes a real run's count lower; the record (`summary`) counts the real one."""
    short = round(cfg.short_seq_fraction * cfg.max_steps) if cfg.short_seq_len else 0
    total = 0.0
    for steps, seq_len in ((short, cfg.short_seq_len), (cfg.max_steps - short, cfg.seq_len or cfg.model.max_len)):
        if not steps:
            continue
        rows = steps * cfg.batch_size
        tokens = rows * seq_len
        heads = sum(objective_class(o).expected_head_flops(o, cfg.model, vocab_size, seq_len=seq_len, rows=rows,
                                                           tokens=tokens) for o in cfg.objectives)
        total += batch_flops(cfg.model, seq_len, tokens, heads)
    return total
