"""Greedy and beam search over the Transformer's public decoding API (encode / start_decoding / decode_step).

Beam search is batched and vectorised: one top-k over beam x vocabulary per step for all sentences
at once, no Python loop over sentences or beams; the encoder runs once and its keys/values are
projected once per sentence; sentences leave the batch as soon as they have `beam` finished
hypotheses. Finished hypotheses are ranked by score / length**lenpen (fairseq's length penalty;
length counts the generated tokens including EOS).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_cli.core.buckets import bucket
from transformer_cli.models.transformer import Transformer
from transformer_cli.runtime.cpu import has_amx

# Sizes per doubling of the active sentence count. Each count a shrinking batch passes through brings its own
# matmul shapes (projections, and attention with every cache length and source width), compiled once each by
# oneDNN on CPUs with bf16; 4 a doubling instead of buckets.STEPS' 8 cuts a test set's kernel creations at no
# measured cost in speed, 2 cut more at some cost (measured: docs/benchmarks/speed.md, "Memory").
BEAM_STEPS = 4
# Below this many active sentences the sizes are the powers of two (1, 2, 4, 8, 16 instead of 1-8, 10, 12, 14, 16): a
# batch's tail passes through few sizes, each with its own kernels, and a step with so few rows costs its overhead
# more than its rows: fewer kernels after warm-up, no slower (measured: docs/benchmarks/machines/intel-xeon-amx.md).
SMALL = 16


def sentence_slots(n: int) -> int:
    """The sentence count a beam batch's decoding steps run at while n sentences are active: the next power of two
    below SMALL, else bucket(n, steps=BEAM_STEPS)."""
    return 1 << (max(n, 1) - 1).bit_length() if n < SMALL else bucket(n, steps=BEAM_STEPS)


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # sum of log-probabilities / length**lenpen


def max_lengths(src: Tensor, pad_id: int, a: float, b: int, limit: int) -> Tensor:
    """Per-sentence output budget a * source length + b (EOS included), capped by the positions table."""
    src_len = src.ne(pad_id).sum(1)
    return (a * src_len.float() + b).long().clamp(min=1, max=limit)


@torch.inference_mode()
def greedy_search(
    model: Transformer, src: Tensor, bos_id: int, eos_id: int, max_len_a: float = 1.2, max_len_b: int = 10
) -> list[list[int]]:
    """Argmax decoding; returns token ids per sentence without BOS/EOS."""
    memory, src_pad = model.encode(src)
    B = src.size(0)
    limits = max_lengths(src, model.pad_id, max_len_a, max_len_b, model.positions.size(0) - 1)
    T = int(limits.max())
    state = model.start_decoding(memory, src_pad, T)
    out = src.new_full((B, T + 1), model.pad_id)
    out[:, 0] = bos_id
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    for t in range(T):
        logits = model.decode_step(out[:, t : t + 1], state)  # (B, V)
        next_tok = logits.argmax(-1)
        next_tok = torch.where(t + 1 >= limits, torch.full_like(next_tok, eos_id), next_tok)
        out[:, t + 1] = next_tok.masked_fill(done, model.pad_id)
        done |= next_tok.eq(eos_id)
        if bool(done.all()):
            break
    return [_strip(row, eos_id, model.pad_id) for row in out[:, 1:].tolist()]


def _filled(index: Tensor, n: int) -> Tensor:
    """index (m,) extended to n >= m entries by repeating its last one."""
    return torch.cat([index, index[-1:].expand(n - index.numel())]) if n > index.numel() else index


def step_memory_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype of the cross-attention keys and values during decoding steps; None keeps the model's dtype.

    fp32 on a CPU without AMX. A half-precision batched matmul goes through oneDNN there, which compiles a kernel
    for every shape, and the source width times the sentence count makes many. fp32 goes through MKL, which
    compiles none, and is as fast at these few queries per sentence. With AMX, bf16 steps decode faster even with
    their kernels (measured: docs/benchmarks/speed.md, "Memory", and docs/benchmarks/machines/intel-xeon-amx.md),
    so there, and on GPUs, the model's dtype."""
    return torch.float32 if device.type == "cpu" and not has_amx() else None


