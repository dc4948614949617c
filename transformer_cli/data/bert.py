"""BERT pretraining data: documents -> `[CLS] A [SEP] B [SEP]` pairs (NSP) -> dynamically masked batches (MLM).

Pairs follow the BERT paper and its reference `create_pretraining_data.py`: sequences are filled up to
max_seq_len from runs of consecutive sentences (a share `short_seq_prob` aims shorter); half the time B
is the text that really follows A (IsNext, label 0), half the time a span of another document
(NotNext, label 1). Masks are drawn afresh for every batch of every epoch from (seed, epoch, batch),
so resuming reproduces them exactly.

Two forms of the same pairs: `make_instances` builds Python lists (the held-out set, small), and the sample map
(`build_sample_map`, `plan_epoch`, `make_plan_batch`) serves corpora of any size from memory-mapped token arrays.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from transformer_cli.core.buckets import bucket
from transformer_cli.core.files import write_atomic
from transformer_cli.core.sentences import heading_level, split_sentences
from transformer_cli.core.text import check_document_counts, read_lines
from transformer_cli.data.shards import ranges
from transformer_cli.models.losses import IGNORE

IS_NEXT, NOT_NEXT = 0, 1

# ----------------------------------------------------------------------------- documents


def read_documents(path: Path, fmt: str, split: bool) -> list[list[str]]:
    """Documents as lists of sentences.

    text: blank lines separate documents; a line is a sentence (or a paragraph, with `split`).
    wikitext: a ` = Title = ` line starts a document; ` = = Section = = ` headings are dropped.
    """
    docs: list[list[str]] = [[]]
    for line in read_lines(path):
        text = line.strip()
        level = heading_level(text) if fmt == "wikitext" else 0
        if level:
            if level == 1:
                docs.append([])
            continue
        if not text:
            if fmt == "text":
                docs.append([])
            continue
        docs[-1].extend(split_sentences(text) if split else [text])
    return [d for d in docs if d]


# ----------------------------------------------------------------------------- NSP pairs


@dataclass
class Span:
    doc: int
    start: int  # first sentence
    end: int  # one past the last sentence


@dataclass
class Instance:
    tokens_a: list[int]
    tokens_b: list[int]
    is_next: bool
    a: Span
    b: Span

    def __len__(self) -> int:
        return len(self.tokens_a) + len(self.tokens_b) + 3


def check_corpus(docs: list[list[list[int]]], name: str, fmt: str, split_sentences: bool) -> None:
    """At least two documents, one of them with two sentences, as a checkpoint that reads its data as data.format and
    data.split_sentences say (its advice names that reading)."""
    check_document_counts(len(docs), max(map(len, docs), default=0), name, fmt, split_sentences)


def make_instances(
    docs: list[list[list[int]]], max_seq_len: int, short_seq_prob: float, rng: random.Random
) -> list[Instance]:
    """NSP instances for one pass over the corpus. Documents of one sentence serve only as random B sides."""
    instances = []
    for d in range(len(docs)):
        if len(docs[d]) >= 2:
            instances.extend(_instances_of_document(docs, d, max_seq_len, short_seq_prob, rng))
    rng.shuffle(instances)
    return instances


def _instances_of_document(docs, d, max_seq_len, short_seq_prob, rng) -> list[Instance]:
    doc = docs[d]
    max_tokens = max_seq_len - 3  # [CLS] A [SEP] B [SEP]
    target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
    out, chunk_start, length, i = [], 0, 0, 0
    while i < len(doc):
        length += len(doc[i])
        chunk = i + 1 - chunk_start
        at_end = i == len(doc) - 1
        if (length >= target and chunk >= 2) or at_end:
            a_end = chunk_start + (rng.randint(1, chunk - 1) if chunk >= 2 else 1)
            tokens_a = [t for s in doc[chunk_start:a_end] for t in s]
            is_next = rng.random() < 0.5
            if is_next and chunk == 1:  # a lone last sentence has no next one: drop it, keeping labels 50/50
                break
            if not is_next:
                b_span, tokens_b = _random_b(docs, d, max(1, target - len(tokens_a)), rng)
                i = a_end - 1  # the unused sentences of the chunk start the next one
            else:
                b_span, tokens_b = Span(d, a_end, i + 1), [t for s in doc[a_end : i + 1] for t in s]
            _truncate_pair(tokens_a, tokens_b, max_tokens)
            out.append(Instance(tokens_a, tokens_b, is_next, Span(d, chunk_start, a_end), b_span))
            chunk_start, length = i + 1, 0
            target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
        i += 1
    return out


def _random_b(docs, d, target: int, rng: random.Random) -> tuple[Span, list[int]]:
    other = rng.randrange(len(docs) - 1)
    other += other >= d  # any document but this one
    start = rng.randrange(len(docs[other]))
    tokens, end = [], start
    while end < len(docs[other]) and len(tokens) < target:
        tokens.extend(docs[other][end])
        end += 1
    return Span(other, start, end), tokens


def _truncate_pair(a: list[int], b: list[int], max_tokens: int) -> None:
    """Shorten the longer side first: A loses tokens at its start, B at its end (the A|B junction stays)."""
    while len(a) + len(b) > max_tokens:
        if len(a) > len(b):
            del a[0]
        else:
            b.pop()


# ----------------------------------------------------------------------------- batches


@dataclass
class SpecialIds:
    pad: int
    cls: int
    sep: int
    mask: int
    first_normal: int  # random replacement tokens are drawn from [first_normal, vocab_size)
    vocab_size: int


@dataclass
class BertBatch:
    input_ids: Tensor  # (B, T), masked
    segment_ids: Tensor  # (B, T)
    mlm_labels: Tensor  # (B, T): original token at chosen positions, IGNORE elsewhere
    nsp_labels: Tensor  # (B,)
    masked: int
    real_tokens: int

    @property
    def counts(self) -> dict[str, int]:
        return {"mlm": self.masked, "nsp": self.nsp_labels.numel()}

    @property
    def throughput_tokens(self) -> int:
        return self.real_tokens

    @property
    def rows(self) -> int:
        return self.input_ids.size(0)

    def shard(self, rank: int, world: int) -> BertBatch | None:
        """Rows rank, rank + world, ... of a global batch (masks already drawn); None if there are none."""
        if world == 1:
            return self
        ids, labels = self.input_ids[rank::world], self.mlm_labels[rank::world]
        if ids.size(0) == 0:
            return None
        return BertBatch(
            ids,
            self.segment_ids[rank::world],
            labels,
            self.nsp_labels[rank::world],
            masked=int(labels.ne(IGNORE).sum()),
            real_tokens=int(ids.ne(0).sum()),
        )

    def to(self, device: torch.device) -> BertBatch:
        nb = device.type == "cuda"
        return BertBatch(
            self.input_ids.to(device, non_blocking=nb),
            self.segment_ids.to(device, non_blocking=nb),
            self.mlm_labels.to(device, non_blocking=nb),
            self.nsp_labels.to(device, non_blocking=nb),
            self.masked,
            self.real_tokens,
        )


def length_batches(lengths: list[int], batch_size: int, rng: random.Random, pool: int = 100) -> list[list[int]]:
    """Batches of `batch_size` indices; within pools of pool*batch_size shuffled items, similar lengths
    are grouped so padding stays low; batch order is shuffled."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    step = pool * batch_size
    for start in range(0, len(order), step):
        group = sorted(order[start : start + step], key=lambda i: lengths[i])
        batches.extend(group[j : j + batch_size] for j in range(0, len(group), batch_size))
    rng.shuffle(batches)
    return batches


