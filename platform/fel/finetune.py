"""One Few Example Learning (FEL) calculation (paper §3.4, §4): finetune a pretrained model on CT or AD
from a few hundred examples, evaluate every epoch, select epochs, and report the paper's metrics.

Plain PyTorch (a Ray Tune trial calls `finetune_calculation`). Schemes (Table 3):
- `pred`: only the prediction layers learn. The encoder is frozen, so its outputs are computed once
  per calculation (in eval mode: encoder dropout is off; the head's own dropout still applies to
  the cached features) and only the head is trained on them -- thousands of these are cheap.
- `pred+trm`: prediction + Transformer layers; embeddings frozen.
- `pred+trm+emb`: everything.
- `mt:pred+trm`: like `pred+trm`, trained jointly with the task's `multitask_partner` (batches alternate);
  scored on `task`.
Heads: `keep_head` initialises each task's head from its aligned objective's (CT from WHP, AD from PAD)
when the model has it; otherwise a fresh head (the paper's `*` models).
Selection (`selection`): "honest" picks epochs on a validation split carved from the budget and
touches the test set once per selected epoch; "paper" picks them on the test set, as the paper did.
Stopping rule (`EpochSelector`): the best-perplexity epoch and the best-accuracy epoch are each selected
on the selection split, and training goes on until BOTH have stopped improving for `patience` epochs
(or to `max_epochs`), so the best-accuracy column is the best of a run that was not cut short at the
perplexity's stopping point; "epochs" is the 1-based epoch of the best selection perplexity.
Metrics: accuracy, and perplexity = exp(mean cross-entropy), over the task's scored units (`Task.unit`).
Tasks are objects (`alignlab.platform.tasks.task`): this module looks them up by the config's name and never
asks which task it is handling.
A task's own options (`FinetuneConfig.task_options`, `Task.finetune_options`) reach only its input encoding.
Device (`device`, default "cpu"): the model, the cached `pred` features and every batch live there ("cuda" in a
Tune trial that holds a GPU); the batch order is drawn on the CPU, so it does not depend on the device.
Keeping a model: `save_finetuned` writes the best-perplexity state with what serving needs under
`<root>/finetuned/<id>/`; `load_finetuned` + `evaluate_examples` score any file with it, and
`alignlab.platform.fel.inference.Predictor` serves it. Encoding and metrics: `task_scoring`.
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

import torch
import torch.nn.functional as F

from alignlab.platform.config import config_hash, to_dict
from alignlab.platform.encoder.model_config import ModelConfig
from alignlab.platform.encoder.model import AlignModel
from alignlab.platform.encoder.tokenizer import Tokenizer, check_model_vocabulary
from alignlab.platform.fel.finetune_config import FinetuneConfig, finetune_from_dict
from alignlab.platform.fel.finetune_schemes import MULTITASK, trainable_parameters
from alignlab.platform.fel.head_input import LAST_LAYER_FIRST_PIECE, HeadInput, fits, reads_of, task_head, widened
from alignlab.platform.fel.task_scoring import (encode_examples, logits_and_labels, UNIT_SCORES, metrics_from_logits,
                                                on_device, parts_per_test_unit, scores_per_test_unit, unit_vectors)
from alignlab.platform.storage.root import MARKER, folder_finished, publish_dir, read_json, write_json, write_marker
from alignlab.platform.tasks.task import Encoded, Task, head_for, registered_tasks, task as task_named
from alignlab.platform.tasks.task_kinds import declarations, declare_all



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
    state, tok = torch.load(final / "model.pt", map_location="cpu", weights_only=True), Tokenizer(final / "tokenizer.model")
    check_model_vocabulary(final, tok, info["vocab_size"], state)
    return Pretrained(mdir, ModelConfig(**info["model"]), info["vocab_size"], state, info["heads"], tok)


def build_task_model(pre: Pretrained, task: str, *, keep_head: bool, dropout: float, seed: int,
                     reads: HeadInput = LAST_LAYER_FIRST_PIECE) -> AlignModel:
    torch.manual_seed(seed)
    cfg = dataclasses.replace(pre.model_cfg, dropout=dropout)
    model = AlignModel(cfg, pre.vocab_size)
    enc = {k[len("encoder."):]: v for k, v in pre.state.items() if k.startswith("encoder.")}
    model.encoder.load_state_dict(enc)
    # Every task's head, in `head_rank` order: creation order draws the fresh heads' random init.
    for t in registered_tasks():
        head = task_head(t, cfg, dropout, reads)
        if keep_head and t.aligned_objective in pre.heads:
            prefix = f"heads.{t.aligned_objective}."
            kept = {k[len(prefix):]: v for k, v in pre.state.items() if k.startswith(prefix)}
            # A declared task's head may differ from its aligned objective's (another class count): kept only
            # when it fits, else the task head starts fresh.
            if fits(kept, head.state_dict()):
                head.load_state_dict(widened(kept, head.state_dict()))
        model.heads[t.name] = head
    return model


class NonFiniteError(ValueError):
    """A calculation whose selection numbers were never finite (the model diverged): it has no result."""


# ---------------------------------------------------------------- the calculation


class _Features:
    """Frozen-encoder outputs, computed once (scheme `pred`)."""

    def __init__(self, model: AlignModel, task: Task, enc: Encoded):
        model.eval()
        with torch.no_grad():
            x, self.y = unit_vectors(model, task, enc)
        self.x, self.row_of_unit = x.clone(), task.unit_rows(enc).to(x.device)

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


def task_heads(cfg: FinetuneConfig) -> tuple[str, ...]:
    """The task heads a calculation trains: its task's, and its multitask partner's in the multitask scheme."""
    return (cfg.task, task_named(cfg.task).multitask_partner) if cfg.scheme == MULTITASK else (cfg.task,)


@dataclass
class Calculation:
    """One calculation's result row (plain values, one row of a study) and the model it kept."""

    row: dict
    model: AlignModel
    """The best-perplexity state (the paper's choice), for extra test sets and `save_finetuned`."""


