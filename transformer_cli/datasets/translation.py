"""Parallel text -> token pairs -> length-bucketed token batches.

Files are `{dir}/{split}.{lang}`, one sentence per line. The source gets EOS appended; the target is
fed as [BOS] y (decoder input) and scored against y [EOS] (labels).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer_cli.datasets import shards
from transformer_cli.datasets.shards import Manifest, flatten, ranges
from transformer_cli.datasets.text import read_lines, stream_lines
from transformer_cli.errors import UserError
from transformer_cli.vocab import BOS_ID, EOS_ID, Vocab
from transformer_cli.vocab import PAD_ID as PAD


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
    """Token ids of the kept pairs (no specials) and their raw text (or, for preprocessed data, the file that
    holds the references and which of its lines are kept: read when the split is scored)."""

    src: list[list[int]]
    tgt: list[list[int]]
    src_text: list[str]
    tgt_text: list[str]
    dropped_empty: int = 0
    dropped_long: int = 0
    references_file: Path | None = None
    reference_rows: Any = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.src)

    def references(self) -> list[str]:
        """The target text of the kept pairs, as scored by BLEU."""
        if self.references_file is None:
            return self.tgt_text
        lines = read_lines(self.references_file)
        return [lines[i] for i in self.reference_rows]


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


class BatchPlan:
    """An epoch's batches as two arrays, with no Python object per sentence: batch j holds the sentences
    `order[bounds[j]:bounds[j + 1]]`. Indexing gives a batch (an index array); slicing a list of them."""

    def __init__(self, order: np.ndarray, bounds: np.ndarray):
        self.order, self.bounds = order, bounds

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            return [self[j] for j in range(*key.indices(len(self)))]
        if key < 0:
            key += len(self)
        return self.order[self.bounds[key] : self.bounds[key + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[j] for j in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, BatchPlan) and np.array_equal(self.order, other.order)
                and np.array_equal(self.bounds, other.bounds))


def token_batches(src_lens: Sequence[int] | np.ndarray, tgt_lens: Sequence[int] | np.ndarray, max_tokens: int,
                  seed: int, epoch: int, shuffle: bool = True, multiple: int = 1) -> BatchPlan:
    """Group sentence indices into batches of at most `max_tokens` padded tokens per side.

    A sentence pair's width is its longer side plus EOS (source) or BOS/EOS (target), padded up to a multiple
    of `multiple` (see `collate`). Sentences are sorted by width (ties in a random order drawn from seed and
    epoch), so that a batch holds sentences of similar length and padding stays low, and cut greedily into
    batches of n sentences with n * width <= max_tokens; the batch order is then shuffled. Vectorised over
    the corpus: only the cut points are found batch by batch. The result depends only on (lengths,
    max_tokens, seed, epoch, multiple): this is what makes resume exact.
    """
    src = np.asarray(src_lens, dtype=np.int64)
    tgt = np.asarray(tgt_lens, dtype=np.int64)
    n = len(src)
    rng = np.random.default_rng([seed, epoch])
    width = -(-(np.maximum(src, tgt) + 1) // multiple) * multiple  # (n,)
    order = rng.permutation(n) if shuffle else np.arange(n)
    span = int(max(src.max(initial=0), tgt.max(initial=0))) + 2
    key = (width[order] * span + tgt[order]) * span + src[order]  # width, then target, then source length
    order = order[np.argsort(key, kind="stable")]
    width = width[order]
    cuts = [0]
    while cuts[-1] < n:
        s = cuts[-1]
        window = width[s : s + max_tokens // int(width[s]) + 1]  # no batch from s holds more sentences
        cost = np.arange(1, len(window) + 1) * window  # (k,) padded tokens of the first k sentences: increasing
        cuts.append(s + max(1, int(np.searchsorted(cost, max_tokens, side="right"))))
    bounds = np.asarray(cuts, dtype=np.int64)
    if shuffle:
        perm = rng.permutation(len(bounds) - 1)
        sizes = np.diff(bounds)[perm]
        order = order[ranges(bounds[:-1][perm], sizes)]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
    return BatchPlan(order, bounds)


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
    return padded(*flatten(seqs), pad_id, prefix, suffix, multiple)


def padded(flat: np.ndarray, lengths: np.ndarray, pad_id: int, prefix: int | None = None, suffix: int | None = None,
           multiple: int = 1) -> Tensor:
    """(B, width) long tensor of `[prefix] seq [suffix]` per row, right-padded; the B sequences come
    concatenated in `flat` with their `lengths`. Vectorised: one scatter for all rows."""
    B, first = len(lengths), int(prefix is not None)
    width = round_up(int(lengths.max(initial=0)) + first + (suffix is not None), multiple)
    out = np.full((B, width), pad_id, dtype=np.int64)
    rows = np.repeat(np.arange(B), lengths)  # (total,) row of every token
    cols = ranges(np.full(B, first), lengths)  # (total,) its column
    out[rows, cols] = flat
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[np.arange(B), lengths + first] = suffix
    return torch.from_numpy(out)


def make_batch(src: np.ndarray, src_lens: np.ndarray, tgt: np.ndarray, tgt_lens: np.ndarray, pad_id: int,
               bos_id: int, eos_id: int, multiple: int = 1) -> Batch:
    """The padded tensors of B pairs given as flat ids and lengths. Widths are rounded up to a multiple of
    `multiple`: on CPU, every new tensor shape costs kernel setup and leaves the allocator fragmented (memory
    grows over a run), so a few shapes that repeat are worth a little padding."""
    return Batch(
        src=padded(src, src_lens, pad_id, suffix=eos_id, multiple=multiple),
        tgt_in=padded(tgt, tgt_lens, pad_id, prefix=bos_id, multiple=multiple),
        labels=padded(tgt, tgt_lens, pad_id, suffix=eos_id, multiple=multiple),
        tokens=int(tgt_lens.sum()) + len(tgt_lens),
        src_tokens=int(src_lens.sum()) + len(src_lens),
    )


def collate(data: ParallelData, indices: Sequence[int], pad_id: int, bos_id: int, eos_id: int,
            multiple: int = 1) -> Batch:
    """The batch of the pairs `indices` of in-memory data."""
    src = flatten([data.src[i] for i in indices])
    tgt = flatten([data.tgt[i] for i in indices])
    return make_batch(*src, *tgt, pad_id, bos_id, eos_id, multiple)


class ShardedPairs:
    """A preprocessed split read straight from its memory-mapped arrays: lengths as numpy arrays, sentences
    fetched per batch, nothing per sentence in Python."""

    def __init__(self, manifest: Manifest, split: str):
        self.src, self.tgt = manifest.array(split, "src"), manifest.array(split, "tgt")
        self.src_lens, self.tgt_lens = self.src.lengths(), self.tgt.lengths()
        self._reads = 0

    def __len__(self) -> int:
        return len(self.src_lens)

    def batch(self, rows: np.ndarray, multiple: int = 1) -> Batch:
        out = make_batch(*self.src.gather(rows), *self.tgt.gather(rows), PAD, BOS_ID, EOS_ID, multiple)
        self._reads += 1
        if self._reads % 4 == 0:  # keep only the pages of recent batches mapped (see TokenArray.release)
            self.src.release()
            self.tgt.release()
        return out

    def load(self, max_len: int | None = None) -> ParallelData:
        """The split as in-memory token lists (for validation and test sets), without pairs longer than max_len;
        the reference text stays on disk until it is scored."""
        keep = np.arange(len(self))
        if max_len is not None:
            keep = keep[(self.src_lens <= max_len) & (self.tgt_lens <= max_len)]
        data = ParallelData([self.src.sentence(i) for i in keep], [self.tgt.sentence(i) for i in keep], [], [])
        data.references_file, data.reference_rows = self.src.path.with_name(
            self.src.path.name.replace(".src.bin", ".ref")), keep
        return data


# ----------------------------------------------------------------------------- preprocessing


@dataclass
class SplitFiles:
    """One split to preprocess: its two files, the longest side kept (None: any) and whether its reference
    text is kept (validation and test are scored against it)."""

    name: str
    src: Path
    tgt: Path
    max_len: int | None
    references: bool


def aligned_blocks(src_path: Path, tgt_path: Path,
                   n: int = shards.BLOCK_LINES) -> Iterator[tuple[list[str], list[str]]]:
    """Blocks of n line pairs read from both files as streams; a line-count mismatch names both files and both
    counts (found when the shorter file ends)."""
    src, tgt = shards.lines_of(stream_lines(src_path)), shards.lines_of(stream_lines(tgt_path))
    seen = 0
    while True:
        a, b = list(itertools.islice(src, n)), list(itertools.islice(tgt, n))
        if len(a) != len(b):
            na, nb = seen + len(a) + sum(1 for _ in src), seen + len(b) + sum(1 for _ in tgt)
            raise UserError(f"line counts differ: {src_path} has {na} lines, {tgt_path} has {nb}; "
                            "the files must be aligned line by line")
        if not a:
            if not seen:
                raise UserError(f"{src_path} and {tgt_path} are empty")
            return
        seen += len(a)
        yield a, b


def _encode_block(task: tuple[list[str], list[str], int | None, bool, str]) -> dict[str, Any]:
    """Worker: tokenise a block of pairs, drop pairs with an empty side or a side over max_len."""
    src_lines, tgt_lines, max_len, references, dtype = task
    src_sp, tgt_sp = shards._MODELS[0], shards._MODELS[-1]
    nonempty = [i for i, (s, t) in enumerate(zip(src_lines, tgt_lines)) if s.strip() and t.strip()]
    src, src_lens = flatten(src_sp.encode([src_lines[i] for i in nonempty], num_threads=1))
    tgt, tgt_lens = flatten(tgt_sp.encode([tgt_lines[i] for i in nonempty], num_threads=1))
    keep = np.ones(len(nonempty), dtype=bool)
    if max_len is not None:
        keep = (src_lens <= max_len) & (tgt_lens <= max_len)
    if not keep.all():
        src, tgt = src[np.repeat(keep, src_lens)], tgt[np.repeat(keep, tgt_lens)]
        src_lens, tgt_lens = src_lens[keep], tgt_lens[keep]
    refs = [tgt_lines[nonempty[i]] for i in np.flatnonzero(keep)] if references else None
    return {"src": src.astype(dtype), "src_lens": src_lens, "tgt": tgt.astype(dtype), "tgt_lens": tgt_lens,
            "lines": len(src_lines), "empty": len(src_lines) - len(nonempty), "long": int((~keep).sum()),
            "refs": refs}


def preprocess_parallel(folder: Path, splits: list[SplitFiles], vocabs: tuple[Vocab, Vocab], quiet: bool,
                        workers: int | None = None) -> dict[str, dict[str, Any]]:
    """Tokenise every split into `folder` ({split}.src/.tgt arrays, {split}.ref text); returns each split's
    counts and file sizes for the manifest. Blocks are tokenised in worker processes, in order."""
    dtype = shards.token_dtype(max(len(v) for v in vocabs))
    models = [vocabs[0].model_bytes] + ([vocabs[1].model_bytes] if vocabs[1] is not vocabs[0] else [])
    workers = shards.choose_workers([p for s in splits for p in (s.src, s.tgt)], workers)
    out: dict[str, dict[str, Any]] = {}
    with shards.progress("preprocess", quiet) as bar:
        for split in splits:
            writers = {side: shards.ArrayWriter(folder, f"{split.name}.{side}", dtype) for side in ("src", "tgt")}
            refs = open(folder / f"{split.name}.ref", "w", encoding="utf-8") if split.references else None
            counts = {"lines": 0, "empty": 0, "long": 0}
            blocks = aligned_blocks(split.src, split.tgt)
            tasks = ((a, b, split.max_len, split.references, dtype.str) for a, b in blocks)
            for block in shards.ordered_map(_encode_block, tasks, models, workers):
                for side in ("src", "tgt"):
                    writers[side].add(block[side], block[f"{side}_lens"])
                if refs is not None:
                    refs.write("".join(line + "\n" for line in block["refs"]))
                for key in counts:
                    counts[key] += block[key]
                bar.update(block["lines"])
            for writer in writers.values():
                writer.close()
            if refs is not None:
                refs.close()
            kept = writers["src"].count
            if not kept:
                why = f"{counts['empty']} of {counts['lines']} have an empty side"
                if split.max_len is not None:
                    why += f", {counts['long']} have a side over {split.max_len} pieces (data.max_len)"
                raise UserError(f"{split.name}: no sentence pairs left ({why}); check the {split.name} files")
            names = [n for w in writers.values() for n in w.names] + ([f"{split.name}.ref"] if refs else [])
            out[split.name] = {"counts": {"lines": counts["lines"], "pairs": kept},
                               "dropped": {"empty_side": counts["empty"], "too_long": counts["long"]},
                               "tokens": {side: w.total for side, w in writers.items()},
                               "files": {n: (folder / n).stat().st_size for n in names}}
    return out
