"""Labelled data for fine-tuning: GLUE folders, TSV/CSV/JSONL tables, CoNLL tagging files and plain text.

`TextExample` is one row of a sentence(-pair) task, `TaggedSentence` one sentence of a tagging task; both
keep the line they came from, so that any later complaint (an unknown dev label, a text too long) can name
it. `GLUE_TASKS` describes the nine GLUE tasks as the official `glue_data/` folders lay them out (columns,
label order, metrics, dev splits) and `read_glue` reads one split of one task. `read_table` reads a user's
own table (columns by name), `read_conll` a word-per-line tagging file, `read_plain` one text per line for
`tcli predict`. `label_set` and `check_labels` fix the label ids from training and check other files against
them. Every mistake in a file is a one-line `UserError` naming `file:line` and what would fix it, raised
while reading, before anything is written. No torch here: the readers are imported by light commands too.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import stat
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_cli.core.errors import DECIMAL, UserError, quote
from transformer_cli.core.files import check_file
from transformer_cli.core.text import BOM, decode_text, decode_utf8, read_error, text_error

# How a table's label is read (a task kind's `label_form`): a class name kept as a string, a finite number, or
# a set of class names (a JSON list, or one field split on a separator: GoEmotions' "4,27").
LABEL_FORMS = ("classification", "regression", "multilabel")
DOCSTART = "-DOCSTART-"
ZWJ = "\u200d"  # the one format character a label may hold: it joins emoji ("👩\u200d💻" is one)


@dataclass(frozen=True)
class TextExample:
    """One example of a sentence or sentence-pair task."""

    text: str  # stripped of surrounding whitespace
    pair: str | None  # second text of a pair task, else None
    # str for classification, float for regression, a tuple of names for multilabel, None when the file has no labels
    label: str | float | tuple[str, ...] | None
    line: int  # 1-based line in the file (JSONL: its line; TSV/CSV: the physical line where the row starts)


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence of a tagging task (word first, tag last on each of its lines)."""

    words: tuple[str, ...]
    tags: tuple[str, ...] | None  # None when the file has only words
    line: int  # line of the first word


@dataclass(frozen=True)
class GlueTask:
    """Where one GLUE task's columns are and how it is scored."""

    name: str  # "sst2"
    folder: str  # "SST-2", the folder name in GLUE's glue_data/
    kind: str  # "classification" | "regression"
    text: str | int  # header column name, or 0-based index for headerless files (CoLA)
    pair: str | int | None  # second text's column, None for single-sentence tasks
    label: str | int
    header: bool  # whether the first line names the columns
    labels: tuple[str, ...] | None  # GLUE's label order (the label ids); None for regression
    metrics: tuple[str, ...]  # names understood by task_metrics.compute, main metric first
    dev_splits: tuple[str, ...]  # ("dev",); MNLI: ("dev_matched", "dev_mismatched")


@dataclass
class LabelledData:
    """The training and validation examples of a run, and what scores them."""

    kind: str
    train: list[TextExample] | list[TaggedSentence]
    valid: list[TextExample] | list[TaggedSentence]
    labels: tuple[str, ...]  # label ids are positions here; () for regression
    metrics: tuple[str, ...]
    files: list[Path]  # the training file(s): their hash is the data fingerprint
    valid_path: Path
    # Further dev splits, evaluated beside `valid` and logged as "<split>/<metric>" (MNLI's dev_mismatched);
    # `valid` (MNLI's dev_matched) alone selects best.pt.
    more_valid: dict[str, list[TextExample]] = field(default_factory=dict)

    def fingerprint(self) -> str:
        return _hash_files(self.files)

    def valid_files(self) -> list[Path]:
        return [self.valid_path, *(self.valid_path.with_name(f"{s}.tsv") for s in self.more_valid)]

    def valid_fingerprint(self) -> str:
        """The hash of the dev file(s): best.pt and early stopping compare scores on them across a resume."""
        return _hash_files(self.valid_files())


