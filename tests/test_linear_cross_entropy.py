"""The chunked linear + cross-entropy (`platform/encoder/linear_cross_entropy.py`) is the plain loss summed in another order:
the same mean loss, sums and gradients within float tolerance, at any chunk size, with ignored rows, under bf16
autocast too."""
import pytest
import torch
import torch.nn.functional as F

from alignlab.platform.encoder.batching import IGNORE
from alignlab.platform.encoder.linear_cross_entropy import auto_chunk_rows, linear_cross_entropy_sums
from alignlab.platform.encoder.registry import classification_sums


def _inputs(n=37, h=16, c=101, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g, requires_grad=True)
    w = (torch.randn(c, h, generator=g) * 0.3).requires_grad_()
    b = (torch.randn(c, generator=g) * 0.1).requires_grad_()
    labels = torch.randint(0, c, (n,), generator=g)
    labels[::5] = IGNORE  # padded rows of `labelled_rows` and unmasked positions count nowhere
    return x, w, b, labels


def _grads(loss, *params):
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("chunk_rows", [1, 8, 37, 1000])
def test_the_chunked_loss_equals_the_plain_one_with_its_sums_and_gradients(chunk_rows):
    x, w, b, labels = _inputs()
    plain, plain_sums = classification_sums(F.linear(x, w, b), labels)
    chunked, sums = linear_cross_entropy_sums(x, w, b, labels, chunk_rows=chunk_rows)
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-6)
    for k in ("count", "correct", "nll"):
        torch.testing.assert_close(sums[k].float(), plain_sums[k].float(), rtol=1e-5, atol=1e-5)
    for got, want in zip(_grads(chunked * 3.0, x, w, b), _grads(plain * 3.0, x, w, b)):  # upstream gradient scales
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_under_bf16_autocast_the_chunked_loss_multiplies_in_bf16_and_sums_in_fp32_as_the_plain_one():
    x, w, b, labels = _inputs(n=64, h=32, c=257)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, _ = classification_sums(F.linear(x, w, b), labels)
        chunked, _ = linear_cross_entropy_sums(x, w, b, labels, chunk_rows=16)
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=2e-2, atol=2e-2)
    for got, want in zip(_grads(chunked, x, w, b), _grads(plain, x, w, b)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-3)


def test_a_chunk_with_no_labelled_row_adds_nothing_and_an_all_ignored_batch_is_a_zero_loss():
    x, w, b, labels = _inputs(n=8)
    labels[:] = IGNORE
    loss, sums = linear_cross_entropy_sums(x, w, b, labels, chunk_rows=3)
    assert float(loss.detach()) == 0.0 and float(sums["count"]) == 0.0
    assert all(float(g.abs().sum()) == 0.0 for g in _grads(loss, x, w, b))


def test_without_gradients_only_the_sums_are_made_and_a_nonpositive_chunk_is_refused():
    x, w, b, labels = _inputs()
    with torch.no_grad():
        loss, _ = linear_cross_entropy_sums(x, w, b, labels, chunk_rows=8)
    assert not loss.requires_grad
    with pytest.raises(ValueError, match="chunk_rows"):
        linear_cross_entropy_sums(x, w, b, labels, chunk_rows=0)


def test_auto_chunks_hold_about_256_mib_of_logits_in_multiples_of_128_rows():
    assert auto_chunk_rows(111_000) == 512 and auto_chunk_rows(32_000) == 2048
    assert auto_chunk_rows(10_000_000) == 128


# The GPU check's 768x3 step: 256 rows of 128 tokens, MLM's bound of round(0.15 x 126) = 19 predicted positions a row.
STEP_ROWS = 256 * 19


