"""Parallel text -> token pairs -> length-bucketed token batches.

Files are `{dir}/{split}.{lang}`, one sentence per line, or (data.format: tsv) one file `{dir}/{split}` of
tab-separated columns, as Tatoeba/Anki exports pairs (`source<TAB>target<TAB>attribution`). The source gets EOS
appended; the target is fed as [BOS] y (decoder input) and scored against y [EOS] (labels).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from transformer_cli.core.buckets import bucket
from transformer_cli.core.errors import UserError
from transformer_cli.core.text import LineIndex, index_lines, read_block, read_lines, stream_lines
from transformer_cli.data import shards
from transformer_cli.data.shards import Manifest, flatten, lines_of, ranges, split_columns
from transformer_cli.vocab.spm import BOS_ID, EOS_ID, Vocab
from transformer_cli.vocab.spm import PAD_ID as PAD

if TYPE_CHECKING:  # torch is imported where a batch is built: preprocessing (`tcli preprocess`) never loads it
    import torch
    from torch import Tensor

    from transformer_cli.config import TranslationDataConfig


def split_paths(data_dir: str | Path, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    base = Path(data_dir)
    return base / f"{split}.{src_lang}", base / f"{split}.{tgt_lang}"


def data_paths(data: TranslationDataConfig, split: str, data_dir: str | Path | None = None) -> tuple[Path, Path]:
    """The source and target files of a split (format tsv: the one file, twice); `data_dir` replaces data.dir."""
    base = Path(data_dir if data_dir is not None else data.dir)
    if data.format == "tsv":
        return base / split, base / split
    return split_paths(base, split, data.src_lang, data.tgt_lang)


def data_columns(data: TranslationDataConfig) -> tuple[int, int] | None:
    """The (source, target) columns of a tsv split; None for two text files."""
    return (data.src_column, data.tgt_column) if data.format == "tsv" else None


def read_tsv(path: Path, columns: tuple[int, int]) -> tuple[list[str], list[str]]:
    """Both sides of a tab-separated file of pairs (strict UTF-8, every row checked)."""
    src, tgt = split_columns(read_lines(path), columns, str(path))
    if not src:
        raise UserError(f"{path} is empty")
    return src, tgt


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


def encode_parallel(
    src_lines: list[str],
    tgt_lines: list[str],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    max_len: int | None = None,
    split: str = "the data",
    limit: str = "data.max_len",
) -> ParallelData:
    """Tokenise; drop pairs with an empty side, and (when max_len is set) pairs with a side over max_len.
    `split` names the files in an error, `limit` where max_len comes from."""
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
            why += f", {data.dropped_long} have a side over {max_len} pieces ({limit})"
        raise UserError(f"no sentence pairs left in {split} ({why})")
    return data


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def batch_rows(max_tokens: int, width: int) -> int:
    """Rows of every batch whose widest side is `width` padded tokens: with widths from a small set, the
    batches come in a small set of shapes (see `token_batches`)."""
    return max(1, max_tokens // width)


def bucket_widths(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """`bucket(length, multiple)` of every length, through a table of the few distinct lengths."""
    table = np.array([bucket(n, multiple) for n in range(int(lengths.max(initial=0)) + 1)], dtype=np.int32)
    return table[lengths]


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
        return (
            isinstance(other, BatchPlan)
            and np.array_equal(self.order, other.order)
            and np.array_equal(self.bounds, other.bounds)
        )


def token_batches(
    src_lens: Sequence[int] | np.ndarray,
    tgt_lens: Sequence[int] | np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    multiple: int = 1,
) -> BatchPlan:
    """Group sentence indices into batches of at most `max_tokens` padded tokens per side, in few shapes.

    A sentence pair's width is its longer side plus EOS (source) or BOS/EOS (target), rounded up to the size
    set of `bucket(width, multiple)` (see `collate`). Sentences are sorted by width, then target and source
    length, longest first (ties in a random order drawn from seed and epoch), so that a batch holds sentences
    of similar length and padding stays low, and cut into batches of exactly `batch_rows(max_tokens, width)`
    sentences, width being that of the batch's first (widest) sentence; only the epoch's last batch may be
    short (`collate` fills it up with empty rows). A batch's shape is thus a function of its width bucket and
    the other side's, from a set of at most (number of widths)**2, whatever the corpus. The batch order is
    then shuffled. Vectorised over the corpus, with 32-bit arrays where they suffice (planning 4.5M pairs
    peaks at about 100 MB): only the cut points are found batch by batch. The result depends only on
    (lengths, max_tokens, seed, epoch, multiple): this is what makes resume exact.
    """
    src, tgt = np.asarray(src_lens), np.asarray(tgt_lens)  # (n,) each, any integer type: no 64-bit copies
    n = len(src)
    rng = np.random.default_rng([seed, epoch])
    width = bucket_widths(np.maximum(src, tgt).astype(np.int32) + 1, multiple)  # (n,) int32
    order = np.arange(n, dtype=np.int32 if n < 1 << 31 else np.int64)
    if shuffle:
        rng.shuffle(order)
    span = int(max(src.max(initial=0), tgt.max(initial=0))) + 2
    key = width[order].astype(np.uint64)  # (n,) width, then target, then source length, as one number
    key *= span
    key += tgt[order].astype(np.uint64)
    key *= span
    key += src[order].astype(np.uint64)
    del width
    if int(key.max(initial=0)) < 1 << 32 and n < 1 << 32:
        # A stable sort without a 64-bit index array: the position in the low 32 bits makes every key unique,
        # so an in-place sort of the packed keys orders ties as a stable sort would.
        key <<= 32
        for start in range(0, n, 1 << 20):
            key[start : start + (1 << 20)] |= np.arange(start, min(start + (1 << 20), n), dtype=np.uint64)
        key.sort()
        order = order[key & 0xFFFFFFFF]
        key >>= 32
    else:
        rows = np.argsort(key, kind="stable")
        order, key = order[rows], key[rows]
    order, key = np.ascontiguousarray(order[::-1]), key[::-1]  # widest first: a batch's first sentence sets it
    width = (key // (span * span)).astype(np.int32)  # (n,) in the sorted order
    del key
    cuts = [0]
    while cuts[-1] < n:
        cuts.append(min(n, cuts[-1] + batch_rows(max_tokens, int(width[cuts[-1]]))))
    del width
    bounds = np.asarray(cuts, dtype=np.int64)
    if shuffle:
        perm = rng.permutation(len(bounds) - 1)
        order = np.concatenate([order[bounds[j] : bounds[j + 1]] for j in perm] or [order[:0]])
        bounds = np.concatenate([[0], np.cumsum(np.diff(bounds)[perm])])
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
        return Batch(src, tgt_in, labels, tokens=int(labels.ne(PAD).sum()), src_tokens=int(src.ne(PAD).sum()))

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(
            self.src.to(device, non_blocking=nb),
            self.tgt_in.to(device, non_blocking=nb),
            self.labels.to(device, non_blocking=nb),
            self.tokens,
            self.src_tokens,
        )


def pad_sequences(
    seqs: list[list[int]], pad_id: int, prefix: int | None = None, suffix: int | None = None, multiple: int = 1
) -> Tensor:
    """Right-padded (B, width) tensor of `[prefix] seq [suffix]`, width rounded up to a multiple of `multiple`."""
    return padded(*flatten(seqs), pad_id, prefix, suffix, multiple)


def padded(
    flat: np.ndarray,
    lengths: np.ndarray,
    pad_id: int,
    prefix: int | None = None,
    suffix: int | None = None,
    multiple: int = 1,
    width: int | None = None,
    rows: int | None = None,
) -> Tensor:
    """(rows, width) long tensor of `[prefix] seq [suffix]` per row, right-padded; the B sequences come
    concatenated in `flat` with their `lengths`. Vectorised: one scatter for all rows. `width` defaults to the
    longest row rounded up to a multiple of `multiple`; `rows` (default B) adds rows holding only the prefix."""
    B, first = len(lengths), int(prefix is not None)
    if width is None:
        width = round_up(int(lengths.max(initial=0)) + first + (suffix is not None), multiple)
    out = np.full((max(B, rows or 0), width), pad_id, dtype=np.int64)
    rows = np.repeat(np.arange(B), lengths)  # (total,) row of every token
    cols = ranges(np.full(B, first), lengths)  # (total,) its column
    out[rows, cols] = flat
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[np.arange(B), lengths + first] = suffix
    import torch

    return torch.from_numpy(out)


def make_batch(
    src: np.ndarray,
    src_lens: np.ndarray,
    tgt: np.ndarray,
    tgt_lens: np.ndarray,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    multiple: int = 1,
    max_tokens: int | None = None,
) -> Batch:
    """The padded tensors of B pairs given as flat ids and lengths. Each side's width is its longest row plus
    EOS (or BOS) rounded up to `bucket(width, multiple)`, and with `max_tokens` the batch is filled up to
    `batch_rows(max_tokens, wider side)` rows with empty pairs (source EOS, target BOS, no labels): a CPU
    matmul library compiles a kernel per matmul shape and the allocator keeps blocks per size, so a few
    shapes that repeat are worth a little padding (see `token_batches`)."""
    S = bucket(int(src_lens.max(initial=0)) + 1, multiple)
    T = bucket(int(tgt_lens.max(initial=0)) + 1, multiple)
    rows = batch_rows(max_tokens, max(S, T)) if max_tokens is not None else None
    src_ids = padded(src, src_lens, pad_id, suffix=eos_id, width=S, rows=rows)
    src_ids[len(src_lens) :, 0] = eos_id  # filler rows: one real source token, so attention has a key
    return Batch(
        src=src_ids,
        tgt_in=padded(tgt, tgt_lens, pad_id, prefix=bos_id, width=T, rows=rows),
        labels=padded(tgt, tgt_lens, pad_id, suffix=eos_id, width=T, rows=rows),
        tokens=int(tgt_lens.sum()) + len(tgt_lens),
        src_tokens=int(src_lens.sum()) + len(src_lens),
    )


def collate(
    data: ParallelData,
    indices: Sequence[int],
    pad_id: int,
    bos_id: int,
    eos_id: int,
    multiple: int = 1,
    max_tokens: int | None = None,
) -> Batch:
    """The batch of the pairs `indices` of in-memory data (see `make_batch`)."""
    src = flatten([data.src[i] for i in indices])
    tgt = flatten([data.tgt[i] for i in indices])
    return make_batch(*src, *tgt, pad_id, bos_id, eos_id, multiple, max_tokens)


class ShardedPairs:
    """A preprocessed split read straight from its memory-mapped arrays: lengths as numpy arrays, sentences
    fetched per batch, nothing per sentence in Python."""

    def __init__(self, manifest: Manifest, split: str):
        self.src, self.tgt = manifest.array(split, "src"), manifest.array(split, "tgt")
        self.src_lens, self.tgt_lens = self.src.lengths(), self.tgt.lengths()  # (n,) uint16 (or int32) each

    def __len__(self) -> int:
        return len(self.src_lens)

    def batch(self, rows: np.ndarray, multiple: int = 1, max_tokens: int | None = None) -> Batch:
        return make_batch(*self.src.gather(rows), *self.tgt.gather(rows), PAD, BOS_ID, EOS_ID, multiple, max_tokens)

    def load(self, max_len: int | None = None) -> ParallelData:
        """The split as in-memory token lists (for validation and test sets), without pairs longer than max_len;
        the reference text stays on disk until it is scored."""
        keep = np.arange(len(self))
        if max_len is not None:
            keep = keep[(self.src_lens <= max_len) & (self.tgt_lens <= max_len)]
        sides = []
        for array in (self.src, self.tgt):
            flat, lengths = array.gather(keep)
            sides.append([ids.tolist() for ids in np.split(flat, np.cumsum(lengths)[:-1])] if len(keep) else [])
        data = ParallelData(*sides, [], [])
        data.references_file, data.reference_rows = (
            self.src.path.with_name(self.src.path.name.replace(".src.bin", ".ref")),
            keep,
        )
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
    columns: tuple[int, int] | None = None  # a tsv split: `src` = `tgt` is one file, these its columns

    def side_lines(self, side: str) -> Iterator[str]:
        """The source ("src") or target ("tgt") sentences, streamed in bounded memory."""
        if self.columns is None:
            yield from lines_of(stream_lines(self.src if side == "src" else self.tgt))
            return
        first = 0
        for lines in stream_lines(self.src):
            yield from split_columns(lines, self.columns, str(self.src), first)[0 if side == "src" else 1]
            first += len(lines)


def index_pair(
    src_path: Path,
    tgt_path: Path,
    block: int = shards.BLOCK_LINES,
    also: Any = None,
    columns: tuple[int, int] | None = None,
) -> tuple[LineIndex, LineIndex]:
    """Both files of a split indexed in blocks of lines (one read of each: UTF-8 checked, lines counted); a
    line-count mismatch names both files and both counts. `also`: a hashlib object fed both files' bytes.
    `columns`: the split is one tsv file (`src_path`), indexed once and every row checked."""
    if columns is not None:
        index = index_lines(src_path, block, also=also)
        if not index.lines:
            raise UserError(f"{src_path} is empty")
        for part in index.blocks():
            split_columns(read_block(part), columns, str(src_path), part.first)
        return index, index
    src, tgt = index_lines(src_path, block, also=also), index_lines(tgt_path, block, also=also)
    if src.lines != tgt.lines:
        raise UserError(
            f"line counts differ: {src_path} has {src.lines} lines, {tgt_path} has {tgt.lines}; "
            "the files must be aligned line by line"
        )
    if not src.lines:
        raise UserError(f"{src_path} and {tgt_path} are empty")
    return src, tgt


def preprocess_parallel(
    folder: Path,
    splits: list[SplitFiles],
    vocabs: tuple[Vocab, Vocab],
    quiet: bool,
    workers: int | None = None,
    indexes: dict[str, tuple[LineIndex, LineIndex]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Tokenise every split into `folder` ({split}.src/.tgt arrays, {split}.ref text); returns each split's
    counts and file sizes for the manifest. Worker processes read and tokenise blocks of lines, in order;
    `indexes` (by split name, from `index_pair`) saves reading the files once more to find the blocks."""
    dtype = shards.token_dtype(max(len(v) for v in vocabs))
    models = [vocabs[0].model_bytes] + ([vocabs[1].model_bytes] if vocabs[1] is not vocabs[0] else [])
    indexes = {s.name: (indexes or {}).get(s.name) or index_pair(s.src, s.tgt, columns=s.columns) for s in splits}
    workers = shards.choose_workers([i.size for pair in indexes.values() for i in pair], workers)
    out: dict[str, dict[str, Any]] = {}
    with shards.progress("preprocess", quiet) as bar, shards.Workers(models, workers) as pool:
        for split in splits:
            writers = {side: shards.ArrayWriter(folder, f"{split.name}.{side}", dtype) for side in ("src", "tgt")}
            refs = open(folder / f"{split.name}.ref", "w", encoding="utf-8") if split.references else None
            counts = {"lines": 0, "empty": 0, "long": 0}
            src, tgt = indexes[split.name]
            tasks = (
                (a, b, split.max_len, split.references, dtype.str, split.columns)
                for a, b in zip(src.blocks(), tgt.blocks())
            )
            for block in pool.map(shards.encode_pairs, tasks):
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
                files = str(split.src) if split.columns is not None else f"{split.src} / {split.tgt}"
                raise UserError(f"{files}: no sentence pairs left ({why}); check these files")
            names = [n for w in writers.values() for n in w.names] + ([f"{split.name}.ref"] if refs else [])
            out[split.name] = {
                "counts": {"lines": counts["lines"], "pairs": kept},
                "dropped": {"empty_side": counts["empty"], "too_long": counts["long"]},
                "tokens": {side: w.total for side, w in writers.items()},
                "files": {n: (folder / n).stat().st_size for n in names},
            }
    return out
