"""`tcli embed`: contextual vectors of text from a BERT encoder (a tcli BERT checkpoint, the encoder of a fine-tuned
one, or a Hugging Face BERT folder), per piece, per word or per line, from any layer.

A line is encoded as `[CLS] pieces [SEP]` (one segment), its words being its space-separated parts, each split
into pieces by the model's own tokenizer (as `tcli predict` reads a tagger's words). Layer 0 is the embeddings'
output, layer L the last block's (the encoder's output, after the final LayerNorm of a pre-norm model).
- piece: the vector of every piece ([CLS] and [SEP] left out);
- word: the mean of a word's pieces' vectors;
- sentence: the [CLS] vector (`cls`) or the mean over the line's positions, [CLS] and [SEP] included (`mean`, as
  sentence-transformers pools: padding is never part of it).

The input streams in chunks; each chunk's vectors are appended to the output's staging files before the next chunk
is read (core/arrays.py), so memory holds one chunk, whatever the number of lines. `--similarity WORD` compares
every occurrence of WORD (its characters matched in the pieces' text, so 苹果 is found inside a Chinese line
without spaces) by cosine; `--neighbours K` lists each line's nearest lines by the cosine of their sentence vectors.
"""

from __future__ import annotations

import functools
import sys
import time
import unicodedata
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from transformer_cli.core.errors import UserError
from transformer_cli.models.bert import Bert
from transformer_cli.vocab.bert_tokenizer import BertTokenizer

if TYPE_CHECKING:
    from transformer_cli.runtime.device import Runtime

LEVELS = ("piece", "word", "sentence")
POOLINGS = ("cls", "mean")
ROWS = 64  # lines per forward pass
MAX_CHUNK_LINES = 1024  # lines read before their vectors are written
CONTEXT_CHARS = 14  # characters of a line on either side of an occurrence in its label
WARNED_LINES = 3  # cut lines warned about one by one; the rest are counted at the end


@dataclass
class Encoder:
    """A BERT encoder on a device with the tokenizer its pieces come from."""

    model: Bert
    tokenizer: BertTokenizer
    runtime: Runtime
    source: str

    @property
    def layers(self) -> int:
        return len(self.model.encoder)

    @property
    def max_positions(self) -> int:
        return self.model.embeddings.position.num_embeddings


def load_encoder(source: Path, device: str = "auto", precision: str = "fp32") -> Encoder:
    """A tcli checkpoint (kind bert, or finetune: its encoder) or a Hugging Face BERT folder."""
    from transformer_cli.runtime.device import Runtime

    if source.is_dir():
        from transformer_cli.export.hf_folder import read_hf_encoder
        from transformer_cli.models.builders import build_bert

        hf = read_hf_encoder(source, f"--checkpoint {source}")
        model = build_bert(hf.encoder, hf.vocab_size, pad_id=hf.tokenizer.pad_id, pretraining_heads=False)
        model.load_state_dict(hf.weights)
        tokenizer, name = hf.tokenizer, f"Hugging Face BERT {source}"
    else:
        from transformer_cli.checkpoint import read_checkpoint

        ckpt = read_checkpoint(source)
        if ckpt.kind == "translation":
            raise UserError(
                f"{source} holds a translation model, not a BERT; tcli embed reads a BERT checkpoint (tcli "
                "pretrain-bert), a fine-tuned one (tcli finetune) or a Hugging Face BERT folder"
            )
        if ckpt.kind == "finetune":
            model, tokenizer = ckpt.build_model().bert, ckpt.finetune.tokenizer
        else:
            model = ckpt.build_model()
            tokenizer = BertTokenizer("sentencepiece", ckpt.vocabs[0].model_bytes, str(source))
        name = f"{ckpt.kind} checkpoint {source}"
    runtime = Runtime.create(device, precision)
    return Encoder(model.to(runtime.device).eval(), tokenizer, runtime, name)


def resolve_layer(layer: int | None, layers: int) -> int:
    """--layer: 0 = the embeddings, `layers` = the last block (default); negative values count from the end."""
    if layer is None:
        return layers
    if not -(layers + 1) <= layer <= layers:
        raise UserError(
            f"--layer {layer}: this model has {layers} layers: give 0 (the embeddings) to {layers} (the last), "
            f"or -1 to -{layers + 1} from the end"
        )
    return layer % (layers + 1)


@torch.inference_mode()
def layer_states(model: Bert, ids: Tensor, layer: int) -> Tensor:
    """(B, T) ids of one segment -> (B, T, d) hidden states after `layer` blocks; padding masked as keys."""
    pad_mask = ids.eq(model.pad_id)
    x = model.embeddings(ids, torch.zeros_like(ids))
    for block in model.encoder[:layer]:
        x = block(x, pad_mask)
    return model.final_norm(x) if layer == len(model.encoder) else x


