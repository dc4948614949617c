"""Transformer building blocks: positional encoding, multi-head attention, FFN, encoder/decoder blocks.

Shapes: B batch, T query length, S key length, H heads, d_k = d_model / H.
Masks: `pad_mask` is a bool (B, S) tensor, True at padded key positions.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def sinusoidal_positions(max_positions: int, d_model: int) -> Tensor:
    """P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(i / 10000^(2j/d)); shape (max_positions, d)."""
    position = torch.arange(max_positions, dtype=torch.float64)[:, None]  # (P, 1)
    two_j = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d/2,)
    angle = position / torch.pow(10000.0, two_j / d_model)  # (P, d/2)
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


def residual_dtype(x: Tensor) -> Tensor:
    """The embeddings' output x in the dtype the residual stream carries: bf16 under a CPU's bf16 autocast,
    otherwise x unchanged.

    Autocast runs the matmuls in bf16 but leaves every sum x + sublayer(x) in fp32, where the fp32 embeddings
    put it; then each linear layer casts its input to bf16 and backward casts each gradient back, a large share
    of a CPU training step (measured: docs/benchmarks/speed.md). Started in bf16, the stream stays there:
    LayerNorm of a bf16 input gives bf16 on a CPU (it accumulates in fp32), and so do the adds, as when decoding
    with bf16 weights.
    Weights, their gradients and the optimizer's states stay fp32. bf16 only: it has fp32's range, fp16 does
    not; and on a GPU autocast runs LayerNorm in fp32, so the stream would not stay bf16 there.
    """
    device = x.device.type
    if device == "cpu" and torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16:
        return x.to(torch.bfloat16)
    return x


class _CPUDropout(torch.autograd.Function):
    """Inverted dropout whose mask comes from 16-bit uniforms cut out of 64-bit random words.

    On CPU, torch's bernoulli_ draws one random number per element (its cost: docs/benchmarks/speed.md);
    one 64-bit word gives four 16-bit uniforms, so the mask costs a quarter of the draws.
    P(drop) = round(p * 65536) / 65536, within 1e-5 of p. The default generator is used, so seeding and
    checkpointed RNG states reproduce the masks exactly.

    The mask is written as 1s and 0s in x's dtype, not as bools: a product of a bf16 (or fp32) tensor with a bool
    one first converts the bools to a temporary of the tensor's dtype, once in forward and again in backward,
    which made dropout much slower (measured: docs/benchmarks/speed.md).
    """

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        n = x.numel()
        words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
        uniform16 = words.view(torch.int16)[:n].view(x.shape)  # uniform in [-32768, 32767]
        keep = torch.ge(uniform16, round(p * 65536) - 32768, out=torch.empty(x.shape, dtype=x.dtype))  # 1 / 0
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return _masked_scaled(x, keep, ctx.scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        return _masked_scaled(grad, keep, ctx.scale), None


def _masked_scaled(x: Tensor, keep: Tensor, scale: float) -> Tensor:
    """x * keep * scale in one pass over x (addcmul onto a zero), where x.mul(keep).mul_(scale) took two: the same
    values (x * keep is x or 0, and both round x * scale once, in fp32 for bf16 inputs)."""
    return torch.addcmul(x.new_zeros(()), x, keep, value=scale)


class Dropout(nn.Dropout):
    """nn.Dropout with a cheaper mask on CPU (see _CPUDropout); elsewhere torch's fused kernel."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0 or x.device.type != "cpu":
            return super().forward(x)
        return _CPUDropout.apply(x, self.p)


class KVCache:
    """Keys and values of the positions decoded so far, for one self-attention layer.

    One contiguous (N, H, C, d_k) buffer each, in the dtype of the projected keys (bf16 under
    autocast), whose capacity C grows `grow` positions at a time; slots from `length` on are zero
    and masked out. A decoding step writes one slot; attention reads the whole buffer, because the
    batched matmul takes a contiguous buffer as it is but copies a (N, H, length, d_k) view of one
    at every step; reordering the hypotheses (beam search) is one index_select.
    """

    def __init__(self, max_len: int, grow: int = 8):
        self.max_len, self.grow = max_len, grow
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (N, H, T, d_k) keys/values after the cached ones; return the buffers, (N, H, C, d_k)."""
        N, H, T, d_k = k.shape
        end = self.length + T
        if self.k is None or end > self.k.size(2):
            capacity = max(end, min(self.max_len, -(-end // self.grow) * self.grow))
            grown_k, grown_v = k.new_zeros(N, H, capacity, d_k), v.new_zeros(N, H, capacity, d_k)
            if self.k is not None:
                grown_k[:, :, : self.length] = self.k[:, :, : self.length]
                grown_v[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = grown_k, grown_v
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k, self.v

    def empty_slots(self) -> Tensor:
        """(1, C) bool, True at the buffer positions not filled yet: a key padding mask."""
        return (torch.arange(self.k.size(2), device=self.k.device) >= self.length)[None]

    def select(self, index: Tensor) -> None:
        """Keep rows `index` (beam reordering, finished sentences dropped)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


