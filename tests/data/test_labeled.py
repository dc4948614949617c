"""Readers of labelled data: each rule of data/labeled.py as a property on small files, plus the real GLUE and
CoNLL-2003 counts when the shared data is present."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer_cli.core.errors import UserError
from transformer_cli.data.labeled import (
    GLUE_TASKS,
    TaggedSentence,
    TextExample,
    check_labels,
    glue_tasks_in,
    label_set,
    look_alike,
    read_conll,
    read_glue,
    read_plain,
    read_table,
)

from ..conftest import one_line_error

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def refused(fn, *args, match: str) -> str:
    """The one-line UserError `fn(*args)` raises, matching `match`."""
    with pytest.raises(UserError, match=match) as e:
        fn(*args)
    return one_line_error(e)


# --- TSV ------------------------------------------------------------------------------------------------------


def test_a_column_named_twice_is_refused_not_guessed(tmp_path):
    for name, text in (
        ("a.tsv", "sentence\tsentence\tlabel\nfirst\tsecond\tpos\n"),
        ("a.csv", "sentence,label,label\nfirst,pos,neg\n"),
    ):
        message = refused(
            read_table, write(tmp_path / name, text), "sentence", None, "label", "classification", match="times"
        )
        assert message.startswith(f"{tmp_path / name}:1: the header names the column"), message
    path = write(
        tmp_path / "a.jsonl", '{"sentence": "a", "label": "pos"}\n{"sentence": "b", "sentence": "c", "label": "pos"}\n'
    )
    message = refused(read_table, path, "sentence", None, "label", "classification", match="appears twice")
    assert message.startswith(f"{path}:2: the key 'sentence'"), message


def test_tsv_splits_on_tab_only_and_keeps_quotes(tmp_path):
    p = write(tmp_path / "a.tsv", 'sentence\tpair\tlabel\nHe said "hi\tand, then\tpos\n"odd" one\tx\tneg\n')
    got = read_table(p, "sentence", "pair", "label", "classification")
    assert got == [TextExample('He said "hi', "and, then", "pos", 2), TextExample('"odd" one', "x", "neg", 3)]


def test_tsv_bom_crlf_strip_and_blank_lines(tmp_path):
    p = write(tmp_path / "a.tsv", "\ufefflabel\ttext\r\n1\t  spaced text \r\n\r\n0\tb\r\n")
    got = read_table(p, "text", None, "label", "classification")
    assert got == [TextExample("spaced text", None, "1", 2), TextExample("b", None, "0", 4)]


def test_tsv_without_labels_and_regression(tmp_path):
    p = write(tmp_path / "a.tsv", "text\tscore\na\t4.250\nb\t-1e-3\n")
    assert [e.label for e in read_table(p, "text", None, None, "classification")] == [None, None]
    assert [e.label for e in read_table(p, "text", None, "score", "regression")] == [4.25, -0.001]


def test_tsv_wrong_field_count_names_the_line(tmp_path):
    p = write(tmp_path / "a.tsv", "text\tlabel\na\t1\nb\t1\textra\n")
    message = refused(read_table, p, "text", None, "label", "classification", match="3 fields")
    assert message.startswith(f"{p}:3: ") and "header has 2" in message


def test_tsv_empty_text_and_missing_label(tmp_path):
    p = write(tmp_path / "a.tsv", "text\tlabel\na\t1\n   \t0\n")
    assert refused(read_table, p, "text", None, "label", "classification", match="empty text").startswith(f"{p}:3: ")
    p = write(tmp_path / "b.tsv", "text\tlabel\na\t1\nb\t \n")
    assert refused(read_table, p, "text", None, "label", "classification", match="missing label").startswith(f"{p}:3: ")
    # Without a label column asked for, the same file reads.
    assert len(read_table(p, "text", None, None, "classification")) == 2


@pytest.mark.parametrize("value", ["high", "nan", "inf", "-inf", "1_0", "\uff15", "0x10", "1e999", "--1", "1.2.3"])
def test_regression_label_must_be_a_finite_float(tmp_path, value):
    p = write(tmp_path / "a.tsv", f"text\tscore\na\t1.0\nb\t{value}\n")
    message = refused(read_table, p, "text", None, "score", "regression", match="not a finite number")
    assert message.startswith(f"{p}:3: ")


@pytest.mark.parametrize("value", ["1e300", "-1e39", "2e18"])
def test_a_regression_label_whose_square_overflows_float32_is_refused(tmp_path, value):
    """1e39 (or 1e300) passed as finite, then trained with loss inf and every update skipped, exit 0."""
    p = write(tmp_path / "a.jsonl", f'{{"text": "a", "score": 1}}\n{{"text": "b", "score": {value}}}\n')
    message = refused(read_table, p, "text", None, "score", "regression", match="beyond ±1e\\+18")
    assert message.startswith(f"{p}:2: ")
    p = write(tmp_path / "b.tsv", "text\tscore\na\t1e18\nb\t-1e18\n")  # the bound itself reads
    assert [e.label for e in read_table(p, "text", None, "score", "regression")] == [1e18, -1e18]


def test_regression_labels_as_numbers_are_written(tmp_path):
    values = ["3", "-2.5", "+.5", "1e-3", "4.", "2E+2", " 7 "]
    p = write(tmp_path / "a.tsv", "text\tscore\n" + "".join(f"t\t{v}\n" for v in values))
    assert [e.label for e in read_table(p, "text", None, "score", "regression")] == [3, -2.5, 0.5, 1e-3, 4, 200, 7]


def test_missing_column_names_the_columns_there_are(tmp_path):
    p = write(tmp_path / "a.tsv", "sentence\tgold\na\t1\n")
    message = refused(read_table, p, "sentence", None, "label", "classification", match="no column 'label'")
    assert str(p) in message and "'sentence', 'gold'" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    p = write(tmp_path / "a.tsv", b"text\tlabel\na\t1\nb\xff\t0\n")
    message = refused(read_table, p, "text", None, "label", "classification", match="invalid UTF-8")
    assert str(p) in message and "line 3" in message
    p = write(tmp_path / "a.csv", b"text,label\na,1\nb\xff,0\n")
    assert "line 3" in refused(read_table, p, "text", None, "label", "classification", match="invalid UTF-8")
    for name in ("a.tsv", "a.csv", "a.jsonl"):  # a NUL byte is valid UTF-8 but no text
        sep = "\t" if name.endswith("tsv") else ","
        content = (
            b'{"text": "a", "label": 1}\n{"text": "b\0", "label": 0}\n'
            if name.endswith("jsonl")
            else f"text{sep}label\na{sep}1\nb\0{sep}0\n".encode()
        )
        p = write(tmp_path / name, content)
        message = refused(read_table, p, "text", None, "label", "classification", match="a NUL byte")
        assert f"line {2 if name.endswith('jsonl') else 3}" in message, message


@pytest.mark.parametrize("name,content", [("a.tsv", ""), ("b.tsv", "text\tlabel\n"), ("c.csv", "text,label\n")])
def test_a_file_without_examples_is_an_error(tmp_path, name, content):
    p = write(tmp_path / name, content)
    assert str(p) in refused(read_table, p, "text", None, "label", "classification", match="no examples")


def test_unknown_suffix_names_the_formats(tmp_path):
    p = write(tmp_path / "a.xlsx", "x")
    message = refused(read_table, p, "text", None, None, "classification", match="unknown table format")
    assert ".tsv, .csv, .jsonl, .json" in message


# --- CSV and JSONL --------------------------------------------------------------------------------------------


def test_csv_quoting_and_embedded_newline_report_the_starting_line(tmp_path):
    p = write(tmp_path / "a.csv", 'text,label\n"one, with comma",a\n"two\nlines ""quoted""",b\nthree,c\n')
    got = read_table(p, "text", None, "label", "classification")
    assert got == [
        TextExample("one, with comma", None, "a", 2),
        TextExample('two\nlines "quoted"', None, "b", 3),
        TextExample("three", None, "c", 5),
    ]
    p = write(tmp_path / "b.csv", 'text,label\n"multi\nline",a,extra\n')
    assert refused(read_table, p, "text", None, "label", "classification", match="3 fields").startswith(f"{p}:2: ")


