"""Mutants: deliberate breakages of the guarantees, each with the default-run tests that must fail on it.

Each mutant is one textual edit of one source file, applied to a temporary copy of the checkout (the files git
tracks or would track), never to the checkout itself. The copy's tests run with the copy's code: `PYTHONPATH` puts a
package `alignlab` first whose subpackages are the copy's `platform/`, `objectives/`, `tasks/` and `studies/`, so the
editable install's mapping to the checkout is never reached, in the test process and in every process it starts (the
Ray workers and Train workers inherit the environment). A mutant is killed when its tests fail, survives when they pass;
any other pytest outcome (a collection error, no test run) is an error of the script, not a kill.

    python tests/mutants/mutants.py                      # every mutant
    python tests/mutants/mutants.py lock-skipped ...     # some
    python tests/mutants/mutants.py --list               # the mutants and their tests
    python tests/mutants/mutants.py --lock /tmp/alignlab-heavy.lock   # each mutant's tests under that flock
    python tests/mutants/mutants.py --baseline ...       # first the same tests on an unmutated copy: must pass

It prints one line per mutant and, last, which survived; its exit status is 0 only when every mutant was killed.
CPU-heavy where a mutant's tests pretrain (the resume and key mutants: about one to three minutes each on 2 cores).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"platform": "platform", "objectives": "objectives", "tasks": "tasks", "studies": "studies"}
"""alignlab's subpackages and their folders (pyproject.toml's package-dir)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mutant:
    name: str
    breaks: str
    """The guarantee it breaks, in a few words."""
    path: str
    edits: tuple[tuple[str, str], ...]
    """(old, new) replacements in `path`; each old text occurs exactly once there."""
    tests: tuple[str, ...]
    """Default-run pytest node ids that must fail on it."""


MUTANTS = (
    Mutant(name="reweighting-share-1", breaks="data-parallel loss reweighting: every rank's share is 1",
           path="platform/pretrain/pretrain.py",
           edits=(("        if self.world == 1 or self.reduce_counts is None:\n", "        if True:\n"),),
           tests=("tests/test_dp_reweighting.py::"
                  "test_two_ddp_workers_with_unequal_rows_get_the_gradient_of_one_worker_on_the_global_batch",)),
    Mutant(name="resume-ignores-checkpoint", breaks="resume: a Train worker starts from scratch, not its checkpoint",
           path="platform/pretrain/driver.py",
           edits=(("    ck = ray.train.get_checkpoint()\n", "    ck = None\n"),),
           tests=("tests/test_markers.py::test_a_finished_model_keeps_its_last_checkpoint_and_a_truncated_weights_"
                  "file_makes_it_unfinished_and_re_exported",)),
    Mutant(name="rank-rng-shared", breaks="per-rank randomness: every rank draws rank 0's dropout masks",
           path="platform/pretrain/pretrain.py",
           edits=(("torch.manual_seed(cfg.seed * 1_000_003 + rank + 1)",
                   "torch.manual_seed(cfg.seed * 1_000_003 + 1)"),),
           tests=("tests/test_dp_reweighting.py::"
                  "test_two_ranks_start_from_the_same_weights_and_each_draws_its_own_dropout_masks",)),
    Mutant(name="rank-rng-shared-on-resume", breaks="per-rank randomness: a resumed rank takes rank 0's state",
           path="platform/pretrain/pretrain.py",
           edits=(("            mine = states[self.rank]\n", "            mine = states[0]\n"),),
           tests=("tests/test_dp_reweighting.py::"
                  "test_two_ranks_start_from_the_same_weights_and_each_draws_its_own_dropout_masks",)),
    Mutant(name="rank-collate-key-shared", breaks="per-rank randomness: every rank collates with rank 0's key",
           path="platform/pretrain/pretrain.py",
           edits=(("seed=cfg.seed, rank=rank, pad_to_max_len=cfg.compile)",
                   "seed=cfg.seed, rank=0, pad_to_max_len=cfg.compile)"),),
           tests=("tests/test_data_parallel.py::"
                  "test_a_rank_collates_only_its_own_rows_with_its_own_key_and_one_worker_collates_as_before",)),
    Mutant(name="batches-reshuffled", breaks="the data order: each rank's local shuffle seeded otherwise",
           path="platform/pretrain/driver.py",
           edits=(("local_shuffle_seed=cfg.seed + epoch,", "local_shuffle_seed=cfg.seed + epoch + 1,"),),
           tests=("tests/test_versions.py::"
                  "test_the_rows_the_smoke_model_trains_on_at_each_step_change_only_with_the_code_versions",)),
    Mutant(name="verdict-drops-unit-variance",
           breaks="the verdict: a crossed design's variance without the test units' parts",
           path="platform/report/unit_statistics.py",
           edits=(("            if primary in S or S not in ms:\n", "            if True:\n"),),
           tests=("tests/test_unit_statistics.py::test_the_crossed_decision_is_the_two_way_anova_of_the_linearised_"
                  "difference_with_cochran_cox_critical_values",)),
    Mutant(name="verdict-partly-crossed-drops-unit-variance",
           breaks="the verdict: a partly crossed design's variance without the test units' part",
           path="platform/report/unit_statistics.py",
           edits=(("    var = max(v_rep + v_unit - v_cell, v_rep, v_unit)\n", "    var = v_rep\n"),),
           tests=("tests/test_unit_statistics.py::"
                  "test_a_partly_crossed_difference_carried_by_the_units_alone_counts_their_spread",)),
    Mutant(name="corpus-holdout-disabled", breaks="the corpus holdout: no document is held out",
           path="platform/corpus/corpus_sources.py",
           edits=(('        why = "doc_id" if doc.doc_id in holdout else '
                    'content.reason(doc.text) if content else None\n',
                   "        why = None\n"),),
           tests=("tests/test_content_holdout.py::"
                  "test_no_task_text_or_acronym_definition_in_a_dump_or_web_folder_reaches_a_shard",)),
    Mutant(name="marker-before-artifact", breaks="finished markers: a model's marker written before its files",
           path="platform/pretrain/models.py",
           edits=(('    tmp = Path(tempfile.mkdtemp(prefix="final.", dir=mdir))\n',
                   '    tmp = Path(tempfile.mkdtemp(prefix="final.", dir=mdir))\n    write_marker(tmp)\n'),
                  ("    write_marker(tmp)  # last: the size of every file above\n", "")),
           tests=("tests/test_markers.py::test_an_exported_models_marker_lists_every_file_of_its_final_folder_at_its_"
                  "size",)),
    Mutant(name="lock-skipped", breaks="one run per artifact id: the folder lock is never taken",
           path="platform/storage/locks.py",
           edits=(("            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n", "            pass\n"),),
           tests=("tests/test_concurrency.py::test_a_second_process_waits_for_the_lock_and_takes_it_when_the_holder_is_"
                  "killed",)),
)