def _hash_files(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(_read_bytes(path))
    return h.hexdigest()


_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
# MNLI's order is that of transformers' MnliProcessor.get_labels (transformers 4.x, and Google's BERT
# run_classifier.py); HF `datasets`' glue/mnli numbers them differently (entailment, neutral, contradiction).
_NLI3 = ("contradiction", "entailment", "neutral")


def _glue(
    name: str,
    folder: str,
    text: str | int,
    pair: str | None,
    label: str | int,
    labels: tuple[str, ...] | None,
    metrics: tuple[str, ...],
    dev_splits: tuple[str, ...] = ("dev",),
) -> GlueTask:
    kind = "classification" if labels is not None else "regression"
    return GlueTask(name, folder, kind, text, pair, label, isinstance(text, str), labels, metrics, dev_splits)


# Columns as GLUE's glue_data/ files name them (CoLA has no header: columns by index).
GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        _glue("cola", "CoLA", 3, None, 1, _BINARY, ("mcc",)),
        _glue("sst2", "SST-2", "sentence", None, "label", _BINARY, ("accuracy",)),
        _glue("mrpc", "MRPC", "#1 String", "#2 String", "Quality", _BINARY, ("f1", "accuracy")),
        _glue("stsb", "STS-B", "sentence1", "sentence2", "score", None, ("pearson", "spearman")),
        _glue("qqp", "QQP", "question1", "question2", "is_duplicate", _BINARY, ("f1", "accuracy")),
        _glue(
            "mnli",
            "MNLI",
            "sentence1",
            "sentence2",
            "gold_label",
            _NLI3,
            ("accuracy",),
            ("dev_matched", "dev_mismatched"),
        ),
        _glue("qnli", "QNLI", "question", "sentence", "label", _NLI2, ("accuracy",)),
        _glue("rte", "RTE", "sentence1", "sentence2", "label", _NLI2, ("accuracy",)),
        _glue("wnli", "WNLI", "sentence1", "sentence2", "label", _BINARY, ("accuracy",)),
    )
}


