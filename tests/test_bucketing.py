"""Length bucketing (platform/pretrain/bucketing.py): every row once a pass, less padding, exact resume."""
import numpy as np
import pytest
import torch

from alignlab.platform.pretrain.bucketing import bucketed, static_width


def stream(n_batches: int, size: int = 8, seed: int = 1):
    rng = np.random.default_rng(seed)
    for b in range(n_batches):
        yield {"doc_id": np.array([f"d{b}-{i}" for i in range(size)]), "length": rng.integers(1, 60, size),
               "a_ids": np.zeros(size)}


def collate(rows: dict, offset: int, batches: int):
    """Rows as examples of their own length, padded to the longest; `step` says which step collated them."""
    n = np.asarray(rows["length"])
    mask = torch.from_numpy(np.arange(n.max()) < n[:, None])
    return ({"attention_mask": mask, "input_ids": mask.long() * 7, "label": torch.arange(len(n)),
             "step": torch.full((len(n),), offset)}, [str(d) for d in rows["doc_id"]])


def run(n_batches=37, window=8, skip=0, key=(0,), **kw):
    return list(bucketed(stream(n_batches), window, skip=skip, key=key, collate=collate, **kw))


def padding(out) -> float:
    masks = [b["attention_mask"] for _, b, _ in out]
    return 1 - sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)


def test_bucketing_trains_every_row_once_in_batches_of_the_streams_size_with_less_padding():
    plain, out = run(window=1), run(window=8)
    assert [p for p, _, _ in out] == list(range(1, 38))  # data positions count the batches handed out
    ids = [i for _, _, rows in out for i in rows]
    assert sorted(ids) == sorted(i for _, _, rows in plain for i in rows) and len(ids) == len(set(ids))
    assert all(len(rows) == 8 == len(b["label"]) == len(b["input_ids"]) for _, b, rows in out)
    assert padding(out) < padding(plain) / 3
    # Each batch is its own longest example wide, and its tensors stay row-aligned with its ids.
    for _, b, rows in out:
        assert b["input_ids"].shape[1] == int(b["attention_mask"].sum(1).max())
        assert torch.equal(b["input_ids"], b["attention_mask"].long() * 7)


def test_a_window_is_collated_once_at_its_first_step_and_cut_to_its_own_width_keeps_it():
    out = run(n_batches=16, window=8, width="window")
    assert {int(b["step"][0]) for _, b, _ in out[:8]} == {0} and {int(b["step"][0]) for _, b, _ in out[8:]} == {8}
    assert len({b["input_ids"].shape[1] for _, b, _ in out[:8]}) == 1


def test_window_one_is_the_stream_as_it_comes_each_batch_at_its_own_step():
    got = run(n_batches=5, window=1)
    assert [rows for _, _, rows in got] == [[str(d) for d in r["doc_id"]] for r in stream(5)]
    assert [int(b["step"][0]) for _, b, _ in got] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("skip", [0, 1, 7, 8, 9, 16, 33, 36, 37])
def test_a_resumed_pass_hands_out_exactly_the_batches_the_uninterrupted_pass_had_left(skip):
    whole = run(key=(3, 0, 1))
    counted = [0]
    resumed = run(key=(3, 0, 1), skip=skip, counted=counted)
    assert [(p, rows) for p, _, rows in resumed] == [(p, rows) for p, _, rows in whole[skip:]]
    # The same labels: the window is collated at the same step (offsets count from the resumed step).
    assert all(torch.equal(a["label"], b["label"]) for (_, a, _), (_, b, _) in zip(resumed, whole[skip:]))
    assert [int(b["step"][0]) + skip for _, b, _ in resumed] == [int(b["step"][0]) for _, b, _ in whole[skip:]]
    assert counted[0] == 37


def test_each_pass_key_orders_its_windows_batches_its_own_way():
    first, second = run(16, 16, key=(0, 0, 0)), run(16, 16, key=(0, 0, 1))
    assert sorted(tuple(r) for _, _, r in first) == sorted(tuple(r) for _, _, r in second)
    assert [r for _, _, r in first] != [r for _, _, r in second]


def test_a_label_array_that_is_not_per_row_is_refused_naming_it():
    def bad(rows, offset, batches):
        batch, ids = collate(rows, offset, batches)
        return {**batch, "pooled": torch.zeros(3)}, ids

    with pytest.raises(ValueError, match="batch tensor 'pooled' has 3 rows, not the window's 16"):
        list(bucketed(stream(2), 2, skip=0, key=(0,), collate=bad))


def test_static_widths_cut_the_same_rows_in_the_same_order_to_one_of_four_widths():
    def full_width(rows, offset, batches):  # a compiled run's collation: every batch as wide as the length, 64
        batch, ids = collate(rows, offset, batches)
        wide = {k: torch.nn.functional.pad(v, (0, 64 - v.shape[1])) if v.dim() == 2 else v for k, v in batch.items()}
        return wide, ids

    longest = list(bucketed(stream(37), 8, skip=0, key=(0,), collate=full_width))
    static = list(bucketed(stream(37), 8, skip=0, key=(0,), collate=full_width, width="static"))
    assert [(p, rows) for p, _, rows in static] == [(p, rows) for p, _, rows in longest]
    assert {b["input_ids"].shape[1] for _, b, _ in static} <= {16, 32, 48, 64}
    for (_, s, _), (_, t, _) in zip(static, longest):
        w = t["input_ids"].shape[1]
        assert s["input_ids"].shape[1] == static_width(w, 64) >= w
        assert torch.equal(s["input_ids"][:, :w], t["input_ids"]) and not s["attention_mask"][:, w:].any()
    with pytest.raises(ValueError, match="width"):
        run(width="widest")
