"""The engine stays without names, keeps Ray at its edges
(docs/architecture.md#the-import-rules-and-the-tests-that-keep-them), and its modules import each other without a
circle.

These walk `platform/` with `ast`, so they fail the moment someone writes `if task == "ct"`, `import ray` in a
core module or an import that closes a circle, rather than when the next objective is added and something
breaks."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from alignlab.platform.encoder.registry import layout_fraction_key, registered
from alignlab.platform.tasks.task import registered_tasks, task_names

PLATFORM = Path(__file__).resolve().parents[1] / "platform"

RAY_EDGES = {
    # Where work is distributed: the Ray Data pipeline, the TorchTrainer wrapper, the Tune trainables and
    # tuner, the Ray session itself and its resource checks. Every other module runs without Ray.
    "corpus/corpus.py", "pretrain/driver.py", "runtime/ray_env.py", "runtime/resources.py", "study/objective_search.py",
    "study/run.py", "study/grid.py", "study/search.py", "study/search_tune.py",
}
FOREIGN_KEYS = {
    # Keys of formats alignlab does not own that happen to start with an objective's name.
    "pad_token_id",  # transformers' config.json (pretrain/export.py)
    # Padding, not the PAD objective: the tokenizer's padding piece and id, and local `pad` counts of padding.
    "pad", "pad_id", "pad_token", "pad_piece", "pad_to_max_len",
}
_JOINED = re.compile(r"[\w-]+(?:[,+][\w-]+)+")
MAX_LINES = 600
"""A module past this is a runaway: fail. Below it the size is reported, not judged (see the size test)."""
GENERIC_WORDS = {
    # Words of the objectives' and tasks' option names that say nothing of whose they are: the engine may use them.
    "data", "target", "form", "fraction", "key", "labels", "alpha", "weight",
}


PACKAGE_DATA = ("sources/corpus_data", "pretrain/hf", "task_data")  # shipped files and their scripts, never imported


def _modules() -> list[Path]:
    """Every module of platform/, its stage folders' included (package data left out)."""
    return sorted(p for p in PLATFORM.rglob("*.py") if not _rel(p).startswith(PACKAGE_DATA))


def _rel(p: Path) -> str:
    return p.relative_to(PLATFORM).as_posix()


def _names() -> set[str]:
    names = set(registered()) | set(task_names())
    assert {"mlm", "nsp"} <= names, "the registry found no objectives: the guard would check nothing"
    return names


def _owned() -> set[str]:
    """What the objectives and tasks own besides their names: an objective's own example layout ("acronym") and
    the names of the options a task or a layout declares (AD's acronym_form and target_snippets, the layout
    fraction's id key), with each distinctive word of them ("snippets"). The engine names none of these: a
    name in it means an option of one objective or task that it handles as its own."""
    from alignlab.platform.encoder.registry import objective_class

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
    offenders = [f"platform/{_rel(p)}:{line}" for p in _modules() if _rel(p) not in RAY_EDGES
                 for line in _imports_ray(ast.parse(p.read_text(), str(p)))]
    assert not offenders, f"ray imported outside the edge modules {sorted(RAY_EDGES)}: {offenders}"


def test_the_edge_list_names_only_modules_that_exist():
    assert RAY_EDGES <= {_rel(p) for p in _modules()}


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
    offenders = [o for p in _modules() for o in _leaks(p.read_text(), names, f"platform/{_rel(p)}", owned)]
    assert not offenders, "objective/task names belong in objectives/ and tasks/, not in the engine:\n" + "\n".join(offenders)


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


def _module_name(root: Path, p: Path, package: str = "alignlab.platform") -> str:
    parts = list(p.relative_to(root).with_suffix("").parts)
    return ".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])