# ----------------------------------------------------------------------------- lines -> pieces


@dataclass
class Line:
    number: int  # 1-based, as an editor shows it
    text: str
    ids: list[int]  # pieces, without [CLS] and [SEP], cut to the model's positions
    word_of: list[int]  # the word of each piece (index into `words`)
    words: list[str]
    cut: int = 0  # pieces left out (the line is longer than the model reads)


def encode_line(tokenizer: BertTokenizer, text: str, number: int, max_pieces: int) -> Line:
    words = text.split()
    ids, word_of = [], []
    for w, pieces in enumerate(tokenizer.encode_words(words)):
        ids += pieces
        word_of += [w] * len(pieces)
    cut = max(0, len(ids) - max_pieces)
    if cut:  # the words with a piece left (the last one perhaps in part)
        words = words[: word_of[max_pieces - 1] + 1] if max_pieces else []
    return Line(number, text, ids[:max_pieces], word_of[:max_pieces], words, cut)


def piece_texts(tokenizer: BertTokenizer, ids: list[int]) -> list[str]:
    """The tokenizer's strings of the pieces ('▁' starts a sentencepiece word, '##' continues a WordPiece one)."""
    if tokenizer.kind == "sentencepiece":
        return [tokenizer.vocab.sp.id_to_piece(i) for i in ids]
    return [tokenizer.tok.id_to_token(i) or "" for i in ids]


def surface(tokenizer: BertTokenizer, line: Line) -> tuple[str, list[tuple[int, int]]]:
    """The line's text as its pieces spell it (normalised as the tokenizer normalises: lower-cased by an uncased
    WordPiece, NFKC by sentencepiece), words joined by one space, and each piece's span of characters in it."""
    text, spans, word = "", [], -1
    for piece, w in zip(piece_texts(tokenizer, line.ids), line.word_of):
        if w != word:
            text += " " if word >= 0 else ""
            word = w
        # '##' continues a WordPiece word; '▁' starts a sentencepiece one (also in the tokenizer.json of export-hf)
        piece = (piece.removeprefix("##") if tokenizer.kind == "hf" else piece).replace("\u2581", "")
        spans.append((len(text), len(text) + len(piece)))
        text += piece
    return text, spans


def _spaced(ch: str) -> bool:
    """A letter or digit of a script that separates words with spaces: a match must not run into one. CJK
    characters (Han, kana, Hangul syllables) are not: 苹果 is a word inside 我吃苹果."""
    if not ch.isalnum():
        return False
    name = unicodedata.name(ch, "")
    return not name.startswith(("CJK", "HIRAGANA", "KATAKANA", "HANGUL", "IDEOGRAPHIC"))


def occurrences(target: str, text: str) -> list[tuple[int, int]]:
    """Character spans of `target` in `text`, whole words where the script spaces its words."""
    found, start = [], text.find(target)
    while start >= 0 and target:
        end = start + len(target)
        before = start == 0 or not (_spaced(text[start - 1]) and _spaced(target[0]))
        after = end == len(text) or not (_spaced(text[end]) and _spaced(target[-1]))
        if before and after:
            found.append((start, end))
        start = text.find(target, start + 1)
    return found


@dataclass
class Occurrence:
    line: int
    label: str
    vector: np.ndarray  # (d,) the mean of the vectors of the pieces it spans


@dataclass
class Similarity:
    """WORD's occurrences, found line by line."""

    word: str
    target: str  # WORD as the pieces spell it
    found: list[Occurrence] = field(default_factory=list)

    @classmethod
    def of(cls, tokenizer: BertTokenizer, word: str) -> Similarity:
        target = surface(tokenizer, encode_line(tokenizer, word, 0, 1 << 30))[0]
        if not target.strip():
            raise UserError(f"--similarity {word!r}: the model's tokenizer gives it no pieces; give a word")
        return cls(word, target)

    def matches(self, tokenizer: BertTokenizer, line: Line, states: np.ndarray) -> list[Occurrence]:
        """The occurrences in one line; `states`: its (pieces + 2, d) vectors, [CLS] first."""
        text, spans = surface(tokenizer, line)
        hits, found = occurrences(self.target, text), []
        for start, end in hits:
            rows = [i + 1 for i, (a, b) in enumerate(spans) if a < end and b > start]
            label = f"{line.number}: {context(text, start, end)}"
            found.append(Occurrence(line.number, label, states[rows].mean(0)))
        return found

    def matrix(self) -> np.ndarray:
        """(M, M) cosine similarities of the occurrences: symmetric, ones on the diagonal."""
        v = np.stack([o.vector for o in self.found]).astype(np.float64)
        v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
        m = v @ v.T
        m = (m + m.T) / 2  # the two halves of a product need not round alike
        np.fill_diagonal(m, 1.0)
        return m