def collate_pairs(instances: list[Instance], ids: SpecialIds, multiple: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Unmasked (B, T) input ids, segment ids (A = 0, B = 1) and NSP labels; T is the longest sequence
    rounded up to `bucket(T, multiple)` (few repeating shapes, as in translation batches)."""
    T = bucket(max(len(x) for x in instances), multiple)
    input_ids = torch.full((len(instances), T), ids.pad, dtype=torch.long)
    segments = torch.zeros((len(instances), T), dtype=torch.long)
    for row, x in enumerate(instances):
        seq = [ids.cls, *x.tokens_a, ids.sep, *x.tokens_b, ids.sep]
        input_ids[row, : len(seq)] = torch.tensor(seq)
        segments[row, len(x.tokens_a) + 2 : len(seq)] = 1
    nsp = torch.tensor([IS_NEXT if x.is_next else NOT_NEXT for x in instances])
    return input_ids, segments, nsp


def batch_seed(seed: int, *parts: int) -> int:
    """The seed of one batch's random draws (its masks) from the run's train.seed and where the batch sits:
    (2, epoch, number) for training batches, (3, number) for held-out ones. The one definition the task, the
    evaluation and the scripts that rebuild these batches use."""
    return hash((seed, *parts)) & 0x7FFF_FFFF_FFFF


def mask_tokens(
    input_ids: Tensor, ids: SpecialIds, mask_prob: float, max_predictions: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """BERT masking, vectorised over the batch: in each row choose round(mask_prob * n) of its n
    non-special positions (at least 1, at most max_predictions); of those 80% -> [MASK],
    10% -> a random token, 10% unchanged. Returns (masked input ids, labels)."""
    special = (input_ids == ids.pad) | (input_ids == ids.cls) | (input_ids == ids.sep)
    candidates = (~special).sum(1)  # (B,)
    n_pred = (candidates.float() * mask_prob).round().long().clamp(min=1, max=max_predictions)
    n_pred = torch.minimum(n_pred, candidates)
    score = torch.rand(input_ids.shape, generator=generator).masked_fill(special, 2.0)
    rank = score.argsort(1).argsort(1)  # rank of each position's score within its row
    chosen = rank < n_pred[:, None]
    labels = input_ids.masked_fill(~chosen, IGNORE)
    action = torch.rand(input_ids.shape, generator=generator)
    random_tokens = torch.randint(ids.first_normal, ids.vocab_size, input_ids.shape, generator=generator)
    masked = input_ids.clone()
    masked[chosen & (action < 0.8)] = ids.mask
    replace = chosen & (action >= 0.8) & (action < 0.9)
    masked[replace] = random_tokens[replace]
    return masked, labels


def make_batch(
    instances: list[Instance],
    ids: SpecialIds,
    mask_prob: float,
    max_predictions: int,
    generator: torch.Generator,
    multiple: int = 1,
) -> BertBatch:
    input_ids, segments, nsp = collate_pairs(instances, ids, multiple)
    masked, labels = mask_tokens(input_ids, ids, mask_prob, max_predictions, generator)
    return BertBatch(
        masked, segments, labels, nsp, masked=int(labels.ne(IGNORE).sum()), real_tokens=int(input_ids.ne(ids.pad).sum())
    )


def encode_documents(vocab, docs: list[list[str]]) -> list[list[list[int]]]:
    """Documents of sentences -> documents of token-id lists; empty sentences and documents dropped (as
    training encodes its text)."""
    flat = vocab.encode([s for d in docs for s in d])
    out, i = [], 0
    for d in docs:
        out.append([s for s in flat[i : i + len(d)] if s])
        i += len(d)
    return [d for d in out if d]


# ----------------------------------------------------------------------------- sample map (memory-mapped corpora)
#
# The corpus as arrays (as preprocessed shards hold it): `tokens` (all sentences concatenated), `offsets`
# (n_sentences + 1,) with sentence i = tokens[offsets[i] : offsets[i + 1]], and `doc_starts` (n_docs + 1,) with
# document d = sentences doc_starts[d] .. doc_starts[d + 1] - 1; no sentence and no document is empty. The chunks
# of consecutive sentences (the sample map) are cut once; each epoch draws, for all samples at once, where A ends,
# IsNext or NotNext, and the random B (plan_epoch); a batch's rows are read from the tokens when it is made.

DOC, FIRST, END, TARGET = range(4)  # sample-map columns
SAMPLE_MAP_VERSION = 1  # part of the cache key: bump it when build_sample_map cuts differently


def sentence_targets(n_sentences: int, max_seq_len: int, short_seq_prob: float, seed: int) -> np.ndarray:
    """(n_sentences,) token targets: max_seq_len - 3, or with probability short_seq_prob a random length in
    [2, max_seq_len - 3]. A chunk aims at the target of its first sentence."""
    max_tokens = max_seq_len - 3  # [CLS] A [SEP] B [SEP]
    if max_tokens < 2:
        raise ValueError(f"max_seq_len {max_seq_len} leaves no room for two sentences")
    rng = np.random.default_rng([seed, 1])
    short = rng.random(n_sentences) < short_seq_prob
    return np.where(short, rng.integers(2, max_tokens + 1, n_sentences), max_tokens)


def build_sample_map(
    offsets: np.ndarray, doc_starts: np.ndarray, max_seq_len: int, short_seq_prob: float, seed: int
) -> np.ndarray:
    """The chunks of consecutive sentences that NSP samples are made of, in corpus order: an (n_samples, 4) int64
    array of [doc, first sentence, end sentence (exclusive), target tokens].

    In a document of two or more sentences a chunk takes sentences until it holds at least its target in tokens
    and at least two sentences; a lone sentence left at the document's end joins the chunk before it. Documents
    of one sentence make no samples: they only serve as random B sides.

    Every sentence draws a target and a chunk uses its first sentence's, so each chunk still has its own
    independent draw, and the chunk starting at sentence s ends at `nxt[s]`, a function of s alone. The chunks
    are then the path 0 -> nxt[0] -> ... -> n_sentences (a chunk ends at its document's end at the latest, which
    is where the next document starts), found by pointer doubling: O(n log n) numpy work, no Python loop.
    """
    offsets, doc_starts = np.asarray(offsets, dtype=np.int64), np.asarray(doc_starts, dtype=np.int64)
    n = len(offsets) - 1
    targets = sentence_targets(n, max_seq_len, short_seq_prob, seed)  # (n,)
    doc_end = np.repeat(doc_starts[1:], np.diff(doc_starts))  # (n,) end of each sentence's document
    enough = np.searchsorted(offsets, offsets[:-1] + targets)  # (n,) first e with >= target tokens in [s, e)
    nxt = np.append(np.minimum(np.maximum(enough, np.arange(2, n + 2)), doc_end), n)  # (n + 1,); n is the end
    on_path = np.zeros(n + 1, dtype=bool)
    on_path[0] = True
    jump = nxt  # invariant: on_path = {nxt^j(0) : j < 2^k} and jump = nxt^(2^k)
    while jump[0] != n:
        on_path[jump[on_path]] = True
        jump = jump[jump]
    starts = np.flatnonzero(on_path[:-1])
    lone = np.append(starts[1:], n) - starts == 1  # one-sentence documents and lone last sentences
    starts = starts[~lone]
    doc = np.searchsorted(doc_starts, starts, side="right") - 1
    ends = np.minimum(np.append(starts[1:], n), doc_starts[doc + 1])  # a lone last sentence joins its chunk
    return np.stack([doc, starts, ends, targets[starts]], axis=1).astype(np.int64, copy=False)


def is_sample_map_of(
    sample_map: np.ndarray, offsets: np.ndarray, doc_starts: np.ndarray, max_seq_len: int, short_seq_prob: float
) -> bool:
    """Whether `sample_map` is a map that build_sample_map could cut from this corpus under these settings (the
    random targets aside): the chunks tile every document of two or more sentences, in order, and each ends where
    the rule ends it. A cache file is checked with this before it is used."""
    if sample_map.ndim != 2 or sample_map.shape[1] != 4 or sample_map.dtype != np.int64:
        return False
    doc, first, end, target = (np.asarray(sample_map[:, c]) for c in range(4))  # (N,) each
    max_tokens = max_seq_len - 3
    if not ((target >= (2 if short_seq_prob > 0 else max_tokens)) & (target <= max_tokens)).all():
        return False
    new_doc, last_of_doc = np.diff(doc, prepend=-1) != 0, np.diff(doc, append=-1) != 0
    if not np.array_equal(doc[new_doc], np.flatnonzero(np.diff(doc_starts) >= 2)):
        return False
    doc_end = doc_starts[doc + 1]
    if not (first == np.where(new_doc, doc_starts[doc], np.append(-1, end[:-1]))).all():
        return False
    if not ((end - first >= 2) & (end <= doc_end) & (~last_of_doc | (end == doc_end))).all():
        return False
    greedy = np.minimum(np.maximum(np.searchsorted(offsets, offsets[first] + target), first + 2), doc_end)
    return bool(((end == greedy) | ((end == doc_end) & (greedy == doc_end - 1))).all())


def sample_map_cached(
    cache_dir: Path | None,
    offsets: np.ndarray,
    doc_starts: np.ndarray,
    max_seq_len: int,
    short_seq_prob: float,
    seed: int,
) -> np.ndarray:
    """build_sample_map, kept in `cache_dir` as a .npy named by the settings and a digest of the corpus index and
    loaded memory-mapped, so every rank and every later run reads one file. A cache file that does not load or is
    not a valid map of this corpus is rebuilt (a killed write leaves no half file: tmp + rename)."""
    if cache_dir is None:
        return build_sample_map(offsets, doc_starts, max_seq_len, short_seq_prob, seed)
    key = _sample_map_key(offsets, doc_starts, max_seq_len, short_seq_prob, seed)
    path = Path(cache_dir) / f"bert_sample_map_{key}.npy"
    if path.exists():
        try:
            cached = np.load(path, mmap_mode="r")
        except (OSError, ValueError, EOFError):  # truncated, or not an .npy file
            cached = None
        if cached is not None and is_sample_map_of(cached, offsets, doc_starts, max_seq_len, short_seq_prob):
            return cached
    sample_map = build_sample_map(offsets, doc_starts, max_seq_len, short_seq_prob, seed)
    buffer = io.BytesIO()
    np.save(buffer, sample_map)
    write_atomic(buffer.getvalue(), path)
    return np.load(path, mmap_mode="r")


def _sample_map_key(
    offsets: np.ndarray, doc_starts: np.ndarray, max_seq_len: int, short_seq_prob: float, seed: int
) -> str:
    """The settings, the index sizes, and up to 4097 evenly spaced entries of each index (cheap on a memmap)."""
    settings = {
        "version": SAMPLE_MAP_VERSION,
        "max_seq_len": int(max_seq_len),
        "short_seq_prob": float(short_seq_prob),
        "seed": int(seed),
        "offsets": len(offsets),
        "doc_starts": len(doc_starts),
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for index in (offsets, doc_starts):
        picks = np.linspace(0, len(index) - 1, num=min(len(index), 4097)).astype(np.int64)
        digest.update(np.asarray(index[picks], dtype=np.int64).tobytes())
    return digest.hexdigest()[:24]


class PlanBatch(NamedTuple):
    number: int  # the batch's place in its epoch (its masks are seeded from it)
    rows: np.ndarray  # (B,) sample-map rows


@dataclass(frozen=True, eq=False)
class EpochPlan(Sequence):
    """One epoch's NSP pairs and batches as arrays over the samples (N = len(sample_map) in every epoch).
    Indexing gives PlanBatch specs: plan[i], or a list for plan[a:b]."""

    sample_map: np.ndarray  # (N, 4), shared, not copied
    max_seq_len: int
    batch_size: int
    a_end: np.ndarray  # (N,) A = sentences [first, a_end)
    b_start: np.ndarray  # (N,) B = sentences [b_start, b_end): [a_end, end) when IsNext, else another document's
    b_end: np.ndarray  # (N,)
    is_next: np.ndarray  # (N,) bool
    lengths: np.ndarray  # (N,) tokens of [CLS] A [SEP] B [SEP] after truncation
    order: np.ndarray  # (N,) samples; order[j*B : (j+1)*B] is batch j
    batch_order: np.ndarray  # (n_batches,) the epoch's order of those batches

    def __len__(self) -> int:
        return len(self.batch_order)

    def __getitem__(self, i: int | slice) -> PlanBatch | list[PlanBatch]:
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        number = range(len(self))[i]  # IndexError past the end, as a list would
        j = int(self.batch_order[number])
        return PlanBatch(number, self.order[j * self.batch_size : (j + 1) * self.batch_size])


def plan_epoch(
    sample_map: np.ndarray,
    offsets: np.ndarray,
    doc_starts: np.ndarray,
    max_seq_len: int,
    batch_size: int,
    seed: int,
    epoch: int,
) -> EpochPlan:
    """Draw one epoch's pairs for all samples at once from (seed, epoch), as make_instances does one by one: A ends
    uniformly inside the chunk; half the pairs are IsNext (B = the rest of the chunk); NotNext pairs take B from a
    uniformly drawn other document, from a random sentence on, sentence by sentence until B holds
    max(1, target - len(A)) tokens or the document ends. Then length-grouped batches, as length_batches."""
    n_docs = len(doc_starts) - 1
    if n_docs < 2:
        raise ValueError("next sentence prediction needs at least two documents")
    rng = np.random.default_rng([seed, 2, epoch])
    offsets, doc_starts = np.asarray(offsets), np.asarray(doc_starts)  # views of memmaps, not copies
    doc, first, end, target = (np.asarray(sample_map[:, c]) for c in range(4))  # (N,) each
    n = len(doc)
    a_end = rng.integers(first + 1, end)  # (N,) A keeps one sentence at least, and leaves one for IsNext
    is_next = rng.random(n) < 0.5
    other = rng.integers(0, n_docs - 1, n)
    other += other >= doc  # any document but the sample's own
    start = rng.integers(doc_starts[other], doc_starts[other + 1])
    len_a = offsets[a_end] - offsets[first]
    wanted = np.maximum(1, target - len_a)
    stop = np.minimum(np.maximum(np.searchsorted(offsets, offsets[start] + wanted), start + 1), doc_starts[other + 1])
    b_start, b_end = np.where(is_next, a_end, start), np.where(is_next, end, stop)
    lengths = np.minimum(len_a + offsets[b_end] - offsets[b_start], max_seq_len - 3) + 3
    order, batch_order = _length_batches(lengths, batch_size, rng)
    return EpochPlan(sample_map, max_seq_len, batch_size, a_end, b_start, b_end, is_next, lengths, order, batch_order)


def _length_batches(
    lengths: np.ndarray, batch_size: int, rng: np.random.Generator, pool: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """length_batches on arrays: shuffle, sort by length within pools of pool*batch_size, cut into batch_size
    slices (only the very last can be short), shuffle the batch order. Returns (order, batch_order)."""
    shuffled = rng.permutation(len(lengths))
    pools = np.arange(len(lengths)) // (pool * batch_size)
    order = shuffled[np.lexsort((lengths[shuffled], pools))]  # stable: equal lengths keep the shuffled order
    return order, rng.permutation(-(-len(lengths) // batch_size))


def truncated_lengths(len_a: np.ndarray, len_b: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The lengths _truncate_pair leaves, in closed form. The longer side is cut first, so either only it is cut
    (to max_tokens minus the other) or both meet near half, A keeping the odd token (a tie cuts B)."""
    over = len_a + len_b > max_tokens
    keep_a = np.where(over, np.minimum(len_a, np.maximum((max_tokens + 1) // 2, max_tokens - len_b)), len_a)
    return keep_a, np.where(over, max_tokens - keep_a, len_b)


def make_plan_batch(
    plan: EpochPlan,
    spec: PlanBatch,
    spans: Callable[[np.ndarray, np.ndarray], np.ndarray],
    offsets: np.ndarray,
    ids: SpecialIds,
    mask_prob: float,
    max_predictions: int,
    generator: torch.Generator,
    multiple: int = 1,
) -> BertBatch:
    """The batch `spec` of `plan`, its rows read from the corpus now (`spans(starts, lengths)`: those token
    ranges, concatenated, as TokenArray.spans reads them): pairs truncated as _truncate_pair (A loses tokens
    at its start, B at its end), laid out as collate_pairs, masked by mask_tokens."""
    rows, offsets = spec.rows, np.asarray(offsets)
    a_first, a_end = offsets[plan.sample_map[rows, FIRST]], offsets[plan.a_end[rows]]  # (B,) token positions
    b_first = offsets[plan.b_start[rows]]
    keep_a, keep_b = truncated_lengths(a_end - a_first, offsets[plan.b_end[rows]] - b_first, plan.max_seq_len - 3)
    input_ids, segments = _pack_pairs(
        spans(a_end - keep_a, keep_a), keep_a, spans(b_first, keep_b), keep_b, ids, multiple
    )
    nsp = torch.from_numpy(np.where(plan.is_next[rows], IS_NEXT, NOT_NEXT))
    masked, labels = mask_tokens(input_ids, ids, mask_prob, max_predictions, generator)
    return BertBatch(
        masked, segments, labels, nsp, masked=int(labels.ne(IGNORE).sum()), real_tokens=int(input_ids.ne(ids.pad).sum())
    )


def _pack_pairs(
    a_tokens: np.ndarray, a_len: np.ndarray, b_tokens: np.ndarray, b_len: np.ndarray, ids: SpecialIds, multiple: int
) -> tuple[Tensor, Tensor]:
    """(B, T) rows `[CLS] A [SEP] B [SEP] [PAD]...` from the rows' A and B tokens (each concatenated, with their
    lengths), and their segment ids (B and its [SEP] are 1); T is the longest row rounded up to a multiple of
    `multiple`."""
    B = len(a_len)
    T = bucket(int((a_len + b_len).max() + 3), multiple)
    row = np.arange(B)
    input_ids = np.full((B, T), ids.pad, dtype=np.int64)
    input_ids[np.repeat(row, a_len), ranges(np.ones(B, np.int64), a_len)] = a_tokens  # A at columns 1 .. a_len
    input_ids[np.repeat(row, b_len), ranges(a_len + 2, b_len)] = b_tokens  # B after [CLS] A [SEP]
    input_ids[:, 0] = ids.cls
    input_ids[row, a_len + 1] = ids.sep
    input_ids[row, a_len + b_len + 2] = ids.sep
    b_col = np.arange(T)[None, :] - (a_len + 2)[:, None]  # (B, T) position within B
    segments = ((b_col >= 0) & (b_col <= b_len[:, None])).astype(np.int64)
    return torch.from_numpy(input_ids), torch.from_numpy(segments)
