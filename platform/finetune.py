"""One Few Example Learning (FEL) calculation (paper §3.4, §4): finetune a pretrained model on CT or AD
from a few hundred examples, evaluate every epoch, select epochs, and report the paper's metrics.

Plain PyTorch (a Ray Tune trial calls `run_calculation`). Schemes (Table 3):
- `pred`: only the prediction layers learn. The encoder is frozen, so its outputs are computed once
  per calculation (in eval mode: encoder dropout is off; the head's own dropout still applies to
  the cached features) and only the head is trained on them -- thousands of these are cheap.
- `pred+trm`: prediction + Transformer layers; embeddings frozen.
- `pred+trm+emb`: everything.
- `mt:pred+trm`: like `pred+trm`, trained jointly on CT and AD (batches alternate); scored on `task`.
Heads: `keep_head` initialises CT's head from WHP's and AD's from PAD's when the model has them;
otherwise a fresh head (the paper's `*` models).
Selection (`selection`): "honest" picks epochs on a validation split carved from the budget and
touches the test set once per selected epoch; "paper" picks them on the test set, as the paper did.
Stopping rule (`EpochSelector`): the best-perplexity epoch and the best-accuracy epoch are each selected
on the selection split, and training goes on until BOTH have stopped improving for `patience` epochs
(or to `max_epochs`), so the best-accuracy column is the best of a run that was not cut short at the
perplexity's stopping point; "epochs" is the 1-based epoch of the best selection perplexity.
Metrics: accuracy, and perplexity = exp(mean cross-entropy), over words (CT, at each word's first
piece) or pairs (AD).
Acronym input form (`acronym_form`, default "letters"): AD's acronym enters as one token per letter,
not as the sentencepiece pieces of the acronym string ("text"). Measured on smoke-scale models (32x1
after 12 steps and 64x2 after 600 steps of mlm+nsp+whp+pad, PAD pretrained in either form; 10 AD
calculations per cell, budget 200, schemes pred and pred+trm+emb), both forms stay at chance (49.8-50.7%,
below the 58.5% letters-only context-free baseline), so that scale cannot decide; and with the smoke
vocabulary (1000 pieces) the forms hardly differ (1.0 piece per acronym letter). We keep "letters"
because (1) AD asks whether the letters are the initials of a span, and with a real vocabulary "text"
hides them: at 8000 pieces an acronym averages 0.8 pieces per letter (MENA -> "▁men" "a"), the
spelling-blindness the paper blames for AD's difficulty (§4.2); (2) PAD pretrains on letters by default,
so a kept PAD head sees the input form it was trained on. Revisit with a mini/paper-scale model.
Keeping a model: `save_finetuned` writes the best-perplexity state with what serving needs under
`<root>/finetuned/<id>/`; `load_finetuned` + `evaluate_examples` score any file with it, and
`alignlab.platform.inference.Predictor` serves it.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from alignlab.platform.aligned_labels import WHP_TAGS
from alignlab.platform.config import FinetuneConfig, ModelConfig, config_hash, finetune_from_dict, to_dict
from alignlab.platform.model import AlignModel, SequenceHead, TokenHead
from alignlab.platform.storage import MARKER, folder_finished, publish_dir, read_json, write_json, write_marker
from alignlab.platform.tokenizer import Tokenizer

IGNORE = -100
ALIGNED_HEAD = {"ct": "whp", "ad": "pad"}
NUM_CLASSES = {"ct": len(WHP_TAGS), "ad": 2}


# ---------------------------------------------------------------- loading a pretrained model


@dataclass
class Pretrained:
    mdir: Path
    model_cfg: ModelConfig
    vocab_size: int
    state: dict
    heads: list[str]
    tok: Tokenizer


def load_pretrained(mdir: str | Path) -> Pretrained:
    mdir = Path(mdir)
    final = mdir / "final"
    if not folder_finished(final, legacy="model.pt", announce="eval.json"):
        raise ValueError(f"{mdir}: not a finished pretrained model (final/ is missing, or a file of it is missing "
                         f"or shorter than its {MARKER} lists)")
    info = read_json(final / "model_config.json")
    return Pretrained(mdir, ModelConfig(**info["model"]), info["vocab_size"],
                      torch.load(final / "model.pt", map_location="cpu", weights_only=True), info["heads"],
                      Tokenizer(final / "tokenizer.model"))


def make_head(name: str, hidden: int, dropout: float) -> torch.nn.Module:
    """A fresh head of a task or of its aligned pretraining objective (CT/WHP tag words, AD/PAD score [CLS])."""
    if name in ("ct", "whp"):
        return TokenHead(hidden, NUM_CLASSES["ct"], dropout)
    if name in ("ad", "pad"):
        return SequenceHead(hidden, NUM_CLASSES["ad"], dropout)
    raise ValueError(f"no finetuning head named {name!r}")


def build_task_model(pre: Pretrained, task: str, *, keep_head: bool, dropout: float, seed: int) -> AlignModel:
    torch.manual_seed(seed)
    cfg = dataclasses.replace(pre.model_cfg, dropout=dropout)
    model = AlignModel(cfg, pre.vocab_size)
    enc = {k[len("encoder."):]: v for k, v in pre.state.items() if k.startswith("encoder.")}
    model.encoder.load_state_dict(enc)
    for t in ("ct", "ad"):
        head = make_head(t, cfg.hidden, dropout)
        src = ALIGNED_HEAD[t]
        if keep_head and src in pre.heads:
            prefix = f"heads.{src}."
            head.load_state_dict({k[len(prefix):]: v for k, v in pre.state.items() if k.startswith(prefix)})
        model.heads[t] = head
    return model


# ---------------------------------------------------------------- encoding task examples


@dataclass
class Encoded:
    """Padded inputs of a task's examples, and labels (per first subword for CT, per row for AD)."""

    input_ids: torch.Tensor
    segment_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, idx) -> "Encoded":
        return Encoded(self.input_ids[idx], self.segment_ids[idx], self.attention_mask[idx], self.labels[idx])


