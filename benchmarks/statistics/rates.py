"""What the simulated calibration (calibration.py) and the A/A on real calculations (real_aa.py) share: the
decision's level, the exact interval of a rejection rate, the commit a run records and where the figures go. One
module, so that neither script imports the other for them (calibration.py runs real_aa.py for `--real`)."""
from __future__ import annotations

from pathlib import Path

from scipy import stats as sps

from alignlab.platform.runtime.provenance import code_commit

RESULTS = Path(__file__).resolve().parents[1] / "results"
ALPHA = 0.05


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided interval of a binomial rate (its upper end is the "Monte-Carlo upper 95% bound")."""
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(sps.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(sps.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def commit_of() -> tuple[str, str]:
    commit, dirty = code_commit()
    return commit[:12], " (with uncommitted changes)" if dirty else ""