def checkout_files() -> list[str]:
    """The checkout's files that git tracks or would track (not .venv, caches, build output)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                         capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p and (REPO / p).is_file()]


def problems(mutant: Mutant) -> list[str]:
    """Why `mutant` cannot be applied to this checkout (its text is gone or ambiguous, a test is not there)."""
    out = []
    text = (REPO / mutant.path).read_text() if (REPO / mutant.path).is_file() else ""
    for old, _ in mutant.edits:
        if (n := text.count(old)) != 1:
            out.append(f"{mutant.name}: {old.strip()!r} occurs {n} times in {mutant.path}, not once")
    for node in mutant.tests:
        path, _, func = node.partition("::")
        if not (REPO / path).is_file() or f"def {func}(" not in (REPO / path).read_text():
            out.append(f"{mutant.name}: no test {node}")
    return out


def make_copy(dest: Path, files: list[str], mutant: Mutant | None) -> dict[str, str]:
    """The checkout copied to `dest`, `mutant` applied; the environment that runs the copy's code."""
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)
    if mutant is not None:
        target = dest / mutant.path
        text = target.read_text()
        for old, new in mutant.edits:
            text = text.replace(old, new, 1)
        target.write_text(text)
    pkg = dest / ".mutant-path" / "alignlab"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name, folder in PACKAGES.items():
        (pkg / name).symlink_to(dest / folder, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(dest / ".mutant-path"), os.environ.get("PYTHONPATH", "")])}
    where = subprocess.run([sys.executable, "-c", "import alignlab.platform.storage.root as m; print(m.__file__)"],
                           cwd=dest, env=env, capture_output=True, text=True)
    if not where.stdout.strip().startswith(str(dest)):
        raise RuntimeError(f"the copy at {dest} imports alignlab from {where.stdout.strip() or where.stderr[-500:]}")
    return env


def run_tests(dest: Path, env: dict, tests: tuple[str, ...], lock: str | None, timeout: float) -> tuple[int, str]:
    # The time limit counts the tests only, not the wait for the lock.
    cmd = ["timeout", str(int(timeout)), sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           "-o", "addopts=", *tests]
    if lock:
        cmd = ["flock", lock, *cmd]
    done = subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True)
    if done.returncode == 124:
        return 124, f"timed out after {timeout:.0f} s"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="the mutants to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests")
    ap.add_argument("--lock", help="run each mutant's tests under `flock LOCK` (the shared heavy-run lock)")
    ap.add_argument("--baseline", action="store_true", help="first run the same tests on an unmutated copy")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for one mutant's tests")
    args = ap.parse_args(argv)
    known = {m.name: m for m in MUTANTS}
    if unknown := [n for n in args.names if n not in known]:
        ap.error(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = [known[n] for n in args.names] if args.names else list(MUTANTS)
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.breaks}\n  {m.path}\n" + "".join(f"  {t}\n" for t in m.tests), end="")
        return 0
    if bad := [p for m in chosen for p in problems(m)]:
        print("\n".join(bad), file=sys.stderr)
        return 2
    files = checkout_files()
    survived, errors = [], []
    runs = ([(None, tuple(dict.fromkeys(t for m in chosen for t in m.tests)))] if args.baseline else []) + \
        [(m, m.tests) for m in chosen]
    for mutant, tests in runs:
        label = mutant.name if mutant else "baseline (no mutant)"
        with tempfile.TemporaryDirectory(prefix="alignlab-mutant-") as d:
            env = make_copy(Path(d), files, mutant)
            t0 = time.time()
            rc, last = run_tests(Path(d), env, tests, args.lock, args.timeout)
        secs = time.time() - t0
        if mutant is None:
            if rc != 0:
                print(f"baseline: the tests fail without a mutant (pytest exit {rc}: {last}); nothing to conclude")
                return 2
            print(f"baseline: the tests pass without a mutant ({secs:.0f} s)", flush=True)
            continue
        verdict = {0: "SURVIVED", 1: "killed"}.get(rc, f"error (pytest exit {rc})")
        print(f"{mutant.name}: {verdict} ({secs:.0f} s; {mutant.breaks}) -- {last}", flush=True)
        (survived if rc == 0 else errors if rc != 1 else []).append(mutant.name)
    print(f"{len(chosen)} mutants: {len(chosen) - len(survived) - len(errors)} killed, "
          f"{len(survived)} survived{': ' + ', '.join(survived) if survived else ''}, "
          f"{len(errors)} errors{': ' + ', '.join(errors) if errors else ''}")
    return 0 if not survived and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
