"""What every benchmark records about the machine it ran on (CPU model, cores, versions, load average), and where."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from alignlab.platform.runtime import provenance


def cpu_model() -> str:
    return provenance.cpu_model() or "unknown"


def machine(*modules: str) -> dict:
    """CPU model, core count, Python, and the versions of `modules` that import here."""
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": sys.version.split()[0]}
    for mod in modules:
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return info


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def record(out: Path, entry: dict) -> None:
    """Add `entry` to the JSON list at `out`, replacing an earlier entry of the same command; temp name, rename last."""
    out.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(out.read_text()) if out.exists() else []
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps([e for e in old if e.get("command") != entry["command"]] + [entry], indent=1))
    tmp.replace(out)