def context(text: str, start: int, end: int, side: int = CONTEXT_CHARS) -> str:
    """An occurrence in brackets with up to `side` characters of its line on either side: a heatmap's label."""
    before, after = text[max(0, start - side) : start], text[end : end + side]
    return f"{'…' if start > side else ''}{before}[{text[start:end]}]{after}{'…' if end + side < len(text) else ''}"


# ----------------------------------------------------------------------------- vectors


@dataclass
class Options:
    level: str = "sentence"
    pooling: str = "mean"
    layer: int | None = None  # None: the last


def line_vectors(states: np.ndarray, line: Line, level: str, pooling: str) -> np.ndarray:
    """The vectors of one line from its (pieces + 2, d) states: (pieces, d), (words, d) or (1, d)."""
    if level == "piece":
        return states[1:-1]
    if level == "sentence":
        return states[:1] if pooling == "cls" else states.mean(0, keepdims=True)
    word_of = np.asarray(line.word_of, dtype=np.int64)
    sums = np.zeros((len(line.words), states.shape[1]), dtype=np.float64)
    np.add.at(sums, word_of, states[1:-1])
    return (sums / np.bincount(word_of, minlength=len(line.words))[:, None]).astype(np.float32)


def embed_chunk(
    encoder: Encoder, lines: list[Line], layer: int, reduce: Callable[[Line, np.ndarray], Any], rows: int = ROWS
) -> list[Any]:
    """`reduce(line, states)` of every line, in input order, with its (pieces + 2, d) float32 states ([CLS] first):
    called as each batch is computed, so that only the reduced results of the chunk are held."""
    from transformer_cli.data.translation import pad_sequences

    tok = encoder.tokenizer
    order = sorted(range(len(lines)), key=lambda i: len(lines[i].ids))  # little padding in a batch
    results: list[Any] = [None] * len(lines)
    for start in range(0, len(order), rows):
        batch = order[start : start + rows]
        ids = pad_sequences([lines[i].ids for i in batch], tok.pad_id, prefix=tok.cls_id, suffix=tok.sep_id)
        with encoder.runtime.context():
            hidden = layer_states(encoder.model, ids.to(encoder.runtime.device), layer)  # (B, T, d)
        hidden = hidden.float().cpu().numpy()
        for row, i in enumerate(batch):
            results[i] = reduce(lines[i], hidden[row, : len(lines[i].ids) + 2])
    return results


def _reduce(
    options: Options, find: Similarity | None, tokenizer: BertTokenizer, line: Line, states: np.ndarray
) -> tuple[np.ndarray, list[Occurrence]]:
    found = find.matches(tokenizer, line, states) if find is not None else []
    return line_vectors(states, line, options.level, options.pooling), found


COLUMNS = {"piece": ("piece", "position"), "word": ("word", "index"), "sentence": ()}


