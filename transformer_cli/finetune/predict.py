"""`tcli predict`: a fine-tuned checkpoint's labels (and their probability), scores, or tags for new text.

Input: a table (.tsv, .csv, .jsonl with the columns the model was trained on), a CoNLL file (.conll, tagging),
questions for a QA model (a SQuAD .json, or JSON lines of {"question", "context"}, a file or stdin), or plain lines
(a file or stdin): one text per line, `a<TAB>b` for a pair model, words separated by spaces for a tagger; for a
model trained on tables without a header (data.columns, CLUE's), also the rows of such a table. Plain lines stream
like `tcli translate`: each chunk's predictions are written before the next chunk is read. Output:
`label<TAB>probability` or the score, one line per input; for tagging one `word tag` line per word and a blank line
after each sentence; for QA a JSON line {"id", "answer", "score", "start"} per question.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_cli.checkpoint import read_checkpoint
from transformer_cli.core.errors import UserError
from transformer_cli.core.streams import check_outputs, chunks, first_chunk, open_input, writer
from transformer_cli.data.labeled import (
    DOCSTART,
    GLUE_TASKS,
    TABLE_SUFFIXES,
    TaggedSentence,
    TextExample,
    glue_key,
    read_conll,
    read_task_table,
)
from transformer_cli.kinds.finetuned import FinetuneMeta, decide, features_of, length_order, non_finite, predict_logits

ROWS = 64  # examples per forward pass
FIRST_CHUNK_LINES, MAX_CHUNK_LINES = 64, 4096  # plain lines: the first predictions come out at once


class Predictor:
    """A fine-tuned model on a device, turning examples into output lines."""

    def __init__(self, checkpoint: Path, device: str = "auto", precision: str = "fp32"):
        from transformer_cli.runtime.device import Runtime

        ckpt = read_checkpoint(checkpoint, kind="finetune")
        self.checkpoint = checkpoint
        self.cfg, self.meta = ckpt.cfg, ckpt.finetune
        self.runtime = Runtime.create(device, precision)
        self.model = ckpt.build_model().to(self.runtime.device).eval()

    def columns(self) -> tuple[str, str | None]:
        """The text (and pair) columns the model was trained on."""
        d, glue = self.cfg.data, self.cfg.task.glue
        if glue is not None:
            t = GLUE_TASKS[glue_key(glue)]
            text = t.text if isinstance(t.text, str) else "sentence"
            return text, t.pair if isinstance(t.pair, str) else None
        return d.text, d.pair

    def lines(self, examples: list[Any]) -> list[str]:
        """Output lines for a chunk of examples (TextExample or TaggedSentence)."""
        meta = self.meta
        feats = features_of(meta, examples)  # (no labels: the examples have none)
        logits = predict_logits(
            self.model,
            feats,
            length_order(feats, ROWS),
            meta.tokenizer.pad_id,
            meta.kind,
            self.runtime,
            meta.max_seq_len,
        )
        non_finite(logits, refuse=str(self.checkpoint))
        preds, probs = decide(meta, logits, examples, feats)
        for warning in meta.task_kind.warnings(meta, examples, preds):
            print(warning, file=sys.stderr)
        return [format_prediction(meta, ex, p, q) for ex, p, q in zip(examples, preds, probs)]


def format_prediction(meta: FinetuneMeta, example: Any, pred: Any, prob: float) -> str:
    return meta.task_kind.format(meta, example, pred, prob)


CONLL_HINT = (
    "a CoNLL file (a word and its columns per line, a blank line after each sentence) is read as one when named .conll"
)


def _conll_rows(lines: list[str], tags: set[str]) -> bool:
    """Whether a tagger's plain lines are a CoNLL file's rows: a -DOCSTART- line, or two or more lines, up to the
    first blank one, of as many fields each (two or more), the last of each one of the model's tags."""
    rows = []
    for line in lines[:50]:
        fields = line.split()
        if fields[:1] == [DOCSTART]:
            return True
        if not fields:
            break
        rows.append(fields)
    return (
        len(rows) >= 2 and len({len(f) for f in rows}) == 1 and len(rows[0]) >= 2 and all(f[-1] in tags for f in rows)
    )


def _plain(
    line: str, number: int, pair_model: bool, tagging: bool, name: str, row: RowColumns | None = None
) -> TextExample | TaggedSentence:
    text = line.strip()
    if not text:
        hint = f"; {CONLL_HINT}" if tagging else ""
        raise UserError(f"{name}:{number}: empty line; predict writes one output per input line, so give a text{hint}")
    if tagging:
        return TaggedSentence(tuple(text.split()), None, number)
    if row is not None:  # a row of the header-less files the model was trained on (CLUE's dev.txt), label and all
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) == row.width:
            a, b = fields[row.text].strip(), None if row.pair is None else fields[row.pair].strip()
            if not a or b == "":
                which = "second text" if a else "first text" if pair_model else "text"
                raise UserError(f"{name}:{number}: the {which} of this row is empty; give it a text or remove the row")
            return TextExample(a, b, None, number)
    if pair_model:
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            found = (
                f"its {'first' if not fields[0].strip() else 'second'} text is empty"
                if len(fields) == 2
                else f"the line has {len(fields)} tab-separated field{'s' if len(fields) != 1 else ''}"
            )
            raise UserError(f"{name}:{number}: this model reads pairs: give 'first text<TAB>second text' ({found})")
        a, b = fields
        return TextExample(a.strip(), b.strip(), None, number)
    if "\t" in text:  # a table's row (a header, a label column) read as one text: its output would be wrong
        raise UserError(
            f"{name}:{number}: a tab in a line: this model reads one text per line (a pair model reads "
            "'a<TAB>b'); for a table with columns, give it as .tsv, .csv or .jsonl"
        )
    return TextExample(text, None, None, number)


