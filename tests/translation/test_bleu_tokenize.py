"""One BLEU tokenizer per run, everywhere it scores: validation and the test event in training, translate
--reference and evaluate (the checkpoint's choice, or --bleu-tokenize); checkpoints from before eval.bleu_tokenize
keep 13a."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from transformer_cli.checkpoint import read_checkpoint, serialize
from transformer_cli.core.files import write_atomic
from transformer_cli.core.metrics_log import read_metrics

from ..conftest import TEST_PRECISION, TOY, one_line_error, run_tcli
from ..data.test_tsv_pairs import tsv_config, write_tsv
from ..export.test_average import write_checkpoint
from ..metrics.test_bleu import ZH_REFS


@pytest.fixture(scope="module")
def zh_checkpoint(tmp_path_factory, toy_vocab) -> Path:
    """A tiny random model whose run said data.tgt_lang zh (and eval.bleu_tokenize auto)."""
    return write_checkpoint(
        tmp_path_factory.mktemp("zh") / "model.pt", toy_vocab, seed=5, step=1, data={"tgt_lang": "zh"}
    )


@pytest.fixture(scope="module")
def old_checkpoint(tmp_path_factory, zh_checkpoint) -> Path:
    """The same checkpoint as written before eval.bleu_tokenize existed: its stored config lacks the key."""
    state = torch.load(zh_checkpoint, weights_only=True)
    del state["config"]["eval"]["bleu_tokenize"]
    path = tmp_path_factory.mktemp("old") / "model.pt"
    write_atomic(serialize(state), path)
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("pair")
    src, ref = folder / "in.src", folder / "ref.zh"
    src.write_text("\n".join((TOY / "test.src").read_text(encoding="utf-8").splitlines()[:4]) + "\n", encoding="utf-8")
    ref.write_text("".join(line + "\n" for line in ZH_REFS), encoding="utf-8")
    return src, ref


def test_an_old_checkpoint_keeps_13a_and_a_new_one_its_setting(zh_checkpoint, old_checkpoint):
    assert read_checkpoint(zh_checkpoint).cfg.eval.bleu_tokenize == "auto"
    assert read_checkpoint(old_checkpoint).cfg.eval.bleu_tokenize == "13a"


@pytest.mark.parametrize(
    ("which", "option", "expected"),
    [
        ("zh", (), "tok:zh"),
        ("zh", ("--bleu-tokenize", "char"), "tok:char"),
        ("old", (), "tok:13a"),
        ("old", ("--bleu-tokenize", "auto"), "tok:zh"),
    ],
)
def test_translate_reference_scores_with_the_checkpoints_tokenizer_or_the_override(
    request, pair, tmp_path, which, option, expected
):
    ckpt = request.getfixturevalue(f"{which}_checkpoint")
    stats = tmp_path / "stats.json"
    args = ["--input", str(pair[0]), "--reference", str(pair[1]), "--beam", "1", "--stats-json", str(stats)]
    result = run_tcli("translate", "--checkpoint", str(ckpt), *args, *option, "--quiet")
    assert result.returncode == 0, result.stderr
    bleu_lines = [line for line in result.stderr.splitlines() if line.startswith("BLEU")]
    assert len(bleu_lines) == 2 and all(expected in line for line in bleu_lines), result.stderr
    assert expected in json.loads(stats.read_text())["bleu_signature"]


@pytest.mark.parametrize(
    ("which", "option", "expected"),
    [("zh", (), "tok:zh"), ("zh", ("--bleu-tokenize", "13a"), "tok:13a"), ("old", (), "tok:13a")],
)
def test_evaluate_scores_with_the_checkpoints_tokenizer_or_the_override(request, pair, which, option, expected):
    ckpt = request.getfixturevalue(f"{which}_checkpoint")
    args = ["--input", str(pair[0]), "--reference", str(pair[1]), "--beam", "1", "--json"]
    result = run_tcli("evaluate", "--checkpoint", str(ckpt), *args, *option)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert expected in report["bleu_signature"] and expected in report["bleu_lc_signature"]


def test_bleu_tokenize_options_refuse_mistakes_in_one_line(zh_checkpoint, pair, monkeypatch):
    ckpt = str(zh_checkpoint)
    unknown = run_tcli("translate", "--checkpoint", ckpt, "--reference", str(pair[1]), "--bleu-tokenize", "jieba")
    one_line_error(unknown, "--bleu-tokenize", "'jieba'", "13a")
    one_line_error(run_tcli("translate", "--checkpoint", ckpt, "--bleu-tokenize", "zh"), "--reference")
    monkeypatch.setitem(sys.modules, "MeCab", None)
    args = ["--input", str(pair[0]), "--reference", str(pair[1]), "--bleu-tokenize", "ja-mecab"]
    for command in ("translate", "evaluate"):
        one_line_error(run_tcli(command, "--checkpoint", ckpt, *args), "--bleu-tokenize ja-mecab", "[ja]")


TINY = """
data: {{dir: {data}, src_lang: src, tgt_lang: {tgt_lang}, train: train, valid: val, test: test, max_len: 60}}
vocab: {{size: 120}}
model: {{d_model: 32, heads: 4, ffn_dim: 64, enc_layers: 1, dec_layers: 1}}
train: {{max_steps: 4, max_tokens: 400, lr: 0.003, warmup_steps: 2, precision: {precision}, eval_every: 4, seed: 3}}
eval: {{beam: 1, max_len_b: 5}}
"""


def test_training_validates_and_tests_with_the_tokenizer_of_its_target_language(tmp_path):
    """On a tsv split (data.format: tsv) with Chinese targets: evaluate --split reads it as training did."""
    config = tsv_config(tmp_path, write_tsv(tmp_path / "data"))
    run = tmp_path / "run"
    result = run_tcli("train", "--config", str(config), "--out", str(run), "--quiet")
    assert result.returncode == 0, result.stderr
    log = read_metrics(run)
    (test,) = [e for e in log if e["event"] == "test"]
    assert "tok:zh" in test["bleu_signature"]
    (last_eval,) = [e for e in log if e["event"] == "eval"]
    ckpt = str(run / "checkpoints" / "best.pt")
    evaluated = json.loads(run_tcli("evaluate", "--checkpoint", ckpt, "--split", "valid.tsv", "--json").stdout)
    assert "tok:zh" in evaluated["bleu_signature"] and evaluated["bleu"] == pytest.approx(last_eval["bleu"])


def test_a_tokenizer_that_cannot_run_stops_training_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "MeCab", None)
    config = tmp_path / "ja.yaml"
    config.write_text(TINY.format(data=tmp_path / "data", tgt_lang="ja", precision=TEST_PRECISION))
    run = tmp_path / "run"
    one_line_error(
        run_tcli("train", "--config", str(config), "--out", str(run)),
        "eval.bleu_tokenize auto (for target language ja)",
        "pip install 'transformer-cli[ja]'",
    )
    assert not run.exists()