def run_embed(
    checkpoint: Path,
    input_path: Path | None,
    output: Path | None,
    options: Options,
    similarity: str | None = None,
    plot: Path | None = None,
    neighbours: int | None = None,
    device: str = "auto",
    precision: str = "fp32",
    chunk_lines: int = MAX_CHUNK_LINES,
) -> dict:
    """Embed every line of the input; returns counts (lines, vectors, dim, layer, occurrences)."""
    from transformer_cli.core.arrays import ArrayWriter
    from transformer_cli.core.streams import chunks, open_input

    check_arguments(checkpoint, input_path, output, options, similarity, plot, neighbours)
    started = time.perf_counter()
    encoder = load_encoder(checkpoint, device, precision)
    layer = resolve_layer(options.layer, encoder.layers)
    d = encoder.model.embeddings.token.embedding_dim
    find = Similarity.of(encoder.tokenizer, similarity) if similarity is not None else None
    level, kept = options.level, []  # kept: sentence vectors for --neighbours without --output
    numbers, vectors, cut_lines = 0, 0, 0
    with ExitStack() as stack:
        out = None
        if output is not None:
            extra = {name: (str if name in ("piece", "word") else np.int64, ()) for name in COLUMNS[level]}
            columns = {"vectors": (np.float32, (d,)), "line": (np.int64, ()), **extra}
            out = stack.enter_context(ArrayWriter(output, columns))
        reader = stack.enter_context(open_input(input_path, sys.stdin))
        name = "standard input" if input_path is None or str(input_path) == "-" else str(input_path)
        for chunk in chunks(reader, chunk_lines, chunk_lines):
            lines = [
                encode_line(encoder.tokenizer, t, numbers + k + 1, encoder.max_positions - 2)
                for k, t in enumerate(chunk)
            ]
            numbers += len(chunk)
            cut_lines = warn_cut(lines, cut_lines, encoder.max_positions - 2)
            reduce = functools.partial(_reduce, options, find, encoder.tokenizer)
            results = embed_chunk(encoder, lines, layer, reduce)
            rows = [(line, v) for line, (v, _) in zip(lines, results)]
            vectors += sum(len(v) for _, v in rows)
            if find is not None:
                find.found += [o for _, found in results for o in found]
            if out is not None:
                out.append(**chunk_columns(encoder.tokenizer, rows, level, d))
            elif neighbours is not None:
                kept += [v for _, v in rows]
        if numbers == 0:
            raise UserError(f"{name} is empty: give one text per line to embed")
        if cut_lines > WARNED_LINES:
            print(f"warning: {cut_lines:,} lines in all were longer than the model reads (cut)", file=sys.stderr)
        if output is not None and vectors == 0:
            raise UserError(f"{name} holds no words (every line is blank): there is no {level} to embed")
        matrix = similarity_results(find, name, plot, layer)
        if neighbours is not None:
            all_vectors = out.raw_rows("vectors") if out is not None else np.concatenate(kept)
            print_neighbours(all_vectors, neighbours, name)
        if out is not None:
            out.finish(extra=similarity_arrays(find, matrix) if output.suffix.lower() == ".npz" else None)
    seconds = time.perf_counter() - started
    print(
        f"embedded {numbers:,} lines ({vectors:,} {level} vectors of {d} dimensions, layer {layer} of "
        f"{encoder.layers}) in {seconds:.1f} s{f'; wrote {output}' if output else ''}",
        file=sys.stderr,
    )
    found = len(find.found) if find is not None else 0
    return {"lines": numbers, "vectors": vectors, "dim": d, "layer": layer, "occurrences": found}


def warn_cut(lines: list[Line], warned: int, most: int) -> int:
    """A warning for each of the first WARNED_LINES lines cut to the model's positions; returns the count so far."""
    for line in lines:
        if line.cut:
            warned += 1
            if warned <= WARNED_LINES:
                print(
                    f"warning: line {line.number}: {len(line.ids) + line.cut} pieces, more than the {most} this model "
                    f"reads besides [CLS] and [SEP]; its last {line.cut} have no vectors (split the line)",
                    file=sys.stderr,
                )
    return warned


def chunk_columns(tokenizer: BertTokenizer, rows: list[tuple[Line, np.ndarray]], level: str, d: int) -> dict:
    """The arrays of a chunk's vectors: the vectors, the line of each, and its piece or word with its index."""
    empty = np.zeros(0, np.int64)
    columns = {
        "vectors": np.concatenate([np.zeros((0, d), np.float32), *(v for _, v in rows)]),
        "line": np.concatenate([empty, *(np.full(len(v), ln.number, np.int64) for ln, v in rows)]),
    }
    if level == "piece":
        columns.update(
            piece=[p for ln, _ in rows for p in piece_texts(tokenizer, ln.ids)],
            position=np.concatenate([empty, *(np.arange(len(ln.ids)) for ln, _ in rows)]),
        )
    elif level == "word":
        columns.update(
            word=[w for ln, _ in rows for w in ln.words],
            index=np.concatenate([empty, *(np.arange(len(ln.words)) for ln, _ in rows)]),
        )
    return columns


def similarity_results(find: Similarity | None, name: str, plot: Path | None, layer: int) -> np.ndarray | None:
    """WORD's cosine matrix, printed as a table (and drawn with --plot); None without --similarity."""
    if find is None:
        return None
    if not find.found:
        raise UserError(
            f"--similarity {find.word!r}: no line of {name} holds it (matched as the model's pieces spell it: "
            f"{find.target!r}); give a word of the text"
        )
    matrix = find.matrix()
    labels = [o.label for o in find.found]
    sys.stdout.write("".join(f"{k}\t{label}\n" for k, label in enumerate(labels, 1)))
    sys.stdout.write("\t" + "\t".join(map(str, range(1, len(labels) + 1))) + "\n")
    for k, row in enumerate(matrix, 1):
        sys.stdout.write(f"{k}\t" + "\t".join(f"{x:.4f}" for x in row) + "\n")
    sys.stdout.flush()
    if plot is not None:
        from transformer_cli.core.figures import heatmaps

        title = f"cosine similarity of {find.word!r} across lines (layer {layer})"
        heatmaps(
            plot,
            [("", matrix)],
            labels,
            labels,
            title,
            "occurrence",
            "occurrence",
            vmin=min(float(matrix.min()), 0.999),  # the range the values span: their differences show
            vmax=1.0,
            bar_label="cosine similarity",
        )
    return matrix