_WORD_START: dict[str, np.ndarray] = {}


def word_pieces(tok: Tokenizer, words) -> list[list[int]]:
    """The pieces of each word, as `tok.encode_words(words)` gives them, from one encode of the joined text.

    One string is ~10x faster than a list (sentencepiece starts its thread pool for a list), and equal,
    because pieces never cross whitespace: a piece beginning with "▁" starts each word. Where that does
    not give one start per word (a word normalised away, or absorbed into <unk>), words are encoded one by one.
    """
    words = list(words)
    if not words:
        return []
    start = _WORD_START.get(tok.model_path)
    if start is None:
        start = np.array([tok.sp.id_to_piece(i).startswith("▁") for i in range(tok.vocab_size)])
        _WORD_START[tok.model_path] = start
    ids = tok.sp.encode(" ".join(words))
    starts = [i for i, p in enumerate(ids) if start[p]]
    if len(starts) != len(words) or (ids and starts[0] != 0):
        return [tok.sp.encode(w) for w in words]
    return [ids[a:b] for a, b in zip(starts, starts[1:] + [len(ids)])]


def ct_input(tok: Tokenizer, words, max_len: int) -> tuple[list[int], list[int]]:
    """`[CLS] pieces.. [SEP]` of a query and the position of each word's first piece.

    A word with no pieces becomes `<unk>`; words that would not fit are dropped (and not scored).
    Shared by training, evaluation and the predictor, so all three see the same inputs.
    """
    ids, first = [tok.cls_id], []
    for p in word_pieces(tok, words):
        p = p or [tok.unk_id]
        if len(ids) + len(p) > max_len - 1:
            break
        first.append(len(ids))
        ids += p
    ids.append(tok.sep_id)
    return ids, first


