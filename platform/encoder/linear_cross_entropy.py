"""A linear layer and cross-entropy in chunks of rows: the loss of a head over a large output (MLM's tied decoder over
the vocabulary) without its [N, C] logits held at once.

`registry.classification_sums(F.linear(x, W, b), labels)` makes the fp32 logits of every scored row, keeps them for
the backward pass, and makes their gradient as large again: at the paper corpus's 111K vocabulary and 4,864
predicted positions a step (256 full rows), 2.2 GB a copy. `linear_cross_entropy_sums` computes the same loss and
sums chunk by chunk: each chunk's logits, their log-sum-exp, the target's logit and the gradient of the summed loss
with respect to the chunk's input, the weight and the bias (softmax minus one-hot, through the linear layer), then
frees the chunk. The backward pass only scales those gradients by the loss's upstream gradient, so the decoder costs
the same three matrix products as before and at most `chunk_rows` x C logits exist at any time (Liger-Kernel's
fused linear cross-entropy, and Wijmans et al. 2024, "Cut your losses", do the same).

The number of chunks depends only on the number of rows, so under `torch.compile` with static shapes
(`PretrainConfig.compile`) the loop unrolls into one graph. Numerically it is the plain loss summed in another order:
equal within float tolerance, not bit for bit (tests/test_linear_cross_entropy.py). Under autocast the products run
in the autocast dtype as `F.linear` would and the logits, their softmax and the sums are fp32, as in the plain loss;
the weight and bias gradients are summed over the chunks in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from alignlab.platform.encoder.batching import IGNORE

CHUNK_BYTES = 1 << 28
"""fp32 logits per chunk that `auto_chunk_rows` aims for (256 MiB): a handful of chunks a step at the paper's sizes,
each large enough for full-speed matrix products."""


def auto_chunk_rows(num_classes: int) -> int:
    """Rows per chunk for a head over `num_classes` outputs: about `CHUNK_BYTES` of fp32 logits, a multiple of 128
    rows (tensor-core tiles), at least 128: 512 rows at 111K classes, 2,048 at 32K."""
    return max(128, CHUNK_BYTES // (4 * num_classes) // 128 * 128)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype `F.linear` would multiply in here: the autocast dtype where autocast is on, else x's own."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """(summed negative log-likelihood over the rows whose label is not IGNORE, correct argmax count) of
    `x @ weight.T + bias`; the gradients are made in the forward pass (see the module docstring)."""

    @staticmethod
    def forward(ctx, x_NH, weight_CH, bias_C, labels_N, chunk_rows: int, dtype: torch.dtype, with_grad: bool):
        w, b = weight_CH.to(dtype), bias_C.to(dtype)
        nll = x_NH.new_zeros((), dtype=torch.float32)
        correct = x_NH.new_zeros((), dtype=torch.float32)
        if with_grad:
            grad_x = torch.empty_like(x_NH)
            grad_w = torch.zeros(weight_CH.shape, dtype=torch.float32, device=weight_CH.device)
            grad_b = torch.zeros(bias_C.shape, dtype=torch.float32, device=bias_C.device)
        for start in range(0, x_NH.shape[0], chunk_rows):
            x = x_NH[start:start + chunk_rows].to(dtype)
            labels = labels_N[start:start + chunk_rows]
            valid = labels != IGNORE
            target = labels.clamp_min(0)  # IGNORE rows read class 0 and are masked out below
            logits = F.linear(x, w, b).float()
            lse = torch.logsumexp(logits, -1)
            picked = logits.gather(1, target[:, None]).squeeze(1)
            nll = nll + torch.where(valid, lse - picked, 0.0).sum()
            correct = correct + ((logits.argmax(-1) == labels) & valid).sum()
            if with_grad:
                # d(sum of nll)/d logits: softmax minus the one-hot target, zero on the rows no loss scores.
                g = torch.exp(logits - lse[:, None])
                g.scatter_add_(1, target[:, None], torch.full_like(lse[:, None], -1.0))
                g = (g * valid[:, None]).to(dtype)
                grad_x[start:start + chunk_rows] = (g @ w).to(x_NH.dtype)
                grad_w += (g.t() @ x).float()
                grad_b += g.float().sum(0)
            del logits
        if with_grad:
            ctx.save_for_backward(grad_x, grad_w.to(weight_CH.dtype), grad_b.to(bias_C.dtype))
        ctx.mark_non_differentiable(correct)
        return nll, correct

    @staticmethod
    def backward(ctx, grad_nll, grad_correct):
        grad_x, grad_w, grad_b = ctx.saved_tensors
        return grad_x * grad_nll, grad_w * grad_nll, grad_b * grad_nll, None, None, None, None


def linear_cross_entropy_sums(x_NH: torch.Tensor, weight_CH: torch.Tensor, bias_C: torch.Tensor,
                              labels_N: torch.Tensor, *, chunk_rows: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`registry.classification_sums(F.linear(x_NH, weight_CH, bias_C), labels_N)` (mean cross-entropy over the rows
    whose label is not IGNORE, and the sums "count", "correct", "nll"), computed `chunk_rows` rows at a time."""
    if chunk_rows < 1:
        raise ValueError(f"linear_cross_entropy_sums needs chunk_rows >= 1, got {chunk_rows}")
    labels_N = labels_N.long()
    with_grad = torch.is_grad_enabled() and (x_NH.requires_grad or weight_CH.requires_grad or bias_C.requires_grad)
    dtype = _compute_dtype(x_NH)
    with torch.autocast(x_NH.device.type, enabled=False):  # the dtypes are explicit inside
        nll, correct = _ChunkedLinearCrossEntropy.apply(x_NH, weight_CH, bias_C, labels_N, chunk_rows, dtype,
                                                        with_grad)
    n = (labels_N != IGNORE).sum()
    return nll / n.clamp_min(1), {"count": n.detach().float(), "correct": correct, "nll": nll.detach()}
