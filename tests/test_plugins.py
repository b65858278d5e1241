"""Plugins: an installed package adds an objective and a task through the `alignlab.plugins` entry-point group,
with no file of alignlab changed. A throwaway package is built and installed into a folder of its own (pip
--target) and put on the PYTHONPATH of a fresh interpreter; a package reusing a name is refused with both packages
named. tests/test_user_task_study.py runs the plugin in a study on real Ray."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "software_ner"

TOY = '''
"""A toy objective (is the input piece's id odd?) and a toy tagging task declared from files shipped here."""
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from alignlab.platform.encoder.batching import IGNORE
from alignlab.platform.encoder.model import TokenHead
from alignlab.platform.encoder.registry import Objective, classification_sums, register
from alignlab.platform.tasks.task_kinds import declare_task


@register
@dataclass(frozen=True, kw_only=True, slots=True)
class ParityConfig:
    name: ClassVar[str] = "{objective}"
    weight: float = 1.0

    def build(self, tokenizer):
        return Parity(self, tokenizer)


class Parity(Objective):
    name = "{objective}"
    num_classes = 2

    def add_labels(self, batch, ex, rng):
        batch["{objective}"] = np.where(batch["attention_mask"], batch["input_ids"] % 2, IGNORE)

    def build_head(self, model_cfg, encoder):
        return TokenHead(model_cfg.hidden, 2, model_cfg.dropout)

    def loss_and_sums(self, head, hidden_BTH, batch):
        labels = batch["{objective}"].reshape(-1)
        pos = torch.nonzero(labels != IGNORE).squeeze(1)
        return classification_sums(head(hidden_BTH.reshape(-1, hidden_BTH.shape[-1]).index_select(0, pos)),
                                   labels.index_select(0, pos))


HERE = Path(__file__).resolve().parent
declare_task("{task}", "tagging", HERE / "pool.jsonl", HERE / "test.jsonl")
'''


def _install(tmp_path: Path, dist: str, objective: str, task: str, start: int = 0) -> Path:
    """Build and install a plugin package into a folder of its own; that folder (for PYTHONPATH)."""
    src = tmp_path / f"{dist}-src"
    pkg = src / dist
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(TOY.replace("{objective}", objective).replace("{task}", task))
    lines = (EXAMPLE / "pool.jsonl").read_text().splitlines()
    (pkg / "pool.jsonl").write_text("\n".join(lines[start: start + 60]) + "\n")
    (pkg / "test.jsonl").write_text("\n".join(lines[start + 60: start + 90]) + "\n")
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{dist}"
        version = "0.1"

        [project.entry-points."alignlab.plugins"]
        {dist} = "{dist}"

        [tool.setuptools]
        packages = ["{dist}"]

        [tool.setuptools.package-data]
        {dist} = ["*.jsonl"]
        """))
    target = tmp_path / f"{dist}-site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src)], check=True, capture_output=True, timeout=300)
    return target


def _env(*paths: Path) -> dict:
    """The environment of a user's run with these folders on PYTHONPATH; RAY_ADDRESS=local: a Ray instance of its
    own even when another cluster was started on this machine (`ray start`), which ray.init would join."""
    return {**os.environ, "RAY_ADDRESS": "local",
            "PYTHONPATH": os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")])}


LIST = ("from alignlab.platform.encoder.registry import registered; from alignlab.platform.tasks.task import task_names; "
        "import json; print(json.dumps([list(registered()), list(task_names())]))")


def test_an_installed_plugin_adds_its_objective_and_task_and_a_clash_names_both_packages(tmp_path):
    site = _install(tmp_path, "toyplugin", "par", "toytag")
    out = subprocess.run([sys.executable, "-c", LIST], env=_env(site), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    objectives, tasks = json.loads(out.stdout.splitlines()[-1])
    assert objectives[-1] == "par" and {"mlm", "nsp", "whp", "pad"} <= set(objectives)
    assert tasks[-1] == "toytag" and {"ct", "ad"} <= set(tasks)

    clashing = _install(tmp_path, "clashplugin", "mlm", "clashtag")
    out = subprocess.run([sys.executable, "-c", LIST], env=_env(clashing), capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert ("objective name 'mlm' registered twice: by alignlab (alignlab.objectives.masked_lm) and by "
            "clashplugin (clashplugin)") in out.stderr
    task_clash = _install(tmp_path, "taskclash", "par2", "toytag", start=100)  # other files, the same task name
    out = subprocess.run([sys.executable, "-c", LIST], env=_env(site, task_clash), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0
    assert "task name 'toytag' registered twice: by taskclash (taskclash) and by toyplugin (toyplugin)" in out.stderr
