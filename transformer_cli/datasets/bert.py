"""BERT pretraining data: documents -> `[CLS] A [SEP] B [SEP]` pairs (NSP) -> dynamically masked batches (MLM).

Pairs follow the BERT paper and its reference `create_pretraining_data.py`: sequences are filled up to
max_seq_len from runs of consecutive sentences (a share `short_seq_prob` aims shorter); half the time B
is the text that really follows A (IsNext, label 0), half the time a span of another document
(NotNext, label 1). Masks are drawn afresh for every batch of every epoch from (seed, epoch, batch),
so resuming reproduces them exactly.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from transformer_cli.datasets.text import read_lines
from transformer_cli.errors import UserError
from transformer_cli.models.losses import IGNORE

IS_NEXT, NOT_NEXT = 0, 1

# ----------------------------------------------------------------------------- documents

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "vs.", "etc.", "e.g.", "i.e.", "jr.", "sr.", "no.",
                  "fig.", "inc.", "ltd.", "co.", "u.s.", "a.m.", "p.m."}


def split_sentences(paragraph: str) -> list[str]:
    """Rule-based splitter: break after . ! ? before a capital or digit, except after common abbreviations
    and single-letter initials."""
    pieces, start = [], 0
    for match in _SENTENCE_END.finditer(paragraph):
        candidate = paragraph[start : match.start()].rstrip()
        last_word = candidate.split()[-1].lower() if candidate.split() else ""
        if last_word in _ABBREVIATIONS or re.fullmatch(r"[a-z]\.", last_word):
            continue
        pieces.append(paragraph[start : match.end()].strip())
        start = match.end()
    pieces.append(paragraph[start:].strip())
    return [p for p in pieces if p]


def read_documents(path: Path, fmt: str, split: bool) -> list[list[str]]:
    """Documents as lists of sentences.

    text: blank lines separate documents; a line is a sentence (or a paragraph, with `split`).
    wikitext: a ` = Title = ` line starts a document; ` = = Section = = ` headings are dropped.
    """
    docs: list[list[str]] = [[]]
    for line in read_lines(path):
        text = line.strip()
        level = _heading_level(text) if fmt == "wikitext" else 0
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


def _heading_level(text: str) -> int:
    """WikiText headings: `= Title =` is level 1, `= = Section = =` level 2, ...; other lines 0."""
    words = text.split()
    if len(words) < 3 or words[0] != "=" or words[-1] != "=":
        return 0
    level = 0
    while level < len(words) and words[level] == "=":
        level += 1
    return level if level < len(words) else 0


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


def check_corpus(docs: list[list[list[int]]], name: str, fmt: str = "text") -> None:
    """At least two documents, one of them with two sentences; the advice depends on data.format."""
    if not docs:
        raise UserError(f"{name} holds no text: BERT pretraining needs documents separated by blank lines")
    if len(docs) < 2:
        how = ("no ' = Title = ' line starts a second document; plain text with blank lines between documents "
               "needs data.format: text" if fmt == "wikitext"
               else "separate documents with a blank line, or use data.format: wikitext for WikiText files")
        raise UserError(f"{name} holds a single document; next sentence prediction needs at least two ({how})")
    if not any(len(d) >= 2 for d in docs):
        raise UserError(f"{name}: no document has two sentences, so there is no real next sentence "
                        "(one sentence per line, or set data.split_sentences: true)")


def make_instances(docs: list[list[list[int]]], max_seq_len: int, short_seq_prob: float,
                   rng: random.Random) -> list[Instance]:
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
        return BertBatch(ids, self.segment_ids[rank::world], labels, self.nsp_labels[rank::world],
                         masked=int(labels.ne(IGNORE).sum()), real_tokens=int(ids.ne(0).sum()))

    def to(self, device: torch.device) -> BertBatch:
        nb = device.type == "cuda"
        return BertBatch(self.input_ids.to(device, non_blocking=nb), self.segment_ids.to(device, non_blocking=nb),
                         self.mlm_labels.to(device, non_blocking=nb), self.nsp_labels.to(device, non_blocking=nb),
                         self.masked, self.real_tokens)


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
    rounded up to a multiple of `multiple` (few repeating shapes, as in translation batches)."""
    T = -(-max(len(x) for x in instances) // multiple) * multiple
    input_ids = torch.full((len(instances), T), ids.pad, dtype=torch.long)
    segments = torch.zeros((len(instances), T), dtype=torch.long)
    for row, x in enumerate(instances):
        seq = [ids.cls, *x.tokens_a, ids.sep, *x.tokens_b, ids.sep]
        input_ids[row, : len(seq)] = torch.tensor(seq)
        segments[row, len(x.tokens_a) + 2 : len(seq)] = 1
    nsp = torch.tensor([IS_NEXT if x.is_next else NOT_NEXT for x in instances])
    return input_ids, segments, nsp


def mask_tokens(input_ids: Tensor, ids: SpecialIds, mask_prob: float, max_predictions: int,
                generator: torch.Generator) -> tuple[Tensor, Tensor]:
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


def make_batch(instances: list[Instance], ids: SpecialIds, mask_prob: float, max_predictions: int,
               generator: torch.Generator, multiple: int = 1) -> BertBatch:
    input_ids, segments, nsp = collate_pairs(instances, ids, multiple)
    masked, labels = mask_tokens(input_ids, ids, mask_prob, max_predictions, generator)
    return BertBatch(masked, segments, labels, nsp, masked=int(labels.ne(IGNORE).sum()),
                     real_tokens=int(input_ids.ne(ids.pad).sum()))


def encode_documents(vocab, docs: list[list[str]]) -> list[list[list[int]]]:
    """Documents of sentences -> documents of token-id lists; empty sentences and documents dropped (as
    training encodes its text)."""
    flat = vocab.encode([s for d in docs for s in d])
    out, i = [], 0
    for d in docs:
        out.append([s for s in flat[i : i + len(d)] if s])
        i += len(d)
    return [d for d in out if d]
