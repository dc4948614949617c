"""BERT on Chinese: paragraphs split into sentences at 。！？, a vocabulary that makes every ideograph a token
(vocab.split_cjk, coverage auto), and tcli fill-mask on Chinese text."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from transformer_cli.core.cjk import IDEOGRAPH
from transformer_cli.vocab.spm import CJK_COVERAGE, Vocab

from ..conftest import TEST_PRECISION, run_tcli

CONFIG = """
data: {{dir: {data}, train: train.txt, valid: valid.txt, max_seq_len: 48, max_predictions: 6, split_sentences: true}}
vocab: {{size: 300, split_cjk: true}}
model: {{d_model: 32, layers: 2, heads: 4, ffn_dim: 64, max_positions: 64}}
train: {{batch_size: 8, max_steps: 8, lr: 0.002, warmup_steps: 2, precision: {precision}, eval_every: 8,
        save_every: 8, log_every: 4, seed: 3}}
"""

SENTENCES = [
    "今天天气很{w}。",
    "我们{t}去公园散步。",
    "老师说这本书很有意思！",
    "你{t}想喝咖啡吗？",
    "“这家餐厅的菜真好吃。”他说。",
    "iPhone的价格是{n}元。",
    "明天会下雨吗？",
    "孩子们在学校学习中文……",
]


def write_corpus(path: Path, docs: int, seed: int) -> None:
    """Documents of one paragraph each (several sentences on one line), a blank line between documents."""
    rng = random.Random(seed)
    paragraphs = []
    for _ in range(docs):
        picked = rng.sample(SENTENCES, rng.randint(2, 5))
        paragraphs.append(
            "".join(
                s.format(w=rng.choice("好热冷"), t=rng.choice(["今天", "明天", "周末"]), n=rng.randint(1, 9999))
                for s in picked
            )
        )
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def chinese_bert(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bert_zh")
    write_corpus(root / "train.txt", 80, seed=1)
    write_corpus(root / "valid.txt", 12, seed=2)
    (root / "bert.yaml").write_text(CONFIG.format(data=root, precision=TEST_PRECISION))
    run = root / "run"
    done = run_tcli("pretrain-bert", "--config", str(root / "bert.yaml"), "--out", str(run), "--quiet")
    assert done.returncode == 0, done.stderr
    return run


def test_the_vocabulary_records_auto_resolved_for_chinese(chinese_bert):
    record = json.loads((chinese_bert / "vocab" / "vocab.json").read_text(encoding="utf-8"))
    assert record["vocab"]["character_coverage"] == CJK_COVERAGE and record["vocab"]["split_cjk"] is True


def test_fill_mask_on_chinese(chinese_bert):
    ckpt = chinese_bert / "checkpoints" / "best.pt"
    text = "今天天气很[MASK]。"
    result = run_tcli("fill-mask", "--checkpoint", str(ckpt), text, "--top-k", "5", "--json")
    assert result.returncode == 0, result.stderr
    (obj,) = [json.loads(line) for line in result.stdout.splitlines()]
    (mask,) = obj["masks"]  # the [MASK] survives: one masked position, right after 很
    vocab = Vocab.load(chinese_bert / "vocab" / "bert.model")
    (before,) = vocab.encode(["今天天气很"])
    pieces = [vocab.sp.id_to_piece(i) for i in before]
    assert [p.lstrip("▁") for p in pieces if p != "▁"] == list("今天天气很")  # one token per character
    assert obj["text"] == text and mask["position"] == 1 + len(before)  # after [CLS] and those
    tokens = [p["token"] for p in mask["predictions"]]
    assert len(tokens) == 5 and all(len(IDEOGRAPH.findall(t)) <= 1 for t in tokens)  # each answer one piece
    plain = run_tcli("fill-mask", "--checkpoint", str(ckpt), text)
    assert plain.returncode == 0 and plain.stdout.splitlines()[0] == text
