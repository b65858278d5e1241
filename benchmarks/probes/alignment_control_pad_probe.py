"""Does PAD leave chance in the alignment control (issue #65)? A short pretraining probe of the control's model.

Builds (or finds) the control's synthetic corpus at `--vocab` pieces, pretrains the control's 64x2 model with
`--objectives` and PAD's `--pad-weight`/`--alpha`, and prints the held-out metrics of its eval.json.

    flock /tmp/alignlab-heavy.lock timeout 480 .venv/bin/python benchmarks/probes/alignment_control_pad_probe.py \
        --storage /tmp/pad65probe --objectives pad --vocab 60 --steps 1500
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--storage", default="/tmp/pad65probe")
    ap.add_argument("--objectives", default="pad")
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--pad-weight", type=float, default=1.0)
    ap.add_argument("--alpha", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--init", choices=("bert", "fan_in"), default=None, help="the encoder's init (default: the control's)")
    a = ap.parse_args()

    from alignlab.objectives.pseudo_acronym import PseudoAcronymConfig
    from alignlab.platform.corpus.corpus import build_corpus
    from alignlab.platform.pretrain.driver import pretrain as run_pretrain
    from alignlab.studies.alignment_control import CORPUS, pretrain

    cdir = build_corpus(dataclasses.replace(CORPUS, vocab_size=a.vocab), Path(a.storage))
    cfg = pretrain(a.objectives, a.steps)
    objs = tuple(dataclasses.replace(o, weight=a.pad_weight, subword_alpha=a.alpha)
                 if isinstance(o, PseudoAcronymConfig) else o for o in cfg.objectives)
    cfg = dataclasses.replace(cfg, objectives=objs, **({"lr": a.lr} if a.lr else {}))
    if a.init:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init=a.init))
    mdir = run_pretrain(cdir, cfg, Path(a.storage))
    ev = json.loads((Path(mdir) / "final" / "eval.json").read_text())
    print("PROBE", json.dumps({**vars(a), "model": Path(mdir).name, **{k: v for k, v in ev.items() if "pad" in k or k in ("step", "precision")}}))


if __name__ == "__main__":
    main()