@pytest.mark.parametrize(
    "body",
    [
        'x,a\n"stray quote,b\ny,a\nz,"b\n',  # a quote left open swallowed the rows after it
        'x,a\n"quoted"tail,b\n',  # text after a closing quote
        'x,a\n"open until the end,b\ny,a\n',
    ],
)
def test_a_stray_csv_quote_is_one_line_not_rows_merged(tmp_path, body):
    """Python's lenient csv reader read these as fewer rows holding other rows' text and labels, in silence."""
    p = write(tmp_path / "a.csv", "text,label\n" + body)
    message = refused(read_table, p, "text", None, "label", "classification", match="not valid CSV")
    assert message.startswith(f"{p}:") and "quoting" in message


def test_csv_bom_and_crlf(tmp_path):
    p = write(tmp_path / "a.csv", "\ufefftext,label\r\nx,1\r\n")
    assert read_table(p, "text", None, "label", "classification") == [TextExample("x", None, "1", 2)]


def test_jsonl_reads_keys_and_skips_blank_lines(tmp_path):
    p = write(
        tmp_path / "a.jsonl",
        '{"premise": "a", "hypothesis": "b", "label": "yes"}\n\n{"premise": " c ", "hypothesis": "d", "label": 2}\n',
    )
    got = read_table(p, "premise", "hypothesis", "label", "classification")
    assert got == [TextExample("a", "b", "yes", 1), TextExample("c", "d", "2", 3)]
    p = write(tmp_path / "r.json", '{"t": "a", "y": 0.5}\n{"t": "b", "y": "2"}\n')
    assert [e.label for e in read_table(p, "t", None, "y", "regression")] == [0.5, 2.0]