def similarity_arrays(find: Similarity | None, matrix: np.ndarray | None) -> dict[str, np.ndarray]:
    if find is None or matrix is None:
        return {}
    return {
        "similarity": matrix.astype(np.float32),
        "similarity_vectors": np.stack([o.vector for o in find.found]).astype(np.float32),
        "similarity_line": np.array([o.line for o in find.found], dtype=np.int64),
        "similarity_label": np.array([o.label for o in find.found]),
    }


def print_neighbours(vectors: np.ndarray, k: int, name: str, block: int = 1024) -> None:
    """`line -> line (cosine)  ...`: each line's k nearest other lines by the cosine of the sentence vectors."""
    n = len(vectors)
    if n < 2:
        raise UserError(f"--neighbours: {name} has {n} line; nearest lines need two or more")
    k = min(k, n - 1)
    unit = np.asarray(vectors, dtype=np.float32)
    unit = unit / np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    for start in range(0, n, block):
        sims = unit[start : start + block] @ unit.T  # (b, n)
        sims[np.arange(len(sims)), np.arange(start, start + len(sims))] = -np.inf  # not its own neighbour
        best = np.argpartition(-sims, k - 1, axis=1)[:, :k]  # the k best, unordered: no sort of every row
        best = np.take_along_axis(best, np.argsort(-np.take_along_axis(sims, best, 1), axis=1, kind="stable"), 1)
        out = []
        for r, row in enumerate(best):
            out.append(f"{start + r + 1} -> " + "  ".join(f"{j + 1} ({sims[r, j]:.4f})" for j in row) + "\n")
        sys.stdout.write("".join(out))
    sys.stdout.flush()


def check_arguments(
    checkpoint: Path,
    input_path: Path | None,
    output: Path | None,
    options: Options,
    similarity: str | None,
    plot: Path | None,
    neighbours: int | None,
) -> None:
    """Every option's mistake before the model is read."""
    from transformer_cli.core.files import check_distinct
    from transformer_cli.core.streams import check_outputs

    if options.level not in LEVELS:
        raise UserError(f"--level {options.level!r}: expected piece, word or sentence")
    if options.pooling not in POOLINGS:
        raise UserError(f"--pooling {options.pooling!r}: expected cls or mean")
    if output is None and similarity is None and neighbours is None:
        raise UserError("give --output FILE.npz (the vectors), --similarity WORD or --neighbours K")
    if output is not None and str(output) == "-":
        raise UserError("--output -: the vectors are binary arrays, not text for standard output; give a .npz file")
    if output is not None and output.suffix.lower() not in (".npz", ".npy"):
        raise UserError(
            f"--output {output}: give a .npz file (the vectors with their lines and pieces) or .npy (the vectors alone)"
        )
    if plot is not None and similarity is None:
        raise UserError("--plot draws the --similarity matrix: add --similarity WORD")
    if neighbours is not None and options.level != "sentence":
        raise UserError(
            f"--neighbours compares lines by their sentence vectors; it needs --level sentence, not {options.level}"
        )
    if similarity is not None and not similarity.strip():
        raise UserError("--similarity: give a word, not an empty text")
    inputs = [("--checkpoint", checkpoint), ("--input", input_path)]
    check_distinct([("--output", output), ("--plot", plot)], inputs)
    # an earlier .npz of arrays is a zip file as a checkpoint is: replacing it is no loss of a checkpoint
    check_outputs([("--output", None if _array_archive(output) else output), ("--plot", plot)], inputs)
    if plot is not None:
        from transformer_cli.core.figures import check_image_replaceable, image_format, require_matplotlib

        require_matplotlib()
        check_image_replaceable(plot, image_format(plot, "--plot"), "--plot")


def _array_archive(path: Path | None) -> bool:
    """Whether `path` is a .npz of numpy arrays (np.savez, an earlier tcli embed), not a torch checkpoint."""
    import zipfile

    if path is None or not path.is_file() or path.suffix.lower() != ".npz":
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False
    return bool(names) and all(n.endswith(".npy") and "/" not in n for n in names)
