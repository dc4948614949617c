"""Parallel text -> token pairs -> length-bucketed token batches.

Files are `{dir}/{split}.{lang}`, one sentence per line. The source gets EOS appended; the target is
fed as [BOS] y (decoder input) and scored against y [EOS] (labels).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from transformer_cli.datasets.text import read_lines
from transformer_cli.errors import UserError
from transformer_cli.vocab import PAD_ID as PAD
from transformer_cli.vocab import Vocab


def split_paths(data_dir: str | Path, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    base = Path(data_dir)
    return base / f"{split}.{src_lang}", base / f"{split}.{tgt_lang}"


def read_parallel(src_path: Path, tgt_path: Path) -> tuple[list[str], list[str]]:
    """Both sides of a split; a line-count mismatch names both files and both counts."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise UserError(
            f"line counts differ: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}; "
            "the files must be aligned line by line"
        )
    if not src:
        raise UserError(f"{src_path} and {tgt_path} are empty")
    return src, tgt


@dataclass
class ParallelData:
    """Token ids of the kept pairs (no specials) and their raw text."""

    src: list[list[int]]
    tgt: list[list[int]]
    src_text: list[str]
    tgt_text: list[str]
    dropped_empty: int = 0
    dropped_long: int = 0

    def __len__(self) -> int:
        return len(self.src)


def encode_parallel(src_lines: list[str], tgt_lines: list[str], src_vocab: Vocab, tgt_vocab: Vocab,
                    max_len: int | None = None, split: str = "the data") -> ParallelData:
    """Tokenise; drop pairs with an empty side, and (when max_len is set) pairs with a side over max_len."""
    keep = [i for i, (s, t) in enumerate(zip(src_lines, tgt_lines)) if s.strip() and t.strip()]
    dropped_empty = len(src_lines) - len(keep)
    src_text = [src_lines[i] for i in keep]
    tgt_text = [tgt_lines[i] for i in keep]
    src_ids, tgt_ids = src_vocab.encode(src_text), tgt_vocab.encode(tgt_text)
    data = ParallelData([], [], [], [], dropped_empty=dropped_empty)
    for s, t, st, tt in zip(src_ids, tgt_ids, src_text, tgt_text):
        if max_len is not None and (len(s) > max_len or len(t) > max_len):
            data.dropped_long += 1
            continue
        data.src.append(s)
        data.tgt.append(t)
        data.src_text.append(st)
        data.tgt_text.append(tt)
    if not data.src:
        why = f"{data.dropped_empty} of {len(src_lines)} have an empty side"
        if max_len is not None:
            why += f", {data.dropped_long} have a side over {max_len} pieces (data.max_len)"
        raise UserError(f"{split}: no sentence pairs left ({why}); check the {split} files")
    return data


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def token_batches(src_lens: list[int], tgt_lens: list[int], max_tokens: int, seed: int, epoch: int,
                  shuffle: bool = True, multiple: int = 1) -> list[list[int]]:
    """Group sentence indices into batches of at most `max_tokens` padded tokens per side.

    Sentences are sorted by length (ties in a random order drawn from seed and epoch) so that a
    batch holds sentences of similar length and padding stays low; the batch order is then shuffled.
    Widths count the padding up to a multiple of `multiple` (see `collate`).
    The result depends only on (lengths, max_tokens, seed, epoch): this is what makes resume exact.
    """
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(src_lens)))
    if shuffle:
        rng.shuffle(order)
    order.sort(key=lambda i: (tgt_lens[i], src_lens[i]))
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order:
        width = round_up(max(src_lens[i], tgt_lens[i]) + 1, multiple)  # + EOS (source), BOS/EOS (target)
        if batch and (len(batch) + 1) * max(longest, width) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, width)
    if batch:
        batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


@dataclass
class Batch:
    src: Tensor  # (B, S) source ids + EOS, padded
    tgt_in: Tensor  # (B, T) BOS + target ids, padded
    labels: Tensor  # (B, T) target ids + EOS, padded
    tokens: int  # non-padding target tokens (= label positions)
    src_tokens: int

    @property
    def counts(self) -> dict[str, int]:
        """Normalisers of the loss terms: the loss is averaged over target tokens."""
        return {"tokens": self.tokens}

    @property
    def throughput_tokens(self) -> int:
        return self.tokens

    @property
    def rows(self) -> int:
        return self.src.size(0)

    def shard(self, rank: int, world: int) -> Batch | None:
        """Rows rank, rank + world, ... (this process's share of a global batch); None if there are none."""
        if world == 1:
            return self
        src, tgt_in, labels = self.src[rank::world], self.tgt_in[rank::world], self.labels[rank::world]
        if src.size(0) == 0:
            return None
        return Batch(src, tgt_in, labels, tokens=int(labels.ne(PAD).sum()),
                     src_tokens=int(src.ne(PAD).sum()))

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(self.src.to(device, non_blocking=nb), self.tgt_in.to(device, non_blocking=nb),
                     self.labels.to(device, non_blocking=nb), self.tokens, self.src_tokens)


def pad_sequences(seqs: list[list[int]], pad_id: int, prefix: int | None = None, suffix: int | None = None,
                  multiple: int = 1) -> Tensor:
    """Right-padded (B, width) tensor of `[prefix] seq [suffix]`, width rounded up to a multiple of `multiple`."""
    extra = (prefix is not None) + (suffix is not None)
    width = round_up(max(map(len, seqs)) + extra, multiple)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for row, seq in enumerate(seqs):
        full = ([prefix] if prefix is not None else []) + seq + ([suffix] if suffix is not None else [])
        out[row, : len(full)] = torch.tensor(full, dtype=torch.long)
    return out


def collate(data: ParallelData, indices: list[int], pad_id: int, bos_id: int, eos_id: int,
            multiple: int = 1) -> Batch:
    """Padded tensors of the pairs `indices`. Widths are rounded up to a multiple of `multiple`: on CPU,
    every new tensor shape costs kernel setup and leaves the allocator fragmented (memory grows over a
    run), so a few shapes that repeat are worth a little padding."""
    src = [data.src[i] for i in indices]
    tgt = [data.tgt[i] for i in indices]
    return Batch(
        src=pad_sequences(src, pad_id, suffix=eos_id, multiple=multiple),
        tgt_in=pad_sequences(tgt, pad_id, prefix=bos_id, multiple=multiple),
        labels=pad_sequences(tgt, pad_id, suffix=eos_id, multiple=multiple),
        tokens=sum(map(len, tgt)) + len(tgt),
        src_tokens=sum(map(len, src)) + len(src),
    )