def glue_key(name: str) -> str:
    """ "SST-2", "sst2", "STS-B" -> the GLUE_TASKS key; an unknown name is a one-line error."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in GLUE_TASKS:
        raise UserError(f"task.glue: unknown GLUE task {name!r}; the tasks are {', '.join(GLUE_TASKS)}")
    return key


def glue_tasks_in(data_dir: Path) -> list[str]:
    """The GLUE tasks present in a `glue_data/`-style folder.

    Args:
        data_dir: the folder holding one sub-folder per task (`CoLA/`, `SST-2/`, ...).

    Returns:
        Names of the tasks whose folder holds a `train.tsv`, in `GLUE_TASKS` order.
    """
    return [name for name, t in GLUE_TASKS.items() if (Path(data_dir) / t.folder / "train.tsv").is_file()]


def read_glue(data_dir: Path, task: str, split: str) -> list[TextExample]:
    """One split of one GLUE task, labels checked against GLUE's label set.

    Args:
        data_dir: the `glue_data/`-style folder.
        task: a key of `GLUE_TASKS` ("sst2", "mnli", ...).
        split: "train" or one of the task's `dev_splits` ("dev", or MNLI's "dev_matched"/"dev_mismatched").

    Returns:
        The examples in file order.

    Raises:
        UserError: an unknown task or split, a missing file, or any problem in the file (naming `file:line`).
    """
    if task not in GLUE_TASKS:
        raise UserError(f"unknown GLUE task {quote(task)}; the tasks are: {', '.join(GLUE_TASKS)}")
    t = GLUE_TASKS[task]
    if split not in ("train", *t.dev_splits):
        raise UserError(
            f"GLUE task {task} has no split {quote(split)}; its splits are: train, {', '.join(t.dev_splits)}"
        )
    path = Path(data_dir) / t.folder / f"{split}.tsv"
    check_file(path, f"{path} {{what}}: {data_dir} should hold GLUE's {t.folder}/{split}.tsv (the glue_data layout)")
    examples = _read_tsv(path, t.text, t.pair, t.label, (t.kind, ","), header=t.header)
    if t.labels is not None:
        check_labels(examples, t.labels, path)
    return examples


TABLE_SUFFIXES = (".tsv", ".csv", ".jsonl", ".json")  # files read as tables; CoNLL's are .conll or .txt
# (a .txt file is a tagger's CoNLL file, or a TSV table for the other kinds: CLUE's AFQMC ships train.txt)


def read_task_table(
    path: Path,
    task: GlueTask | None,
    text: str,
    pair: str | None,
    label: str | None,
    kind: str,
    columns: Sequence[str] | None = None,
    separator: str = ",",
) -> list[TextExample]:
    """A table given to a model (tcli evaluate --input, tcli predict): `read_table` with the named columns, or,
    for a GLUE task whose files have no header (CoLA), a .tsv without such a header read as that task's own
    files are, columns by position (its dev.tsv, which otherwise had no column 'sentence'). A model trained on
    tables without a header (`columns`, CLUE's AFQMC) reads a file as those were, unless its first line names
    the text column: then that header names the columns."""
    suffix = Path(path).suffix.lower()
    if task is not None and not task.header and suffix == ".tsv":
        first = next((line for line in _lines(Path(path)) if line != ""), "")
        if text not in first.split("\t"):
            label = None if label is None else task.label  # type: ignore[assignment]
            return _read_tsv(Path(path), task.text, task.pair, label, (kind, separator), False)
    if columns is not None and suffix != ".jsonl" and suffix != ".json":
        first = next((line for line in _lines(Path(path)) if line != ""), "")
        names = next(csv.reader([first])) if suffix == ".csv" else first.split("\t")
        if text in (name.strip() for name in names):
            columns = None
    return read_table(path, text, pair, label, kind, columns, separator=separator)


def read_table(
    path: Path,
    text: str,
    pair: str | None,
    label: str | None,
    kind: str,
    columns: Sequence[str] | None = None,
    format: str | None = None,
    separator: str = ",",
) -> list[TextExample]:
    """A user's labelled (or unlabelled) table, by its suffix: `.tsv` (and `.txt`), `.csv`, `.jsonl` or `.json`
    (JSON lines), or by `format`.

    TSV is split on TAB only, without quote processing (quotes are text, as in GLUE); CSV follows RFC 4180
    (quoted fields may hold TABs, commas and newlines). TSV and CSV files start with a header naming the
    columns, unless `columns` names them (CLUE's files have no header); JSONL lines are objects and the names
    are their keys. Blank lines are skipped (JSONL included).

    Args:
        path: the file.
        text: the column (key) of the text.
        pair: the column of the second text of a pair task, or None.
        label: the column of the label, or None to read texts only (for prediction).
        kind: "classification" (labels kept as stripped strings), "regression" (labels must be finite floats) or
            "multilabel" (a JSON list of names, or a field of names split on `separator`; a tuple of them).
        columns: the names of the columns of a TSV or CSV file without a header line, in order; None: the
            first line is the header. JSON lines name their keys themselves and ignore it.
        format: "tsv", "csv" or "jsonl" whatever the suffix; None: from the suffix.
        separator: what separates the names of a multilabel field.

    Returns:
        The examples in file order; texts are stripped of surrounding whitespace.

    Raises:
        UserError: one line naming the file (and the line) for an unknown suffix, a missing column, a row of the
            wrong length, an empty text, a missing or invalid label, invalid UTF-8, or a file without examples.
    """
    if kind not in LABEL_FORMS:
        raise ValueError(f"kind must be one of {LABEL_FORMS}, not {kind!r}")
    path = Path(path)
    suffix = path.suffix.lower()
    form = (kind, separator)
    if format is None:
        format = {".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}.get(suffix)
    if format == "tsv":
        return _read_tsv(path, text, pair, label, form, header=columns is None, names=columns)
    if format == "csv":
        return _read_csv(path, text, pair, label, form, columns)
    if format == "jsonl":
        return _read_jsonl(path, text, pair, label, form)
    raise UserError(
        f"{path}: unknown table format {quote(path.suffix or '(no suffix)')}; the formats understood are "
        f"{', '.join(TABLE_SUFFIXES)} (.json as JSON lines, one object per line)"
    )


def read_conll(path: Path) -> list[TaggedSentence]:
    """A CoNLL-style tagging file: one word per line, word first and tag last (whitespace-separated columns).

    A blank line ends a sentence; `-DOCSTART-` lines are skipped (they also end a sentence). A file whose
    lines all have one column is words only (prediction input): its sentences have `tags=None`. Tags are
    not checked to be IOB-like here.

    Raises:
        UserError: a file mixing one-column lines with tagged ones (naming the first line that differs from
            the first word's line), invalid UTF-8, or a file without sentences.
    """
    path = Path(path)
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    tagged: bool | None = None  # decided by the first word's line
    first_word_line = 0

    def close() -> None:
        if words:
            sentences.append(TaggedSentence(tuple(words), tuple(tags) if tagged else None, start))
            words.clear()
            tags.clear()

    for n, raw in enumerate(_lines(path), start=1):
        cols = raw.split()
        if not cols or cols[0] == DOCSTART:
            close()
            continue
        if tagged is None:
            tagged, first_word_line = len(cols) > 1, n
        elif tagged != (len(cols) > 1):
            have = "has no tag" if tagged else "has a tag"
            want = "tags" if tagged else "no tags"
            raise UserError(
                f"{path}:{n}: this word {have}, but line {first_word_line} has {want}; "
                "give every word its tag as the last column, or give words only (one column) throughout"
            )
        if not words:
            start = n
        words.append(cols[0])
        if tagged:
            tags.append(cols[-1])
    close()
    if not sentences:
        raise UserError(f"{path}: no sentences (expected one word per line, blank lines between sentences)")
    return sentences


def read_plain(path: Path) -> list[TextExample]:
    """One text per line, for `tcli predict`: the whole line (stripped) is the text, `label=None`.

    An empty line is an error rather than skipped: predict writes one output per input line, and a skipped
    line would silently shift every output after it.

    Raises:
        UserError: an empty or whitespace-only line (naming `file:line`), invalid UTF-8, or an empty file.
    """
    path = Path(path)
    examples = []
    for n, raw in enumerate(_lines(path), start=1):
        line = raw.strip()
        if not line:
            raise UserError(
                f"{path}:{n}: empty line; predict writes one output per input line, so give a text on every line"
            )
        examples.append(TextExample(line, None, None, n))
    if not examples:
        raise UserError(f"{path}: empty file (expected one text per line)")
    return examples


def label_set(examples: Sequence[TextExample] | Sequence[TaggedSentence], path: Path) -> tuple[str, ...]:
    """The labels (or tags) seen in training, sorted: their positions are the label ids.

    Sorted as numbers when every label is an integer ("2" before "10"), otherwise as strings.

    Args:
        examples: classification examples or tagged sentences, all labelled.
        path: the file they came from, for errors.

    Raises:
        UserError: no examples, or an example without a label (naming `file:line`).
        ValueError: regression examples (float labels have no label set).
    """
    if not examples:
        raise UserError(f"{path}: no examples to take the labels from")
    seen: set[str] = set()
    for ex in examples:
        values = ex.label if isinstance(ex, TextExample) else ex.tags
        if values is None:
            raise UserError(f"{path}:{ex.line}: no label; training data needs a label on every example")
        if isinstance(values, float):
            raise ValueError("label_set is for classification and tagging; regression labels are floats")
        for i, value in enumerate((values,) if isinstance(values, str) else values):
            hidden = invisible(value)
            if hidden is not None:  # '1' and '1\u200b' print alike and would be two classes
                raise UserError(
                    f"{path}:{_line_of(ex, i)}: label {quote(value)} holds the invisible character "
                    f"U+{ord(hidden):04X}; remove it"
                )
            seen.add(value)
    if all(_is_int(s) for s in seen):
        return tuple(sorted(seen, key=lambda s: (int(s), s)))
    return tuple(sorted(seen))


# Characters that print as nothing though they are no control or format character: Hangul fillers (letters)
# and the combining grapheme joiner (a mark).
BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u034f")


def invisible(label: str) -> str | None:
    """The first character of a label that prints as nothing: a control or format character (NUL, a zero-width
    space), a Hangul filler, a combining grapheme joiner, and a joiner or variation selector that is not part
    of an emoji ("👩\u200d💻", "❤\ufe0f" and the keycap "1\ufe0f\u20e3" are labels; "1\u200d" is "1" again)."""
    for i, c in enumerate(label):
        before, after = label[i - 1 : i], label[i + 1 : i + 2]
        if c == ZWJ:
            if _emoji_part(before) and _emoji_part(after):
                continue
            return c
        if _variation_selector(c):
            if _emoji_part(before) or after == "\u20e3":  # (a keycap: digit, VS-16, U+20E3)
                continue
            return c
        if c in BLANK_CHARACTERS or unicodedata.category(c) in ("Cc", "Cf"):
            return c
    return None


def _variation_selector(c: str) -> bool:
    return "\ufe00" <= c <= "\ufe0f" or "\U000e0100" <= c <= "\U000e01ef"


def _emoji_part(c: str) -> bool:
    """A symbol (an emoji, a skin-tone modifier) or a variation selector after one: what a joiner joins."""
    return bool(c) and (unicodedata.category(c) in ("So", "Sk") or _variation_selector(c))


def look_alike(labels: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs of labels that differ only in case or in how a number is written ('pos' and 'Pos'; '1', '1.0' and
    '01'): two classes to the model, and seldom meant to be."""
    groups: dict[str, list[str]] = {}
    for label in labels:
        try:
            key = repr(float(label))
        except ValueError:
            key = label.casefold()
        groups.setdefault(key, []).append(label)
    return [(group[0], group[1]) for group in groups.values() if len(group) > 1]


def check_labels(examples: Sequence[TextExample] | Sequence[TaggedSentence], labels: Sequence[str], path: Path) -> None:
    """Check that every label (or tag) is one of `labels`, the set fixed by training.

    Unlabelled examples (`label`/`tags` None) pass. For classification and tagging only.

    Raises:
        UserError: for the first unknown label, naming `file:line`, the label and the known labels.
    """
    known = set(labels)
    for ex in examples:
        values = ex.label if isinstance(ex, TextExample) else ex.tags
        if values is None:
            continue
        for i, value in enumerate((values,) if isinstance(values, (str, float)) else values):
            if value not in known:
                line = _line_of(ex, i)
                raise UserError(
                    f"{path}:{line}: label {quote(value)} is not one the model knows ({_listing(labels)}); "
                    "correct the label, or add examples of it to the training data and train again"
                )


# --- helpers -------------------------------------------------------------------------------------------------


def _line_of(ex: TextExample | TaggedSentence, i: int) -> int:
    """The line of an example's i-th label: a sentence's words are consecutive lines from ex.line on; a row's
    labels (multilabel) are all on its line."""
    return ex.line + i if isinstance(ex, TaggedSentence) else ex.line


def _fields(n: int) -> str:
    return "1 field" if n == 1 else f"{n} fields"


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True


def _listing(labels: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(quote(s, 40) for s in labels[:limit])
    return shown if len(labels) <= limit else f"{shown}, … ({len(labels)} in all)"


def _read_bytes(path: Path) -> bytes:
    """A table or CoNLL file, read whole: a regular file (a link to one too). A device never ends (/dev/zero
    under a .tsv name filled the memory until the system killed the process) and a FIFO is read once."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode) and not path.is_dir():
            raise UserError(f"{path} is not a regular file (a device, FIFO or socket); save the table to a file")
        return path.read_bytes()
    except OSError as e:
        raise read_error(e, path) from None


def _lines(path: Path) -> list[str]:
    """Lines without endings (\n or \r\n, a leading BOM dropped); invalid UTF-8 names file and line."""
    return decode_utf8(_read_bytes(path), str(path))


def _decode(path: Path) -> str:
    """The whole text (for the csv module, whose quoted fields may span lines), BOM dropped."""
    data = _read_bytes(path)
    text, bad = decode_text(data)
    if bad >= 0:  # (a NUL: the csv module refuses it too, naming no line)
        raise text_error(str(path), data.count(b"\n", 0, bad) + 1, data[bad])
    return text.removeprefix(BOM)


def _read_tsv(
    path: Path,
    text: str | int,
    pair: str | int | None,
    label: str | int | None,
    kind: Form,
    header: bool,
    names: Sequence[str] | None = None,
) -> list[TextExample]:
    # TAB only, no quoting: GLUE's texts hold unbalanced `"` characters that a CSV reader would join across rows.
    rows = ((n, raw.split("\t")) for n, raw in enumerate(_lines(path), start=1) if raw != "")
    return _examples(path, rows, text, pair, label, kind, header, names)


def _read_csv(
    path: Path, text: str, pair: str | None, label: str | None, kind: Form, names: Sequence[str] | None = None
) -> list[TextExample]:
    def rows() -> Iterator[tuple[int, list[str]]]:
        reader = csv.reader(io.StringIO(_decode(path), newline=""), strict=True)  # a stray quote is an error
        start = 1
        try:
            for row in reader:
                if row:  # the csv module gives [] for a blank line
                    yield start, row
                start = reader.line_num + 1
        except csv.Error as e:
            raise UserError(f"{path}:{start}: not valid CSV ({e}); check the quoting of this row") from None

    return _examples(path, rows(), text, pair, label, kind, header=names is None, given=names)


def _examples(
    path: Path,
    rows: Iterable[tuple[int, list[str]]],
    text: str | int,
    pair: str | int | None,
    label: str | int | None,
    kind: Form,
    header: bool,
    given: Sequence[str] | None = None,
) -> list[TextExample]:
    """Rows of fields (with their line) into examples; the first row is the header when `header`, and `given`
    names the columns of a file without one."""
    examples: list[TextExample] = []
    width = 0
    idx: tuple[int, int | None, int | None] | None = None
    for n, fields in rows:
        if idx is None:  # the first row fixes the width, and names the columns when there is a header
            if given is not None:
                _check_no_header(path, n, fields, given, text)
            width = len(fields) if given is None else len(given)
            names = [f.strip() for f in fields] if header else None if given is None else list(given)
            idx = (_column(path, names, width, text), *(_column(path, names, width, c) for c in (pair, label)))
            if header:
                continue
        if len(fields) != width:
            what = (
                f"{'the header' if header else 'the first row'} has {width}"
                if given is None
                else f"the columns given are {width} ({', '.join(given)})"
            )
            hint = (
                "check the commas and quotes (a quote left open runs on to the next rows)"
                if path.suffix.lower() == ".csv"
                else "fields are separated by TAB, and quotes are text (for quoted fields use .csv)"
            )
            raise UserError(f"{path}:{n}: {_fields(len(fields))} but {what}; {hint}")
        i_text, i_pair, i_label = idx
        examples.append(
            TextExample(
                _text(path, n, fields[i_text], "text"),
                None if i_pair is None else _text(path, n, fields[i_pair], "second text"),
                None if i_label is None else _label(path, n, fields[i_label], kind),
                n,
            )
        )
    if not examples:
        raise UserError(
            f"{path}: no examples" + (" (only a header)" if idx is not None and header else " (empty file)")
        )
    return examples


def _check_no_header(path: Path, line: int, fields: list[str], given: Sequence[str], text: str | int) -> None:
    """A header line in a file whose columns are named by the config: read as an example, its label would be a
    class of its own (the word 'label') and its text a training example."""
    if isinstance(text, str) and text in (f.strip() for f in fields):
        raise UserError(
            f"{path}:{line}: this line is a header (it names the column {quote(text)}), but data.columns "
            f"([{', '.join(given)}]) is for files without one; remove data.columns to read the header"
        )


def _column(path: Path, names: list[str] | None, width: int, column: str | int | None) -> int | None:
    if column is None:
        return None
    if isinstance(column, int):
        if not 0 <= column < width:
            raise UserError(f"{path}: no column {column} (0-based); its rows have {width} fields")
        return column
    if names is None or column not in names:
        raise UserError(f"{path}: no column {quote(column)}; the header has: {_listing(names or [], 50)}")
    if names.count(column) > 1:  # which one is meant? (taking the first would silently drop the other)
        raise UserError(
            f"{path}:1: the header names the column {quote(column)} {names.count(column)} times; rename one"
        )
    return names.index(column)


def _text(path: Path, line: int, value: object, what: str) -> str:
    if not isinstance(value, str):
        raise UserError(f"{path}:{line}: the {what} is {quote(value)}, not a string")
    value = value.strip()
    if not value:
        raise UserError(f"{path}:{line}: empty {what}; remove the row or give it a {what}")
    return value


Form = tuple[str, str]  # (a LABEL_FORMS name, the separator of a multilabel field)


def _label(path: Path, line: int, value: object, form: Form) -> str | float | tuple[str, ...]:
    kind, separator = form
    if value is None or (isinstance(value, str) and not value.strip()):
        raise UserError(f"{path}:{line}: missing label; give every example a label (or read the file without labels)")
    if kind == "multilabel":
        return _label_names(path, line, value, separator)
    if kind == "classification":
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise UserError(f"{path}:{line}: label {quote(value)} should be a string or an integer")
        return str(value).strip()
    try:
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, str) and not DECIMAL.fullmatch(value.strip()):
            raise ValueError  # float() also reads "1_0" as 10 and full-width digits
        number = float(value.strip() if isinstance(value, str) else value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise UserError(f"{path}:{line}: label {quote(value)} is not a finite number; a regression label is a number")
    if abs(number) > MAX_REGRESSION_LABEL:
        raise UserError(
            f"{path}:{line}: label {quote(value)} is beyond ±{MAX_REGRESSION_LABEL:g}: the squared error of the loss "
            "overflows float32 (loss inf, every update skipped); rescale the scores"
        )
    return number


def _label_names(path: Path, line: int, value: object, separator: str) -> tuple[str, ...]:
    """A multilabel field: a JSON list of names (or integers; [] for none), or a string of names split on
    `separator`; each name stripped, none empty, none twice."""
    if isinstance(value, list):
        names = value
    elif isinstance(value, str):
        names = value.split(separator)
    else:
        raise UserError(
            f"{path}:{line}: label {quote(value)} should be a list of labels or a string of them separated by "
            f"{quote(separator)}"
        )
    out: list[str] = []
    for name in names:
        if isinstance(name, bool) or not isinstance(name, (str, int)) or not str(name).strip():
            raise UserError(
                f"{path}:{line}: label {quote(value)} holds {quote(name)}: each of its labels should be a non-empty "
                f"string or an integer (separated by {quote(separator)}; data.label_separator)"
            )
        if str(name).strip() in out:
            raise UserError(f"{path}:{line}: label {quote(value)} names {quote(str(name).strip())} twice; keep one")
        out.append(str(name).strip())
    return tuple(out)


MAX_REGRESSION_LABEL = 1e18  # squared, 1e36: within float32's 3.4e38, a batch's sum too


@dataclass(frozen=True)
class _Repeated:
    key: str  # a key given twice in one JSON object (json.loads would keep the last one silently)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Repeated:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj or isinstance(value, _Repeated):
            return value if isinstance(value, _Repeated) else _Repeated(key)
        obj[key] = value
    return obj


def _read_jsonl(path: Path, text: str, pair: str | None, label: str | None, kind: Form) -> list[TextExample]:
    examples = []
    for n, raw in enumerate(_lines(path), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw, object_pairs_hook=_pairs)
        except (ValueError, RecursionError) as e:  # also an integer of over 4,300 digits, or nesting past the stack
            if isinstance(e, json.JSONDecodeError):
                why = f"{e.msg}, column {e.colno}"
            else:
                why = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(":")[0]
            raise UserError(
                f"{path}:{n}: not valid JSON ({why[:80]}); a {path.suffix} file holds one object per line (JSON "
                f'lines), like {{"{text}": "...", ...}}'
            ) from None
        if isinstance(obj, _Repeated):
            raise UserError(f"{path}:{n}: the key {quote(obj.key)} appears twice in this object; keep one")
        if not isinstance(obj, dict):
            raise UserError(
                f"{path}:{n}: not a JSON object; a {path.suffix} file holds one object per line (JSON lines), "
                f'like {{"{text}": "...", ...}}'
            )
        for key in (text, pair, label):
            if key is not None and key not in obj:
                raise UserError(f"{path}:{n}: no key {quote(key)}; this line has: {_listing(list(obj), 50)}")
        examples.append(
            TextExample(
                _text(path, n, obj[text], "text"),
                None if pair is None else _text(path, n, obj[pair], "second text"),
                None if label is None else _label(path, n, obj[label], kind),
                n,
            )
        )
    if not examples:
        raise UserError(f"{path}: no examples (empty file)")
    return examples