@dataclass(frozen=True)
class RowColumns:
    """Where the text (and pair) are in a row of the model's header-less training files (data.columns)."""

    width: int
    text: int
    pair: int | None


def _row_columns(predictor: Predictor) -> RowColumns | None:
    d = predictor.cfg.data
    if d.columns is None or predictor.cfg.task.glue is not None:
        return None
    return RowColumns(len(d.columns), d.columns.index(d.text), None if d.pair is None else d.columns.index(d.pair))


def run_predict(
    checkpoint: Path, input_path: Path | None, output: Path | None, device: str = "auto", precision: str = "fp32"
) -> int:
    """Predict for every example of the input; returns how many were written."""
    check_outputs([("--output", output)], [("--checkpoint", checkpoint), ("--input", input_path)])
    suffix = input_path.suffix.lower() if input_path is not None else ""
    with ExitStack() as stack:
        predictor = Predictor(checkpoint, device, precision)
        tagging = predictor.meta.task_kind.reads == "conll"
        if predictor.meta.task_kind.reads == "squad":
            return _answer_questions(predictor, input_path, suffix, output, stack)
        if suffix == ".conll" and not tagging:
            raise UserError(
                f"--input {input_path}: a .conll file is for a tagger, and this is a {predictor.meta.kind} model; "
                "give a table with its columns (.tsv, .csv, .jsonl) or one text per line"
            )
        if suffix in TABLE_SUFFIXES and tagging:
            raise UserError(
                f"--input {input_path}: this model tags words; give a .conll file or one sentence per line, "
                f"not a {suffix} table"
            )
        write = writer(output, stack)
        if suffix in TABLE_SUFFIXES:
            text, pair = predictor.columns()
            glue = predictor.cfg.task.glue
            task = GLUE_TASKS[glue_key(glue)] if glue else None
            form = predictor.meta.task_kind.label_form
            columns, separator = predictor.cfg.data.columns, predictor.cfg.data.label_separator
            examples = read_task_table(input_path, task, text, pair, None, form, columns, separator)
            return _write_all(predictor, [examples], write)
        if suffix == ".conll":
            return _write_all(predictor, [read_conll(input_path)], write)
        lines = stack.enter_context(open_input(input_path, sys.stdin))
        name, pair_model = str(input_path or "<stdin>"), predictor.columns()[1] is not None
        row = _row_columns(predictor)
        number = 0
        first = first_chunk(output, FIRST_CHUNK_LINES, MAX_CHUNK_LINES)
        for chunk in chunks(lines, first, MAX_CHUNK_LINES):  # written before the next chunk is read
            if tagging and number == 0 and _conll_rows(chunk, set(predictor.meta.labels)):
                raise UserError(
                    f"{name}: its lines are a CoNLL file's rows (each ends with a tag), not sentences to tag; "
                    f"{CONLL_HINT}, or give one sentence per line"
                )
            examples = [_plain(line, number + i + 1, pair_model, tagging, name, row) for i, line in enumerate(chunk)]
            number += _write_all(predictor, [examples], write)
        return number


def _answer_questions(
    predictor: Predictor, input_path: Path | None, suffix: str, output: Path | None, stack: ExitStack
) -> int:
    """A QA model: a SQuAD .json read whole, else JSON lines ({"question", "context"}, "id" optional: the line
    number) from a file or stdin, streamed in chunks like plain lines; a JSON line `{id, answer, score, start}`
    out per question."""
    from transformer_cli.data.squad import question_lines, read_squad

    if suffix not in ("", ".json", ".jsonl", ".txt"):
        raise UserError(
            f"--input {input_path}: a question-answering model reads a SQuAD .json or JSON lines of "
            '{"question", "context"} (.jsonl, or stdin)'
        )
    write = writer(output, stack)
    if suffix == ".json":
        return _write_all(predictor, [read_squad(input_path, need_answers=False)], write)
    lines = stack.enter_context(open_input(input_path, sys.stdin))
    name, number, done = str(input_path or "<stdin>"), 0, 0
    for chunk in chunks(lines, first_chunk(output, FIRST_CHUNK_LINES, MAX_CHUNK_LINES), MAX_CHUNK_LINES):
        questions = question_lines(name, enumerate(chunk, start=number + 1), need_answers=False)
        number += len(chunk)
        done += _write_all(predictor, [questions], write)  # written before the next chunk is read
    return done


def _write_all(predictor: Predictor, groups: Iterable[list[Any]], write: Callable[[str], None]) -> int:
    done = 0
    for examples in groups:
        for start in range(0, len(examples), 1024):
            write("".join(predictor.lines(examples[start : start + 1024])))
        done += len(examples)
    return done