def memory_slots(need: int, full: int) -> int:
    """The fewest sentences, of full, ceil(full / 2), ceil(full / 4), ..., that hold `need`: the sizes the
    encoder and the cross-attention of a batch of `full` sentences take, at most twice what is needed."""
    slots = full
    while need <= (slots + 1) // 2 < slots:
        slots = (slots + 1) // 2
    return slots


def _strip(tokens: list[int], eos_id: int, pad_id: int) -> list[int]:
    if eos_id in tokens:
        tokens = tokens[: tokens.index(eos_id)]
    return [t for t in tokens if t != pad_id]


@torch.inference_mode()
def beam_search(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    beam: int = 5,
    lenpen: float = 1.0,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    nbest: int = 1,
    pad_rows: bool = True,
    full: int | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search; returns the `nbest` best finished hypotheses of each sentence, best first.

    With `pad_rows`, copies of the last sentence fill the batch so that its matmuls take a few shapes (a CPU
    matmul library compiles a kernel per shape) instead of one per count of active sentences; the copies'
    outputs are dropped, and the search itself sees only the real rows. The decoder's rows are those of
    `sentence_slots(active sentences)` sentences; the encoder and the cross-attention, whose shapes
    also hold the source width, run on `memory_slots(...)` of `full` sentences (default: the bucket of this
    batch's): one of a few fractions of the full batch of this width, so that their shapes repeat from batch to
    batch and as sentences finish.
    """
    K, B, device = beam, src.size(0), src.device
    size = sentence_slots if pad_rows else (lambda n: n)
    full = max(size(B), full or 0)
    slots = (lambda n: memory_slots(size(n), full)) if pad_rows else (lambda n: n)
    limits = max_lengths(src, model.pad_id, max_len_a, max_len_b, model.positions.size(0) - 1)  # (B,)
    memory, src_pad = model.encode(src[_filled(torch.arange(B, device=device), slots(B))])
    T = int(limits.max())
    state = model.start_decoding(memory, src_pad, T, rows_per_sentence=K, memory_dtype=step_memory_dtype(device))

    tokens = src.new_full((B * K, T + 1), model.pad_id)  # alive hypotheses, row = sentence * K + beam
    tokens[:, 0] = bos_id
    scores = torch.zeros(B, K, device=device)
    scores[:, 1:] = float("-inf")  # all beams start equal: keep one so the first step has no duplicates
    fin_tokens = src.new_full((B, K, T + 1), model.pad_id)  # finished hypotheses, by original sentence
    fin_scores = torch.full((B, K), float("-inf"), device=device)
    active = torch.arange(B, device=device)  # original index of each sentence still decoding
    ranks = torch.arange(2 * K, device=device)

    for t in range(T):
        b = active.numel()
        step_in = tokens[_filled(torch.arange(b * K, device=device), size(b) * K), t : t + 1]
        logits = model.decode_step(step_in, state)[: b * K]  # (b*K, V)
        at_limit = t + 1 >= limits[active]  # (b,): only EOS may follow
        cand_lprobs, cand_tok = _row_candidates(logits, 2 * K, at_limit.repeat_interleave(K), eos_id)  # (b*K, C)
        C = cand_tok.size(1)
        # One top-k over beam x vocabulary: the best 2K of all (beam, token) pairs are among the rows'
        # best 2K. 2K candidates always hold K that do not end in EOS.
        totals = cand_lprobs.view(b, K, C) + scores[:, :, None]  # (b, K, C)
        top_scores, top_idx = totals.view(b, K * C).topk(2 * K, dim=1)  # (b, 2K)
        rows = torch.arange(b, device=device)[:, None] * K + top_idx // C  # (b, 2K) hypothesis rows
        top_tok = cand_tok.view(b, K * C).gather(1, top_idx)
        is_eos = top_tok.eq(eos_id)

        # EOS candidates ranked within the top K finish; each sentence keeps its K best finished ones.
        finishing = is_eos & (ranks < K) & top_scores.isfinite()
        if bool(finishing.any()):
            f = finishing.any(1).nonzero().squeeze(1)  # sentences where something finishes
            sent = active[f]
            cand = tokens[rows[f]]  # (f, 2K, T+1)
            cand[:, :, t + 1] = top_tok[f]
            normalised = (top_scores[f] / (t + 1) ** lenpen).masked_fill(~finishing[f], float("-inf"))
            best, which = torch.cat([fin_scores[sent], normalised], 1).topk(K, dim=1)  # of (f, 3K)
            merged = torch.cat([fin_tokens[sent], cand], 1)  # (f, 3K, T+1)
            fin_scores[sent] = best
            fin_tokens[sent] = merged.gather(1, which[:, :, None].expand(-1, -1, T + 1))

        # Sentences with K finished hypotheses are done and leave the batch.
        keep = fin_scores[active, -1].isinf().nonzero().squeeze(1)  # (b',)
        if keep.numel() == 0:
            break
        alive_scores, pick = top_scores.masked_fill(is_eos, float("-inf"))[keep].topk(K, dim=1)  # (b', K)
        next_rows = rows[keep].gather(1, pick).view(-1)  # (b'*K,)
        tokens = tokens[next_rows]
        tokens[:, t + 1] = top_tok[keep].gather(1, pick).view(-1)
        scores = alive_scores
        state.select_rows(_filled(next_rows, size(keep.numel()) * K))
        if keep.numel() < b:
            state.select_sentences(_filled(keep, slots(keep.numel())))
            active = active[keep]

    results = []
    order = fin_scores.argsort(dim=1, descending=True)
    for i in range(B):
        hyps = []
        for j in order[i, :nbest].tolist():
            if torch.isfinite(fin_scores[i, j]):
                hyps.append(
                    Hypothesis(_strip(fin_tokens[i, j, 1:].tolist(), eos_id, model.pad_id), float(fin_scores[i, j]))
                )
        results.append(hyps)
    return results


@torch.inference_mode()
def reference_beam_search(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    beam: int = 5,
    lenpen: float = 1.0,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    nbest: int = 1,
) -> list[Hypothesis]:
    """The search `beam_search` performs, written plainly for one sentence src (1, S): a Python list of
    hypotheses, the decoder re-run over each whole prefix at every step (no cache, no batching).

    It defines the result the fast path must reproduce (tests and scripts/verify_beam_search.py).
    """
    memory, src_pad = model.encode(src)
    limit = int(max_lengths(src, model.pad_id, max_len_a, max_len_b, model.positions.size(0) - 1)[0])
    alive = [[bos_id]]  # token lists, each starting with BOS
    alive_scores = torch.zeros(1)  # sums of log-probabilities (fp32)
    finished: list[tuple[Tensor, list[int]]] = []  # (score / length**lenpen, tokens)
    for t in range(limit):
        prefixes = torch.tensor(alive, device=src.device)  # (n, t+1)
        n = prefixes.size(0)
        hidden = model.decode(prefixes, memory.expand(n, -1, -1), src_pad.expand(n, -1))
        lprobs = F.log_softmax(model.out_proj(hidden[:, -1]), dim=-1, dtype=torch.float32)  # (n, V)
        V = lprobs.size(1)
        if t + 1 >= limit:  # the length budget is spent: only EOS may follow
            lprobs[:, torch.arange(V) != eos_id] = float("-inf")
        candidates = (lprobs + alive_scores[:, None].to(lprobs.device)).view(-1)
        top_scores, top_idx = candidates.topk(2 * beam)
        next_alive, next_scores = [], []
        for rank, (score, idx) in enumerate(zip(top_scores, top_idx.tolist())):
            row, token = divmod(idx, V)
            tokens = alive[row] + [token]
            if token == eos_id:
                if rank < beam and bool(score.isfinite()):
                    finished.append((score / (t + 1) ** lenpen, tokens))
            elif len(next_alive) < beam:
                next_alive.append(tokens)
                next_scores.append(score)
        finished = sorted(finished, key=lambda f: float(f[0]), reverse=True)[:beam]
        if len(finished) == beam:
            break
        alive, alive_scores = next_alive, torch.stack(next_scores).cpu()
    return [Hypothesis(_strip(tokens[1:], eos_id, model.pad_id), float(score)) for score, tokens in finished[:nbest]]


def _row_candidates(
    logits: Tensor, n: int, at_limit: Tensor, eos_id: int, chunk_rows: int = 128
) -> tuple[Tensor, Tensor]:
    """The n best next tokens of each hypothesis row and their log-probabilities (fp32), (N, n) each.

    log_softmax runs a chunk of rows at a time, so its fp32 (chunk, V) output stays in cache instead of
    a vocabulary-sized fp32 tensor for the whole batch. Rows at their length limit get EOS alone.
    """
    N, V = logits.shape
    n = min(n, V)
    values = torch.empty(N, n, dtype=torch.float32, device=logits.device)
    tokens = torch.empty(N, n, dtype=torch.long, device=logits.device)
    eos_lprob = torch.empty(N, dtype=torch.float32, device=logits.device)
    for start in range(0, N, chunk_rows):
        lprobs = F.log_softmax(logits[start : start + chunk_rows], dim=-1, dtype=torch.float32)  # (chunk, V)
        top = lprobs.topk(n, dim=1)
        values[start : start + chunk_rows], tokens[start : start + chunk_rows] = top.values, top.indices
        eos_lprob[start : start + chunk_rows] = lprobs[:, eos_id]
    if bool(at_limit.any()):
        values[at_limit] = float("-inf")
        values[at_limit, 0] = eos_lprob[at_limit]
        tokens[at_limit, 0] = eos_id
    return values, tokens


@dataclass
class DecodeOptions:
    beam: int = 5
    lenpen: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10
    max_tokens: int = 8000  # source tokens per batch
    nbest: int = 1


def decode_corpus(
    model: Transformer,
    sources: list[list[int]],
    opts: DecodeOptions,
    bos_id: int,
    eos_id: int,
    device: torch.device,
    context=None,
    bucketed: bool = False,
) -> list[list[Hypothesis]]:
    """Translate many token sequences (EOS appended here), batched by length; results in input order.

    `context` is a factory of the runtime's context manager (autocast, attention kernel), or None. With
    `bucketed` (where matmuls compile a kernel per shape: `Runtime.kernel_per_shape`), batch widths and the rows
    of every search step come from a few sizes, so that their kernels are compiled once each; without, batches
    are as wide as their longest source and steps carry only the active rows, which padding would only slow down
    (fp32 on a CPU goes through MKL, which compiles nothing per shape).
    """
    from transformer_cli.data.shards import flatten
    from transformer_cli.data.translation import padded

    limit = model.positions.size(0) - 1
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]), reverse=True)
    results: list[list[Hypothesis]] = [[] for _ in sources]
    start = 0
    while start < len(order):
        # The longest of the batch comes first; its width (from a small set where bucketed) sets the batch's shape.
        width = min(len(sources[order[start]]), limit - 1) + 1
        width = min(bucket(width), limit) if bucketed else width
        size = max(1, opts.max_tokens // width)
        chunk = order[start : start + size]
        seqs = flatten([sources[i][: limit - 1] for i in chunk])
        src = padded(*seqs, model.pad_id, suffix=eos_id, width=width).to(device)
        with context() if context is not None else contextlib.nullcontext():
            hyps = beam_search(
                model,
                src,
                bos_id,
                eos_id,
                opts.beam,
                opts.lenpen,
                opts.max_len_a,
                opts.max_len_b,
                opts.nbest,
                pad_rows=bucketed,
                full=sentence_slots(size),  # every batch of this width, the last one too
            )
        for i, h in zip(chunk, hyps):
            results[i] = h
        start += size
    return results