def attention_weights(q: Tensor, k: Tensor, pad_mask: Tensor | None = None, causal: bool = False) -> Tensor:
    """softmax(QK^T / sqrt(d_k) + mask) written out, in fp32: q (B, H, T, d_k), k (B, H, S, d_k) -> (B, H, T, S).

    Padded keys (pad_mask (B, S), True = padding) and, with `causal`, keys after the query get weight 0
    (query t sees keys <= t: SDPA's is_causal).
    """
    # Autocast (bf16 / fp16 runs) would cast the matmul back to half precision: these weights are read as
    # probabilities (heatmaps, alignments), so they are computed in fp32 on every machine.
    with torch.autocast(q.device.type, enabled=False):
        scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * q.size(-1) ** -0.5  # (B, H, T, S)
        if pad_mask is not None:
            scores = scores.masked_fill(pad_mask[:, None, None, :], float("-inf"))
        if causal:
            T, S = scores.shape[-2:]
            future = torch.ones(T, S, dtype=torch.bool, device=scores.device).triu(1)  # (T, S)
            scores = scores.masked_fill(future, float("-inf"))
        return scores.softmax(-1, dtype=torch.float32)


def dropout_attention(q: Tensor, k: Tensor, v: Tensor, pad_mask: Tensor | None, causal: bool, p: float) -> Tensor:
    """dropout(softmax(QK^T / sqrt(d_k) + mask)) V written out, for training on a CPU: q (B, H, T, d_k), k and v
    (B, H, S, d_k) -> (B, H, T, d_k), in the inputs' dtype.

    SDPA's CPU math kernel draws one random number per attention weight for its dropout (bernoulli_) and checks
    every row for all-masked keys; here the mask comes from `Dropout`'s 16-bit uniforms, and masked keys take
    the dtype's lowest finite score instead of -inf, so a row with no key to attend to (an empty row of a batch)
    averages the values instead of making NaN, with no check. Faster than the math kernel for BERT's attention
    (measured: docs/benchmarks/speed.md).
    """
    scores = torch.matmul(q * q.size(-1) ** -0.5, k.transpose(-2, -1))  # (B, H, T, S)
    lowest = torch.finfo(scores.dtype).min
    if pad_mask is not None:
        # Added, not filled in: lowest + a score rounds to lowest, and the sum's backward passes the gradient on
        # as it is, where masked_fill copies the scores and then their gradient. The weights are masked_fill's,
        # bit for bit, and so are the gradients but in a row with no key at all (a batch's padding row), whose
        # output no loss reads.
        bias = torch.zeros(pad_mask.shape, dtype=scores.dtype, device=q.device).masked_fill_(pad_mask, lowest)
        scores = scores + bias[:, None, None, :]  # (B, 1, 1, S) over heads and queries
    if causal:
        T, S = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool, device=q.device).triu(1), lowest)
    return torch.matmul(_CPUDropout.apply(scores.softmax(-1), p), v)


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention, softmax(QK^T / sqrt(d_k)) V, with an output projection.

    Self-attention projects Q, K, V with one fused matrix; cross-attention projects Q from the decoder
    and K, V (fused) from the encoder output, which `project_memory` does once per sentence.
    """

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0, cross: bool = False):
        super().__init__()
        assert d_model % heads == 0, "d_model must be divisible by heads"
        self.heads, self.d_k, self.dropout, self.cross = heads, d_model // heads, dropout, cross
        if cross:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        # Opt-in capture (attention maps, alignments): when a list is set here, every full (non-step)
        # call also appends its softmax weights, (B, H, T, S). The output still comes from SDPA, so
        # capturing never changes what the model computes; None (the default) costs one attribute test.
        self.record: list[Tensor] | None = None

    def _split_heads(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        B, T, _ = x.shape
        x = x.view(B, T, n, self.heads, self.d_k).permute(2, 0, 3, 1, 4)  # (n, B, H, T, d_k)
        return x.unbind(0)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        pad_mask: Tensor | None,
        causal: bool,
        step: bool = False,
        project: bool = True,
    ) -> Tensor:
        """Attention of q (B, H, T, d_k) over k, v (B, H, S, d_k) -> (B, T, d), through the output projection
        unless `project` is False."""
        # SDPA takes a bool mask with True = "may attend": (B, 1, 1, S) broadcasts over heads and queries.
        mask = None if pad_mask is None else ~pad_mask[:, None, None, :]
        if step:
            # A decoding step: the formula written out, the 1/sqrt(d_k) scale applied to the few new
            # queries. (SDPA's CPU math kernel rescales and copies every cached key at every step.) Keys of
            # another dtype than the queries (memory kept in fp32 for half-precision decoding) set the dtype
            # the step computes in, autocast or not; the output comes back in the queries' dtype.
            same = k.dtype == q.dtype
            with contextlib.nullcontext() if same else torch.autocast(q.device.type, enabled=False):
                scores = torch.matmul(q.to(k.dtype) * self.d_k**-0.5, k.transpose(-2, -1))  # (B, H, T, S)
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                out = torch.matmul(scores.softmax(-1), v).to(q.dtype)  # (B, H, T, d_k)
        else:
            p = self.dropout if self.training else 0.0
            if p > 0.0 and q.device.type == "cpu":
                out = dropout_attention(q, k, v, pad_mask, causal, p)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
            if self.record is not None:
                self.record.append(attention_weights(q, k, pad_mask, causal))
        B, H, T, d_k = out.shape
        out = out.transpose(1, 2).reshape(B, T, H * d_k)  # (B, T, d)
        return self.out_proj(out) if project else out

    def forward(
        self, x: Tensor, pad_mask: Tensor | None = None, causal: bool = False, cache: KVCache | None = None
    ) -> Tensor:
        """Self-attention over x (B, T, d). With a cache, x holds only the new positions."""
        q, k, v = self._split_heads(self.qkv_proj(x), 3)  # each (B, H, T, d_k)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, C, d_k): positions < cache.length filled, all visible
            if q.size(2) == 1:  # a decoding step
                return self._attend(q, k, v, cache.empty_slots(), causal=False, step=True)
            k, v = k[:, :, : cache.length], v[:, :, : cache.length]  # (B, H, t + T, d_k)
            causal = causal and q.size(2) > 1
        return self._attend(q, k, v, pad_mask, causal)

    def first_query(self, x: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """Self-attention over x (B, T, d) for the first position's query alone -> (B, 1, d): what `forward`
        gives at position 0, from keys and values of every position but one query (its projection only:
        q = x_0 W_q, [k v] = x [W_k W_v], the rows of the fused matrix)."""
        d = x.size(-1)
        w, b = self.qkv_proj.weight, self.qkv_proj.bias  # (3d, d), (3d,): the rows of W_q, W_k, W_v
        (q,) = self._split_heads(F.linear(x[:, :1], w[:d], b[:d]), 1)  # (B, H, 1, d_k)
        k, v = self._split_heads(F.linear(x, w[d:], b[d:]), 2)  # each (B, H, T, d_k)
        return self._attend(q, k, v, pad_mask, causal=False)

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output (B, S, d) -> cross-attention keys and values, each (B, H, S, d_k)."""
        k, v = self._split_heads(self.kv_proj(memory), 2)
        return k, v

    def cross_forward(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor],
        pad_mask: Tensor,
        step: bool = False,
        rows_per_sentence: int | None = None,
    ) -> Tensor:
        """Cross-attention of x (N, T, d) over the keys/values of B sentences, r = `rows_per_sentence` rows each
        (default N / B).

        In beam search r = beams: the r rows of a sentence become r * T queries against that sentence's keys,
        so the encoder output is never copied per beam. N may be less than B * r: the rows belong to the first
        N / r sentences, and the others' queries are zeros whose outputs are dropped, so the attention's shapes
        stay those of B sentences while sentences finish.
        """
        k, v = memory_kv
        N, T, d = x.shape
        B = k.size(0)
        r = N // B if rows_per_sentence is None else rows_per_sentence
        q = self.q_proj(x)  # (N, T, d)
        if N < B * r:
            q = torch.cat([q, q.new_zeros(B * r - N, T, d)])  # (B*r, T, d)
        (q,) = self._split_heads(q.reshape(B, r * T, d), 1)  # (B, H, r*T, d_k)
        out = self._attend(q, k, v, pad_mask, causal=False, step=step, project=False)  # (B, r*T, d)
        return self.out_proj(out.reshape(B * r, T, d)[:N])  # (N, T, d)


