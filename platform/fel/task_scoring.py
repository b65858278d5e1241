"""Scoring a task model on encoded examples: a task's padded inputs (on a device), the logits of its scored units
(`Task.unit`: CT words, AD pairs), and accuracy and perplexity = exp(mean cross-entropy) over them.

Per test unit (`scores_per_test_unit`, `Task.test_unit`: CT texts, AD snippets): the correct and scored counts of
each unit, so the report's decision can count the test set's sampling variance rather than treat it as fixed.
Per test unit, too, the part of the test set it falls in (`parts_per_test_unit`, `Task.parts`: AD's pair kinds), so
the report can read every table by part.
Shared by the FEL calculation (`finetune`), the extra test sets of a study (`protocol.extra_test_scores`) and
`alignlab evaluate`; plain PyTorch. Split from finetune.py so that each stays a readable size.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math

import torch
import torch.nn.functional as F

from alignlab.platform.encoder.model import AlignModel
from alignlab.platform.encoder.tokenizer import Tokenizer
from alignlab.platform.fel.head_input import head_input
from alignlab.platform.tasks.task import Encoded, Task


def encode_examples(task: Task, examples, tok: Tokenizer, max_len: int, options=()) -> Encoded:
    """Padded inputs and labels of `task`'s examples (the task's own input encoding; `options`:
    FinetuneConfig.task_options). `task`, here and below: the task object its caller resolved once."""
    return task.encode(examples, tok, max_len, options)


def on_device(enc: Encoded, device) -> Encoded:
    """`enc` with every tensor on `device` (the same object's tensors where they already are)."""
    return dataclasses.replace(enc, **{f.name: getattr(enc, f.name).to(device) for f in dataclasses.fields(enc)})


def unit_vectors(model: AlignModel, task: Task, enc: Encoded) -> tuple[torch.Tensor, torch.Tensor]:
    """What `task`'s head reads at each scored unit (`Task.unit`; `head_input.HeadInput`), and the units' labels."""
    reads = head_input(model.heads[task.name])
    hidden = model.encoder(enc.input_ids, enc.segment_ids, enc.attention_mask, layers=reads.layers)
    return task.units(hidden, enc, reads.pooling)


def logits_and_labels(model: AlignModel, task: Task, enc: Encoded) -> tuple[torch.Tensor, torch.Tensor]:
    """Task logits for the scored units (`Task.unit`) and their labels."""
    h, labels = unit_vectors(model, task, enc)
    return model.heads[task.name](h), labels


def metrics_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy and perplexity = exp(mean cross-entropy), over the scored units."""
    if labels.numel() == 0:
        return {"accuracy": float("nan"), "perplexity": float("nan")}
    nll = F.cross_entropy(logits.float(), labels).item()
    acc = (logits.argmax(-1) == labels).float().mean().item()
    # A diverged model's mean NLL can exceed what math.exp holds (OverflowError): its perplexity is inf.
    return {"accuracy": acc, "perplexity": math.exp(nll) if nll < 700 else (nll if math.isnan(nll) else math.inf)}


UNIT_SCORES = ("unit_keys", "unit_count", "unit_correct")


def scores_per_test_unit(task: Task, examples, hit_N: torch.Tensor, rows_N: torch.Tensor) -> dict[str, list]:
    """Per test unit of `examples` (`Task.test_unit`), in the order units first appear: "unit_keys" (a short hash
    of the unit's text: the same unit has the same key in every calculation, so units shared by calculations,
    CT's one test set, are one unit crossed with the folds), "unit_count" (scored words or pairs) and "unit_correct". `hit_N`
    says whether each scored unit was right, `rows_N` its example (`Task.unit_rows`)."""
    units = [task.test_unit(ex) for ex in examples]
    index = {u: i for i, u in enumerate(dict.fromkeys(units))}
    of_scored = torch.tensor([index[u] for u in units], dtype=torch.long)[rows_N.cpu()]
    correct = torch.zeros(len(index), dtype=torch.long).index_add_(0, of_scored, hit_N.cpu().long())
    count = torch.bincount(of_scored, minlength=len(index))
    keys = [hashlib.blake2b(u.encode(), digest_size=6).hexdigest() for u in index]
    return dict(zip(UNIT_SCORES, (keys, count.tolist(), correct.tolist())))


UNIT_PARTS = "unit_parts"


def parts_per_test_unit(task: Task, examples) -> dict[str, list]:
    """{"unit_parts": the part of each test unit of `examples` (`Task.unit_part` of the unit's examples), in
    `scores_per_test_unit`'s order, so it lines up with a calculation's "unit_keys"} for a task with `Task.parts`;
    {} for one without. A property of the test set, not of a model: a calculation records it once."""
    if not task.parts:
        return {}
    units: dict[str, list] = {}
    for ex in examples:
        units.setdefault(task.test_unit(ex), []).append(ex)
    parts = [task.unit_part(group) for group in units.values()]
    unknown = {p for p in parts if p is not None} - set(task.parts)
    if unknown:
        raise ValueError(f"{task.name}: unit_part returned {sorted(unknown)}, not one of its parts {list(task.parts)}")
    return {UNIT_PARTS: parts}


def evaluate_examples(model: AlignModel, task: Task, examples, tok: Tokenizer, *, options=(),
                      batch_size: int = 64, per_unit: bool = False) -> dict:
    """Accuracy and perplexity = exp(mean cross-entropy) over every scored unit (CT words, AD pairs) of
    `examples`, in batches so a large user file fits in memory; with `per_unit`, `scores_per_test_unit` too."""
    if not examples:
        raise ValueError(f"no {task.name.upper()} examples to evaluate")
    model.eval()
    device = next(model.parameters()).device  # a calculation's kept model is where it was trained
    nll, correct, count, hits, rows, preds, pred_rows = 0.0, 0, 0, [], [], [], []
    with torch.inference_mode():
        for start in range(0, len(examples), batch_size):
            enc = encode_examples(task, examples[start: start + batch_size], tok, model.cfg.max_len, options)
            enc = on_device(enc, device)
            logits, labels = logits_and_labels(model, task, enc)
            nll += F.cross_entropy(logits.float(), labels, reduction="sum").item()
            hit = logits.argmax(-1) == labels
            correct += int(hit.sum())
            count += labels.numel()
            if per_unit:
                hits.append(hit.cpu())
                rows.append(task.unit_rows(enc).cpu() + start)
            # Every unit's prediction and example, for a task's own metrics (`Task.unit_metrics`: span F1).
            preds += logits.argmax(-1).tolist()
            pred_rows += (task.unit_rows(enc) + start).tolist()
    units = scores_per_test_unit(task, examples, torch.cat(hits), torch.cat(rows)) if per_unit else {}
    if count == 0:
        return {"accuracy": float("nan"), "perplexity": float("nan"), "count": 0, "num_examples": len(examples),
                **units}
    return {"accuracy": correct / count, "perplexity": math.exp(nll / count), "count": count,
            "num_examples": len(examples), **units, **task.unit_metrics(preds, pred_rows, examples)}
