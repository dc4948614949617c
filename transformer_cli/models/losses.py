"""Label-smoothed cross-entropy over a large vocabulary, fused by hand.

loss = (1 - eps) * NLL + eps * mean over the vocabulary of -log p, summed over rows.
The autograd graph of `log_softmax -> gather -> mean` keeps an fp32 (M, V) log-probability tensor and
spends four more vocabulary-sized passes in backward (zeros for the gather, the mean's expand and
division, the log-softmax backward). Here forward keeps only the logits and one logsumexp per row,
and backward writes the gradient softmax(x) - (1 - eps) * onehot - eps / V in one pass per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

_CHUNK_ELEMENTS = 1 << 20  # rows per chunk such that an fp32 chunk is ~4 MB: cache friendly, few Python steps


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
        acc = torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 logits are reduced in fp32
        lse = torch.empty(M, dtype=acc, device=logits.device)
        mean_logit = torch.empty_like(lse)
        for a, b in _chunks(M, V):
            x = logits[a:b].to(acc)  # (c, V)
            torch.logsumexp(x, dim=-1, out=lse[a:b])
            torch.mean(x, dim=-1, out=mean_logit[a:b])
        nll = lse - logits.gather(-1, target[:, None]).squeeze(-1).to(acc)  # -log p(target), (M,)
        smooth = lse - mean_logit  # mean over the vocabulary of -log p, (M,)
        loss = (1.0 - epsilon) * nll.sum() + epsilon * smooth.sum()
        ctx.save_for_backward(logits, target, lse)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return loss, nll.sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        logits, target, lse = ctx.saved_tensors
        eps = ctx.epsilon
        M, V = logits.shape
        grad = torch.empty_like(logits)
        rows = torch.arange(M, device=logits.device)
        for a, b in _chunks(M, V):
            g = (logits[a:b].to(lse.dtype) - lse[a:b, None]).exp_()  # softmax, (c, V)
            if eps:
                g.sub_(eps / V)
            g[rows[: b - a], target[a:b]] -= 1.0 - eps
            grad[a:b] = g.mul_(grad_loss)
        return grad, None, None


def smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float = 0.0) -> LossOutput:
    """Summed label-smoothed cross-entropy of logits (M, V) against target ids (M,), and the plain NLL."""
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, epsilon)
    return LossOutput(loss=loss, nll=nll.detach(), tokens=target.new_tensor(target.numel()))