def finetune_calculation(pre: Pretrained, cfg: FinetuneConfig, train, test, *, val=None, other_task_train=None,
                         on_epoch=None, device: str | torch.device = "cpu", task: Task | None = None) -> Calculation:
    """Finetune on `train`, select epochs on `val` (honest) or `test` (paper); the result row and kept model
    (on `device`). With `cfg.refit`, the selected epochs are then trained again on `train` + `val` from the same
    initialisation, and those models are scored and kept. `task`: the object of `cfg.task`, when the caller
    (a trial) has resolved it; else it is looked up here, once, and passed down."""
    t0 = time.time()
    if cfg.selection == "honest" and not val:
        raise ValueError("honest selection needs a validation split (carve it from the training budget)")
    if cfg.refit and test is val:
        raise ValueError("FinetuneConfig.refit trains on the validation split, so it cannot be scored on it: "
                         "set refit=False where the validation split is the test set (searches, validation tables)")
    if task is None:
        task = task_named(cfg.task)
    elif task.name != cfg.task:
        raise ValueError(f"finetune_calculation: the task object is {task.name!r}, the config names {cfg.task!r}")
    tok, L = pre.tok, pre.model_cfg.max_len

    def encode(t: Task, examples) -> Encoded:
        return on_device(encode_examples(t, examples, tok, L, cfg.task_options), device)

    if cfg.head == "logistic":
        return _logistic_calculation(pre, cfg, task, train, val, test, encode, device, t0)
    enc_train, enc_test = encode(task, train), encode(task, test)
    enc_sel = enc_test if cfg.selection == "paper" else encode(task, val)
    tasks = (task, task_named(task.multitask_partner)) if cfg.scheme == MULTITASK else (task,)
    multitask, other = len(tasks) > 1, tasks[-1]
    if multitask and not other_task_train:
        raise ValueError("scheme mt:pred+trm needs the other task's training examples (other_task_train)")
    enc_other = encode(other, other_task_train) if multitask else None
    frozen = cfg.scheme == "pred"
    fit = _Fit(pre, cfg, tasks, enc_train, enc_other, device)
    if frozen:  # the frozen encoder is the pretrained one in every _Fit: its features are computed once
        f_sel = _Features(fit.model, task, enc_sel)
        f_test = f_sel if enc_sel is enc_test else _Features(fit.model, task, enc_test)
    else:
        f_sel = f_test = None

    history: list[dict] = []
    selector = EpochSelector(cfg.patience)
    best_ppl = best_acc = (None, None)  # (snapshot, selection metrics) at the selected epoch
    for epoch in range(1, cfg.max_epochs + 1):
        fit.epoch()
        # "paper" selects on the test set: its per-unit scores are taken with the selection numbers, not again.
        m = fit.evaluate(enc_sel, f_sel, test if enc_sel is enc_test else None)
        units = {k: m.pop(k) for k in UNIT_SCORES if k in m}
        history.append({"epoch": epoch, **m})
        if on_epoch:
            on_epoch(epoch, m)
        new_ppl, new_acc = selector.update(epoch, m)
        if new_ppl:
            best_ppl = (fit.snapshot(), {**m, **units})
        if new_acc:
            best_acc = (fit.snapshot(), {**m, **units})
        if selector.done(epoch):
            break
    if best_ppl[0] is None or best_acc[0] is None:
        last = history[-1]
        raise NonFiniteError(
            f"{task.name.upper()} calculation (fold {cfg.fold}, seed {cfg.seed}, lr {cfg.lr:g}): the "
            f"{'test' if cfg.selection == 'paper' else 'validation'} numbers were never finite in "
            f"{len(history)} epoch{'s' if len(history) != 1 else ''} (last: accuracy {last['accuracy']}, "
            f"perplexity {last['perplexity']}); the model diverged")
    if cfg.refit:  # the same run on the whole budget, to the selected epochs; nothing is selected on it
        fit = _Fit(pre, cfg, tasks, encode(task, list(train) + list(val)), enc_other, device)
        at = {}
        for epoch in range(1, max(selector.ppl_epoch, selector.acc_epoch) + 1):
            fit.epoch()
            if epoch in (selector.ppl_epoch, selector.acc_epoch):
                at[epoch] = fit.snapshot()
        best_ppl, best_acc = (at[selector.ppl_epoch], best_ppl[1]), (at[selector.acc_epoch], best_acc[1])
    if cfg.selection == "paper":
        at_ppl, at_acc = best_ppl[1], best_acc[1]
    else:  # the test set is touched once per selected epoch, after all selection is done; scored per test unit
        fit.restore(best_ppl[0])
        at_ppl = fit.evaluate(enc_test, f_test, test)
        fit.restore(best_acc[0])
        at_acc = fit.evaluate(enc_test, f_test, test)
    fit.restore(best_ppl[0])  # the kept model is the best-perplexity one (the paper's choice)
    return Calculation({
        "accuracy": at_ppl["accuracy"], "perplexity": at_ppl["perplexity"],
        "best_accuracy": at_acc["accuracy"], "perplexity_at_best_accuracy": at_acc["perplexity"],
        "epochs": selector.ppl_epoch, "epochs_run": len(history), "best_accuracy_epoch": selector.acc_epoch,
        "selection": cfg.selection, "refit": cfg.refit, "head_input": f"{cfg.feature_layers}:{cfg.word_pooling}",
        "num_train": len(train) + (len(val) if cfg.refit else 0), "num_val": len(val or []), "num_test": len(test),
        "seconds": round(time.time() - t0, 3), "device": str(device),
        "unit_keys": at_ppl["unit_keys"], "unit_count": at_ppl["unit_count"], "unit_correct": at_ppl["unit_correct"],
        "unit_correct_at_best_accuracy": at_acc["unit_correct"], **parts_per_test_unit(task, test),
    }, fit.model)


