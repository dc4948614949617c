"""`tcli count-params`: exact counts of the presets, formula == built model, checkpoints, errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from transformer_cli.config import BertRunConfig, TranslationRunConfig, build_config, config_kind
from transformer_cli.core.errors import UserError
from transformer_cli.models.builders import build_bert, build_transformer
from transformer_cli.tools.count_params import PRESETS, count_config, preset_config, run_count_params, stored_count

from ..conftest import ROOT, one_line_error, run_tcli

# (BertModel = encoder + pooler, BertForPreTraining) from the BERT paper's sizes; the Transformer's
# with a 37,000 joint vocabulary and all three matrices tied (the paper rounds them to 65M and 213M).
BERT = {"bert-base": (109_482_240, 110_106_428), "bert-large": (335_141_888, 336_226_108)}
TRANSFORMER = {"transformer-base": 63_082_496, "transformer-big": 214_245_376}


def _meta_count(model_fn) -> int:
    with torch.device("meta"):
        model = model_fn()
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied one once


def _check_report(r: dict) -> None:
    assert r["formula_total"] == r["total"] and r["formula_matches"]
    assert sum(c["params"] for c in r["components"]) == r["total"]
    assert r["trainable"] + r["frozen"] == r["total"]
    assert r["bytes_fp32"] == 4 * r["total"] and r["bytes_bf16"] == 2 * r["total"]


@pytest.mark.parametrize("name", BERT)
def test_bert_presets(name):
    r = count_config(preset_config(name))
    assert (r["bert_model"], r["pretraining"]) == BERT[name]
    assert r["total"] == r["pretraining"]
    _check_report(r)
    tied = {c["name"] for c in r["components"] if c["tied"]}
    assert tied == {"token embeddings", "MLM decoder"}


@pytest.mark.parametrize("name", TRANSFORMER)
def test_transformer_presets(name):
    r = count_config(preset_config(name))
    assert r["total"] == TRANSFORMER[name]
    _check_report(r)
    tied_zero = [c["name"] for c in r["components"] if c["tied"] and c["params"] == 0]
    assert len(tied_zero) == 2  # target embeddings and output projection reuse the source matrix


def test_bert_base_approximation_about_one_percent():
    r = count_config(preset_config("bert-base"))
    assert r["approximation"] == 12 * 12 * 768**2 + 30522 * 768
    assert -0.02 < r["approximation_rel_error"] < 0


def test_set_overrides_turn_bert_base_into_bert_large():
    sets = ["model.layers=24", "model.d_model=1024", "model.heads=16", "model.ffn_dim=4096"]
    r = count_config(preset_config("bert-base", sets))
    assert (r["bert_model"], r["total"]) == BERT["bert-large"]


def test_set_override_the_issue_example_keeps_ffn_3072():
    sets = ["model.layers=24", "model.d_model=1024", "model.heads=16"]
    r = count_config(preset_config("bert-base", sets))
    H, F, L = 1024, 3072, 24
    layer = 4 * H * H + 4 * H + 2 * H * F + F + H + 4 * H
    assert r["bert_model"] == (30522 + 512 + 2) * H + 2 * H + L * layer + H * H + H
    _check_report(r)


def _random_bert(rng: random.Random) -> BertRunConfig:
    heads = rng.choice([1, 2, 3, 4, 8])
    raw = {
        "vocab": {"size": rng.randint(16, 3000)},
        "model": {
            "d_model": heads * rng.randint(1, 12),
            "heads": heads,
            "layers": rng.randint(1, 5),
            "ffn_dim": rng.randint(1, 200),
            "max_positions": rng.randint(8, 600),
        },
        "data": {"max_seq_len": 8},
        "train": {"max_steps": 1},
    }
    return build_config(BertRunConfig, raw, "random")


def _random_translation(rng: random.Random) -> TranslationRunConfig:
    heads = rng.choice([1, 2, 4, 8])
    share = rng.random() < 0.5
    raw = {
        "vocab": {"size": rng.randint(16, 3000), "joint": share or rng.random() < 0.5},
        "model": {
            "d_model": 2 * heads * rng.randint(1, 8),
            "heads": heads,
            "ffn_dim": rng.randint(1, 200),
            "enc_layers": rng.randint(1, 4),
            "dec_layers": rng.randint(1, 4),
            "max_positions": 16,
            "norm": rng.choice(["pre", "post"]),
            "share_embeddings": share,
            "tie_output": rng.random() < 0.5,
        },
        "data": {"max_len": 8},
        "train": {"max_steps": 1},
    }
    return build_config(TranslationRunConfig, raw, "random")


def test_formula_equals_built_model_for_random_bert_configs():
    rng = random.Random(1234)
    for _ in range(30):
        cfg = _random_bert(rng)
        r = count_config(cfg)
        _check_report(r)
        assert r["total"] == _meta_count(lambda cfg=cfg: build_bert(cfg.model, cfg.vocab.size))


def test_formula_equals_built_model_for_random_translation_configs():
    rng = random.Random(4321)
    for _ in range(30):
        cfg = _random_translation(rng)
        V = cfg.vocab.size
        r = count_config(cfg)
        _check_report(r)
        assert r["total"] == _meta_count(lambda cfg=cfg, V=V: build_transformer(cfg.model, V, V))
        # unequal source and target vocabularies (a non-joint checkpoint)
        if not cfg.model.share_embeddings:
            r = count_config(cfg, V, V + 7)
            _check_report(r)
            assert r["total"] == _meta_count(lambda cfg=cfg, V=V: build_transformer(cfg.model, V, V + 7))


def test_config_kind_and_shipped_config(tmp_path):
    assert config_kind({"model": {"layers": 2}}) == "bert"
    assert config_kind({"data": {"max_seq_len": 64}}) == "bert"
    assert config_kind({"train": {"batch_size": 8}}) == "bert"
    assert config_kind({"model": {"enc_layers": 2}}) == "translation"
    assert config_kind({"model": None}) == "translation"
    r = run_count_params(ROOT / "configs" / "multi30k_en_de.yaml", None, None, None, True)
    assert r["kind"] == "translation"
    _check_report(r)
    path = tmp_path / "bert.yaml"
    path.write_text("model:\n  d_model: 64\n  layers: 2\n  heads: 4\n  ffn_dim: 256\ntrain:\n  max_steps: 10\n")
    r = run_count_params(path, None, None, ["vocab.size=500"], True)
    assert r["kind"] == "bert" and r["sizes"]["V"] == 500
    _check_report(r)


@pytest.fixture(scope="module")
def bert_vocab():
    """A small BERT vocabulary ([PAD] [UNK] [CLS] [SEP] [MASK] first) over the toy corpus."""
    from transformer_cli.vocab.spm import train_vocab

    lines = (ROOT / "data" / "toy" / "train.src").read_text(encoding="utf-8").splitlines()
    specials = {"pad_piece": "[PAD]", "unk_piece": "[UNK]", "control_symbols": ("[CLS]", "[SEP]", "[MASK]")}
    return train_vocab(lines, size=90, bos_eos=False, **specials)


def _state(kind: str, cfg, weights: dict, vocab) -> dict:
    """A checkpoint as the trainer writes it, less what only a resume reads."""
    stored = {"bert" if kind == "bert" else "joint": vocab.model_bytes}
    return {"tcli": {"kind": kind}, "config": cfg.model_dump(mode="json"), "vocab": stored, "model": weights}


def _save(tmp_path: Path, kind: str, cfg, model: torch.nn.Module, vocab) -> Path:
    path = tmp_path / f"{kind}.pt"
    torch.save(_state(kind, cfg, model.state_dict(), vocab), path)
    return path


@pytest.mark.parametrize("tie", [True, False])
def test_translation_checkpoint(tmp_path, capsys, tie, toy_vocab):
    raw = {
        "vocab": {"size": 100},
        "data": {"max_len": 30},
        "train": {"max_steps": 1},
        "model": {
            "d_model": 16,
            "heads": 2,
            "ffn_dim": 40,
            "enc_layers": 2,
            "dec_layers": 1,
            "max_positions": 32,
            "share_embeddings": tie,
            "tie_output": tie,
        },
    }
    cfg = build_config(TranslationRunConfig, raw, "test")
    V = len(toy_vocab)
    model = build_transformer(cfg.model, V, V)
    path = _save(tmp_path, "translation", cfg, model, toy_vocab)
    unique = sum(p.numel() for p in model.parameters())
    weights = torch.load(path, weights_only=True)["model"]
    assert stored_count(weights) == unique
    if tie:
        assert sum(t.numel() for t in weights.values()) == unique + 2 * V * 16  # stored once, named thrice
    r = run_count_params(None, path, None, None, True)
    assert r["stored_total"] == r["total"] == unique and r["stored_matches"]
    assert json.loads(capsys.readouterr().out)["total"] == unique


def test_bert_checkpoint(tmp_path, capsys, bert_vocab):
    raw = {
        "vocab": {"size": 120},
        "data": {"max_seq_len": 16},
        "train": {"max_steps": 1},
        "model": {"d_model": 16, "layers": 2, "heads": 2, "ffn_dim": 48, "max_positions": 16},
    }
    cfg = build_config(BertRunConfig, raw, "test")
    model = build_bert(cfg.model, len(bert_vocab))  # the trained vocabulary may be smaller than vocab.size
    path = _save(tmp_path, "bert", cfg, model, bert_vocab)
    unique = sum(p.numel() for p in model.parameters())
    assert stored_count(torch.load(path, weights_only=True)["model"]) == unique
    r = run_count_params(None, path, None, None, False)
    assert r["sizes"]["V"] == len(bert_vocab) < cfg.vocab.size
    assert r["stored_total"] == r["total"] == r["formula_total"] == unique
    out = capsys.readouterr().out
    assert f"{unique:,}" in out and "equal to the model count" in out


@pytest.mark.parametrize("kind", ["bert", "translation"])
def test_checkpoint_is_checked_like_every_command_that_loads_one(tmp_path, kind, toy_vocab, bert_vocab):
    """NaN weights, a missing, extra, mis-shaped, integer, sparse or meta tensor, a vocabulary sentencepiece cannot
    read or of another size than the embeddings: one line naming the file, as translate's and export-hf's
    (checkpoint.read_checkpoint and Checkpoint.check), not a count of a broken file."""
    vocab = bert_vocab if kind == "bert" else toy_vocab
    if kind == "bert":
        raw = {"train": {"max_steps": 1}, "model": {"d_model": 16, "layers": 1, "heads": 2, "ffn_dim": 32}}
        cfg = build_config(BertRunConfig, {**raw, "data": {"max_seq_len": 16}}, "test")
        model = build_bert(cfg.model, len(vocab))
        other = build_bert(cfg.model, len(vocab) + 1).state_dict()
    else:
        dims = {"d_model": 16, "heads": 2, "ffn_dim": 32, "enc_layers": 1, "dec_layers": 1, "max_positions": 32}
        cfg = build_config(
            TranslationRunConfig, {"train": {"max_steps": 1}, "data": {"max_len": 30}, "model": dims}, "test"
        )
        model = build_transformer(cfg.model, len(vocab), len(vocab))
        other = build_transformer(cfg.model, len(vocab) + 1, len(vocab) + 1).state_dict()
    weights = model.state_dict()
    name = next(k for k, t in weights.items() if t.dim() == 2 and "embed" not in k)
    path = tmp_path / f"{kind}.pt"
    for broken, message in (
        ({**weights, name: torch.full_like(weights[name], float("nan"))}, "NaN or infinite"),
        ({k: t for k, t in weights.items() if k != name}, f"lack {name}"),
        ({**weights, "surprise.weight": torch.zeros(2)}, "unexpected tensor 'surprise.weight'"),
        ({**weights, name: weights[name][:, :-1]}, "has shape"),
        ({**weights, name: weights[name].long()}, f"{name} is int64, not floating-point"),  # would load as zeros
        ({**weights, name: weights[name].to_sparse()}, f"{name} is a sparse_coo tensor"),  # were tracebacks
        ({**weights, name: torch.empty_like(weights[name], device="meta")}, f"{name} is a meta tensor"),
        (other, "has shape"),  # embeddings of one more row than the vocabulary has pieces
    ):
        torch.save(_state(kind, cfg, broken, vocab), path)
        msg = _one_line_error(None, path, None, None, False)
        assert message in msg and str(path) in msg, msg
    state = _state(kind, cfg, weights, vocab)
    state["vocab"] = {key: b"garbage" * 10 for key in state["vocab"]}  # counted in full before
    torch.save(state, path)
    msg = _one_line_error(None, path, None, None, False)
    assert "vocabulary is not a valid sentencepiece model" in msg and str(path) in msg, msg


def _one_line_error(*args) -> str:
    with pytest.raises(UserError) as e:
        run_count_params(*args)
    return one_line_error(e)


def test_errors(tmp_path):
    msg = _one_line_error(None, None, "bert-huge", None, False)
    assert all(name in msg for name in PRESETS)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    assert "invalid YAML" in _one_line_error(bad, None, None, None, False)
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint\n")
    assert "not a readable tcli checkpoint" in _one_line_error(None, text, None, None, False)
    whole = tmp_path / "whole.pt"
    torch.save({"tcli": {"kind": "bert"}, "model": {"w": torch.zeros(512, 64)}}, whole)
    for cut in (100, len(whole.read_bytes()) // 2, len(whole.read_bytes()) - 10):  # a copy or save cut short
        cut_file = tmp_path / f"cut{cut}.pt"
        cut_file.write_bytes(whole.read_bytes()[:cut])
        msg = _one_line_error(None, cut_file, None, None, False)
        assert "is not a readable tcli checkpoint: the file is truncated" in msg and msg.endswith("of the run"), msg
        assert len(msg) < 300 + len(str(cut_file)), msg  # torch's own sentence, cut at a word, not mid-word
    assert "give one of" in _one_line_error(None, None, None, None, False)
    assert "give one of" in _one_line_error(bad, None, "bert-base", None, False)
    assert "model.head" in _one_line_error(None, None, "bert-base", ["model.head=3"], False)
    assert "divisible" in _one_line_error(None, None, "transformer-base", ["model.heads=7"], False)


def test_cli_preset_json():
    help_text = run_tcli("--help").stdout
    if "count-params" not in help_text:
        pytest.skip("count-params is not wired into the CLI (transformer_cli/cli.py) yet")
    proc = run_tcli("count-params", "--preset", "bert-base", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["bert_model"], r["pretraining"]) == BERT["bert-base"]
    proc = run_tcli("count-params", "--preset", "nope")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "bert-large" in proc.stderr
