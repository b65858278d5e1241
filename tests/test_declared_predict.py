"""A finetuned model of a declared task is served with no files: its folder carries the task's declaration,
so `alignlab predict` in a fresh process (the task not declared there) tags a text with the task's own tags."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from alignlab.platform.cli import main
from alignlab.platform.config import MODEL_SIZES
from alignlab.platform.encoder.model import AlignModel
from alignlab.platform.encoder.registry import resolve_objectives
from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer
from alignlab.platform.fel.finetune import finetune_calculation, load_pretrained, save_finetuned
from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.storage.root import MARKER, write_json
from alignlab.platform.tasks.task import task_names
from alignlab.platform.tasks.task_kinds import declare_task, undeclare

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "software_ner"


def _pretrained(root: Path):
    from alignlab.platform.sources.sources import read_bundled

    final = root / "models" / "tiny-test" / "final"
    final.mkdir(parents=True)
    train_tokenizer([d.text for d in read_bundled(("en",), max_docs_per_lang=200)], final / "tokenizer.model",
                    vocab_size=500)
    tok = Tokenizer(final / "tokenizer.model")
    torch.manual_seed(0)
    model = AlignModel(MODEL_SIZES["tiny"], tok.vocab_size, {c.name: c.build(tok) for c in resolve_objectives("mlm,whp")})
    torch.save(model.state_dict(), final / "model.pt")
    write_json(final / "model_config.json", {"model": dataclasses.asdict(MODEL_SIZES["tiny"]), "vocab_size": tok.vocab_size,
                                             "heads": list(model.heads.keys()), "pretrain": {}})
    write_json(final / "eval.json", {"step": 0})
    write_json(root / "models" / "tiny-test" / "config.json", {"model_id": "tiny-test"})
    return load_pretrained(root / "models" / "tiny-test")


def test_predict_tags_a_text_with_a_declared_tasks_model_in_a_process_that_never_declared_it(tmp_path, capsys):
    t = declare_task("swner_serve", "tagging", EXAMPLE / "pool.jsonl", EXAMPLE / "test.jsonl", aligned_objective="whp")
    try:
        pre = _pretrained(tmp_path)
        train, test = t.load_examples(EXAMPLE / "pool.jsonl")[:30], t.load_examples(EXAMPLE / "test.jsonl")[:20]
        cfg = FinetuneConfig(task="swner_serve", budget=30, max_epochs=2, patience=2, batch_size=8, lr=1e-3,
                             selection="paper")
        saved = save_finetuned(tmp_path, pre, cfg, finetune_calculation(pre, cfg, train, test))
    finally:
        undeclare("swner_serve")
    assert "swner_serve" not in task_names() and (saved / MARKER).exists()
    assert main(["predict", "--model", saved.name, "--text", "a python library for yaml", "--storage",
                 str(tmp_path)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    words = line.split()
    assert [w.rsplit("/", 1)[0] for w in words] == "a python library for yaml".split()
    assert all(w.rsplit("/", 1)[1] in t.labels for w in words), line
    undeclare("swner_serve")