LOGISTIC_CS = tuple(float(c) for c in 10.0 ** torch.arange(-4.0, 2.01, 0.5))
"""The inverse L2 penalties a logistic head chooses from, strongest first: from a head that hardly moves off the
class prior to one that can fit every training example."""
LOGISTIC_FOLDS = 5


def fit_logistic_head(head: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, groups: list, num_classes: int) -> float:
    """Fit the `LinearHead` `head` by L2-regularised logistic regression on frozen features `x` (units x width) and
    labels `y`, its penalty the one of `LOGISTIC_CS` with the best log-loss over `LOGISTIC_FOLDS` folds of the given
    examples, a test unit's examples in one fold (`groups`), then refitted on all of them (scikit-learn's
    LogisticRegressionCV). Deterministic: the seed does not change it. Returns the chosen C."""
    import numpy as np
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import GroupKFold

    X, Y = x.detach().double().cpu().numpy(), y.cpu().numpy()
    classes = np.unique(Y)
    w = torch.zeros(num_classes, X.shape[1], dtype=torch.float64)
    # A class no training unit has is never predicted (a large negative bias), as a trained head would learn.
    b = torch.full((num_classes,), -30.0, dtype=torch.float64)
    if len(classes) == 1:
        b[int(classes[0])], c = 0.0, float("nan")
    else:
        folds = list(GroupKFold(n_splits=min(LOGISTIC_FOLDS, len(set(groups)))).split(X, Y, groups))
        lr = LogisticRegressionCV(Cs=list(LOGISTIC_CS), cv=folds, scoring="neg_log_loss", max_iter=5000).fit(X, Y)
        c = float(lr.C_[0])
        coef, icpt = torch.from_numpy(lr.coef_), torch.from_numpy(lr.intercept_)
        if len(classes) == 2:  # scikit-learn's binary form: one logit, the second class's
            coef, icpt = torch.cat([-coef / 2, coef / 2]), torch.cat([-icpt / 2, icpt / 2])
        idx = torch.from_numpy(classes).long()
        w[idx], b[idx] = coef, icpt
    with torch.no_grad():
        head.out.weight.copy_(w.to(head.out.weight))
        head.out.bias.copy_(b.to(head.out.bias))
    return c


