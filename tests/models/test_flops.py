"""Model FLOPs of a training step (transformer_cli.models.params): against parameters counted on the built model
by name, against count-params' totals, and BERT-base by hand."""

from __future__ import annotations

import pytest

from transformer_cli.models.builders import build_bert, build_transformer
from transformer_cli.models.params import (
    attention_train_flops,
    bert_train_flops,
    shorthand_train_flops,
    translation_train_flops,
)
from transformer_cli.tools.count_params import count_config, preset_config

SMALL = ["model.d_model=8", "model.ffn_dim=24", "model.heads=2"]


def _params(model, *prefixes: str, within: str = "") -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefixes) and within in n)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_translation_flops_from_the_built_model(norm):
    cfg = preset_config("transformer-base", [*SMALL, "model.enc_layers=2", "model.dec_layers=3", f"model.norm={norm}"])
    V, d = 100, 8
    model = build_transformer(cfg.model, V, V)
    enc, dec = _params(model, "encoder."), _params(model, "decoder.")
    kv = _params(model, "decoder.", within="cross_attn.kv_proj")  # works on the encoder output, once a source token
    assert kv == 3 * (2 * d * d + 2 * d)
    flops = translation_train_flops(cfg.model, V, src_tokens=70, tgt_tokens=50, src_len=7, tgt_len=5)
    assert flops["dense"] == 6 * ((enc + kv) * 70 + (dec - kv + V * d) * 50)  # the tied output projection: V·d
    assert flops["attention"] == 12 * d * (2 * 7 * 70 + 3 * (5 + 7) * 50)
    assert flops["total"] == flops["dense"] + flops["attention"]


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_bert_flops_from_the_built_model(norm):
    cfg = preset_config("bert-base", [*SMALL, "model.layers=3", f"model.norm={norm}"])
    V, H = 100, 8
    model = build_bert(cfg.model, V)
    layers = _params(model, "encoder.")
    mlm = _params(model, "mlm_dense", "mlm_norm", "mlm_bias") + V * H  # the decoder is the token embedding matrix
    once = _params(model, "pooler", "nsp_head")
    flops = bert_train_flops(cfg.model, V, tokens=4 * 16, seq_len=16, masked=4 * 3, sequences=4)
    assert flops["dense"] == 6 * (layers * 64 + mlm * 12 + once * 4)
    assert flops["attention"] == attention_train_flops(H, 3, 16, 64) == 12 * 3 * H * 16 * 64


def test_flops_match_count_params():
    """With every position charged for every head, the dense FLOPs are 6 x (count-params total minus the
    embedding lookups) x tokens; translation with equal source and target tokens: 6 x total x tokens."""
    n = 1000
    bert_cfg = preset_config("bert-base")
    bert = count_config(bert_cfg)
    assert bert["total"] == 110_106_428
    H, L, V, P = 768, 12, 30522, 512
    flops = bert_train_flops(bert_cfg.model, V, tokens=n, seq_len=128, masked=n, sequences=n)
    lookups = (P + 2) * H + 2 * H  # position and segment tables, embedding LayerNorm (the token table is the decoder)
    assert flops["dense"] == 6 * (bert["total"] - lookups) * n
    assert flops["attention"] == 12 * L * H * 128 * n

    nmt_cfg = preset_config("transformer-base", ["vocab.size=32000"])
    nmt = count_config(nmt_cfg)
    flops = translation_train_flops(nmt_cfg.model, 32000, n, n, 48, 40)
    assert flops["dense"] == 6 * nmt["total"] * n
    assert flops["attention"] == 12 * 512 * (6 * 48 * n + 6 * (40 + 48) * n)
    longer_source = translation_train_flops(nmt_cfg.model, 32000, 2 * n, n, 48, 40)["dense"]
    kv = 6 * (2 * 512**2 + 2 * 512)  # cross-attention key/value projections work on the source side
    encoder = 6 * (12 * 512**2 + 13 * 512)
    assert longer_source - flops["dense"] == 6 * (encoder + kv) * n


def test_bert_base_step_flops_by_hand():
    """BERT-base, 256 x 128 tokens, 20 masked per sequence: the numbers behind an MFU figure."""
    tokens, masked, rows = 256 * 128, 256 * 20, 256
    flops = bert_train_flops(preset_config("bert-base").model, 30522, tokens, 128, masked, rows)
    layer = 12 * 768**2 + 13 * 768  # F = 4H
    head = 768**2 + 3 * 768 + 30522 * 768 + 30522
    pooler_nsp = 768**2 + 768 + 2 * 768 + 2
    assert flops["dense"] == 6 * (12 * layer * tokens + head * masked + pooler_nsp * rows)
    assert flops["total"] == pytest.approx(1.79e13, rel=1e-2)  # 17.9 TFLOP per step
    shorthand = shorthand_train_flops(110_106_428, tokens, 12, 768, 128)
    assert shorthand == 6 * 110_106_428 * tokens + flops["attention"]
    assert shorthand > flops["total"]  # the vocabulary projection charged at every position
