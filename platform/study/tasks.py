"""A user's declared tasks in a study: the `--task` spec every study script and `alignlab fel` read, and the
study transform that gives a declared task rows of its own.

A study script builds its cells for the tasks it was written for; a declared task gets a copy of the cells of
the study's task it resembles most (the one aligned with the same pretraining objective, else the first), with
that task's name replaced by its own in the row and group, and the same baseline cell. So each study answers
its question for the user's task too, with the models it already pretrains.
"""
from __future__ import annotations

import dataclasses

from alignlab.platform.config import config_hash

# The task registry and the task kinds (torch) are imported inside the functions that declare tasks: a study
# script's arguments are parsed without loading torch.

SPEC_HELP = ("declare a task from files: name=NAME,kind=tagging|sequence|pair,pool=FILE,test=FILE"
             "[,aligned=OBJECTIVE][,budget=N][,extra.NAME=FILE] (repeatable); the study gets rows for it, at its "
             "budget=N where the study's other tasks train on the preset's budget")


def parse_task_spec(spec: str) -> dict:
    """`name=ner,kind=tagging,pool=a.jsonl,test=b.jsonl,aligned=whp,budget=150,extra.ood=c.jsonl` -> declare_task's
    keywords, and "budget" (None when not given: the study's own)."""
    fields, extra = {}, {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ValueError(f"--task {spec!r}: {part!r} is not KEY=VALUE")
        if key.startswith("extra."):
            extra[key[len("extra."):]] = value
        elif key in ("name", "kind", "pool", "test", "aligned", "budget"):
            fields[key] = value
        else:
            raise ValueError(f"--task {spec!r}: unknown key {key!r} (name, kind, pool, test, aligned, budget, "
                             "extra.NAME)")
    budget = fields.get("budget")
    if budget is not None and not (budget.isdigit() and int(budget) > 0):
        raise ValueError(f"--task {spec!r}: budget must be a whole number of examples > 0, got {budget!r}")
    missing = [k for k in ("name", "kind", "pool", "test") if k not in fields]
    if missing:
        raise ValueError(f"--task {spec!r}: missing {', '.join(missing)}")
    return {"name": fields["name"], "kind": fields["kind"], "pool": fields["pool"], "test": fields["test"],
            "aligned_objective": fields.get("aligned", ""), "extra_tests": extra,
            "budget": int(budget) if budget is not None else None}


def declare_specs(specs) -> list[str]:
    """Declare every `--task` spec (files validated, FILE:LINE problems raised); their names."""
    from alignlab.platform.tasks.task_kinds import declare_task

    names = []
    for spec in specs:
        kw = parse_task_spec(spec)
        kw.pop("budget")
        declare_task(kw.pop("name"), kw.pop("kind"), kw.pop("pool"), kw.pop("test"), **kw)
        names.append(parse_task_spec(spec)["name"])
    return names


def declared_budgets(specs) -> dict[str, int]:
    """{task name: budget} of the `--task` specs that give `budget=N`."""
    return {kw["name"]: kw["budget"] for kw in map(parse_task_spec, specs) if kw["budget"] is not None}


DECLARE_FLAG = "--declare-task"


def specs_in(argv) -> list[str]:
    """The values of every `--declare-task SPEC` / `--declare-task=SPEC` of a command line (read before the
    parser is built, so that the declared names are among `--task`'s choices)."""
    out = []
    for i, a in enumerate(argv):
        if a == DECLARE_FLAG and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith(DECLARE_FLAG + "="):
            out.append(a[len(DECLARE_FLAG) + 1:])
    return out


def add_declare_argument(ap) -> None:
    """`--declare-task SPEC` of `alignlab fel`/`finetune`/`evaluate`/`data validate` (declared in `cli.main`)."""
    ap.add_argument(DECLARE_FLAG, action="append", default=[], metavar="SPEC", help=SPEC_HELP.replace(
        "; the study gets rows for it", "; then name it with --task"))


def add_task_arguments(ap) -> None:
    ap.add_argument("--task", DECLARE_FLAG, action="append", default=[], metavar="SPEC", dest="declare_tasks",
                    help=SPEC_HELP)
    ap.add_argument("--only-tasks", default=None, metavar="NAMES",
                    help="keep only these tasks' rows (comma-separated), e.g. only your declared task")


def _renamed(label: str, old: str, new: str) -> str:
    return new + label[len(old):] if label.startswith(old) else f"{new} {label}"


def with_tasks(study, names, only=None, budgets: dict[str, int] | None = None):
    """`study` with rows for each declared task `names` (copies of its most similar task's cells) and, with
    `only`, none but those tasks' rows; named after what changed, so it keeps its own folder and report.

    A declared task's rows train on its `budgets[name]` (`budget=N` in its declaration) where the copied rows
    trained on the study's reference budget (`spec.with_budget`). In a study that varies the budget over a task's
    rows (data_budget), the declared task keeps only the rows its pool can hold, and its baseline cell moves to the
    largest of them; elsewhere a budget its pool cannot hold is refused before any work (`run.check_budgets`)."""
    from alignlab.platform.study.spec import with_budget
    from alignlab.platform.tasks.task import task

    budgets = dict(budgets or {})
    if not names and not only:
        return study
    in_study = list(dict.fromkeys(c.finetune.task for c in study.calcs))
    # A task named in `only` that the study lacks (a plugin's) gets rows as a declared one does.
    names = [*names, *(n for n in (only or ()) if n not in in_study and n not in names)]
    calcs, searches, cells = list(study.calcs), list(study.searches), list(study.baseline_cells)
    claims = list(study.claims)
    for name in names:
        t = task(name)
        like = next((n for n in in_study if task(n).aligned_objective == t.aligned_objective), in_study[0])
        old, new = like.upper(), name.upper()

        def moved(c):
            return dataclasses.replace(c, row=_renamed(c.row, old, new),
                                       group=_renamed(c.group, old, new) if c.group else c.group)

        calcs += [dataclasses.replace(moved(c), finetune=dataclasses.replace(c.finetune, task=name))
                  for c in study.calcs if c.finetune.task == like]
        searches += [dataclasses.replace(moved(s), base=dataclasses.replace(s.base, task=name))
                     for s in study.searches if s.base.task == like]
        rows = {c.row for c in study.calcs if c.finetune.task == like}
        cells += [(_renamed(r, old, new), col) for r, col in study.baseline_cells if r in rows]
        # A declared task claims what its most similar task claims (its aligned model above its baseline).
        claims += [(_renamed(r, old, new), col) for r, col in study.claims if r in rows]
        if name in budgets:
            shaped = with_budget(dataclasses.replace(study, calcs=tuple(calcs), searches=tuple(searches),
                                                     baseline_cells=tuple(cells)), budgets[name], task=name)
            calcs, searches = list(shaped.calcs), list(shaped.searches)
        calcs, cells = _rows_the_pool_holds(calcs, cells, name, getattr(t, "pool_size", None))
    if only:
        keep = set(only)
        unknown = keep - {c.finetune.task for c in calcs}
        if unknown:
            raise ValueError(f"--only-tasks: {sorted(unknown)} have no rows in study {study.name}")
        calcs = [c for c in calcs if c.finetune.task in keep]
        searches = [s for s in searches if s.base.task in keep]
        rows = {c.row for c in calcs} | {s.row for s in searches}
        cells = [(r, col) for r, col in cells if r in rows]
    used = {c.model for c in calcs} | {s.model for s in searches}
    cols = {c.col for c in calcs} | {s.col for s in searches}
    baseline_col = study.baseline_col if study.baseline_col in cols else sorted(cols)[0]
    from alignlab.platform.tasks.task_kinds import declarations

    key = config_hash({"declared": [d for d in declarations() if d["name"] in names], "added": sorted(names),
                       "only": sorted(only or ()), **({"budgets": budgets} if budgets else {})}, length=8)
    present = {(c.row, c.col) for c in calcs} | {(s.row, s.col) for s in searches}
    claims = [c for c in dict.fromkeys(claims) if c in present and c not in set(cells)]
    return dataclasses.replace(study, name=f"{study.name}-tasks-{key}", calcs=tuple(calcs), searches=tuple(searches),
                               baseline_cells=tuple(cells), baseline_col=baseline_col, claims=tuple(claims),
                               models=tuple(m for m in study.models if m.key in used))


def _rows_the_pool_holds(calcs: list, cells: list, name: str, pool: int | None) -> tuple[list, list]:
    """Where `name`'s rows vary the budget, drop the rows whose budget exceeds its `pool`, and move a baseline cell
    of a dropped row to the remaining row of its group with the largest budget (same column)."""
    mine = [c for c in calcs if c.finetune.task == name]
    budget_of = {c.row: c.finetune.budget for c in mine}
    if pool is None or len(set(budget_of.values())) < 2:
        return calcs, cells
    dropped = {r for r, b in budget_of.items() if b > pool}
    if not dropped:
        return calcs, cells
    if dropped == set(budget_of):
        raise ValueError(f"task {name}: every budget of the study ({sorted(set(budget_of.values()))}) exceeds its pool "
                         f"of {pool} examples; add examples to its pool file or pass smaller --budgets")
    group_of = {c.row: c.group or c.row for c in mine}
    kept = [c for c in calcs if not (c.finetune.task == name and c.row in dropped)]
    out_cells = []
    for r, col in cells:
        if r in dropped:
            options = [x for x in budget_of if x not in dropped and group_of[x] == group_of[r]]
            r = max(options, key=lambda x: budget_of[x])
        out_cells.append((r, col))
    return kept, out_cells


def maximize_key(name: str) -> str:
    """`--maximize TASK[:METRIC]` -> the trial key it names (`ner:span_f1` -> `ner_val_span_f1`)."""
    from alignlab.platform.study.objective_search import val_metric

    task, _, metric = name.partition(":")
    return val_metric(task.strip(), metric.strip() or "accuracy")


def search_with_tasks(spec, names, only=None, maximize=()):
    """An objective-mixture search (`objective_search.MixSearchSpec`) that scores the declared tasks `names`
    too (with `only`, only those tasks) and maximizes `maximize` (`TASK[:METRIC]`; default: each scored task's
    accuracy, or, when tasks are declared, the first declared task's). It carries the declarations (their
    files' digests) and is named after them, so a search on other tasks is another search with its own report."""
    from alignlab.platform.tasks.task import task_names
    from alignlab.platform.tasks.task_kinds import declarations

    if not names and not only and not maximize:
        return spec
    unknown = sorted(set(only or ()) - set(task_names()))
    if unknown:
        raise ValueError(f"--only-tasks: no task named {', '.join(unknown)} (known: {', '.join(task_names())})")
    tasks = tuple(only) if only else task_names()
    keys = tuple(maximize_key(m) for m in maximize) or (
        (maximize_key(names[0]),) if names and names[0] in tasks else ())
    outside = [k for k in keys if not any(k.startswith(f"{t}_val_") for t in tasks)]
    if outside:
        raise ValueError(f"--maximize: {', '.join(outside)} is not a metric of the scored tasks {', '.join(tasks)}")
    declared = tuple(d for d in declarations() if d["name"] in tasks)
    key = config_hash({"declared": list(declared), "tasks": list(tasks), "maximize": list(keys)}, length=8)
    return dataclasses.replace(spec, name=f"{spec.name}-tasks-{key}", title=f"{spec.title}, tasks {', '.join(tasks)}",
                               tasks=tasks, maximize=keys, declared=declared)
