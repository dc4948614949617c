"""Label-smoothed cross-entropy over a large vocabulary, fused by hand.

loss = (1 - eps) * NLL + eps * mean over the vocabulary of -log p, summed over rows.
The autograd graph of `log_softmax -> gather -> mean` keeps an fp32 (M, V) log-probability tensor and
spends four more vocabulary-sized passes in backward (zeros for the gather, the mean's expand and
division, the log-softmax backward). Here forward runs one fused softmax per cache-sized chunk of
rows, reads the loss off it, and keeps the softmax (in the logits' dtype) for backward, which only
shifts and scales it into softmax(x) - (1 - eps) * onehot - eps / V.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_cli.core.buckets import bucket

_CHUNK_ELEMENTS = 1 << 20  # rows per chunk such that an fp32 chunk is ~4 MB: cache friendly, few Python steps
# Rows per chunk of the fused projection on CPU: a bf16 (chunk, V) output of ~4 MB, where the vocabulary matmul
# ran fastest (measured: docs/benchmarks/speed.md). A GPU gets one chunk: small matmuls waste it.
_PROJECTION_CHUNK_ELEMENTS = 1 << 21
IGNORE = -100  # target of a row that carries no loss
ROW_MULTIPLE = 64  # see gather_rows


@dataclass
class LossOutput:
    """Sums over the non-padding target tokens of a batch; the trainer normalises."""

    loss: Tensor  # label-smoothed cross-entropy, summed
    nll: Tensor  # plain negative log-likelihood, summed (no smoothing), detached
    tokens: Tensor  # number of non-padding target tokens


def _chunks(rows: int, vocab: int, elements: int = _CHUNK_ELEMENTS):
    step = max(1, elements // vocab)
    return ((start, min(start + step, rows)) for start in range(0, rows, step))


def _softmax_chunk(x: Tensor, probs: Tensor, lse: Tensor, mean_logit: Tensor | None = None) -> None:
    """Softmax of a chunk of logits x (c, V) into probs (c, V) (the dtype kept for backward), and each row's
    log-sum-exp (fp32 or wider) into lse (c,); with mean_logit, each row's mean logit too."""
    x_max = x.amax(-1)  # exact in any dtype
    if mean_logit is not None:
        torch.mean(x, dim=-1, dtype=lse.dtype, out=mean_logit)
    if probs.dtype == lse.dtype:  # written in place: no chunk-sized temporary and no copy of it
        p = torch.softmax(x, dim=-1, out=probs)
    else:  # reduced in fp32 (read from the lower-precision logits, no cast copy), then cast once into probs
        p = torch.softmax(x, dim=-1, dtype=lse.dtype)
        probs.copy_(p)
    # log-sum-exp from the softmax: p_max = exp(x_max - lse) >= 1/V never underflows.
    torch.sub(x_max.to(lse.dtype), p.amax(-1).log(), out=lse)


def _losses(lse: Tensor, mean_logit: Tensor, target_logit: Tensor, valid: Tensor, epsilon: float):
    nll = (lse - target_logit.to(lse.dtype)) * valid  # -log p(target), (M,)
    smooth = (lse - mean_logit) * valid  # mean over the vocabulary of -log p, (M,)
    return (1.0 - epsilon) * nll.sum() + epsilon * smooth.sum(), nll.sum()