def _logistic_calculation(pre: Pretrained, cfg: FinetuneConfig, task: Task, train, val, test, encode, device,
                          t0: float) -> Calculation:
    """`FinetuneConfig.head="logistic"`: a linear head fitted on the frozen features of the training examples (and
    the validation split's, with refit: the penalty is chosen by cross-validation inside them, so none is held
    out), scored once on the test set. No epochs: the epoch columns are 0, the best-accuracy column is the same
    model's."""
    fit_examples = list(train) + (list(val or []) if cfg.refit else [])
    model = build_task_model(pre, task.name, keep_head=False, dropout=cfg.dropout, seed=calculation_seed(cfg),
                             reads=reads_of(cfg)).to(device)
    model.heads[task.name] = head = task_head(task, model.cfg, cfg.dropout, reads_of(cfg), "logistic").to(device)
    f_fit = _Features(model, task, encode(task, fit_examples))
    units = [task.test_unit(fit_examples[r]) for r in f_fit.row_of_unit.tolist()]
    c = fit_logistic_head(head, f_fit.x, f_fit.y, units, task.num_classes)
    model.eval()
    enc_test = encode(task, test)
    f_test = _Features(model, task, enc_test)
    with torch.no_grad():
        logits = head(f_test.x)
    m = metrics_from_logits(logits, f_test.y)
    m.update(scores_per_test_unit(task, test, logits.argmax(-1) == f_test.y, f_test.row_of_unit))
    return Calculation({
        "accuracy": m["accuracy"], "perplexity": m["perplexity"],
        "best_accuracy": m["accuracy"], "perplexity_at_best_accuracy": m["perplexity"],
        "epochs": 0, "epochs_run": 0, "best_accuracy_epoch": 0, "logistic_c": c,
        "selection": cfg.selection, "refit": cfg.refit, "head_input": f"{cfg.feature_layers}:{cfg.word_pooling}",
        "num_train": len(fit_examples), "num_val": len(val or []), "num_test": len(test),
        "seconds": round(time.time() - t0, 3), "device": str(device),
        "unit_keys": m["unit_keys"], "unit_count": m["unit_count"], "unit_correct": m["unit_correct"],
        "unit_correct_at_best_accuracy": m["unit_correct"], **parts_per_test_unit(task, test),
    }, model)


def calculation_seed(cfg: FinetuneConfig) -> int:
    """The randomness of one calculation (its fresh heads' initialisation, dropout, batch order), keyed by its seed
    *and* fold. Seed s of fold 0 and seed s of fold 1 are two independent draws: a seed's luck (a good head
    initialisation) is not shared by the five folds, so the folds are independent replicates of the finetuning
    randomness (docs/statistics.md). Two models finetuned at the same (fold, seed) start from the same heads."""
    return cfg.seed * 1000 + cfg.fold


class _Fit:
    """One training run of a calculation: a task model from the pretrained weights (its heads initialised, its
    dropout and its batch order drawn by `calculation_seed`), its optimizer, on the encoded examples `enc_fit`."""

    def __init__(self, pre: Pretrained, cfg: FinetuneConfig, tasks: tuple[Task, ...], enc_fit: Encoded,
                 enc_other: Encoded | None, device):
        names = tuple(t.name for t in tasks)
        self.cfg, self.task, self.tasks, self.enc_fit, self.enc_other = cfg, tasks[0], tasks, enc_fit, enc_other
        self.model = build_task_model(pre, names[0], keep_head=cfg.keep_head, dropout=cfg.dropout,
                                      seed=calculation_seed(cfg), reads=reads_of(cfg)).to(device)
        self.opt = torch.optim.Adam(trainable_parameters(self.model, cfg.scheme, names), lr=cfg.lr)
        self.gen = torch.Generator().manual_seed(calculation_seed(cfg))
        self.head, self.frozen, self.device = self.model.heads[names[0]], cfg.scheme == "pred", device
        self.features = _Features(self.model, self.task, enc_fit) if self.frozen else None

    def epoch(self) -> None:
        model, cfg, task = self.model, self.cfg, self.task
        order = torch.randperm(len(self.enc_fit), generator=self.gen)
        for start in range(0, len(order), cfg.batch_size):
            rows = order[start: start + cfg.batch_size].to(self.device)
            self.opt.zero_grad(set_to_none=True)
            if self.frozen:
                self.head.train()
                units = self.features.units_of_rows(rows)
                loss = F.cross_entropy(self.head(self.features.x[units]), self.features.y[units])
            else:
                model.train()
                loss = F.cross_entropy(*logits_and_labels(model, task, self.enc_fit.rows(rows)))
                if len(self.tasks) > 1:
                    orows = torch.randint(len(self.enc_other), (len(rows),), generator=self.gen).to(self.device)
                    loss = loss + F.cross_entropy(*logits_and_labels(model, self.tasks[-1], self.enc_other.rows(orows)))
            loss.backward()
            self.opt.step()

    def evaluate(self, enc: Encoded, feats: _Features | None = None, examples=None) -> dict:
        """Accuracy and perplexity on `enc`; with its `examples`, the per-test-unit scores too."""
        self.model.eval()
        with torch.no_grad():
            if feats is not None:
                logits, labels, rows = self.head(feats.x), feats.y, feats.row_of_unit
            else:
                (logits, labels), rows = logits_and_labels(self.model, self.task, enc), None
        m = metrics_from_logits(logits, labels)
        if examples is not None:
            rows = self.task.unit_rows(enc) if rows is None else rows
            m.update(scores_per_test_unit(self.task, examples, logits.argmax(-1) == labels, rows))
        return m

    def snapshot(self):
        return copy.deepcopy(self.head.state_dict()) if self.frozen else copy.deepcopy(self.model.state_dict())

    def restore(self, sd) -> None:
        (self.head if self.frozen else self.model).load_state_dict(sd)


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