def _import_graph(root: Path, package: str = "alignlab.platform",
                  type_checking: bool = False) -> dict[str, dict[str, int]]:
    """module -> {module of the same package it imports: the line of the first such import}, for every module
    under `root` (package data left out). Imports at module level, in class bodies and inside functions all count;
    those under `if TYPE_CHECKING:` count only with `type_checking` (they never run, so they close no circle at
    import time, but an annotation is a dependency all the same). `from P import name` counts as an import of the
    submodule P.name when there is one, else of P."""
    files = {_module_name(root, p, package): p for p in sorted(root.rglob("*.py"))
             if not _rel_to(root, p).startswith(PACKAGE_DATA)}
    graph = {}
    for mod, path in files.items():
        edges: dict[str, int] = {}

        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) and not type_checking:
                    continue
                targets = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                    targets = [f"{child.module}.{a.name}" if f"{child.module}.{a.name}" in files else child.module
                               for a in child.names]
                for t in targets:
                    if t in files and t != mod:
                        edges.setdefault(t, child.lineno)
                visit(child)

        visit(ast.parse(path.read_text(), str(path)))
        graph[mod] = edges
    return graph


def _rel_to(root: Path, p: Path) -> str:
    return p.relative_to(root).as_posix()


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import circles: each strongly connected set of two or more modules, as one circle through it
    ("a -> b -> a"), found by walking back from each module to itself."""
    def reaches(a: str, b: str) -> list[str] | None:  # a path a -> ... -> b, breadth first
        seen, todo = {a: [a]}, [a]
        while todo:
            cur = todo.pop(0)
            for nxt in sorted(graph[cur]):
                if nxt == b:
                    return seen[cur] + [b]
                if nxt not in seen:
                    seen[nxt] = seen[cur] + [nxt]
                    todo.append(nxt)
        return None

    out, done = [], set()
    for mod in sorted(graph):
        if mod not in done and (loop := reaches(mod, mod)):
            out.append(loop)
            done |= set(loop)
    return out


def test_no_module_of_the_engine_imports_itself_through_others():
    """No import circle inside platform/, counting function-local imports too: a local import that only dodges
    a circle hides a dependency that runs the other way (issue #45). Local imports kept for a real reason (Ray in
    a worker function, matplotlib, optuna, transformers) name third-party modules and so never close a circle."""
    circles = _circles(_import_graph(PLATFORM))
    assert not circles, "import circles in platform/ (move the code to where it belongs):\n" + "\n".join(
        " -> ".join(c) for c in circles)


def test_the_circle_guard_sees_a_planted_circle_through_a_local_import_and_ignores_type_checking(tmp_path):
    (tmp_path / "stage").mkdir()
    (tmp_path / "stage" / "__init__.py").write_text('"""A stage."""\n')
    (tmp_path / "a.py").write_text("from alignlab.platform.stage import b\n")
    (tmp_path / "stage" / "b.py").write_text("def f():\n    from alignlab.platform.c import g\n")
    (tmp_path / "c.py").write_text("from alignlab.platform.a import x\n")
    (tmp_path / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from alignlab.platform.e import y\n")
    (tmp_path / "e.py").write_text("import alignlab.platform.d\n")
    graph = _import_graph(tmp_path)
    assert graph["alignlab.platform.a"] == {"alignlab.platform.stage.b": 1}
    assert _circles(graph) == [["alignlab.platform.a", "alignlab.platform.stage.b", "alignlab.platform.c",
                                "alignlab.platform.a"]]
    (tmp_path / "c.py").write_text("x = 1\n")
    assert _circles(_import_graph(tmp_path)) == []


LAYERS = ("storage", "runtime", "encoder", "config", "sources", "tasks", "corpus", "pretrain", "fel", "presets",
          "report", "study", "cli", "bench")
"""platform/ bottom to top: the foundations (the storage root, the runtime, the encoder every stage shares, the
configs), then the stages in the order of the data flow, the presets that set every stage, the report (which reads
the studies' results from disk), the studies (which run every stage, the report last), the command, and what the
benchmarks above the engine share (`bench/`: nothing in the engine imports it). A folder or a top-level module each
(docs/architecture.md#the-rooms)."""


def _layer(mod: str) -> int:
    return LAYERS.index(mod.split(".")[2])


def _upward(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import of a module of a later layer (`LAYERS`) by one of an earlier layer: "a:line -> b"."""
    return [f"{a}:{line} -> {b}" for a, edges in sorted(graph.items()) for b, line in sorted(edges.items())
            if _layer(b) > _layer(a)]


def test_every_module_of_the_engine_sits_in_a_named_layer():
    mods = _import_graph(PLATFORM)
    unplaced = sorted(m for m in mods if m != "alignlab.platform" and m.split(".")[2] not in LAYERS)
    assert not unplaced, f"modules outside the layers of LAYERS (add the folder there, in data-flow order): {unplaced}"


def test_no_stage_imports_a_later_stage():
    """The data flow runs one way: a stage imports the foundations and the stages before it, never one after it,
    counting function-local imports (issue #57) and imports for annotations only (issue #69: the encoder took
    `ModelConfig` from config.py above it; it now sits in the encoder's layer). A stage that needs a later stage's
    code is a sign the code belongs earlier."""
    graph = _import_graph(PLATFORM, type_checking=True)
    up = _upward({m: e for m, e in graph.items() if m != "alignlab.platform"})
    assert not up, "imports that run against the data flow (move the code to the earlier layer):\n" + "\n".join(up)


def test_the_stage_order_guard_sees_a_planted_upward_import(tmp_path):
    for folder in ("tasks", "report"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text('"""A stage."""\n')
    (tmp_path / "tasks" / "a.py").write_text("def f():\n    from alignlab.platform.report import b\n")
    (tmp_path / "report" / "b.py").write_text("from alignlab.platform.tasks.a import f\n")
    graph = _import_graph(tmp_path)
    assert _upward(graph) == ["alignlab.platform.tasks.a:2 -> alignlab.platform.report.b"]
    (tmp_path / "tasks" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                             "    from alignlab.platform.report.b import f\n")
    assert _upward(_import_graph(tmp_path)) == []  # an annotation-only import runs nothing at import time
    assert _upward(_import_graph(tmp_path, type_checking=True)) == [
        "alignlab.platform.tasks.a:3 -> alignlab.platform.report.b"]  # but it is a dependency: the test counts it


def test_no_engine_module_defines_a_module_getattr():
    """No module-level `__getattr__` (issue #45): a name a module hands on lazily is a dependency no reader, tool
    or import sees. Callers import a name from the module that defines it."""
    offenders = [f"platform/{_rel(p)}:{n.lineno}" for p in _modules() for n in ast.parse(p.read_text()).body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__getattr__"]
    assert not offenders, f"module-level __getattr__ in {offenders}"


def _is_module(package: str, name: str) -> bool:
    top, *rest = package.split(".")[1:] or [""]
    where = PLATFORM.parent / top / Path(*rest, name) if top else Path("/nonexistent")
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def _handed_on(source: str) -> list[str]:
    """Names a module imports at its top from alignlab and either never uses or lists in its `__all__`."""
    tree = ast.parse(source)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    exported = {e.value for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "__all__" for t in n.targets)
                for e in ast.walk(n.value) if isinstance(e, ast.Constant)}
    return [f"{node.lineno}: {a.asname or a.name}" for node in tree.body
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("alignlab.")
            for a in node.names if not _is_module(node.module, a.name)
            and ((a.asname or a.name) in exported or (a.asname or a.name) not in used)]


def test_no_engine_module_hands_on_a_name_it_only_imports():
    """No re-exports (issue #45): every alignlab name a platform module imports at its top is used there, and
    its `__all__` lists only names it defines. Whole modules imported for their side effect (the registry) are
    not names and may stand unused."""
    offenders = [f"platform/{_rel(p)}:{o}" for p in _modules() for o in _handed_on(p.read_text())]
    assert not offenders, "names imported only to be handed on (import them where they are defined):\n" + \
        "\n".join(offenders)


def test_the_re_export_guard_sees_an_unused_name_and_an_imported_name_in_all():
    assert _handed_on("from alignlab.platform.pretrain.models import model_id\n") == ["1: model_id"]
    assert _handed_on("from alignlab.platform.storage.root import read_json\n__all__ = ['read_json']\n"
                      "read_json('x')\n") == ["1: read_json"]
    assert _handed_on("from alignlab.platform.storage.root import read_json\nread_json('x')\n") == []
    assert _handed_on("from alignlab.platform.encoder import registry as _registry\n") == []  # a module
    assert _handed_on("from alignlab.platform.study import run\n") == []  # a stage's module


def test_module_sizes_are_reported_and_only_a_runaway_module_fails():
    """The largest modules are printed (`pytest -s`) for whoever splits next; only one past MAX_LINES fails. A
    hard limit near the typical size (it was 400) made modules split by line count rather than by concern, and
    grow `__getattr__` forwards and re-exports to stay under it; the stages of issue #45 group by concern
    instead, so the limit only catches a module that has become two."""
    sizes = sorted(((len(p.read_text().splitlines()), _rel(p)) for p in _modules()), reverse=True)
    print("\nlargest platform/ modules (lines):", ", ".join(f"{name} {n}" for n, name in sizes[:10]))
    long = {name: n for n, name in sizes if n > MAX_LINES}
    assert not long, f"platform/ modules over {MAX_LINES} lines (split them by concern): {long}"


def test_the_guard_sees_a_name_literal_when_there_is_one():
    tree = ast.parse('if task == "mlm":\n    pass\n')
    assert any(isinstance(n, ast.Constant) and n.value in _names() for n in ast.walk(tree))
    assert _imports_ray(ast.parse("from ray import tune")) == [1]
    assert _imports_ray(ast.parse("import ray.data as rd")) == [1]


# ---------------------------------------------------------------- the rooms around the engine (issue #69)

REPO = PLATFORM.parent
ROOMS = ("platform", "objectives", "tasks", "studies", "benchmarks")
"""The repository's rooms, bottom to top (docs/architecture.md#the-rooms): the engine; the pretraining objectives,
built on it; the finetuning tasks, built on it and on their aligned objectives (CT's tags are WHP's); the study
scripts; the benchmarks, which may run any of them. A room imports from itself and the rooms below it only."""


def _imported(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import of a file, at any depth, annotation-only ones included;
    `from P import n` gives both P and P.n (the name may be a module)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _target(repo: Path, path: Path, name: str) -> tuple[str, str] | None:
    """(room, file relative to the repo) of what an import names, or None outside the repository. `alignlab.X`
    is room X (the benchmarks' shared helpers are the engine's, `alignlab.platform.bench`); a benchmark's bare name
    is a script of its own folder, of another benchmark folder or of studies/, as the folders it puts on sys.path
    find it."""
    parts = name.split(".")
    if parts[0] == "alignlab" and len(parts) > 1 and parts[1] in ROOMS:
        rel = Path(parts[1], *parts[2:])
        found = [f for f in (rel.with_suffix(".py"), rel / "__init__.py") if (repo / f).is_file()]
        return (parts[1], found[0].as_posix()) if found else None
    rel = path.relative_to(repo)
    if rel.parts[0] == "benchmarks" and len(parts) == 1:
        others = sorted(f.relative_to(repo) for f in (repo / "benchmarks").iterdir() if f.is_dir())
        for folder in (rel.parent, *others, Path("studies")):
            if (repo / folder / f"{name}.py").is_file():
                return folder.parts[0], (folder / f"{name}.py").as_posix()
    return None


def _room_edges(repo: Path = REPO) -> dict[str, dict[str, int]]:
    """file -> {file of the repository it imports: the first line}, over every room's Python files (the engine's
    package data left out)."""
    edges: dict[str, dict[str, int]] = {}
    for room in ROOMS:
        for path in sorted((repo / room).rglob("*.py")):
            rel = path.relative_to(repo).as_posix()
            if room == "platform" and rel.removeprefix("platform/").startswith(PACKAGE_DATA):
                continue
            mine = edges.setdefault(rel, {})
            for line, name in _imported(path):
                hit = _target(repo, path, name)
                if hit and hit[1] != rel:
                    mine.setdefault(hit[1], line)
    return edges


def _room_offences(edges: dict[str, dict[str, int]]) -> list[str]:
    """Each import of a room above the importer's ("a:line -> b"), and each benchmark that imports a benchmark
    outside its own folder (what benchmarks share is in `alignlab.platform.bench`). Importing a room's
    package itself is discovery, not a dependency on its code: `alignlab study` lists `alignlab.studies` as the
    registry scans `alignlab.objectives` and `alignlab.tasks` (by name, which no walk sees)."""
    out = []
    for a, targets in sorted(edges.items()):
        for b, line in sorted(targets.items()):
            ra, rb = a.split("/")[0], b.split("/")[0]
            if ROOMS.index(rb) > ROOMS.index(ra) and b != f"{rb}/__init__.py":
                out.append(f"{a}:{line} -> {b} (a room above)")
            elif ra == rb == "benchmarks" and b.split("/")[1] != a.split("/")[1]:
                out.append(f"{a}:{line} -> {b} (another benchmark folder)")
    return out


def test_no_room_imports_a_room_above_it_and_a_benchmark_only_its_own_folder():
    """platform/ < objectives/ < tasks/ < studies/ < benchmarks/ (`ROOMS`), counting function-local and
    annotation-only imports and the benchmarks' imports through sys.path; and each benchmark folder stands on
    the engine (its helpers in `alignlab.platform.bench`) alone, so a folder moves or goes without breaking
    another."""
    edges = _room_edges()
    assert any(b.startswith("tasks/") for e in edges.values() for b in e), "the walk found no import of tasks/"
    offences = _room_offences(edges)
    assert not offences, "imports against the rooms' order (docs/architecture.md#the-rooms):\n" + "\n".join(offences)


def test_no_import_circle_in_the_objectives_the_tasks_or_the_benchmarks():
    """As inside the engine: no module of objectives/, tasks/ or benchmarks/ imports itself through others
    (calibration.py and real_aa.py did, until their shared pieces moved to benchmarks/statistics/rates.py)."""
    edges = _room_edges()
    circles = _circles({a: {b: n for b, n in t.items()} for a, t in edges.items()})
    assert not circles, "import circles (move the shared code to a module both import):\n" + "\n".join(
        " -> ".join(c) for c in circles)


def test_the_room_guard_sees_an_objective_importing_a_task_a_benchmark_crossing_folders_and_a_circle(tmp_path):
    for folder in ("platform/bench", "objectives", "tasks", "studies", "benchmarks/probes", "benchmarks/throughput"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "tasks" / "ct.py").write_text("from alignlab.objectives.whp import TAGS\n")
    (tmp_path / "objectives" / "whp.py").write_text("TAGS = ()\ndef f():\n    from alignlab.tasks import ct\n")
    (tmp_path / "platform" / "bench" / "bench_args.py").write_text("import os\n")
    (tmp_path / "benchmarks" / "throughput" / "feed.py").write_text("from alignlab.platform.bench import bench_args\n")
    (tmp_path / "benchmarks" / "probes" / "p.py").write_text("import feed\nimport q\n")
    (tmp_path / "benchmarks" / "probes" / "q.py").write_text("def f():\n    import p\n")
    edges = _room_edges(tmp_path)
    assert edges["benchmarks/throughput/feed.py"] == {"platform/bench/bench_args.py": 1}
    assert _room_offences(edges) == [
        "benchmarks/probes/p.py:1 -> benchmarks/throughput/feed.py (another benchmark folder)",
        "objectives/whp.py:3 -> tasks/ct.py (a room above)"]
    assert _circles(edges) == [["benchmarks/probes/p.py", "benchmarks/probes/q.py", "benchmarks/probes/p.py"],
                               ["objectives/whp.py", "tasks/ct.py", "objectives/whp.py"]]
    (tmp_path / "platform" / "bench" / "bench_args.py").write_text("def f():\n    from alignlab.tasks import ct\n")
    assert "platform/bench/bench_args.py:2 -> tasks/ct.py (a room above)" in \
        _room_offences(_room_edges(tmp_path))  # the helpers stand on the engine alone


def test_the_benchmarks_folder_holds_at_most_five_entries_its_readme_the_results_and_the_question_folders():
    """A newcomer reads benchmarks/ by question; a sixth entry (a loose script, a helpers folder) goes into one of
    the question folders or, if every benchmark shares it, into `platform/bench/`."""
    entries = sorted(p.name for p in (REPO / "benchmarks").iterdir()
                     if p.name != "__pycache__" and not p.name.startswith("."))
    assert len(entries) <= 5 and {"README.md", "results"} <= set(entries), entries