def test_auto_chunks_only_on_a_gpu_and_only_where_the_plain_loss_would_hold_more_than_its_budget():
    """`loss_chunk_rows` auto (`pretrain.auto_loss_chunk_rows`): the plain loss holds about 8 bytes a logit eager and
    4 compiled under bf16 (8 compiled in fp32); chunked where that is over `PLAIN_LOSS_BUDGET`, on a GPU only."""
    from alignlab.platform.pretrain.pretrain import PLAIN_LOSS_BUDGET, auto_loss_chunk_rows, plain_loss_bytes

    def auto(rows, classes, device="cuda", compiled=False, bf16=True):
        return auto_loss_chunk_rows(rows, classes, device_type=device, compiled=compiled, bf16=bf16)

    assert auto(STEP_ROWS, 111_000) == auto_chunk_rows(111_000) == 512  # 4.0 GiB eager: chunked
    assert auto(STEP_ROWS, 111_000, compiled=True) == 0  # 2.0 GiB compiled in bf16: plain
    assert auto(STEP_ROWS, 111_000, compiled=True, bf16=False) == 512  # fp32 logits compiled: 4.0 GiB again
    assert auto(STEP_ROWS, 32_000) == auto(STEP_ROWS, 32_000, compiled=True) == 0  # 1.2 and 0.6 GiB: plain
    assert auto(8 * STEP_ROWS, 32_000) == auto_chunk_rows(32_000) == 2048  # a batch 8x larger: 9.3 GiB, chunked
    assert auto(100 * STEP_ROWS, 111_000, device="cpu") == 0  # a CPU keeps the plain loss at any size
    at_budget = PLAIN_LOSS_BUDGET // (8 * 1000)
    assert plain_loss_bytes(at_budget, 1000, compiled=False, bf16=True) <= PLAIN_LOSS_BUDGET
    assert auto(at_budget, 1000) == 0 and auto(at_budget + 1, 1000) == auto_chunk_rows(1000)


def test_a_trainer_on_auto_gives_each_head_what_the_rule_picks_for_its_rows_and_classes(tmp_path, monkeypatch):
    """The trainer asks the rule with the most rows each head scores in one of its worker's batches: MLM's
    `max_labelled` at full length (19 a row at 128 tokens), one row an example for NSP."""
    import dataclasses

    from tiny_model import tiny_tokenizer

    from alignlab.objectives.masked_lm import MaskedLM
    from alignlab.platform.config import MODEL_SIZES
    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.pretrain import Pretrainer

    tok = tiny_tokenizer(tmp_path / "tok")
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, model=MODEL_SIZES["128x2"], objectives="mlm,nsp",
                              batch_size=256, precision="fp32")  # rows of up to 128 tokens
    trainer = Pretrainer(cfg, tok)
    assert {n: o.output_chunk_rows for n, o in trainer.objectives.items()} == {"mlm": 0, "nsp": 0}  # a CPU
    monkeypatch.setattr(trainer, "device", torch.device("cuda"))  # asked as a GPU's trainer would ask
    assert trainer.auto_output_chunk_rows() == {"mlm": 0, "nsp": 0}  # 600 pieces: 7 MiB of logits
    monkeypatch.setattr(MaskedLM, "num_classes", property(lambda self: 111_000))
    assert trainer.auto_output_chunk_rows() == {"mlm": 512, "nsp": 0}
    monkeypatch.setattr(trainer, "cfg", dataclasses.replace(cfg, batch_size=64))  # a quarter: 1.0 GiB, plain
    assert trainer.auto_output_chunk_rows() == {"mlm": 0, "nsp": 0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (and a torch built for it)")
def test_on_a_cuda_device_under_bf16_autocast_the_chunked_loss_gives_the_plain_ones_loss_sums_and_gradients():
    """What a GPU step runs where `loss_chunk_rows` auto chunks (a large vocabulary eager), at a vocabulary large
    enough for several chunks; the chunked loss and its gradients never wait for the device (the whole step's check,
    tests/test_input_path.py, runs the plain loss at the smoke vocabulary)."""
    x, w, b, labels = (t.detach().cuda().requires_grad_(t.requires_grad) for t in _inputs(n=512, h=64, c=32_000))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        plain, plain_sums = classification_sums(F.linear(x, w, b), labels)
        _grads(linear_cross_entropy_sums(x, w, b, labels, chunk_rows=128)[0], x, w, b)  # warm: lazy initialisation
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            chunked, sums = linear_cross_entropy_sums(x, w, b, labels, chunk_rows=128)
            chunked_grads = _grads(chunked, x, w, b)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert chunked.device.type == "cuda" and chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=2e-2, atol=2e-2)
    assert int(sums["count"]) == int(plain_sums["count"]) == int((labels != IGNORE).sum())
    for got, want in zip(chunked_grads, _grads(plain, x, w, b)):
        assert got.dtype == want.dtype and got.device == want.device
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-3)
