"""Pairs as people download them: one tab-separated file per split (`source<TAB>target<TAB>attribution`, as
Tatoeba/Anki exports and d2l's fra.txt are), read with data.format: tsv; every bad row is one line naming the file
and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer_cli.config import TranslationRunConfig, load_config
from transformer_cli.core.errors import UserError
from transformer_cli.core.text import read_lines
from transformer_cli.data.shards import split_columns
from transformer_cli.data.translation import read_tsv
from transformer_cli.vocab.spm import Vocab

from ..conftest import TEST_PRECISION, TOY, one_line_error, run_tcli

ATTRIBUTION = "CC-BY 2.0 (France) Attribution: tatoeba.org #1 (a) & #2 (b)"


def write_tsv(folder: Path, rows: int = 150) -> Path:
    """The toy pairs as three tsv files (train/valid/test), source, target, attribution; the first rows'
    targets in Chinese, as a Tatoeba export has them (no spaces, full-width punctuation)."""
    folder.mkdir(parents=True, exist_ok=True)
    chinese = ["我们为什么要工作？", "今天的天气非常好。", "他每天早上七点起床。"]
    for split, name, n in (("train", "train.tsv", rows), ("val", "valid.tsv", 10), ("test", "test.tsv", 10)):
        src = (TOY / f"{split}.src").read_text(encoding="utf-8").splitlines()[:n]
        tgt = (TOY / f"{split}.tgt").read_text(encoding="utf-8").splitlines()[:n]
        tgt[: len(chinese)] = chinese
        (folder / name).write_text("".join(f"{s}\t{t}\t{ATTRIBUTION}\n" for s, t in zip(src, tgt)), encoding="utf-8")
    return folder


TSV_CONFIG = """
data: {{dir: {data}, format: tsv, src_lang: en, tgt_lang: zh, train: train.tsv, valid: valid.tsv, test: test.tsv,
        max_len: 60}}
vocab: {{size: 150}}
model: {{d_model: 32, heads: 4, ffn_dim: 64, enc_layers: 1, dec_layers: 1}}
train: {{max_steps: 4, max_tokens: 400, lr: 0.003, warmup_steps: 2, eval_every: 4, seed: 3, precision: {precision}}}
eval: {{beam: 1, max_len_b: 5}}
"""


def tsv_config(tmp_path: Path, data: Path) -> Path:
    path = tmp_path / "tsv.yaml"
    path.write_text(TSV_CONFIG.format(data=data, precision=TEST_PRECISION))
    return path


def test_split_columns_takes_the_named_columns_and_keeps_the_rest_out():
    rows = ["Hi.\t嗨。\tCC-BY #1", "Run!\t你用跑的。\tCC-BY\t#2 with a tab"]
    assert split_columns(rows, (0, 1), "f") == (["Hi.", "Run!"], ["嗨。", "你用跑的。"])
    assert split_columns(rows, (1, 0), "f") == (["嗨。", "你用跑的。"], ["Hi.", "Run!"])
    assert split_columns(rows, (2, 0), "f")[0] == ["CC-BY #1", "CC-BY"]


@pytest.mark.parametrize(
    ("row", "columns", "fragments"),
    [
        ("Hi.", (0, 1), ("cmn.txt line 2", "1 tab-separated column", "need 2")),
        ("Hi.\t嗨。", (0, 2), ("cmn.txt line 2", "2 tab-separated columns", "data.tgt_column 2", "need 3")),
        ("\t嗨。\tCC", (0, 1), ("cmn.txt line 2", "source (column 0) is empty")),
        ("Hi.\t \tCC", (0, 1), ("cmn.txt line 2", "target (column 1) is empty")),
        ("", (0, 1), ("cmn.txt line 2", "1 tab-separated column")),
    ],
)
def test_a_bad_row_is_one_line_naming_file_and_line(row, columns, fragments):
    with pytest.raises(UserError) as info:
        split_columns(["Wait!\t等等！\tCC", row], columns, "cmn.txt")
    one_line_error(info, *fragments)


def test_read_tsv_counts_lines_across_a_bom_and_crlf(tmp_path):
    path = tmp_path / "cmn.txt"
    path.write_bytes("\ufeffHi.\t嗨。\tCC\r\nRun.\t你用跑的。\tCC\r\nWait!\r\n".encode())
    with pytest.raises(UserError) as info:
        read_tsv(path, (0, 1))
    one_line_error(info, f"{path} line 3")
    path.write_bytes("\ufeffHi.\t嗨。\tCC\r\nRun.\t你用跑的。\tCC\r\n".encode())
    assert read_tsv(path, (0, 1)) == (["Hi.", "Run."], ["嗨。", "你用跑的。"])


def test_tsv_keys_are_checked_at_load_time():
    base = ["train.max_steps=1", "data.format=tsv"]
    with pytest.raises(UserError) as info:
        load_config(TranslationRunConfig, None, [*base, "data.src_column=1"])
    one_line_error(info, "data.src_column and data.tgt_column are both 1")
    with pytest.raises(UserError) as info:
        load_config(TranslationRunConfig, None, ["train.max_steps=1", "data.tgt_column=2"])
    one_line_error(info, "data.format: tsv")
    with pytest.raises(UserError) as info:
        load_config(TranslationRunConfig, None, [*base, "data.format=csv"])
    one_line_error(info, "data.format")


def test_preprocess_reads_the_columns_of_a_tsv_split(tmp_path):
    data = write_tsv(tmp_path / "data")
    out = tmp_path / "pre"
    result = run_tcli("preprocess", "--config", str(tsv_config(tmp_path, data)), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["format"] == "tsv" and manifest["splits"]["train.tsv"]["counts"]["pairs"] == 150
    assert set(manifest["sources"]) == {"train.tsv", "valid.tsv", "test.tsv"}  # one file a split
    rows = read_lines(data / "valid.tsv")
    assert read_lines(out / "valid.tsv.ref") == [row.split("\t")[1] for row in rows]  # the target column, no more
    vocab = Vocab.load(out / "vocab" / "joint.model")
    first_src = rows[0].split("\t")[0]
    assert vocab.decode([vocab.encode([first_src])[0]]) == [first_src]
    assert vocab.unk_id not in vocab.encode(["我们为什么"])[0]  # the Chinese of the target column is in the vocabulary


@pytest.mark.parametrize(
    ("damage", "fragments"),
    [
        (lambda rows: rows[:4] + ["a row without a tab"] + rows[5:], ("train.tsv line 5", "1 tab-separated column")),
        (
            lambda rows: rows[:6] + ["\tonly a target\tCC"] + rows[7:],
            ("train.tsv line 7", "source (column 0) is empty"),
        ),
    ],
)
def test_training_refuses_a_bad_row_before_writing_anything(tmp_path, damage, fragments):
    data = write_tsv(tmp_path / "data")
    rows = read_lines(data / "train.tsv")
    (data / "train.tsv").write_text("".join(row + "\n" for row in damage(rows)), encoding="utf-8")
    run = tmp_path / "run"
    one_line_error(run_tcli("train", "--config", str(tsv_config(tmp_path, data)), "--out", str(run)), *fragments)
    assert not run.exists()


def test_invalid_utf8_in_a_tsv_split_names_its_line(tmp_path):
    data = write_tsv(tmp_path / "data")
    (data / "valid.tsv").write_bytes(b"Hi.\t\xe5\x97\xa8\tCC\nRun.\t\xff\tCC\n")
    result = run_tcli("preprocess", "--config", str(tsv_config(tmp_path, data)), "--out", str(tmp_path / "p"))
    one_line_error(result, "valid.tsv line 2", "invalid UTF-8")
