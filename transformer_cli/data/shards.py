"""Preprocessed corpora: text tokenised once into flat memory-mapped arrays (as fairseq's MMapIndexedDataset,
Megatron-LM's .bin/.idx pairs and nanoGPT's train.bin), so that training never reads or tokenises text again
and its memory does not grow with the corpus.

A preprocessed folder holds, per split and side (translation: `src`, `tgt`; BERT: `text`):

    {split}.{side}.bin   token ids, little-endian, dtype from the manifest (uint16 below 65,536 pieces, else int32)
    {split}.{side}.idx   int64 offsets, one more than the sentences: sentence i = bin[idx[i]:idx[i+1]]
    {split}.docs         (BERT) int64 sentence numbers where documents start, plus the sentence count at the end
    {split}.ref          (translation, validation and test) the target text of the kept pairs, one per line
    vocab/*.model        the sentencepiece model(s) the ids come from
    manifest.json        written last, atomically: the format, the vocabulary's hash, the source files' sizes and
                         hashes, the settings, and per split the counts, the dropped pairs by reason and the files'
                         sizes; a folder without it is an interrupted preprocess and is never used

Tokenising runs in worker processes, one per core, on blocks of lines read as a stream; only a bounded number
of blocks is in flight, so a corpus of any size is preprocessed in bounded memory.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import mmap
import os
import random
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from transformer_cli.core.errors import UserError, quote
from transformer_cli.core.files import write_atomic
from transformer_cli.core.sentences import heading_level, split_sentences
from transformer_cli.core.text import (
    Block,
    LineIndex,
    check_document_counts,
    fingerprint,
    read_block,
)

FORMAT = "tcli-shards/1"
MANIFEST = "manifest.json"
BLOCK_LINES = 20_000  # lines per tokenising task
IN_PROCESS_BYTES = 8 << 20  # smaller inputs are tokenised in this process (starting workers costs more)
# The vocabulary's training sample holds at most this many characters: sentencepiece's memory grows with the
# characters of its input (measured: docs/benchmarks/data-at-scale.md), so vocabulary training stays within 2 GB.
SAMPLE_CHARS = 50_000_000


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size < 65_536 else np.dtype("<i4")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def describe_file(path: Path) -> dict[str, Any]:
    """Size and sha256 of a source file, read in blocks."""
    digest = fingerprint([path])  # a missing or unreadable file is a one-line error here
    return {"size": path.stat().st_size, "sha256": digest}


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# ----------------------------------------------------------------------------- reading


class TokenArray:
    """One `{name}.bin` / `{name}.idx` pair: sentences are read without loading the files.

    `gather` reads sentences with pread, so that no page of the files is mapped into this process (a read
    through a memory map maps the 64 KB around every page it touches, megabytes for a batch of scattered
    sentences): resident memory stays that of the batches in use. `tokens` and `offsets` are the same files
    memory-mapped, for whole-corpus array code (BERT's sample map); `release()` drops this process's mapping
    of the pages read through them so far. Either way, every process reading the same files shares their
    pages in the OS page cache: torchrun ranks hold no private copy.
    """

    def __init__(self, folder: Path, name: str, dtype: np.dtype):
        self.path = folder / f"{name}.bin"
        self.tokens = _map(self.path, dtype)
        self.offsets = _map(folder / f"{name}.idx", np.dtype("<i8"))
        if len(self.offsets) == 0 or self.offsets[-1] != len(self.tokens) or self.offsets[0] != 0:
            raise UserError(f"{self.path}: its index does not match its size; preprocess again")
        self._bin, self._idx = open(self.path, "rb"), open(self.path.with_suffix(".idx"), "rb")  # for pread

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        """(n,) sentence lengths in pieces: uint16 when all are under 65,536 (half the memory), else int32.
        The index file is read a block at a time (not through the mapping): it is never resident as a whole."""
        n, step = len(self), 1 << 20
        out = np.empty(n, np.uint16)
        with open(self.path.with_suffix(".idx"), "rb") as f:
            for start in range(0, n, step):
                block = np.diff(np.fromfile(f, "<i8", min(step, n - start) + 1, offset=0))  # (<= step,) int64
                f.seek(-8, os.SEEK_CUR)  # the next block starts at this block's last offset
                if block.max(initial=0) >= 1 << 16 and out.dtype == np.uint16:
                    out = out.astype(np.int32)
                out[start : start + len(block)] = block
        return out

    def gather(self, rows: np.ndarray | list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The sentences `rows` as (flat int64 ids, int64 lengths), read with pread (two reads a sentence)."""
        idx = self._idx.fileno()
        bounds = np.frombuffer(b"".join(os.pread(idx, 16, 8 * r) for r in np.asarray(rows).tolist()), "<i8")
        if len(bounds) != 2 * len(rows):
            raise UserError(f"{self.path} changed while training read it; preprocess again")
        starts, lengths = bounds[0::2], bounds[1::2] - bounds[0::2]  # (B,) each
        return self.spans(starts, lengths), lengths

    def spans(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Tokens [starts[i], starts[i] + lengths[i]) for every i, concatenated as int64, read with pread."""
        fd, item = self._bin.fileno(), self.tokens.dtype.itemsize
        data = b"".join(
            os.pread(fd, n * item, a * item) for a, n in zip(np.asarray(starts).tolist(), np.asarray(lengths).tolist())
        )
        flat = np.frombuffer(data, self.tokens.dtype)
        if len(flat) != int(np.sum(lengths)):
            raise UserError(f"{self.path} changed while training read it; preprocess again")
        return flat.astype(np.int64)

    def sentence(self, i: int) -> list[int]:
        return self.gather([i])[0].tolist()

    def release(self) -> None:
        for array in (self.tokens, self.offsets):
            _release(array)

    def close(self) -> None:
        """Close the files read with pread (the mappings go with the arrays)."""
        self._bin.close()
        self._idx.close()


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated aranges: [starts[0], starts[0] + lengths[0]), [starts[1], ...), ... as one index array."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    shift = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)  # (total,)
    return np.arange(total, dtype=np.int64) + shift


def _map(path: Path, dtype: np.dtype) -> np.ndarray:
    """The file as a read-only memory-mapped array (for whole-corpus array code; batches use pread)."""
    try:
        size = path.stat().st_size
        if size == 0:
            return np.zeros(0, dtype)
        if size % dtype.itemsize:
            raise UserError(
                f"{path} is truncated ({size} bytes is not a whole number of {dtype} values); preprocess again"
            )
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}; preprocess again") from None
    return np.frombuffer(mapped, dtype=dtype)


def mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """The mmap behind an array made by `_map` (numpy keeps a memoryview of it as the array's base)."""
    base = array.base
    base = getattr(base, "obj", base)
    return base if isinstance(base, mmap.mmap) else None


def _release(array: np.ndarray) -> None:
    mapped = mapping_of(array)
    if mapped is not None and hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_DONTNEED)


@dataclass
class Manifest:
    folder: Path
    data: dict[str, Any]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data["dtype"])

    def split(self, name: str) -> dict[str, Any]:
        if name not in self.data["splits"]:
            raise UserError(
                f"{self.folder / MANIFEST} has no split {name!r} (it has {', '.join(map(repr, self.data['splits']))}); "
                "run tcli preprocess again with this config"
            )
        return self.data["splits"][name]

    def array(self, split: str, side: str) -> TokenArray:
        return TokenArray(self.folder, f"{split}.{side}", self.dtype)

    def vocab_paths(self) -> list[Path]:
        return [self.folder / "vocab" / f"{name}.model" for name in self.data["vocab_files"]]


def read_manifest(folder: Path, kind: str) -> Manifest:
    """A complete preprocessed folder of this kind, or a one-line error; file sizes are checked against the
    manifest (a truncated array is caught here, before training)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"data.preprocessed: {folder} is not a folder; run tcli preprocess --out {folder} first")
    path = folder / MANIFEST
    if not path.is_file():
        raise UserError(f"{folder} has no {MANIFEST}: its preprocessing did not finish; run tcli preprocess again")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise UserError(f"{path} is damaged ({e}); run tcli preprocess again") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{path} is not a tcli preprocessed-data manifest (format {FORMAT}); run tcli preprocess")
    if data.get("kind") != kind:
        raise UserError(f"{folder} holds {data.get('kind')} data, not {kind} data; preprocess with the {kind} config")
    damage = _structure_damage(data)
    if damage:  # a hand-edited manifest: a KeyError or a count of -3 documents in the training log
        raise UserError(f"{path} is damaged ({damage}); run tcli preprocess again")
    for split in data["splits"].values():
        for name, size in split["files"].items():
            file = folder / name
            have = file.stat().st_size if file.is_file() else None
            if have != size:
                state = "is missing" if have is None else f"has {have} bytes, the manifest says {size}"
                raise UserError(f"{file} {state} (truncated or changed); run tcli preprocess again")
    for vocab in [folder / "vocab" / f"{n}.model" for n in data["vocab_files"]]:
        if not vocab.is_file() or sha256_bytes(vocab.read_bytes()) != data["vocab_sha256"][vocab.stem]:
            raise UserError(
                f"{vocab} is missing or differs from the one {folder} was tokenised with; run tcli preprocess again"
            )
    manifest = Manifest(folder, data)
    check_contents(manifest)
    return manifest


SCAN = 1 << 22  # values per block when an array is checked: memory stays bounded whatever the corpus


def _structure_damage(data: dict[str, Any]) -> str | None:
    """What is wrong with a manifest's layout (the keys tcli reads, of their types), or None."""

    def counts(value: Any) -> bool:
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(n, int) and not isinstance(n, bool) and n >= 0 for k, n in value.items()
        )

    splits, files = data.get("splits"), data.get("vocab_files")
    if not isinstance(splits, dict) or not splits:
        return "no splits"
    for name, split in splits.items():
        if not (
            isinstance(split, dict)
            and all(counts(split.get(key)) for key in ("files", "counts", "tokens"))
            and counts(split.get("dropped", {}))
        ):
            return (
                f"split {quote(name, 40)}: its files, counts, tokens and dropped must be names with sizes of 0 or more"
            )
    if not (isinstance(files, list) and files and all(isinstance(f, str) for f in files)):
        return "vocab_files"
    hashes = data.get("vocab_sha256")
    if not (isinstance(hashes, dict) and all(isinstance(hashes.get(f), str) for f in files)):
        return "vocab_sha256"
    try:
        integers = np.dtype(data.get("dtype")).kind in "iu"
    except TypeError:
        integers = False
    return None if integers else f"dtype {quote(data.get('dtype'), 20)}"


