"""Chinese to English: a joint vocabulary that makes every ideograph a token (coverage auto from src_lang zh), and
attention maps of Chinese pieces drawn with a CJK font and no warning (or one line saying how to get a font)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from transformer_cli.core import figures
from transformer_cli.core.cjk import IDEOGRAPH
from transformer_cli.vocab.spm import CJK_COVERAGE

from ..conftest import SHARED, TEST_PRECISION, run_tcli

EN_ZH = SHARED / "data" / "en-zh"
CONFIG = """
data: {{dir: {data}, src_lang: zh, tgt_lang: en, train: train, valid: valid, test: null, max_len: 40}}
vocab: {{size: 2000, split_cjk: true}}
model: {{d_model: 32, heads: 4, ffn_dim: 64, enc_layers: 1, dec_layers: 1, max_positions: 64}}
train: {{max_steps: 30, max_tokens: 1024, lr: 0.003, warmup_steps: 10, precision: {precision}, seed: 1,
        eval_every: 30, log_every: 10}}
eval: {{beam: 2, max_len_b: 10}}
"""


@pytest.fixture(scope="module")
def en_zh_run(tmp_path_factory) -> Path:
    if not (EN_ZH / "train.zh").is_file():
        pytest.skip(f"no Tatoeba en-zh at {EN_ZH} (../shared absent)")
    root = tmp_path_factory.mktemp("en_zh")
    data = root / "data"
    data.mkdir()
    for split, lines in (("train", slice(0, 3000)), ("valid", slice(0, 50))):
        for lang in ("en", "zh"):
            text = (EN_ZH / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[lines]
            (data / f"{split}.{lang}").write_text("\n".join(text) + "\n", encoding="utf-8")
    (root / "zh.yaml").write_text(CONFIG.format(data=data, precision=TEST_PRECISION))
    run = root / "run"
    done = run_tcli("train", "--config", str(root / "zh.yaml"), "--out", str(run), "--quiet")
    assert done.returncode == 0, done.stderr
    return run


def test_vocabulary_of_the_run(en_zh_run):
    record = json.loads((en_zh_run / "vocab" / "vocab.json").read_text(encoding="utf-8"))
    assert record["vocab"]["character_coverage"] == CJK_COVERAGE and record["vocab"]["split_cjk"] is True


def test_chinese_translation_and_attention_maps(en_zh_run, tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "attention"
    lines = ["我很高兴。", "汤姆在看书。"]
    result = run_tcli(
        "translate",
        "--checkpoint",
        str(en_zh_run / "checkpoints" / "best.pt"),
        "--attention",
        str(folder),
        input="\n".join(lines) + "\n",
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2
    for path, line in zip(sorted(folder.glob("*.npz")), lines):
        with np.load(path) as saved:  # the maps' source pieces: one ideograph each
            pieces = [str(p) for p in saved["src_pieces"]]
        assert [p.lstrip("▁") for p in pieces if IDEOGRAPH.search(p)] == IDEOGRAPH.findall(line)
    assert len(list(folder.glob("*.png"))) == 8
    assert "Glyph" not in result.stderr and "missing from" not in result.stderr
    if figures.cjk_font() is not None:
        assert "note:" not in result.stderr
    else:
        assert result.stderr.count(figures.NO_CJK_FONT) == 1  # one line for the eight figures


def test_plot_of_a_run_named_in_chinese(en_zh_run, tmp_path):
    pytest.importorskip("matplotlib")
    run = tmp_path / "中文翻译模型"
    shutil.copytree(en_zh_run, run, ignore=shutil.ignore_patterns("*.pt"))
    result = run_tcli("plot", str(run))
    assert result.returncode == 0, result.stderr
    assert (run / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert "Glyph" not in result.stderr and "missing from" not in result.stderr
    if figures.cjk_font() is not None:
        assert "note:" not in result.stderr
