"""The pretrained aligned head read zero-shot on its task's inputs (issue #65: PAD's head on AD's pairs), once per
pretrained model: how far pretraining alone carries the task, before any finetuning.

For a task whose labels are its aligned objective's (`Task.zero_shot_head`; AD: its input is PAD's `[CLS] acronym
[SEP] text [SEP]`, label 1 = the letters match), the model's pretrained head, as pretraining left it, is put in the
task head's place and scores the task's examples in the task's own input form (the task options of the study's
calculations: AD spells its acronym letter by letter, as PAD pretrains by default). A model without the aligned
objective's head, or whose head does not have the task head's exact shape, gets none; so does every other task.

The sets scored: "test", every fold's test set (AD: every snippet of its file; CT: its one test set), and each
built-in extra test set (AD: `ood`), each also by part (`Task.parts`). A study records them in
`<study>/zero_shot.json` (`record_zero_shot`), keyed by model id and task, so a rerun scores only what is new; the
report reads them (`report.parts`).
"""
from __future__ import annotations

from pathlib import Path

from alignlab.platform.storage.root import read_json, write_json

ZERO_SHOT_FILE = "zero_shot.json"
ZERO_SHOT_VERSION = 1
"""Bump when what is scored or how changes: the study's file is then recomputed."""


def read_zero_shot(sdir: Path) -> dict:
    """The study's zero-shot file ({} where there is none, or one of another version)."""
    f = Path(sdir) / ZERO_SHOT_FILE
    if not f.exists():
        return {}
    data = read_json(f)
    return data if data.get("version") == ZERO_SHOT_VERSION else {}


def aligned_head_scores(pre, task, sets: dict[str, list], options=()) -> dict | None:
    """{"head": the aligned objective, "sets": {name: {"accuracy", "count", "parts": {part: accuracy}}}} of the
    pretrained model `pre` (`finetune.Pretrained`)'s aligned head scoring `task`'s examples of each set zero-shot;
    None where the model has no such head or it does not fit the task's head exactly."""
    import torch

    from alignlab.platform.fel.finetune import build_task_model
    from alignlab.platform.fel.task_scoring import evaluate_examples, parts_per_test_unit

    head_name = task.aligned_objective
    if not task.zero_shot_head or not head_name or head_name not in pre.heads:
        return None
    prefix = f"heads.{head_name}."
    kept = {k[len(prefix):]: v for k, v in pre.state.items() if k.startswith(prefix)}
    model = build_task_model(pre, task.name, keep_head=False, dropout=0.0, seed=0)
    fresh = model.heads[task.name].state_dict()
    if set(kept) != set(fresh) or any(kept[k].shape != fresh[k].shape for k in kept):
        return None
    model.heads[task.name].load_state_dict(kept)
    model.eval()
    out = {}
    with torch.inference_mode():
        for name, examples in sets.items():
            if not examples:
                continue
            m = evaluate_examples(model, task, examples, pre.tok, options=options, per_unit=True)
            rec = {"accuracy": m["accuracy"], "count": m["count"]}
            parts = parts_per_test_unit(task, examples).get("unit_parts")
            if parts is not None:
                rec["parts"] = {}
                for q in task.parts:
                    idx = [i for i, p in enumerate(parts) if p == q]
                    n = sum(m["unit_count"][i] for i in idx)
                    if n:
                        rec["parts"][q] = sum(m["unit_correct"][i] for i in idx) / n
            out[name] = rec
    return {"head": head_name, "sets": out}


def task_sets(task, data) -> dict[str, list]:
    """"test": every fold's test set, each example once; and the task's built-in extra test sets."""
    from alignlab.platform.tasks.task_data import NUM_FOLDS

    test: dict = {}
    for fold in range(NUM_FOLDS):
        test.update((repr(ex), ex) for ex in task.pool_and_test(data, fold)[1])
    return {"test": list(test.values()), **task.extra_tests(data)}


def record_zero_shot(sdir: Path, models: dict[str, Path], tasks: dict[str, tuple], task_dir: Path,
                     say=lambda *a, **k: None) -> dict:
    """Score every model of `models` (model id -> its folder) with the aligned head of every task of `tasks` (name ->
    the task options of the study's calculations) on the task data of `task_dir`, once: what `<study>/zero_shot.json`
    already holds for the same task data is kept. Returns the file's content."""
    from alignlab.platform.fel.finetune import load_pretrained
    from alignlab.platform.tasks.task import task as task_named
    from alignlab.platform.tasks.task_data import TaskData

    sdir = Path(sdir)
    tasks = {t: options for t, options in tasks.items() if task_named(t).zero_shot_head}
    have = read_zero_shot(sdir)
    if have.get("task_id") != Path(task_dir).name:
        have = {}
    done = have.get("models", {})
    todo = {mid: d for mid, d in models.items() if any(t not in done.get(mid, {}) for t in tasks)}
    if not todo:  # nothing new (or no task reads its aligned head zero-shot)
        return have
    data = TaskData.load(Path(task_dir))
    sets = {t: task_sets(task_named(t), data) for t in tasks}
    for mid, mdir in todo.items():
        try:
            pre = load_pretrained(mdir)
        except ValueError as e:  # not here (a remote root's model on another node): the report shows –
            say(f"[zero-shot] {mid}: skipped ({e})")
            continue
        for t, options in tasks.items():
            if t not in done.get(mid, {}):
                rec = aligned_head_scores(pre, task_named(t), sets[t], options)
                done.setdefault(mid, {})[t] = rec or {}
    out = {"version": ZERO_SHOT_VERSION, "task_id": Path(task_dir).name, "models": done}
    write_json(sdir / ZERO_SHOT_FILE, out)
    return out