def check_contents(manifest: Manifest) -> None:
    """What sizes cannot show: every index starts at 0, never decreases and ends at its array's length,
    every token id is below its vocabulary's size, and (BERT) the document starts are sentence numbers in
    order. One pass over each file, a block at a time; a damaged file is a one-line error naming it, found
    before anything is written or trained (and `tcli preprocess` redoes such a folder)."""
    folder, data = manifest.folder, manifest.data
    sizes = {name: _vocab_size(path) for name, path in zip(data["vocab_files"], manifest.vocab_paths())}
    for split_name, split in data["splits"].items():
        held: dict[str, int] = {}  # what the files hold: rows and tokens per side, documents, reference lines
        for name in split["files"]:
            if name.endswith(".bin"):
                stem = name[: -len(".bin")]
                side = stem.rsplit(".", 1)[-1]
                limit = sizes.get(side, max(sizes.values()) if len(sizes) == 1 else min(sizes.values()))
                held[f"rows {side}"], held[f"tokens {side}"] = _check_array(folder, stem, manifest.dtype, limit)
            elif name.endswith(".docs"):
                sentences = len(TokenArray(folder, name[: -len(".docs")] + ".text", manifest.dtype))
                held["documents"] = _check_docs(folder / name, sentences)
            elif name.endswith(".ref"):
                held["references"] = _count_lines(folder / name)
        damage = _count_damage(split, held)
        if damage:  # the log would report it, and a reference file out of step would misalign BLEU
            raise UserError(
                f"{folder / MANIFEST} is damaged (split {quote(split_name, 40)}: {damage}); run tcli preprocess again"
            )


