"""Scoring a task model on encoded examples: a task's padded inputs (on a device), the logits of its scored units
(`Task.unit`: CT words, AD pairs), and accuracy and perplexity = exp(mean cross-entropy) over them.

Shared by the FEL calculation (`finetune`), the extra test sets of a study (`protocol.extra_test_scores`) and
`alignlab evaluate`; plain PyTorch. Split from finetune.py so that each stays a readable size.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from alignlab.platform.head_input import head_input
from alignlab.platform.model import AlignModel
from alignlab.platform.task import Encoded, task as task_named
from alignlab.platform.tokenizer import Tokenizer


def encode_examples(task: str, examples, tok: Tokenizer, max_len: int, acronym_form: str = "letters") -> Encoded:
    """Padded inputs and labels of `task`'s examples (the task's own input encoding)."""
    return task_named(task).encode(examples, tok, max_len, acronym_form)


def on_device(enc: Encoded, device) -> Encoded:
    """`enc` with every tensor on `device` (the same object's tensors where they already are)."""
    return dataclasses.replace(enc, **{f.name: getattr(enc, f.name).to(device) for f in dataclasses.fields(enc)})


def unit_vectors(model: AlignModel, task: str, enc: Encoded) -> tuple[torch.Tensor, torch.Tensor]:
    """What `task`'s head reads at each scored unit (`Task.unit`; `head_input.HeadInput`), and the units' labels."""
    reads = head_input(model.heads[task])
    hidden = model.encoder(enc.input_ids, enc.segment_ids, enc.attention_mask, layers=reads.layers)
    return task_named(task).units(hidden, enc, reads.pooling)


def logits_and_labels(model: AlignModel, task: str, enc: Encoded) -> tuple[torch.Tensor, torch.Tensor]:
    """Task logits for the scored units (`Task.unit`) and their labels."""
    h, labels = unit_vectors(model, task, enc)
    return model.heads[task](h), labels


def metrics_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy and perplexity = exp(mean cross-entropy), over the scored units."""
    if labels.numel() == 0:
        return {"accuracy": float("nan"), "perplexity": float("nan")}
    nll = F.cross_entropy(logits.float(), labels).item()
    acc = (logits.argmax(-1) == labels).float().mean().item()
    # A diverged model's mean NLL can exceed what math.exp holds (OverflowError): its perplexity is inf.
    return {"accuracy": acc, "perplexity": math.exp(nll) if nll < 700 else (nll if math.isnan(nll) else math.inf)}


def evaluate_examples(model: AlignModel, task: str, examples, tok: Tokenizer, *, acronym_form: str = "letters",
                      batch_size: int = 64) -> dict[str, float]:
    """Accuracy and perplexity = exp(mean cross-entropy) over every scored unit (CT words, AD pairs) of
    `examples`, in batches so a large user file fits in memory."""
    if not examples:
        raise ValueError(f"no {task.upper()} examples to evaluate")
    model.eval()
    device = next(model.parameters()).device  # a calculation's kept model is where it was trained
    nll, correct, count, preds, rows = 0.0, 0, 0, [], []
    with torch.inference_mode():
        for start in range(0, len(examples), batch_size):
            enc = encode_examples(task, examples[start: start + batch_size], tok, model.cfg.max_len, acronym_form)
            enc = on_device(enc, device)
            logits, labels = logits_and_labels(model, task, enc)
            nll += F.cross_entropy(logits.float(), labels, reduction="sum").item()
            correct += int((logits.argmax(-1) == labels).sum())
            count += labels.numel()
            preds += logits.argmax(-1).tolist()
            rows += (task_named(task).unit_rows(enc) + start).tolist()
    if count == 0:
        return {"accuracy": float("nan"), "perplexity": float("nan"), "count": 0, "num_examples": len(examples)}
    return {"accuracy": correct / count, "perplexity": math.exp(nll / count), "count": count,
            "num_examples": len(examples), **task_named(task).unit_metrics(preds, rows, examples)}
