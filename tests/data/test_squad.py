"""Reading SQuAD: the published JSON (v1.1, v2.0) and HF datasets' JSON lines, and one-line errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer_cli.core.errors import UserError
from transformer_cli.data.squad import Answer, read_squad, version_2

SQUAD = Path("/work/shared/data/squad")
CONTEXT = "Denver Broncos beat the Carolina Panthers 24–10 in 2016. Attendance was 71,088 at Levi's Stadium."


def nested(qas: list[dict], context: str = CONTEXT, version: str = "1.1") -> dict:
    return {"version": version, "data": [{"title": "SB", "paragraphs": [{"context": context, "qas": qas}]}]}


def write_json(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    return path


def write_lines(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def qa(qid: str, text: str | None, start: int | None = None, **more) -> dict:
    answers = [] if text is None else [{"text": text, "answer_start": CONTEXT.index(text) if start is None else start}]
    return {"id": qid, "question": f"question {qid}?", "answers": answers, **more}


def row(qid: str, texts: list[str], starts: list[int] | None = None) -> dict:
    starts = [CONTEXT.index(t) for t in texts] if starts is None else starts
    return {
        "id": qid,
        "title": "SB",
        "question": f"q {qid}?",
        "context": CONTEXT,
        "answers": {"text": texts, "answer_start": starts},
    }


def test_v1_json_keeps_every_answer_and_the_file_order(tmp_path):
    path = write_json(tmp_path / "train.json", nested([qa("a", "Denver Broncos"), qa("b", "71,088")]))
    questions = read_squad(path)
    assert [q.id for q in questions] == ["a", "b"]
    assert questions[1].answers == (Answer("71,088", CONTEXT.index("71,088")),)
    assert questions[0].context == CONTEXT and questions[0].title == "SB"
    assert not version_2(questions)


def test_v2_json_reads_unanswerable_questions_and_plausible_answers(tmp_path):
    impossible = qa("c", None, is_impossible=True)
    impossible["plausible_answers"] = [{"text": "Levi's Stadium", "answer_start": CONTEXT.index("Levi's")}]
    path = write_json(tmp_path / "dev.json", nested([qa("a", "2016", is_impossible=False), impossible], version="v2.0"))
    a, c = read_squad(path)
    assert a.answers and not c.answers and c.plausible[0].text == "Levi's Stadium"
    assert version_2([a, c])


def test_hf_json_lines_under_jsonl_and_json_suffixes(tmp_path):
    rows = [row("a", ["Denver Broncos", "Broncos"]), row("b", []), row("c", ["24–10"])]
    for name in ("train.jsonl", "train.json"):
        questions = read_squad(write_lines(tmp_path / name, rows))
        assert [q.id for q in questions] == ["a", "b", "c"]
        assert [a.text for a in questions[0].answers] == ["Denver Broncos", "Broncos"]
        assert questions[1].answers == () and questions[2].answers[0].start == CONTEXT.index("24")
        assert questions[2].where == f"{tmp_path / name}:3"
    one = read_squad(write_lines(tmp_path / "one.json", rows[:1]))  # one line: an object, but not SQuAD's layout
    assert [q.id for q in one] == ["a"]


def error_of(path: Path) -> str:
    with pytest.raises(UserError) as e:
        read_squad(path)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_an_answer_start_off_its_text_names_the_file_and_the_question(tmp_path):
    path = write_json(tmp_path / "bad.json", nested([qa("a", "Denver"), qa("q-7", "Panthers", start=3)]))
    message = error_of(path)
    assert str(path) in message and "'q-7'" in message and "answer_start 3" in message
    assert f"the text is at {CONTEXT.index('Panthers')}" in message
    lines = write_lines(tmp_path / "bad.jsonl", [row("a", ["Denver"]), row("b", ["Broncos", "nowhere"], [7, 0])])
    message = error_of(lines)
    assert f"{lines}:2" in message and "'b'" in message and "nowhere in the context" in message


def test_duplicate_ids_name_the_file_and_both_lines(tmp_path):
    lines = write_lines(tmp_path / "d.jsonl", [row("x", ["Denver"]), row("y", []), row("x", [])])
    assert error_of(lines).startswith(f"{lines}:3: the question id 'x' appears twice (first on line 1)")
    path = write_json(tmp_path / "d.json", nested([qa("x", "Denver"), qa("x", "2016")]))
    assert "'x' appears twice" in error_of(path)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"data": [', "not valid JSON (Expecting value, line 1 column 11)"),
        ("[1, 2]", 'a list under "data"'),
        ('{"version": "1.1"}', 'a list under "data"'),
        ('{"data": [{"title": "t"}]}', 'data[0] has no list of "paragraphs"'),
        ('{"data": [{"paragraphs": [{"qas": []}]}]}', 'paragraphs[0] has no "context"'),
        ('{"data": [{"paragraphs": [{"context": "c"}]}]}', 'paragraphs[0] has no list of "qas"'),
        ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q?", "answers": []}]}]}]}', 'has no "id"'),
        ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "i", "answers": []}]}]}]}', 'has no "question"'),
        ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "i", "question": "q?"}]}]}]}', 'list of "answers"'),
        ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "i", "id": "j"}]}]}]}', "'id' appears twice"),
        ('{"data": []}', "no questions"),
    ],
)
def test_bad_json_is_one_line_naming_the_file(tmp_path, content, fragment):
    path = tmp_path / "x.json"
    path.write_text(content, encoding="utf-8")
    message = error_of(path)
    assert message.startswith(str(path)) and fragment in message, message


def test_answer_fields_are_checked(tmp_path):
    cases = [
        ({"text": "Denver"}, 'needs a "text" and an "answer_start"'),
        ({"text": "Denver", "answer_start": "0"}, "is not a character offset"),
        ({"text": "Denver", "answer_start": -1}, "is not a character offset"),
        ({"text": 5, "answer_start": 0}, "is not a non-empty string"),
    ]
    for answer, fragment in cases:
        path = write_json(tmp_path / "a.json", nested([{"id": "i", "question": "q?", "answers": [answer]}]))
        assert fragment in error_of(path)
    path = write_json(tmp_path / "i.json", nested([qa("i", "Denver", is_impossible=True)]))
    assert "is_impossible is true but it has answers" in error_of(path)
    path = write_json(tmp_path / "j.json", nested([qa("i", "Denver", is_impossible="no")]))
    assert "must be true or false" in error_of(path)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"id": "a", "question": ', "not valid JSON"),
        ("[1]", "not a JSON object"),
        ('{"id": "a", "question": "q?", "context": "c"}', "no key 'answers'"),
        ('{"id": "a", "question": "q?", "context": "c", "answers": {"text": ["c"]}}', "two lists of one length"),
        ('{"id": "a", "question": "q?", "context": "c", "answers": ["c"]}', "two lists of one length"),
        ('{"id": "a", "question": "q?", "context": "", "answers": {"text": [], "answer_start": []}}', "context"),
        ('{"id": "", "question": "q?", "context": "c", "answers": {"text": [], "answer_start": []}}', "the id ''"),
        ('{"id": "a", "id": "b"}', "'id' appears twice"),
    ],
)
def test_bad_json_lines_name_the_file_and_line(tmp_path, line, fragment):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(row("ok", ["Denver"])) + "\n\n" + line + "\n", encoding="utf-8")
    message = error_of(path)
    assert message.startswith(f"{path}:3") and fragment in message, message


def test_unreadable_files(tmp_path):
    assert "not found" in error_of(tmp_path / "missing.json")
    assert "is a folder" in error_of(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "a"}\n\xff\n')
    assert "line 2: invalid UTF-8" in error_of(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    assert "no questions" in error_of(empty)


def test_the_shared_squad_splits_read_whole():
    if not (SQUAD / "dev-split.json").is_file():
        pytest.skip("../shared/data/squad/dev-split.json not present")
    dev = read_squad(SQUAD / "dev-split.json")
    assert len(dev) == 1302 and not version_2(dev)  # the README's counts
    assert all(q.context[a.start : a.start + len(a.text)] == a.text for q in dev for a in q.answers)
    assert 1 <= min(len(q.answers) for q in dev) and max(len(q.answers) for q in dev) <= 6