def _count_damage(split: dict[str, Any], held: dict[str, int]) -> str | None:
    """Where a split's counts and tokens in the manifest differ from what its files hold (`held`), or None.
    Translation: `pairs` rows on each side and `lines` = pairs + dropped; BERT: `sentences` rows and
    `documents`; both: tokens per side, and one reference line per row."""
    counts, tokens = split["counts"], split["tokens"]
    rows = "pairs" if "rows src" in held else "sentences"
    for key, have in held.items():
        kind, _, side = key.partition(" ")
        if kind == "rows":
            what, said = f"{rows} ({side} side)", counts.get(rows)
        elif kind == "tokens":
            what, said = f"{side} tokens", tokens.get(side)
        elif kind == "documents":
            what, said = "documents", counts.get("documents")
        else:
            what, said = "reference lines", counts.get(rows)
        if said != have:
            return f"it says {'no' if said is None else said} {what}, the files hold {have}"
    dropped = split.get("dropped")
    if dropped and counts.get("lines") != counts.get(rows, 0) + sum(dropped.values()):
        return (
            f"its {counts.get('lines')} lines are not its {counts.get(rows)} {rows} and {sum(dropped.values())} dropped"
        )
    return None


def _count_lines(path: Path) -> int:
    """Newlines in a file, read a block at a time (every line tcli writes ends with one)."""
    lines = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            lines += block.count(b"\n")
    return lines


