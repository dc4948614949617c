"""Extractive question answering data: SQuAD JSON as published (v1.1, and v2.0 with `is_impossible` and
`plausible_answers`) and JSON lines as HF `datasets` writes them (`{"id", "title"?, "question", "context",
"answers": {"text": [...], "answer_start": [...]}}`, one object a line; empty lists: no answer).

Every answer's `answer_start` must point at its text in the context; that, a duplicate question id, a missing or
mistyped field and bad JSON are one-line `UserError`s naming the file (and the line, for JSON lines) and the
question id. No torch here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_cli.core.errors import UserError, quote
from transformer_cli.core.files import check_file
from transformer_cli.core.text import decode_text, read_error, text_error


@dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offset of `text` in the context


@dataclass(frozen=True)
class Question:
    """One question on one context; `answers` empty: unanswerable (SQuAD v2)."""

    id: str
    question: str
    context: str
    answers: tuple[Answer, ...]
    plausible: tuple[Answer, ...] = ()  # SQuAD v2's plausible_answers of an unanswerable question (not trained on)
    title: str = ""
    where: str = ""  # "file" or "file:line", for later complaints about this question


def read_squad(path: str | Path, need_answers: bool = True) -> list[Question]:
    """The questions of a SQuAD file, in file order: `.jsonl` is JSON lines; `.json` the published nested layout,
    or JSON lines when it holds one object a line (HF `datasets`' to_json writes those under .json too).

    `need_answers` False (questions to answer, `tcli predict`): "answers" are not read (nor needed), and a JSON
    line may lack "id" (its line number stands for it)."""
    path = Path(path)
    check_file(path, f"{path}: {{what}}; give a SQuAD .json or a .jsonl of questions")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise read_error(e, path) from None
    text, bad = decode_text(data)
    if bad >= 0:
        raise text_error(str(path), data.count(b"\n", 0, bad) + 1, data[bad])
    text = text.removeprefix("\ufeff")
    if path.suffix.lower() != ".jsonl":
        try:
            whole = json.loads(text, object_pairs_hook=_object)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # "Extra data": a first value then more, as JSON lines are
                raise UserError(f"{path}: not valid JSON ({e.msg}, line {e.lineno} column {e.colno})") from None
        except (ValueError, RecursionError, _Repeated) as e:
            raise UserError(f"{path}: not valid JSON ({_why(e)})") from None
        else:
            if not (isinstance(whole, dict) and "data" not in whole and "question" in whole):
                questions = _read_nested(path, whole, need_answers)
                _check_unique(questions)
                return questions
    questions = question_lines(str(path), enumerate(text.splitlines(), start=1), need_answers)
    if not questions:
        raise UserError(f"{path}: no questions (empty file)")
    _check_unique(questions)
    return questions


class _Repeated(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (json.loads would keep the last one silently)."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _Repeated(key)
        obj[key] = value
    return obj


def _why(e: Exception) -> str:
    if isinstance(e, _Repeated):
        return f"the key {quote(e.key)} appears twice in one object; keep one"
    return "nested too deeply" if isinstance(e, RecursionError) else str(e).split(":")[0][:80]


def _read_nested(path: Path, whole: Any, need_answers: bool = True) -> list[Question]:
    layout = '{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers"}]}]}]}'
    if not isinstance(whole, dict) or not isinstance(whole.get("data"), list):
        raise UserError(f'{path}: not a SQuAD file: it needs a top-level object with a list under "data" ({layout})')
    questions = []
    for a, article in enumerate(whole["data"]):
        where = f"{path}: data[{a}]"
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise UserError(f'{where} has no list of "paragraphs" ({layout})')
        title = article.get("title", "")
        if not isinstance(title, str):
            raise UserError(f"{where}: the title is {quote(title, 40)}, not a string")
        for p, paragraph in enumerate(article["paragraphs"]):
            here = f"{where}.paragraphs[{p}]"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                raise UserError(f'{here} has no list of "qas" ({layout})')
            context = paragraph.get("context")
            if not isinstance(context, str) or not context.strip():
                raise UserError(f'{here} has no "context" text')
            for q, qa in enumerate(paragraph["qas"]):
                if not isinstance(qa, dict):
                    raise UserError(f"{here}.qas[{q}] is not an object")
                qid = _id(qa, f"{here}.qas[{q}]")
                questions.append(_nested_question(qa, qid, context, title, str(path), need_answers))
    if not questions:
        raise UserError(f"{path}: no questions")
    return questions


def _nested_question(
    qa: dict[str, Any], qid: str, context: str, title: str, where: str, need_answers: bool = True
) -> Question:
    here = f"{where}: question {quote(qid)}"
    if not need_answers:  # questions to answer: any answers they carry are not read
        return Question(qid, _question(qa, here), context, (), (), title, where)
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise UserError(f"{here}: is_impossible is {quote(impossible, 40)}; it must be true or false")
    answers = _answer_list(qa, "answers", here, context, check_offsets=True)
    if impossible and answers:
        raise UserError(f"{here}: is_impossible is true but it has answers; empty its answers or set it false")
    # plausible_answers are kept for reading, never trained on or scored: their offsets are not checked
    plausible = ()
    if "plausible_answers" in qa:
        plausible = _answer_list(qa, "plausible_answers", here, context, check_offsets=False)
    return Question(qid, _question(qa, here), context, answers, plausible, title, where)


def _id(obj: dict[str, Any], where: str) -> str:
    if "id" not in obj:
        raise UserError(f'{where} has no "id"')
    qid = obj["id"]
    if isinstance(qid, int) and not isinstance(qid, bool):
        return str(qid)
    if not isinstance(qid, str) or not qid.strip():
        raise UserError(f"{where}: the id {quote(qid, 40)} is not a non-empty string")
    return qid


def _question(obj: dict[str, Any], where: str) -> str:
    question = obj.get("question")
    if not isinstance(question, str) or not question.strip():
        raise UserError(f'{where} has no "question" text')
    return question


def _answer_list(qa: dict[str, Any], key: str, where: str, context: str, check_offsets: bool) -> tuple[Answer, ...]:
    items = qa.get(key)
    if not isinstance(items, list):
        raise UserError(f'{where} has no list of "{key}" (an empty list for no answer)')
    answers = []
    for item in items:
        if not isinstance(item, dict) or "text" not in item or "answer_start" not in item:
            raise UserError(f'{where}: each of its {key} needs a "text" and an "answer_start"')
        answers.append(_answer(item["text"], item["answer_start"], where, context, check_offsets))
    return tuple(answers)


def _answer(text: Any, start: Any, where: str, context: str, check_offset: bool = True) -> Answer:
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{where}: the answer text {quote(text, 40)} is not a non-empty string")
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise UserError(f"{where}: answer_start {quote(start, 40)} is not a character offset (an integer >= 0)")
    if check_offset and context[start : start + len(text)] != text:
        found = context.find(text)
        hint = f"the text is at {found}" if found >= 0 else "the text is nowhere in the context"
        raise UserError(
            f"{where}: answer_start {start} does not point at the answer {quote(text, 60)} "
            f"(the context there reads {quote(context[start : start + len(text)], 60)}; {hint})"
        )
    return Answer(text, start)


def question_lines(name: str, lines: Iterable[tuple[int, str]], need_answers: bool = True) -> list[Question]:
    """The questions of numbered JSON lines (of the file or stream `name`); blank lines are skipped. Without
    `need_answers`, "id" (its line number by default) and "answers" may be left out."""
    path = name
    example = '{"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}}'
    if not need_answers:
        example = '{"question", "context"} (an "id" is optional)'
    questions = []
    for n, raw in lines:
        if not raw.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(raw, object_pairs_hook=_object)
        except json.JSONDecodeError as e:
            raise UserError(
                f"{where}: not valid JSON ({e.msg}, column {e.colno}); a JSON lines file holds one object a line"
            ) from None
        except (ValueError, RecursionError, _Repeated) as e:
            raise UserError(f"{where}: not valid JSON ({_why(e)})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{where}: not a JSON object; each line is one question like {example}")
        for key in ("id", "question", "context", "answers") if need_answers else ("question", "context"):
            if key not in obj:
                raise UserError(f"{where}: no key {quote(key)}; each line is one question like {example}")
        qid = _id(obj, where) if "id" in obj else str(n)
        here = f"{where}: question {quote(qid)}"
        context = obj["context"]
        if not isinstance(context, str) or not context.strip():
            raise UserError(f'{here} has no "context" text')
        # questions to answer: any answers they carry are not read
        answers = obj["answers"] if need_answers else {"text": [], "answer_start": []}
        texts, starts = (answers.get("text"), answers.get("answer_start")) if isinstance(answers, dict) else (0, 0)
        if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
            raise UserError(
                f'{here}: "answers" must be {{"text": [...], "answer_start": [...]}}, two lists of one length'
            )
        title = obj.get("title", "")
        if not isinstance(title, str):
            raise UserError(f"{here}: the title is {quote(title, 40)}, not a string")
        found = tuple(_answer(t, s, here, context) for t, s in zip(texts, starts))
        questions.append(Question(qid, _question(obj, here), context, found, (), title, where))
    return questions


def _check_unique(questions: list[Question]) -> None:
    seen: dict[str, Question] = {}
    for q in questions:
        if q.id in seen:
            first = seen[q.id].where
            at = f" (first on line {first.rsplit(':', 1)[-1]})" if first != q.where else ""
            raise UserError(f"{q.where}: the question id {quote(q.id)} appears twice{at}; ids must be unique")
        seen[q.id] = q


def version_2(questions: list[Question]) -> bool:
    """Whether some question has no answer: SQuAD v2 data, scored with evaluate-v2.0.py's rules."""
    return any(not q.answers for q in questions)