def _logits_gradient(ctx, probs: Tensor, target: Tensor, valid: Tensor, grad_loss: Tensor) -> Tensor:
    """d loss / d logits = softmax - (1 - eps) * onehot(target) - eps / V on valid rows, written into the saved
    softmax (no second vocabulary-sized tensor): so backward runs once per forward."""
    if getattr(ctx, "consumed", False):
        raise RuntimeError(
            "smoothed_cross_entropy: backward turns the saved softmax into the gradient in place, "
            "so it runs once per forward (retain_graph is not supported)"
        )
    ctx.consumed = True
    eps = ctx.epsilon
    M, V = probs.shape
    grad = probs
    grad.sub_(eps / V)
    grad[torch.arange(M, device=grad.device), target] -= 1.0 - eps
    grad.mul_((valid * grad_loss).to(grad.dtype)[:, None])
    return grad


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
        M, V = logits.shape
        valid = target.ne(IGNORE)
        target = target.clamp(min=0)
        acc = torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 logits are reduced in fp32
        lse = torch.empty(M, dtype=acc, device=logits.device)
        mean_logit = torch.empty_like(lse)
        probs = torch.empty_like(logits)  # softmax, kept for backward in the logits' dtype
        for a, b in _chunks(M, V):
            _softmax_chunk(logits[a:b], probs[a:b], lse[a:b], mean_logit[a:b])
        target_logit = logits.gather(-1, target[:, None]).squeeze(-1)
        loss, nll = _losses(lse, mean_logit, target_logit, valid, epsilon)
        ctx.save_for_backward(probs, target, valid)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        probs, target, valid = ctx.saved_tensors
        return _logits_gradient(ctx, probs, target, valid, grad_loss), None, None


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The vocabulary projection fused with the loss: the logits rows @ weight^T are made a chunk of rows at a
    time and reduced while the chunk is in cache. A (M, V) logits tensor is neither written nor read back,
    and on CPU the projection itself runs faster in chunks whose output fits the cache.

    Backward touches the saved (M, V) softmax P only in its two matmuls. With s = the rows' loss weights,
    d loss / d logits = diag(s) (P - eps/V - (1 - eps) onehot(target)), and the constant and one-hot terms
    are applied after the matmuls, in the d-sized space:
        d rows   = diag(s) (P W - eps/V colsum(W) - (1 - eps) W[target])
        d weight = P^T (diag(s) rows) - eps/V 1 (s^T rows) - (1 - eps) scatter(target, diag(s) rows)
    so no vocabulary-sized elementwise pass runs in backward. The mean logit the smoothing term needs comes
    the same way, rows @ mean(W), instead of a pass over each chunk."""

    @staticmethod
    def forward(ctx, rows: Tensor, weight: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
        M, V = rows.size(0), weight.size(0)
        valid = target.ne(IGNORE)
        target = target.clamp(min=0)
        acc = torch.promote_types(rows.dtype, torch.float32)
        lse = torch.empty(M, dtype=acc, device=rows.device)
        target_logit = torch.empty_like(lse)
        probs = rows.new_empty(M, V)  # softmax, kept for backward in the rows' dtype
        elements = _PROJECTION_CHUNK_ELEMENTS if rows.device.type == "cpu" else M * V
        for a, b in _chunks(M, V, elements):
            logits = F.linear(rows[a:b], weight)  # (c, V)
            _softmax_chunk(logits, probs[a:b], lse[a:b])
            target_logit[a:b] = logits.gather(-1, target[a:b, None]).squeeze(-1)
        mean_logit = rows.to(acc) @ weight.sum(0, dtype=acc).div_(V)  # (M,): the mean over V of rows @ W^T
        loss, nll = _losses(lse, mean_logit, target_logit, valid, epsilon)
        ctx.save_for_backward(rows, weight, probs, target, valid)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        rows, weight, probs, target, valid = ctx.saved_tensors
        eps, V = ctx.epsilon, weight.size(0)
        acc = torch.promote_types(rows.dtype, torch.float32)
        s = (valid * grad_loss).to(acc)[:, None]  # (M, 1): each row's weight in the loss
        scaled_rows = rows.to(acc) * s  # (M, d)
        grad_rows = (probs @ weight).to(acc)  # (M, d)
        grad_rows -= (eps / V) * weight.sum(0, dtype=acc)
        grad_rows -= (1.0 - eps) * weight[target].to(acc)
        grad_rows *= s
        grad_weight = (probs.t() @ scaled_rows.to(rows.dtype)).to(acc)  # (V, d)
        grad_weight -= (eps / V) * scaled_rows.sum(0)
        grad_weight.index_add_(0, target, scaled_rows, alpha=-(1.0 - eps))
        return grad_rows.to(rows.dtype), grad_weight.to(weight.dtype), None, None


def smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float = 0.0) -> LossOutput:
    """Summed label-smoothed cross-entropy of logits (M, V) against target ids (M,), and the plain NLL.
    Rows whose target is IGNORE contribute nothing."""
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, epsilon)
    return LossOutput(loss=loss, nll=nll.detach(), tokens=target.ne(IGNORE).sum())


def projected_smoothed_cross_entropy(rows: Tensor, weight: Tensor, target: Tensor, epsilon: float = 0.0) -> LossOutput:
    """smoothed_cross_entropy(F.linear(rows, weight), target, epsilon) for rows (M, d) and an output projection
    weight (V, d) without bias, the projection made a chunk of rows at a time inside the loss. Under autocast
    both are cast once, as F.linear would cast them."""
    device = rows.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        rows, weight = rows.to(dtype), weight.to(dtype)  # autograd carries the gradient back through the casts
    with torch.autocast(device, enabled=False):
        loss, nll = _ProjectedSmoothedCrossEntropy.apply(rows, weight, target, epsilon)
    return LossOutput(loss=loss, nll=nll.detach(), tokens=target.ne(IGNORE).sum())


def gather_rows(hidden: Tensor, labels: Tensor, ignore: int) -> tuple[Tensor, Tensor]:
    """The rows of hidden (..., d) whose label is not `ignore`, and their labels (IGNORE on filler rows).

    Only these rows reach the vocabulary projection. Their count is rounded up to `bucket(M, ROW_MULTIPLE)`
    with ignored filler rows: the vocabulary matmul and the vocabulary-sized tensors then come in a small set
    of shapes, so a CPU matmul library's kernel cache and the allocator stay warm (memory would grow over a
    run with a new shape every batch).
    """
    flat_labels = labels.flatten()
    index = flat_labels.ne(ignore).nonzero().squeeze(1)  # (M,)
    targets = flat_labels[index]
    extra = bucket(index.numel(), ROW_MULTIPLE) - index.numel()
    if extra:
        index = torch.cat([index, index.new_zeros(extra)])
        targets = torch.cat([targets, targets.new_full((extra,), IGNORE)])
    return hidden.flatten(0, -2)[index], targets