def _vocab_size(path: Path) -> int:
    import sentencepiece as spm

    try:
        data = path.read_bytes()  # parsed from bytes: sentencepiece cannot open a path that is not UTF-8
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        size = spm.SentencePieceProcessor(model_proto=data).get_piece_size() if data else 0
    except Exception:  # sentencepiece raises RuntimeError for bytes it cannot parse
        size = 0
    if size <= 0:
        raise UserError(f"{path} is not a sentencepiece model; run tcli preprocess again")
    return size


def _check_array(folder: Path, stem: str, dtype: np.dtype, vocab_size: int) -> tuple[int, int]:
    """The array's rows and tokens, once its offsets are in order and its ids inside the vocabulary."""
    array = TokenArray(folder, stem, dtype)  # the index's first and last offsets
    try:
        offsets, tokens = array.offsets, array.tokens
        for start in range(0, len(offsets), SCAN):
            block = offsets[max(start - 1, 0) : start + SCAN]  # one value of overlap: the order across blocks
            if len(block) > 1 and bool((np.diff(block) < 0).any()):
                raise UserError(f"{array.path.with_suffix('.idx')}: its offsets go backwards; preprocess again")
        for start in range(0, len(tokens), SCAN):
            high = int(tokens[start : start + SCAN].max(initial=0))
            low = int(tokens[start : start + SCAN].min(initial=0))
            if high >= vocab_size or low < 0:
                bad = high if high >= vocab_size else low
                raise UserError(
                    f"{array.path} holds token id {bad}, outside its vocabulary of {vocab_size} pieces "
                    "(damaged or written with another vocabulary); preprocess again"
                )
        return len(array), len(tokens)
    finally:
        array.release()
        array.close()


def _check_docs(path: Path, sentences: int) -> int:
    """The number of documents, once their starts are in order and next sentence prediction can use them."""
    docs = _map(path, np.dtype("<i8"))
    if len(docs) < 2 or docs[0] != 0 or docs[-1] != sentences or bool((np.diff(docs) <= 0).any()):
        raise UserError(
            f"{path}: its document starts are not increasing sentence numbers from 0 to {sentences}; preprocess again"
        )
    longest = int(np.diff(docs).max())
    if len(docs) < 3 or longest < 2:  # as the text's check (check_document_counts) has it
        raise UserError(
            f"{path}: {len(docs) - 1} document(s), the longest of {longest} sentence(s); next "
            "sentence prediction needs two documents, one of them of two sentences or more; preprocess again"
        )
    return len(docs) - 1


# ----------------------------------------------------------------------------- writing


