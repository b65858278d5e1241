"""`alignlab study NAME [flags]`: the front door to every study script.

The scripts stay what `ray job submit` runs (`python studies/NAME.py`); studies/ is also the package
`alignlab.studies`, so this command imports `alignlab.studies.NAME` and calls the entry the script's
`__main__` calls, `main(argv, prog)`, with the rest of the command line. One parser, so the flags, the study
it builds and its id (the study folder's name) are the script's.
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from pathlib import Path

USAGE = "usage: alignlab study NAME [flags]   (a study's own flags: alignlab study NAME --help)"


def study_scripts() -> dict[str, str]:
    """{name: the first line of its docstring} of every study script, read without importing them."""
    import alignlab.studies

    out = {}
    for m in sorted(pkgutil.iter_modules(alignlab.studies.__path__), key=lambda m: m.name):
        if m.ispkg or m.name.startswith("_"):
            continue
        doc = (ast.get_docstring(ast.parse((Path(m.module_finder.path) / f"{m.name}.py").read_text())) or "").strip()
        out[m.name] = doc.splitlines()[0] if doc else ""
    return out


def study_command(argv: list[str]) -> int | None:
    """`alignlab [--debug] study NAME [flags]`: run the study script NAME with the flags; its usage and errors name
    `alignlab study NAME`. No name, or `--help`: the list of studies (exit 2, or 0 for `--help`); an unknown name:
    an error naming them. None when `argv` is another subcommand's."""
    first = next((i for i, a in enumerate(argv) if a != "--debug"), len(argv))
    if argv[first:first + 1] != ["study"]:
        return None
    rest = argv[first + 1:]
    argv = rest[:1] + argv[:first] + rest[1:] if rest else []  # a leading --debug goes to the script's parser
    scripts = study_scripts()
    listing = "\n".join(f"  {n:<20} {doc}" for n, doc in scripts.items())
    if not argv or argv[0] in ("-h", "--help"):
        text = (f"{USAGE}\n\nRuns a study script's study with the flags `python studies/NAME.py` takes.\n\n"
                f"studies:\n{listing}\n")
        if argv:
            print(text, end="")
            return 0
        sys.stderr.write(f"{text}alignlab study: error: name a study: {', '.join(scripts)}\n")
        return 2
    name, rest = argv[0], argv[1:]
    if name not in scripts:
        sys.stderr.write(f"alignlab study: error: no study {name!r}; the studies are: {', '.join(scripts)}\n"
                         f"{listing}\n")
        return 2
    try:
        importlib.import_module(f"alignlab.studies.{name}").main(rest, prog=f"alignlab study {name}")
    except SystemExit as e:  # --help (0), a bad flag (2), a failed run (`errors.run_guarded`'s code)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def plan_command(script: str, script_args: list[str]) -> int:
    """`alignlab plan SCRIPT|NAME [flags]`: the study's plan (`study_main`'s `--dry-run`) of a study script file, or
    of the study NAME of `alignlab study`."""
    import importlib.util
    import inspect

    from alignlab.platform.study.run import study_main

    if script in study_scripts():
        mod = importlib.import_module(f"alignlab.studies.{script}")
    else:
        spec = importlib.util.spec_from_file_location("alignlab_study_script", script)
        if spec is None or not Path(script).is_file():
            raise ValueError(f"alignlab plan: {script} is not a study script (a .py file with a `build`)")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    if not callable(getattr(mod, "build", None)):
        raise ValueError(f"alignlab plan: {script} defines no build(preset) function")
    study_main(mod.build, [*script_args, "--dry-run"], prog=f"alignlab plan {script}",
               extra_objective_sets="extra" in inspect.signature(mod.build).parameters)
    return 0