def ad_input(tok: Tokenizer, acronym: str, snippet: str, max_len: int,
             acronym_form: str) -> tuple[list[int], list[int]]:
    """`[CLS] acronym [SEP] snippet [SEP]` ids and segment ids (the PAD input shape)."""
    acr = tok.encode_acronym(acronym, acronym_form)[: max_len // 4]
    # Pieces never cross whitespace, so the joined snippet's pieces are its words' pieces in order.
    snip = tok.sp.encode(" ".join(snippet.split()))[: max_len - 3 - len(acr)]
    ids = [tok.cls_id, *acr, tok.sep_id, *snip, tok.sep_id]
    return ids, [0] * (len(acr) + 2) + [1] * (len(snip) + 1)


def encode_examples(task: str, examples, tok: Tokenizer, max_len: int, acronym_form: str = "letters") -> Encoded:
    seqs, segs, labels = [], [], []
    for ex in examples:
        if task == "ad":
            ids, seg = ad_input(tok, ex.acronym, ex.snippet, max_len, acronym_form)
            labels.append(int(ex.label))
        else:
            ids, first = ct_input(tok, ex.tokens, max_len)
            lab = [IGNORE] * len(ids)
            for pos, tag in zip(first, ex.tags):
                lab[pos] = WHP_TAGS.index(tag)
            seg = [0] * len(ids)
            labels.append(lab)
        seqs.append(ids)
        segs.append(seg)
    if not seqs:
        raise ValueError(f"no {task.upper()} examples to encode")
    T = max(len(s) for s in seqs)
    n = len(seqs)
    input_ids = torch.full((n, T), tok.pad_id, dtype=torch.long)
    segment_ids = torch.zeros((n, T), dtype=torch.long)
    mask = torch.zeros((n, T), dtype=torch.bool)
    lab_t = torch.tensor(labels, dtype=torch.long) if task == "ad" else torch.full((n, T), IGNORE, dtype=torch.long)
    for i, (s, g) in enumerate(zip(seqs, segs)):
        input_ids[i, : len(s)] = torch.tensor(s)
        segment_ids[i, : len(g)] = torch.tensor(g)
        mask[i, : len(s)] = True
        if task == "ct":
            lab_t[i, : len(labels[i])] = torch.tensor(labels[i])
    return Encoded(input_ids, segment_ids, mask, lab_t)


# ---------------------------------------------------------------- metrics


def logits_and_labels(model: AlignModel, task: str, enc: Encoded, hidden=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Task logits for the scored units (words for CT, rows for AD) and their labels."""
    if hidden is None:
        hidden = model.encoder(enc.input_ids, enc.segment_ids, enc.attention_mask)
    if task == "ad":
        return model.heads["ad"](hidden[:, 0]), enc.labels
    sel = enc.labels != IGNORE
    return model.heads["ct"](hidden[sel]), enc.labels[sel]


def metrics_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy and perplexity = exp(mean cross-entropy), over the scored units."""
    if labels.numel() == 0:
        return {"accuracy": float("nan"), "perplexity": float("nan")}
    nll = F.cross_entropy(logits.float(), labels).item()
    acc = (logits.argmax(-1) == labels).float().mean().item()
    # A diverged model's mean NLL can exceed what math.exp holds (OverflowError): its perplexity is inf.
    return {"accuracy": acc, "perplexity": math.exp(nll) if nll < 700 else (nll if math.isnan(nll) else math.inf)}


class NonFiniteError(ValueError):
    """A calculation whose selection numbers were never finite (the model diverged): it has no result."""


# ---------------------------------------------------------------- the calculation


def trainable_parameters(model: AlignModel, scheme: str, tasks: tuple[str, ...]) -> list[torch.nn.Parameter]:
    for p in model.parameters():
        p.requires_grad_(False)
    groups = [model.heads[t] for t in tasks]
    if scheme in ("pred+trm", "mt:pred+trm", "pred+trm+emb"):
        groups.append(model.encoder.layers)
    if scheme == "pred+trm+emb":
        groups += [model.encoder.tok, model.encoder.pos, model.encoder.seg, model.encoder.ln]
    params = [p for g in groups for p in g.parameters()]
    for p in params:
        p.requires_grad_(True)
    return params


class _Features:
    """Frozen-encoder outputs, computed once (scheme `pred`)."""

    def __init__(self, model: AlignModel, task: str, enc: Encoded):
        model.eval()
        with torch.no_grad():
            hidden = model.encoder(enc.input_ids, enc.segment_ids, enc.attention_mask)
        if task == "ad":
            self.x, self.y = hidden[:, 0].clone(), enc.labels
            self.row_of_unit = torch.arange(len(enc))
        else:
            sel = enc.labels != IGNORE
            self.x, self.y = hidden[sel].clone(), enc.labels[sel]
            self.row_of_unit = torch.nonzero(sel)[:, 0]

    def units_of_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(torch.isin(self.row_of_unit, rows)).squeeze(1)


class EpochSelector:
    """The selected epochs of a run and its stopping rule: the first epoch of the lowest selection perplexity,
    the first epoch of the highest selection accuracy, and stop once neither has improved for `patience`
    epochs. One rule for both, so that neither selected epoch is cut short by the other's stopping point."""

    def __init__(self, patience: int):
        self.patience = patience
        self.best_ppl, self.ppl_epoch = math.inf, 0
        self.best_acc, self.acc_epoch = -math.inf, 0

    def update(self, epoch: int, m: dict) -> tuple[bool, bool]:
        """Record an epoch's selection metrics; returns (new best perplexity, new best accuracy)."""
        new_ppl, new_acc = m["perplexity"] < self.best_ppl, m["accuracy"] > self.best_acc
        if new_ppl:
            self.best_ppl, self.ppl_epoch = m["perplexity"], epoch
        if new_acc:
            self.best_acc, self.acc_epoch = m["accuracy"], epoch
        return new_ppl, new_acc

    def done(self, epoch: int) -> bool:
        return epoch - self.ppl_epoch >= self.patience and epoch - self.acc_epoch >= self.patience


def run_calculation(pre: Pretrained, cfg: FinetuneConfig, train, test, *, val=None, other_task_train=None,
                    on_epoch=None) -> dict:
    """Finetune on `train`, select epochs on `val` (honest) or `test` (paper), return one result row."""
    t0 = time.time()
    if cfg.selection == "honest" and not val:
        raise ValueError("honest selection needs a validation split (carve it from the training budget)")
    task = cfg.task
    tok, L = pre.tok, pre.model_cfg.max_len
    model = build_task_model(pre, task, keep_head=cfg.keep_head, dropout=cfg.dropout, seed=cfg.seed)
    enc_train = encode_examples(task, train, tok, L, cfg.acronym_form)
    enc_test = encode_examples(task, test, tok, L, cfg.acronym_form)
    enc_sel = enc_test if cfg.selection == "paper" else encode_examples(task, val, tok, L, cfg.acronym_form)
    multitask = cfg.scheme == "mt:pred+trm"
    other = "ad" if task == "ct" else "ct"
    if multitask and not other_task_train:
        raise ValueError("scheme mt:pred+trm needs the other task's training examples (other_task_train)")
    enc_other = encode_examples(other, other_task_train, tok, L, cfg.acronym_form) if multitask else None
    tasks = (task, other) if multitask else (task,)
    params = trainable_parameters(model, cfg.scheme, tasks)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + cfg.fold)
    head = model.heads[task]
    frozen = cfg.scheme == "pred"
    if frozen:
        f_train, f_sel = _Features(model, task, enc_train), _Features(model, task, enc_sel)
        f_test = f_sel if enc_sel is enc_test else _Features(model, task, enc_test)

    def evaluate(enc: Encoded, feats=None) -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            if feats is not None:
                return metrics_from_logits(head(feats.x), feats.y)
            return metrics_from_logits(*logits_and_labels(model, task, enc))

    def snapshot():
        return copy.deepcopy(head.state_dict()) if frozen else copy.deepcopy(model.state_dict())

    def restore(sd) -> None:
        (head if frozen else model).load_state_dict(sd)

    history: list[dict] = []
    selector = EpochSelector(cfg.patience)
    best_ppl = best_acc = (None, None)  # (snapshot, selection metrics) at the selected epoch
    for epoch in range(1, cfg.max_epochs + 1):
        order = torch.randperm(len(enc_train), generator=gen)
        for start in range(0, len(order), cfg.batch_size):
            rows = order[start: start + cfg.batch_size]
            opt.zero_grad(set_to_none=True)
            if frozen:
                head.train()
                units = f_train.units_of_rows(rows)
                loss = F.cross_entropy(head(f_train.x[units]), f_train.y[units])
            else:
                model.train()
                loss = F.cross_entropy(*logits_and_labels(model, task, enc_train.rows(rows)))
                if multitask:
                    orows = torch.randint(len(enc_other), (len(rows),), generator=gen)
                    loss = loss + F.cross_entropy(*logits_and_labels(model, other, enc_other.rows(orows)))
            loss.backward()
            opt.step()
        m = evaluate(enc_sel, f_sel if frozen else None)
        history.append({"epoch": epoch, **m})
        if on_epoch:
            on_epoch(epoch, m)
        new_ppl, new_acc = selector.update(epoch, m)
        if new_ppl:
            best_ppl = (snapshot(), m)
        if new_acc:
            best_acc = (snapshot(), m)
        if selector.done(epoch):
            break
    if best_ppl[0] is None or best_acc[0] is None:
        last = history[-1]
        raise NonFiniteError(
            f"{task.upper()} calculation (fold {cfg.fold}, seed {cfg.seed}, lr {cfg.lr:g}): the "
            f"{'test' if cfg.selection == 'paper' else 'validation'} numbers were never finite in "
            f"{len(history)} epoch{'s' if len(history) != 1 else ''} (last: accuracy {last['accuracy']}, "
            f"perplexity {last['perplexity']}); the model diverged")
    if cfg.selection == "paper":
        at_ppl, at_acc = best_ppl[1], best_acc[1]
    else:  # the test set is touched once per selected epoch, after all selection is done
        restore(best_ppl[0])
        at_ppl = evaluate(enc_test, f_test if frozen else None)
        restore(best_acc[0])
        at_acc = evaluate(enc_test, f_test if frozen else None)
    restore(best_ppl[0])  # the kept model is the best-perplexity one (the paper's choice)
    return {
        "accuracy": at_ppl["accuracy"], "perplexity": at_ppl["perplexity"],
        "best_accuracy": at_acc["accuracy"], "perplexity_at_best_accuracy": at_acc["perplexity"],
        "epochs": selector.ppl_epoch, "epochs_run": len(history), "best_accuracy_epoch": selector.acc_epoch,
        "selection": cfg.selection, "num_train": len(train), "num_val": len(val or []), "num_test": len(test),
        "seconds": round(time.time() - t0, 3), "_model": model,
    }


# ---------------------------------------------------------------- keeping, loading and scoring a finetuned model
#
# <root>/finetuned/<id>/   (id = task + hash of the pretrained model id and the finetune config)
#     model.pt            encoder + the trained task head(s) + copies of the pretrained aligned heads (whp, pad)
#     tokenizer.model     the pretrained model's vocabulary
#     model_config.json   encoder shape, vocab size, which heads are task heads and which are pretrained copies
#     finetune.json       the FinetuneConfig and the pretrained model it started from
#     metrics.json        the calculation's result row


def finetuned_id(model_id: str, cfg: FinetuneConfig) -> str:
    """Same rule as a study's calculation id: the same request names the same finetuned model."""
    return f"{cfg.task}-{config_hash(model_id, cfg)}"


def finetuned_dir(root: Path, fid: str) -> Path:
    return Path(root) / "finetuned" / fid


def save_finetuned(root: Path, pre: Pretrained, cfg: FinetuneConfig, result: dict) -> Path:
    """Write the model `run_calculation` kept (its best-perplexity state) with all a server needs.

    The pretrained WHP/PAD heads are copied in as they were before finetuning, so the predictor can
    show the aligned pretraining objective's score next to the task's (paper §4.1).
    Written to a temporary folder and renamed, so a crash never leaves a half-written model.
    """
    model: AlignModel = result["_model"]
    tasks = (cfg.task, "ad" if cfg.task == "ct" else "ct") if cfg.scheme == "mt:pred+trm" else (cfg.task,)
    state = {f"encoder.{k}": v for k, v in model.encoder.state_dict().items()}
    for t in tasks:
        state.update({f"heads.{t}.{k}": v for k, v in model.heads[t].state_dict().items()})
    pretrained_heads = [h for h in ("whp", "pad") if h in pre.heads]
    for h in pretrained_heads:
        prefix = f"heads.{h}."
        state.update({k: v for k, v in pre.state.items() if k.startswith(prefix)})
    fid = finetuned_id(pre.mdir.name, cfg)
    final = finetuned_dir(root, fid)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{fid}.", dir=final.parent))
    try:
        torch.save({k: v.detach().clone() for k, v in state.items()}, tmp / "model.pt")
        shutil.copy(pre.tok.model_path, tmp / "tokenizer.model")
        write_json(tmp / "model_config.json", {"model": dataclasses.asdict(model.cfg), "vocab_size": pre.vocab_size,
                                               "task_heads": list(tasks), "pretrained_heads": pretrained_heads})
        write_json(tmp / "finetune.json", {"finetuned_id": fid, "pretrained_model_id": pre.mdir.name,
                                           "pretrained_dir": str(pre.mdir), "finetune": to_dict(cfg),
                                           "encoder_finetuned": cfg.scheme != "pred", "marker": MARKER})
        write_json(tmp / "metrics.json", {k: v for k, v in result.items() if not k.startswith("_")})
        write_marker(tmp)  # last: the size of every file above
        publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


@dataclass
class Finetuned:
    fdir: Path
    model: AlignModel
    """In eval mode; heads: the task head(s) and the pretrained copies (`whp`, `pad`) it carries."""
    tok: Tokenizer
    cfg: FinetuneConfig
    task_heads: tuple[str, ...]
    pretrained_heads: tuple[str, ...]
    info: dict
    metrics: dict

    @property
    def fid(self) -> str:
        return self.fdir.name


def load_finetuned(fdir: str | Path) -> Finetuned:
    fdir = Path(fdir)
    if not folder_finished(fdir, legacy="model.pt", announce="finetune.json"):
        raise ValueError(f"{fdir}: not a saved finetuned model (missing, or a file shorter than its {MARKER} lists); "
                         "save one with `alignlab finetune ... --save`")
    mc = read_json(fdir / "model_config.json")
    info = read_json(fdir / "finetune.json")
    model = AlignModel(ModelConfig(**mc["model"]), mc["vocab_size"])
    for h in (*mc["task_heads"], *mc["pretrained_heads"]):
        model.heads[h] = make_head(h, model.cfg.hidden, model.cfg.dropout)
    model.load_state_dict(torch.load(fdir / "model.pt", map_location="cpu", weights_only=True))
    model.eval()
    metrics = read_json(fdir / "metrics.json") if (fdir / "metrics.json").exists() else {}
    return Finetuned(fdir, model, Tokenizer(fdir / "tokenizer.model"), finetune_from_dict(info["finetune"]),
                     tuple(mc["task_heads"]), tuple(mc["pretrained_heads"]), info, metrics)


def evaluate_examples(model: AlignModel, task: str, examples, tok: Tokenizer, *, acronym_form: str = "letters",
                      batch_size: int = 64) -> dict[str, float]:
    """Accuracy and perplexity = exp(mean cross-entropy) over every scored unit (CT words, AD pairs) of
    `examples`, in batches so a large user file fits in memory."""
    if not examples:
        raise ValueError(f"no {task.upper()} examples to evaluate")
    model.eval()
    nll, correct, count = 0.0, 0, 0
    with torch.inference_mode():
        for start in range(0, len(examples), batch_size):
            enc = encode_examples(task, examples[start: start + batch_size], tok, model.cfg.max_len, acronym_form)
            logits, labels = logits_and_labels(model, task, enc)
            nll += F.cross_entropy(logits.float(), labels, reduction="sum").item()
            correct += int((logits.argmax(-1) == labels).sum())
            count += labels.numel()
    if count == 0:
        return {"accuracy": float("nan"), "perplexity": float("nan"), "count": 0, "num_examples": len(examples)}
    return {"accuracy": correct / count, "perplexity": math.exp(nll / count), "count": count,
            "num_examples": len(examples)}