class ArrayWriter:
    """Appends sentences to `{name}.bin` and their offsets to `{name}.idx` as blocks arrive."""

    def __init__(self, folder: Path, name: str, dtype: np.dtype):
        self.names = (f"{name}.bin", f"{name}.idx")
        self.dtype, self.total, self.count = dtype, 0, 0
        self._bin = open(folder / self.names[0], "wb")
        self._idx = open(folder / self.names[1], "wb")
        self._idx.write(np.zeros(1, "<i8").tobytes())

    def add(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self._bin.write(flat.astype(self.dtype, copy=False).tobytes())
        self._idx.write((np.cumsum(lengths, dtype=np.int64) + self.total).astype("<i8").tobytes())
        self.total += int(lengths.sum())
        self.count += len(lengths)

    def close(self) -> None:
        for f in (self._bin, self._idx):
            f.flush()
            os.fsync(f.fileno())
            f.close()


def flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token-id lists -> (flat int64 ids, int64 lengths)."""
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
    return flat, lengths


# Worker processes: each loads the sentencepiece models of its first task, and keeps them.
_MODELS: list[Any] = []
_MODEL_BYTES: list[bytes] = []


def _load_models(model_bytes: list[bytes]) -> None:
    import sentencepiece as spm

    if model_bytes != _MODEL_BYTES:
        _MODELS[:] = [spm.SentencePieceProcessor(model_proto=b) for b in model_bytes]
        _MODEL_BYTES[:] = model_bytes


def _quiet_worker() -> None:
    """A worker speaks only through its results: a task's error travels back to the parent, which reports it.
    Ctrl-C (sent to the whole process group) is left to the parent, which stops the pool; a worker whose
    parent was killed finds its pipe broken and exits without a traceback on the user's terminal."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (open for the worker's lifetime)


def _run(job: tuple[Callable, list[bytes], Any]) -> Any:
    fn, model_bytes, task = job
    _load_models(model_bytes)
    return fn(task)