def save_finetuned(root: Path, pre: Pretrained, cfg: FinetuneConfig, result: Calculation) -> Path:
    """Write the model `finetune_calculation` kept (its best-perplexity state) with all a server needs.

    The pretrained WHP/PAD heads are copied in as they were before finetuning, so the predictor can
    show the aligned pretraining objective's score next to the task's (paper §4.1).
    Written to a temporary folder and renamed, so a crash never leaves a half-written model.
    """
    model, tasks = result.model, task_heads(cfg)
    state = {f"encoder.{k}": v for k, v in model.encoder.state_dict().items()}
    for t in tasks:
        state.update({f"heads.{t}.{k}": v for k, v in model.heads[t].state_dict().items()})
    pretrained_heads = [t.aligned_objective for t in registered_tasks() if t.aligned_objective in pre.heads]
    for h in pretrained_heads:
        prefix = f"heads.{h}."
        state.update({k: v for k, v in pre.state.items() if k.startswith(prefix)})
    fid = finetuned_id(pre.mdir.name, cfg)
    final = finetuned_dir(root, fid)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{fid}.", dir=final.parent))
    try:
        # On the CPU whatever device the calculation ran on: the file loads where no GPU is.
        torch.save({k: v.detach().cpu().clone() for k, v in state.items()}, tmp / "model.pt")
        shutil.copy(pre.tok.model_path, tmp / "tokenizer.model")
        declared = [d for d in declarations() if d["name"] in tasks]  # a declared task: served with no files
        write_json(tmp / "model_config.json", {"model": dataclasses.asdict(model.cfg), "vocab_size": pre.vocab_size,
                                               "task_heads": list(tasks), "pretrained_heads": pretrained_heads,
                                               **({"declarations": declared} if declared else {})})
        write_json(tmp / "finetune.json", {"finetuned_id": fid, "pretrained_model_id": pre.mdir.name,
                                           "pretrained_dir": str(pre.mdir), "finetune": to_dict(cfg),
                                           "encoder_finetuned": cfg.scheme != "pred", "marker": MARKER})
        write_json(tmp / "metrics.json", result.row)
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
    declare_all(mc.get("declarations"))  # its declared task, as the saving process knew it
    model = AlignModel(ModelConfig(**mc["model"]), mc["vocab_size"])
    cfg = finetune_from_dict(info["finetune"])
    for h in mc["task_heads"]:
        model.heads[h] = task_head(task_named(h), model.cfg, model.cfg.dropout, reads_of(cfg), cfg.head)
    for h in mc["pretrained_heads"]:
        model.heads[h] = head_for(h, model.cfg.hidden, model.cfg.dropout)
    state, tok = torch.load(fdir / "model.pt", map_location="cpu", weights_only=True), Tokenizer(fdir / "tokenizer.model")
    check_model_vocabulary(fdir, tok, mc["vocab_size"], state)
    model.load_state_dict(state)
    model.eval()
    metrics = read_json(fdir / "metrics.json") if (fdir / "metrics.json").exists() else {}
    return Finetuned(fdir, model, tok, cfg,
                     tuple(mc["task_heads"]), tuple(mc["pretrained_heads"]), info, metrics)
