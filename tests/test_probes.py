"""The synthetic PAD probe's data follow PAD's labelling rule, so its learning curves measure PAD's difficulty."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "probes"))  # as when the script is run
import synthetic_pad_probe as probe  # noqa: E402


def _rows(x, seg, word_letter):
    for i in range(len(x)):
        row = x[i].tolist()
        acr = np.array(row[1:row.index(probe.SEP)]) - probe.FIRST
        words = x[i, seg[i] == 1].numpy()[:-1] - probe.FIRST
        initials = words if word_letter is None else word_letter[words - probe.LETTERS]
        yield acr, initials


def test_every_synthetic_label_says_whether_the_acronym_is_the_initials_of_a_span():
    rng = np.random.default_rng(3)
    word_letter = rng.integers(0, probe.LETTERS, 50)
    zipf = 1.0 / np.arange(1, 51)
    zipf /= zipf.sum()
    for wl, z in ((None, None), (word_letter, zipf)):
        x, seg, y = probe.make_batch(rng, 400, 45, wl, z)
        assert 0.4 < float(y.float().mean()) < 0.6
        for (acr, initials), label in zip(_rows(x, seg, wl), y.tolist()):
            assert 2 <= len(acr) <= 6 and len(initials) == 45
            assert probe.has_span(initials, acr) == bool(label)