class Workers:
    """`workers` processes (0: this process), started once for all the splits; `map` runs fn(task) for every
    task, in order, with at most 2 x workers tasks in flight (Pool.imap would read the whole input ahead).
    The models travel with the tasks (a worker loads them once): a model passed at start-up would make each
    start wait for its process to boot and read it, one process after the other."""

    def __init__(self, model_bytes: list[bytes], workers: int):
        self.model_bytes, self.workers, self._pool = model_bytes, workers, None
        if workers == 0:
            return
        import multiprocessing
        import signal
        import threading

        ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (torch, tqdm)
        # Pool.terminate stops workers with SIGTERM, and a process starts with the signals its parent ignores
        # ignored: a worker must not begin life deaf to it (until its initializer runs), or terminate waits forever.
        ignored = (
            signal.getsignal(signal.SIGTERM) == signal.SIG_IGN and threading.current_thread() is threading.main_thread()
        )
        if ignored:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            self._pool = ctx.Pool(workers, initializer=_quiet_worker)
        finally:
            if ignored:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()

    def map(self, fn: Callable, tasks: Iterable[Any]) -> Iterator[Any]:
        jobs = ((fn, self.model_bytes, task) for task in tasks)
        if self._pool is None:
            yield from map(_run, jobs)
            return
        pending: collections.deque = collections.deque()
        for job in jobs:
            pending.append(self._pool.apply_async(_run, (job,)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def choose_workers(sizes: list[int], workers: int | None) -> int:
    """One worker process per core, or none (this process) for text under IN_PROCESS_BYTES."""
    if workers is not None:
        return workers
    return 0 if sum(sizes) < IN_PROCESS_BYTES or cores() == 1 else cores()


def progress(desc: str, quiet: bool):
    from tqdm import tqdm

    return tqdm(
        desc=desc,
        unit=" lines",
        unit_scale=True,
        dynamic_ncols=True,
        file=sys.stderr,
        disable=quiet or not sys.stderr.isatty(),
    )


def reservoir(lines: Iterable[str], size: int, seed: int, max_chars: int = SAMPLE_CHARS) -> list[str]:
    """At most `size` non-blank lines, and at most `max_chars` characters, drawn uniformly from a stream
    (Algorithm R): all of them, in order, when they fit; memory is bounded, whatever the stream's length.
    Over `max_chars`, random lines are dropped until the sample is a tenth under it, and the smaller size is
    kept from there on (a uniform sample of a uniform sample is uniform)."""
    rng = random.Random(seed)
    sample: list[str] = []
    seen = chars = 0
    for line in lines:
        if not line.strip():
            continue
        seen += 1
        if len(sample) < size:
            sample.append(line)
            chars += len(line)
        else:
            j = rng.randrange(seen)
            if j < size:
                chars += len(line) - len(sample[j])
                sample[j] = line
        if chars > max_chars:
            rng.shuffle(sample)
            while chars > 0.9 * max_chars:
                chars -= len(sample.pop())
            size = len(sample)
    return sample


def begin(folder: Path) -> None:
    """Start (or restart) writing a preprocessed folder: its manifest goes first, so that a folder whose
    writing is interrupted never looks complete."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)


def finish(folder: Path, manifest: dict[str, Any]) -> None:
    manifest = {"format": FORMAT, **manifest}
    write_atomic((json.dumps(manifest, indent=1) + "\n").encode(), folder / MANIFEST)


def lines_of(blocks: Iterator[list[str]]) -> Iterator[str]:
    return itertools.chain.from_iterable(blocks)


# ----------------------------------------------------------------------------- worker functions: a block each


def split_columns(lines: list[str], columns: tuple[int, int], name: str, first: int = 0) -> tuple[list[str], list[str]]:
    """The source and target sides of tab-separated rows (line `first + 1` is lines[0]). A row without both
    columns, or with an empty side, is an error naming the file and the line: a pair is never made up or
    silently dropped from a file of pairs."""
    src_col, tgt_col = columns
    need = max(columns) + 1
    src, tgt = [], []
    for number, line in enumerate(lines, first + 1):
        cells = line.split("\t", need)  # columns after the last one needed (attribution) stay joined
        if len(cells) < need:
            raise UserError(
                f"{name} line {number}: {len(cells)} tab-separated column{'s' if len(cells) > 1 else ''}, but "
                f"data.src_column {src_col} and data.tgt_column {tgt_col} need {need}; fix or remove the line"
            )
        for side, col in (("source", src_col), ("target", tgt_col)):
            if not cells[col].strip():
                raise UserError(f"{name} line {number}: the {side} (column {col}) is empty; fix or remove the line")
        src.append(cells[src_col])
        tgt.append(cells[tgt_col])
    return src, tgt


def encode_pairs(task: tuple[Block, Block, int | None, bool, str, tuple[int, int] | None]) -> dict[str, Any]:
    """Worker: read and tokenise one block of line pairs; pairs with an empty side or a side over max_len are
    dropped (and counted). `columns`: the two blocks are one block of a tsv file, these its source and target
    columns (a row without them is an error)."""
    src_block, tgt_block, max_len, references, dtype, columns = task
    if columns is not None:
        src_lines, tgt_lines = split_columns(read_block(src_block), columns, str(src_block.path), src_block.first)
    else:
        src_lines, tgt_lines = read_block(src_block), read_block(tgt_block)
    lines = len(src_lines)
    src_sp, tgt_sp = _MODELS[0], _MODELS[-1]
    nonempty = [i for i, (s, t) in enumerate(zip(src_lines, tgt_lines)) if s.strip() and t.strip()]
    if len(nonempty) < len(src_lines):
        src_lines, tgt_lines = [src_lines[i] for i in nonempty], [tgt_lines[i] for i in nonempty]
    src, src_lens = flatten(src_sp.encode(src_lines, num_threads=1))
    tgt, tgt_lens = flatten(tgt_sp.encode(tgt_lines, num_threads=1))
    keep = np.ones(len(nonempty), dtype=bool)
    if max_len is not None:
        keep = (src_lens <= max_len) & (tgt_lens <= max_len)
    if not keep.all():
        src, tgt = src[np.repeat(keep, src_lens)], tgt[np.repeat(keep, tgt_lens)]
        src_lens, tgt_lens = src_lens[keep], tgt_lens[keep]
    refs = [tgt_lines[i] for i in np.flatnonzero(keep)] if references else None
    return {
        "src": src.astype(dtype),
        "src_lens": src_lens,
        "tgt": tgt.astype(dtype),
        "tgt_lens": tgt_lens,
        "lines": lines,
        "empty": lines - len(nonempty),
        "long": int((~keep).sum()),
        "refs": refs,
    }


def encode_documents(task: tuple[Block, str, bool, str]) -> dict[str, Any]:
    """Worker: read one block of a BERT text file and tokenise its sentences, noting which start a document.
    A boundary (a blank line, or a WikiText title) before a sentence that encodes to nothing moves to the next
    sentence; one after the block's last sentence is carried to the next block (`trailing`)."""
    block, fmt, split, dtype = task
    lines = read_block(block)
    sentences: list[str] = []
    starts: list[bool] = []
    boundary = False
    for line in lines:
        text = line.strip()
        level = heading_level(text) if fmt == "wikitext" else 0
        if level or not text:
            boundary = boundary or level == 1 or (not text and fmt == "text")
            continue
        for sentence in split_sentences(text) if split else [text]:
            sentences.append(sentence)
            starts.append(boundary)
            boundary = False
    flat, lengths = flatten(_MODELS[0].encode(sentences, num_threads=1))
    kept_starts, carry = [], False
    for length, start_here in zip(lengths.tolist(), starts):
        carry = carry or start_here
        if length:
            kept_starts.append(carry)
            carry = False
    return {
        "tokens": flat.astype(dtype),
        "lengths": lengths[lengths > 0],
        "starts": np.array(kept_starts, bool),
        "trailing": carry or boundary,
        "lines": len(lines),
    }


# ----------------------------------------------------------------------------- documents (BERT)


def preprocess_documents(
    folder: Path,
    splits: dict[str, LineIndex],
    vocab: Any,
    fmt: str,
    split: bool,
    quiet: bool,
    workers: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Tokenise BERT text files into `folder`: {split}.text.bin/.idx (sentences) and {split}.docs (where the
    documents start); returns each split's counts and file sizes for the manifest. Worker processes read and
    tokenise the blocks of `splits` (from `index_lines`), in order."""
    dtype = token_dtype(len(vocab))
    workers = choose_workers([index.size for index in splits.values()], workers)
    out: dict[str, dict[str, Any]] = {}
    with progress("preprocess", quiet) as bar, Workers([vocab.model_bytes], workers) as pool:
        for name, index in splits.items():
            writer = ArrayWriter(folder, f"{name}.text", dtype)
            doc_starts: list[np.ndarray] = []
            boundary, lines = True, 0  # the first sentence starts a document
            tasks = ((block, fmt, split, dtype.str) for block in index.blocks())
            for block in pool.map(encode_documents, tasks):
                starts = block["starts"]
                if len(starts):
                    starts[0] |= boundary
                    doc_starts.append(writer.count + np.flatnonzero(starts))
                    boundary = block["trailing"]
                else:
                    boundary = boundary or block["trailing"]
                writer.add(block["tokens"], block["lengths"])
                lines += block["lines"]
                bar.update(block["lines"])
            writer.close()
            docs = np.concatenate(doc_starts + [np.array([writer.count])]).astype("<i8")
            check_document_counts(len(docs) - 1, int(np.diff(docs).max(initial=0)), str(index.path), fmt)
            (folder / f"{name}.docs").write_bytes(docs.tobytes())
            names = [*writer.names, f"{name}.docs"]
            out[name] = {
                "counts": {"lines": lines, "documents": len(docs) - 1, "sentences": writer.count},
                "tokens": {"text": writer.total},
                "files": {n: (folder / n).stat().st_size for n in names},
            }
    return out


def document_starts(folder: Path, split: str) -> np.ndarray:
    """(n_docs + 1,) int64: document d holds sentences [docs[d], docs[d + 1])."""
    return _map(folder / f"{split}.docs", np.dtype("<i8"))
