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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (and a torch built for it)")
def test_on_a_cuda_device_under_bf16_autocast_the_chunked_loss_gives_the_plain_ones_loss_sums_and_gradients():
    """What a GPU step runs (`loss_chunk_rows` auto chunks there), at a vocabulary large enough for several chunks."""
    x, w, b, labels = (t.detach().cuda().requires_grad_(t.requires_grad) for t in _inputs(n=512, h=64, c=32_000))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        plain, plain_sums = classification_sums(F.linear(x, w, b), labels)
        chunked, sums = linear_cross_entropy_sums(x, w, b, labels, chunk_rows=128)
    assert chunked.device.type == "cuda" and chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=2e-2, atol=2e-2)
    assert int(sums["count"]) == int(plain_sums["count"]) == int((labels != IGNORE).sum())
    for got, want in zip(_grads(chunked, x, w, b), _grads(plain, x, w, b)):
        assert got.dtype == want.dtype and got.device == want.device
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-3)