@pytest.mark.parametrize(
    "line,match",
    [
        ("[1, 2]", "not a JSON object"),
        ("{not json", "not valid JSON .Expecting property name enclosed in double quotes, column 2"),
        ('{"text": "a", "n": 1' + "0" * 5000 + "}", "not valid JSON .Exceeds the limit .4300 digits"),  # tracebacks
        ('{"text": "a", "n": ' + "[" * 100_000 + "]" * 100_000 + "}", "not valid JSON .nested too deeply"),
        ('{"label": "x"}', "no key 'text'"),
        ('{"text": 5, "label": "x"}', "not a string"),
        ('{"text": "", "label": "x"}', "empty text"),
        ('{"text": "a", "label": null}', "missing label"),
        ('{"text": "a", "label": true}', "should be a string or an integer"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, line, match):
    p = write(tmp_path / "a.jsonl", '{"text": "ok", "label": "x"}\n' + line + "\n")
    assert refused(read_table, p, "text", None, "label", "classification", match=match).startswith(f"{p}:2: ")


# --- labels ---------------------------------------------------------------------------------------------------


def test_label_set_and_check_labels(tmp_path):
    train = [TextExample("a", None, "neg", 1), TextExample("b", None, "pos", 2), TextExample("c", None, "neg", 3)]
    labels = label_set(train, tmp_path / "train.tsv")
    assert labels == ("neg", "pos")
    assert label_set([TextExample("a", None, s, 1) for s in ("10", "2", "1")], tmp_path) == ("1", "2", "10")
    dev = [TextExample("a", None, "pos", 2), TextExample("b", None, "neutral", 7)]
    message = refused(check_labels, dev, labels, tmp_path / "dev.tsv", match="'neutral'")
    assert message.startswith(f"{tmp_path / 'dev.tsv'}:7: ") and "'neg', 'pos'" in message
    check_labels([TextExample("a", None, None, 1)], labels, tmp_path)  # unlabelled passes
    refused(label_set, [TextExample("a", None, None, 4)], tmp_path / "t.tsv", match=r"t\.tsv:4: no label")
    refused(label_set, [], tmp_path / "t.tsv", match="no examples")


def test_labels_that_print_alike(tmp_path):
    """An invisible character makes another class that prints as the same label: refused, naming the line (a
    tag's line too); labels differing in case or number form are named by look_alike (finetune warns)."""
    for hidden in ("\u200b", "\x00", "\ufeff", "\x7f"):
        train = [TextExample("a", None, "1", 1), TextExample("b", None, "1" + hidden, 2)]
        refused(label_set, train, tmp_path / "t.tsv", match=r"t\.tsv:2: label .* invisible character U\+")
    tags = [TaggedSentence(("a", "b"), ("O", "B-PER\u200b"), 5)]
    refused(label_set, tags, tmp_path / "t.conll", match=r"t\.conll:6: label")
    assert label_set([TextExample("a", None, "\U0001f469\u200d\U0001f4bb", 1)], tmp_path)  # an emoji's joiner
    # joiners and variation selectors outside an emoji, Hangul fillers, the combining grapheme joiner: "1" again
    for hidden in ("\u200d", "\ufe0f", "\u034f", "\u115f", "\u3164", "\uffa0", "\U000e0100"):
        train = [TextExample("a", None, "1", 1), TextExample("b", None, "1" + hidden, 2)]
        refused(label_set, train, tmp_path / "t.tsv", match=r"t\.tsv:2: label .* invisible character U\+")
        refused(label_set, [TextExample("b", None, "x" + hidden + "y", 1)], tmp_path / "t.tsv", match=r"U\+")
    for emoji in (
        "\u2764\ufe0f",
        "1\ufe0f\u20e3",
        "\U0001f3f3\ufe0f\u200d\U0001f308",
        "\U0001f468\U0001f3fd\u200d\U0001f4bb",
    ):
        assert label_set([TextExample("a", None, emoji, 1)], tmp_path) == (emoji,)
    assert look_alike(("0", "01", "1", "1.0", "Neg", "neg", "pos")) == [("01", "1"), ("Neg", "neg")]
    assert look_alike(("entailment", "not_entailment")) == []


def test_label_set_and_check_of_tags(tmp_path):
    train = [TaggedSentence(("a", "b"), ("B-PER", "O"), 1), TaggedSentence(("c",), ("B-LOC",), 4)]
    assert label_set(train, tmp_path) == ("B-LOC", "B-PER", "O")
    dev = [TaggedSentence(("x", "y"), ("O", "I-MISC"), 9)]
    assert refused(check_labels, dev, ("O", "B-PER"), tmp_path / "d", match="'I-MISC'").startswith(
        f"{tmp_path / 'd'}:10: "  # the line of the word with the unknown tag, not of its sentence's first word
    )
    conll = write(tmp_path / "dev.conll", "-DOCSTART- O\n\nJohn B-PER\nlives O\n\nin O\nBerlin B-LOC\nnow O\n")
    message = refused(check_labels, read_conll(conll), ("O", "B-PER"), conll, match="'B-LOC'")
    assert message.startswith(f"{conll}:7: "), message


# --- CoNLL and plain text -------------------------------------------------------------------------------------


def test_conll_docstart_blank_lines_word_first_tag_last(tmp_path):
    p = write(
        tmp_path / "a.txt",
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\nPeter NNP B-NP B-PER\n"
        "-DOCSTART- -X- -X- O\n\nBlackburn\tNNP\tI-NP\tI-PER\r\n",
    )
    assert read_conll(p) == [
        TaggedSentence(("EU", "rejects"), ("B-ORG", "O"), 3),
        TaggedSentence(("Peter",), ("B-PER",), 7),
        TaggedSentence(("Blackburn",), ("I-PER",), 10),
    ]


def test_conll_words_only_and_mixed(tmp_path):
    p = write(tmp_path / "a.txt", "Hello\nworld\n\nBye\n")
    assert read_conll(p) == [TaggedSentence(("Hello", "world"), None, 1), TaggedSentence(("Bye",), None, 4)]
    p = write(tmp_path / "b.txt", "Hello O\nworld O\n\nBye\n")
    assert refused(read_conll, p, match="no tag").startswith(f"{p}:4: ")
    p = write(tmp_path / "c.txt", "Hello\nworld O\n")
    assert refused(read_conll, p, match="has a tag").startswith(f"{p}:2: ")


def test_conll_empty_file(tmp_path):
    p = write(tmp_path / "a.txt", "-DOCSTART- O\n\n\n")
    refused(read_conll, p, match="no sentences")


def test_plain_one_text_per_line_and_empty_lines_are_errors(tmp_path):
    p = write(tmp_path / "a.txt", "first text\r\n second\t with tab \n")
    assert read_plain(p) == [TextExample("first text", None, None, 1), TextExample("second\t with tab", None, None, 2)]
    p = write(tmp_path / "b.txt", "a\n  \nb\n")
    assert refused(read_plain, p, match="empty line").startswith(f"{p}:2: ")
    refused(read_plain, write(tmp_path / "c.txt", ""), match="empty file")


# --- GLUE -----------------------------------------------------------------------------------------------------


def test_glue_tasks_table():
    assert list(GLUE_TASKS) == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]
    assert GLUE_TASKS["mnli"].labels == ("contradiction", "entailment", "neutral")
    assert GLUE_TASKS["mnli"].dev_splits == ("dev_matched", "dev_mismatched")
    assert GLUE_TASKS["stsb"].kind == "regression" and GLUE_TASKS["stsb"].labels is None
    assert not GLUE_TASKS["cola"].header and GLUE_TASKS["cola"].text == 3 and GLUE_TASKS["cola"].label == 1
    for t in GLUE_TASKS.values():
        assert (t.labels is None) == (t.kind == "regression")


def test_read_glue_on_small_folders(tmp_path):
    write_dir = tmp_path / "CoLA"
    write_dir.mkdir()
    write(write_dir / "train.tsv", "gj04\t1\t\tGood one.\ngj04\t0\t*\tBad one .\n")
    write(write_dir / "dev.tsv", 'gj04\t1\t\tDev "quoted.\n')
    (tmp_path / "MNLI").mkdir()
    header = "index\tsentence1\tsentence2\tgold_label\n"
    write(tmp_path / "MNLI" / "train.tsv", header + "0\ta\tb\tneutral\n")
    write(tmp_path / "MNLI" / "dev_mismatched.tsv", header + "0\ta\tb\tmaybe\n")
    (tmp_path / "RTE").mkdir()  # no train.tsv: not listed
    assert glue_tasks_in(tmp_path) == ["cola", "mnli"]
    assert read_glue(tmp_path, "cola", "train") == [
        TextExample("Good one.", None, "1", 1),
        TextExample("Bad one .", None, "0", 2),
    ]
    assert read_glue(tmp_path, "cola", "dev")[0].text == 'Dev "quoted.'
    assert read_glue(tmp_path, "mnli", "train") == [TextExample("a", "b", "neutral", 2)]
    assert refused(read_glue, tmp_path, "mnli", "dev_mismatched", match="'maybe'").startswith(
        f"{tmp_path / 'MNLI' / 'dev_mismatched.tsv'}:2: "
    )
    refused(read_glue, tmp_path, "mnli", "dev", match="no split 'dev'")
    refused(read_glue, tmp_path, "mnli", "dev_matched", match="not found")
    refused(read_glue, tmp_path, "squad", "train", match="unknown GLUE task")


GLUE_COUNTS = {
    "cola": (8551, 1043),
    "sst2": (67349, 872),
    "mrpc": (3668, 408),
    "stsb": (5749, 1500),
    "rte": (2490, 277),
    "wnli": (635, 71),
}


@pytest.mark.skipif(not (SHARED_DATA / "glue").is_dir(), reason=f"shared GLUE data not present at {SHARED_DATA}")
def test_real_glue_counts():
    glue = SHARED_DATA / "glue"
    assert glue_tasks_in(glue) == list(GLUE_COUNTS)
    for task, counts in GLUE_COUNTS.items():
        train, dev = read_glue(glue, task, "train"), read_glue(glue, task, "dev")
        assert (len(train), len(dev)) == counts, task
        if GLUE_TASKS[task].labels is not None:
            assert label_set(train, glue) == GLUE_TASKS[task].labels
        assert all((e.pair is None) == (GLUE_TASKS[task].pair is None) for e in train)
    # MRPC's BOM is dropped from its header, and texts keep their quote characters.
    assert any('"' in e.text for e in read_glue(glue, "mrpc", "train"))
    assert all(0.0 <= e.label <= 5.0 for e in read_glue(glue, "stsb", "dev"))


@pytest.mark.skipif(not (SHARED_DATA / "conll2003").is_dir(), reason=f"shared CoNLL-2003 not present at {SHARED_DATA}")
def test_real_conll2003_counts():
    for name, sentences, tokens in (("train.txt", 14041, 203621), ("valid.txt", 3250, 51362)):
        got = read_conll(SHARED_DATA / "conll2003" / name)
        assert (len(got), sum(len(s.words) for s in got)) == (sentences, tokens), name
        assert len(label_set(got, SHARED_DATA)) == 9


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
@pytest.mark.parametrize("name", ["z.tsv", "z.csv", "z.jsonl", "z.conll"])
def test_a_table_that_is_a_device_is_refused_not_read_until_the_memory_is_gone(tmp_path, name):
    """`predict --input z.tsv` with z.tsv a link to /dev/zero was killed by the system at 23 GB, saying nothing."""
    from transformer_cli.data.labeled import read_conll

    link = tmp_path / name
    link.symlink_to("/dev/zero")
    read = (
        (lambda: read_conll(link))
        if name.endswith("conll")
        else (lambda: read_table(link, "text", None, "label", "classification"))
    )
    with pytest.raises(UserError, match=f"{name} is not a regular file .a device, FIFO or socket.; save the table"):
        read()


def test_a_headerless_glue_task_s_own_file_is_read_by_its_model(tmp_path):
    """`evaluate --input CoLA/dev.tsv` with a CoLA model said "no column 'sentence'" of CoLA's own (headerless)
    file; a table with a header naming the model's columns still reads by them."""
    from transformer_cli.data.labeled import read_task_table

    cola = GLUE_TASKS["cola"]
    own = write(tmp_path / "dev.tsv", "gj04\t1\t\tGood one.\ngj04\t0\t*\tBad one .\n")
    named = write(tmp_path / "named.tsv", "sentence\tlabel\nGood one.\t1\nBad one .\t0\n")
    for path in (own, named):
        examples = read_task_table(path, cola, "sentence", None, "label", "classification")
        assert [(e.text, e.label) for e in examples] == [("Good one.", "1"), ("Bad one .", "0")], path
        unlabelled = read_task_table(path, cola, "sentence", None, None, "classification")
        assert [(e.text, e.label) for e in unlabelled] == [("Good one.", None), ("Bad one .", None)], path
    sst2 = GLUE_TASKS["sst2"]  # a task whose files have a header: the named columns, as before
    refused(read_task_table, own, sst2, "sentence", None, "label", "classification", match="no column")


# --- tables without a header (CLUE's) -------------------------------------------------------------------------


def test_columns_name_a_headerless_table_and_a_txt_file_is_tsv(tmp_path):
    """CLUE's AFQMC: train.txt, `sentence1<TAB>sentence2<TAB>label`, no header; every line is an example."""
    rows = "蚂蚁借呗等额还款可以换成先息后本吗\t借呗有先息到期还本吗\t0\n"
    rows += "花呗支持高铁票支付吗\t为什么友付宝不支持花呗付款\t1\n"
    columns = ["sentence1", "sentence2", "label"]
    for name in ("train.txt", "train.tsv"):
        got = read_table(write(tmp_path / name, rows), "sentence1", "sentence2", "label", "classification", columns)
        assert [(e.text, e.pair, e.label, e.line) for e in got] == [
            ("蚂蚁借呗等额还款可以换成先息后本吗", "借呗有先息到期还本吗", "0", 1),
            ("花呗支持高铁票支付吗", "为什么友付宝不支持花呗付款", "1", 2),
        ]
    csv_rows = '"新闻，标题",news_tech\n体育新闻,news_sports\n'
    got = read_table(write(tmp_path / "t.csv", csv_rows), "s", None, "l", "classification", ["s", "l"])
    assert [(e.text, e.label) for e in got] == [("新闻，标题", "news_tech"), ("体育新闻", "news_sports")]
    headed = write(tmp_path / "h.txt", "s\tl\n标题\tnews_car\n")  # a .txt table with a header, by data.format
    got = read_table(headed, "s", None, "l", "classification", None, "tsv")
    assert [(e.text, e.label, e.line) for e in got] == [("标题", "news_car", 2)]


def test_a_headerless_row_of_another_width_and_a_header_line_are_one_line(tmp_path):
    columns = ["sentence1", "sentence2", "label"]
    path = write(tmp_path / "dev.txt", "一\t二\t0\n只有一句\t1\n")
    message = refused(read_table, path, "sentence1", "sentence2", "label", "classification", columns, match="2 fields")
    assert message.startswith(f"{path}:2: 2 fields but the columns given are 3 (sentence1, sentence2, label)")
    path = write(tmp_path / "train.txt", "sentence1\tsentence2\tlabel\n一\t二\t0\n")
    message = refused(read_table, path, "sentence1", "sentence2", "label", "classification", columns, match="header")
    assert message.startswith(f"{path}:1: this line is a header") and "remove data.columns" in message


def test_a_model_of_headerless_files_reads_them_and_a_file_with_a_header(tmp_path):
    """tcli predict / evaluate: the model's columns for a file like its training files, the header where there
    is one (ChnSentiCorp's dev.tsv carries a qid column its train.tsv lacks)."""
    from transformer_cli.data.labeled import read_task_table

    columns = ["sentence", "label_desc"]
    plain = write(tmp_path / "dev.tsv", "江疏影甜甜圈自拍\tnews_entertainment\n出栏一头猪亏损300元\tnews_finance\n")
    headed = write(tmp_path / "more.tsv", "id\tsentence\n7\t以色列大规模空袭开始！\n")
    got = read_task_table(plain, None, "sentence", None, "label_desc", "classification", columns)
    want = [("江疏影甜甜圈自拍", "news_entertainment"), ("出栏一头猪亏损300元", "news_finance")]
    assert [(e.text, e.label) for e in got] == want
    got = read_task_table(headed, None, "sentence", None, None, "classification", columns)
    assert [(e.text, e.label, e.line) for e in got] == [("以色列大规模空袭开始！", None, 2)]


def test_config_columns_must_hold_the_roles(tmp_path):
    from pydantic import ValidationError

    from transformer_cli.config import FinetuneRunConfig, load_config

    ok = ["data.columns=[sentence1,sentence2,label]", "data.text=sentence1", "data.pair=sentence2"]
    assert load_config(FinetuneRunConfig, None, ok).data.columns == ["sentence1", "sentence2", "label"]
    for sets, match in (
        (["data.columns=[a,b]"], "data.text is 'sentence', which is not one of data.columns"),
        (["data.columns=[sentence,label,label]"], "names the column 'label' twice"),
        (["data.columns=[sentence,label]", "task.glue=SST-2"], "data.columns is set but task.glue"),
        (["data.columns=[w,t]", "task.kind=tagging"], "data.columns names a table column"),
    ):
        with pytest.raises((ValidationError, UserError, ValueError), match=match):
            load_config(FinetuneRunConfig, None, sets)


CLUE = SHARED_DATA / "zh-clf"


@pytest.mark.skipif(not CLUE.is_dir(), reason=f"../shared/data/zh-clf not present at {CLUE}")
@pytest.mark.parametrize(
    "config, folder, overrides, counts, labels",
    [
        ("finetune_chnsenticorp", "ChnSentiCorp", [], (9600, 1200), ("0", "1")),
        ("finetune_tnews", "TNEWS", [], (53360, 10000), 15),
        ("finetune_tnews", "TNEWS", ["data.valid=dev.json"], (53360, 10000), 15),  # CLUE's own JSON lines
        ("finetune_afqmc", "AFQMC", [], (34334, 4316), ("0", "1")),
        ("finetune_afqmc", "LCQMC", ["data.train=dev.txt"], (8802, 8802), ("0", "1")),
        ("finetune_afqmc", "CMNLI", ["data.train=dev.txt"], (12241, 12241), ("contradiction", "entailment", "neutral")),
    ],
)
def test_shipped_chinese_configs_read_the_real_files(config, folder, overrides, counts, labels):
    from transformer_cli.config import FinetuneRunConfig, load_config
    from transformer_cli.finetune.setup import read_labelled

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(FinetuneRunConfig, root / "configs" / f"{config}.yaml", [f"data.dir={CLUE / folder}", *overrides])
    data = read_labelled(cfg)
    assert (len(data.train), len(data.valid)) == counts
    assert data.labels == labels if isinstance(labels, tuple) else len(data.labels) == labels
    assert all(ex.text and (ex.pair is not None) == (cfg.data.pair is not None) for ex in data.train)
