"""The engine stays without names and keeps Ray at its edges
(docs/architecture.md#the-import-rules-and-the-tests-that-keep-them).

These walk `platform/` with `ast`, so they fail the moment someone writes `if task == "ct"` or
`import ray` in a core module, rather than when the next objective is added and something breaks."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from alignlab.platform.registry import layout_fraction_key, registered
from alignlab.platform.task import registered_tasks, task_names

PLATFORM = Path(__file__).resolve().parents[1] / "platform"

RAY_EDGES = {
    # Where work is distributed: the Ray Data pipeline, the TorchTrainer wrapper, the Tune trainables and
    # tuner, the Ray session itself and its resource checks. Every other module runs without Ray.
    "corpus.py", "pretrain_ray.py", "ray_env.py", "resources.py", "objective_search.py",
    "study_run.py", "study_grid.py", "study_search.py", "study_search_tune.py",
}
FOREIGN_KEYS = {
    # Keys of formats alignlab does not own that happen to start with an objective's name.
    "pad_token_id",  # transformers' config.json (export.py)
    # Padding, not the PAD objective: the tokenizer's padding piece and id, and local `pad` counts of padding.
    "pad", "pad_id", "pad_token", "pad_piece", "pad_to_max_len",
}
_JOINED = re.compile(r"[\w-]+(?:[,+][\w-]+)+")
MAX_LINES = 400
GENERIC_WORDS = {
    # Words of the objectives' and tasks' option names that say nothing of whose they are: the engine may use them.
    "data", "target", "form", "fraction", "key", "labels", "alpha", "weight",
}


def _modules():
    return sorted(PLATFORM.glob("*.py"))


def _names() -> set[str]:
    names = set(registered()) | set(task_names())
    assert {"mlm", "nsp"} <= names, "the registry found no objectives: the guard would check nothing"
    return names


def _owned() -> set[str]:
    """What the objectives and tasks own besides their names: an objective's own example layout ("acronym") and
    the names of the options a task or a layout declares (AD's acronym_form and target_snippets, the layout
    fraction's id key), with each distinctive word of them ("snippets"). The engine names none of these: a
    name in it means an option of one objective or task that it handles as its own."""
    from alignlab.platform.registry import objective_class

    layouts = {getattr(objective_class(c), "example_format", "pair") for c in registered().values()} - {"pair"}
    options = {k for t in registered_tasks() for k in (*t.build_options, *t.finetune_options)}
    options |= {layout_fraction_key()} - {"layout_fraction"}
    words = {w for o in options for w in o.split("_")} - GENERIC_WORDS - _names()
    assert "acronym" in layouts and "acronym_form" in options, "the guard would miss the paper's own options"
    return layouts | options | words


def _imports_ray(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "ray" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "ray":
            lines.append(node.lineno)
    return lines


def test_only_the_named_edge_modules_of_the_engine_import_ray():
    offenders = [f"platform/{p.name}:{line}" for p in _modules() if p.name not in RAY_EDGES
                 for line in _imports_ray(ast.parse(p.read_text(), str(p)))]
    assert not offenders, f"ray imported outside the edge modules {sorted(RAY_EDGES)}: {offenders}"


def test_the_edge_list_names_only_modules_that_exist():
    assert RAY_EDGES <= {p.name for p in _modules()}


def _named(node: ast.AST) -> list[str]:
    """What a node names: a string constant (and each name of a comma- or plus-joined list like "mlm,nsp" or
    "mlm+nsp"), an identifier, an attribute, a keyword argument, a parameter, a function or class name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        v = node.value
        return [v, *re.split(r"[,+]", v)] if _JOINED.fullmatch(v) else [v]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.keyword, ast.arg)):
        return [node.arg] if node.arg else []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    return []


def _leaks(source: str, names: set[str], where: str = "", owned: frozenset[str] = frozenset()) -> list[str]:
    """Names (`_named`) that are an objective's or task's, or start with one ("ct_data"), or are a thing they own
    or hold one of its words as a word of their own ("acronym_fraction", "task_snippets": `_owned`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        for v in _named(node):
            if v in FOREIGN_KEYS:
                continue
            if v in names or v in owned or any(v.startswith(f"{n}_") and v.isidentifier() for n in names) or \
                    (v.isidentifier() and owned & set(v.lower().split("_"))):
                out.append(f"{where}:{node.lineno}: {v!r}")
    return out


def test_no_engine_module_names_an_objective_or_a_task():
    names, owned = _names(), frozenset(_owned())
    offenders = [o for p in _modules() for o in _leaks(p.read_text(), names, f"platform/{p.name}", owned)]
    assert not offenders, "objective/task names belong in objectives/, not in the engine:\n" + "\n".join(offenders)


def test_the_guard_sees_names_in_identifiers_keywords_and_joined_strings():
    names, owned = _names(), frozenset(_owned())
    for source in ('x = "mlm,nsp,whp,pad"', 'x = "mlm+nsp"', "f(ct_data=1)", "study.ct_data", "def f(ad_rows): pass",
                   "ct_data = 1",
                   # the leaks of issue #44: an objective's layout, options and their old config fields
                   'if f == "acronym": pass', "cfg.acronym_form", "f(acronym_form=1)", "PretrainConfig(acronym_fraction=0.5)",
                   "study.task_snippets", "f(target_snippets=600)", "tok.encode_acronym(x)", 'd["acronym_fraction"]'):
        assert _leaks(source, names, owned=owned), source
    for source in ('x = "a,b"', "tok.pad_id", "pad = 3", 'x = "emulation"', "f(adapter=1)", "cfg.layout_fraction",
                   "f(task_options=())", "ex.lead_chunk_labels", 'x = "a long snippet of prose"'):
        assert not _leaks(source, names, owned=owned), source


def test_no_engine_module_is_longer_than_a_screenful_of_concerns():
    long = {p.name: n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"platform/ modules over {MAX_LINES} lines (split them by concern): {long}"


def test_the_guard_sees_a_name_literal_when_there_is_one():
    tree = ast.parse('if task == "mlm":\n    pass\n')
    assert any(isinstance(n, ast.Constant) and n.value in _names() for n in ast.walk(tree))
    assert _imports_ray(ast.parse("from ray import tune")) == [1]
    assert _imports_ray(ast.parse("import ray.data as rd")) == [1]