class FeedForward(nn.Module):
    """Position-wise FFN(x) = W2 act(W1 x + b1) + b2."""

    def __init__(self, d_model: int, ffn_dim: int, activation: str = "relu"):
        super().__init__()
        self.w1 = nn.Linear(d_model, ffn_dim)
        self.w2 = nn.Linear(ffn_dim, d_model)
        self.act = nn.GELU() if activation == "gelu" else nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.act(self.w1(x)))


class SublayerConnection(nn.Module):
    """Residual + LayerNorm around a sub-layer: post-norm LN(x + drop(f(x))) or pre-norm x + drop(f(LN(x)))."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer, residual: Tensor | None = None) -> Tensor:
        """`residual`: the rows of x the sub-layer's output continues (default x), where it gives fewer rows."""
        residual = x if residual is None else residual
        if self.norm_first:
            return residual + self.dropout(sublayer(self.norm(x)))
        return self.norm(residual + self.dropout(sublayer(x)))


class EncoderBlock(nn.Module):
    """Self-attention -> Add&Norm -> FFN -> Add&Norm."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        ffn_dim: int,
        dropout: float,
        attention_dropout: float,
        activation: str,
        norm_first: bool,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, attention_dropout)
        self.ffn = FeedForward(d_model, ffn_dim, activation)
        self.attn_sub = SublayerConnection(d_model, dropout, norm_first, eps)
        self.ffn_sub = SublayerConnection(d_model, dropout, norm_first, eps)

    def forward(self, x: Tensor, pad_mask: Tensor | None, first_only: bool = False) -> Tensor:
        """(B, T, d) -> (B, T, d); with `first_only`, position 0's output alone, (B, 1, d): the same values, but
        its query, residual and FFN only (what a [CLS] classifier reads of the last block)."""
        if first_only:
            x = self.attn_sub(x, lambda h: self.self_attn.first_query(h, pad_mask), residual=x[:, :1])  # (B, 1, d)
        else:
            x = self.attn_sub(x, lambda h: self.self_attn(h, pad_mask))
        return self.ffn_sub(x, self.ffn)


class DecoderBlock(nn.Module):
    """Masked self-attention, encoder-decoder cross-attention, FFN; each followed by Add&Norm."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        ffn_dim: int,
        dropout: float,
        attention_dropout: float,
        activation: str,
        norm_first: bool,
    ):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model, heads, attention_dropout, cross=True)
        self.ffn = FeedForward(d_model, ffn_dim, activation)
        self.self_sub = SublayerConnection(d_model, dropout, norm_first)
        self.cross_sub = SublayerConnection(d_model, dropout, norm_first)
        self.ffn_sub = SublayerConnection(d_model, dropout, norm_first)

    def forward(
        self,
        y: Tensor,
        memory_kv: tuple[Tensor, Tensor],
        src_pad_mask: Tensor,
        cache: KVCache | None = None,
        rows_per_sentence: int | None = None,
    ) -> Tensor:
        # Target padding sits after the real tokens, so the causal mask alone keeps real positions
        # from seeing it; no separate target padding mask is needed.
        y = self.self_sub(y, lambda h: self.self_attn(h, causal=True, cache=cache))
        step = cache is not None and y.size(1) == 1
        y = self.cross_sub(
            y, lambda h: self.cross_attn.cross_forward(h, memory_kv, src_pad_mask, step, rows_per_sentence)
        )
        return self.ffn_sub(y, self.ffn)


def init_embedding(emb: nn.Embedding, d_model: int, pad_id: int | None) -> None:
    """N(0, d^-1/2): after the sqrt(d) input scaling the embeddings have unit variance."""
    nn.init.normal_(emb.weight, mean=0.0, std=d_model**-0.5)
    if pad_id is not None:
        with torch.no_grad():
            emb.weight[pad_id].zero_()


def scaled_embedding(emb: nn.Embedding, tokens: Tensor) -> Tensor:
    return emb(tokens) * math.sqrt(emb.embedding_dim)
