"""What every benchmark records about the machine it ran on: CPU model, cores, versions, load average."""
from __future__ import annotations

import os
import sys


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


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
