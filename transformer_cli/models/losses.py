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
from torch import Tensor

from transformer_cli.models.buckets import bucket

_CHUNK_ELEMENTS = 1 << 20  # rows per chunk such that an fp32 chunk is ~4 MB: cache friendly, few Python steps
IGNORE = -100  # target of a row that carries no loss
ROW_MULTIPLE = 64  # see gather_rows


@dataclass
class LossOutput:
    """Sums over the non-padding target tokens of a batch; the trainer normalises."""

    loss: Tensor  # label-smoothed cross-entropy, summed
    nll: Tensor  # plain negative log-likelihood, summed (no smoothing), detached
    tokens: Tensor  # number of non-padding target tokens


def _chunks(rows: int, vocab: int):
    step = max(1, _CHUNK_ELEMENTS // vocab)
    return ((start, min(start + step, rows)) for start in range(0, rows, step))


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
            x = logits[a:b].to(acc)  # (c, V); the chunk stays in cache for the passes below
            torch.mean(x, dim=-1, out=mean_logit[a:b])
            x_max = x.amax(-1)
            if probs.dtype == acc:  # written in place: no chunk-sized temporary and no copy of it
                p = torch.softmax(x, dim=-1, out=probs[a:b])
            else:  # the fp32 softmax is cast once into the saved lower-precision one
                p = torch.softmax(x, dim=-1)
                probs[a:b] = p
            # log-sum-exp from the softmax: p_max = exp(x_max - lse) >= 1/V never underflows.
            torch.sub(x_max, p.amax(-1).log(), out=lse[a:b])
        nll = (lse - logits.gather(-1, target[:, None]).squeeze(-1).to(acc)) * valid  # -log p(target), (M,)
        smooth = (lse - mean_logit) * valid  # mean over the vocabulary of -log p, (M,)
        loss = (1.0 - epsilon) * nll.sum() + epsilon * smooth.sum()
        ctx.save_for_backward(probs, target, valid)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return loss, nll.sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        # d loss / d logits = softmax - (1 - eps) * onehot(target) - eps / V, on valid rows.
        probs, target, valid = ctx.saved_tensors
        if getattr(ctx, "consumed", False):
            raise RuntimeError(
                "smoothed_cross_entropy: backward turns the saved softmax into the gradient in place, "
                "so it runs once per forward (retain_graph is not supported)"
            )
        ctx.consumed = True
        eps = ctx.epsilon
        M, V = probs.shape
        grad = probs  # in place: no second vocabulary-sized tensor
        grad.sub_(eps / V)
        grad[torch.arange(M, device=grad.device), target] -= 1.0 - eps
        grad.mul_((valid * grad_loss).to(grad.dtype)[:, None])
        return grad, None, None


def smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float = 0.0) -> LossOutput:
    """Summed label-smoothed cross-entropy of logits (M, V) against target ids (M,), and the plain NLL.
    Rows whose target is IGNORE contribute nothing."""
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, epsilon)
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
