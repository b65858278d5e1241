"""studies/objective_mix.py's finetuning budget: `--budget N` names another search, and a declared task's own
`budget=N`, which the search (one budget for every task) cannot honour, is refused with a one-line error instead of
being dropped."""
from __future__ import annotations

import pytest

from alignlab.studies import objective_mix


def test_budget_names_another_search_and_a_declared_budget_is_refused(tmp_path, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(objective_mix, "run_objective_search", lambda spec, root, **kw: seen.append(spec) or "r")
    objective_mix.main(["--preset", "smoke", "--storage", str(tmp_path), "--budget", "50"])
    assert seen[0].finetune.budget == 50 and seen[0].name == "objective_mix-smoke-budget50"
    with pytest.raises(SystemExit) as e:
        objective_mix.main(["--preset", "smoke", "--storage", str(tmp_path), "--task",
                            "name=ner,kind=tagging,pool=p.jsonl,test=t.jsonl,budget=150"])
    assert e.value.code != 0
    err = capsys.readouterr().err
    assert "budget= (ner=150) is not supported by the objective search" in err and "--budget N" in err
    assert len(seen) == 1, "nothing ran"
