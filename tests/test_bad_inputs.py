"""Hostile and broken inputs: every command that loads a checkpoint answers every class of bad file with one line
(exit 2); every numeric config key, given 0, a negative, inf, nan or a huge value, gives a one-line error or a
normal run, never a traceback or a NaN run that ends with success."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from transformer_cli.config import BertRunConfig, TranslationRunConfig, build_config
from transformer_cli.core.errors import UserError
from transformer_cli.core.metrics_log import read_metrics

from .conftest import ROOT, TOY, one_line_error, run_tcli, toy_subset

# ----------------------------------------------------------------------------- bad checkpoints


@pytest.fixture(scope="module")
def good(tmp_path_factory, toy_vocab) -> dict[str, Any]:
    """A well-formed translation checkpoint state (untrained), as the trainer writes it."""
    from transformer_cli.models.builders import build_transformer

    raw = {
        "vocab": {"size": 200},
        "train": {"max_steps": 1},
        "data": {"max_len": 50},
        "model": {"d_model": 16, "heads": 2, "ffn_dim": 32, "enc_layers": 1, "dec_layers": 1, "max_positions": 64},
    }
    cfg = build_config(TranslationRunConfig, raw, "test")
    model = build_transformer(cfg.model, len(toy_vocab), len(toy_vocab))
    return {
        "tcli": {"kind": "translation", "version": "0.1.0"},
        "config": cfg.model_dump(mode="json"),
        "vocab": {"joint": toy_vocab.model_bytes},
        "model": model.state_dict(),
    }


def damaged(good: dict[str, Any], how: str) -> Any:
    state = {**good, "model": dict(good["model"]), "config": json.loads(json.dumps(good["config"]))}
    if how == "string":
        return "just a string"
    if how == "list":
        return [1, 2, 3]
    if how == "no_meta":
        state.pop("tcli")
    if how == "unknown_kind":
        state["tcli"] = {"kind": "gpt"}
    if how == "no_config":
        state.pop("config")
    if how == "invalid_config":
        state["config"]["model"]["heads"] = 5
    if how == "unknown_key":
        state["config"]["model"]["wings"] = 2
    if how == "no_vocab":
        state.pop("vocab")
    if how == "bad_vocab_bytes":
        state["vocab"] = {"joint": b"\x00\x01 definitely not sentencepiece" * 10}
    if how == "vocab_not_bytes":
        state["vocab"] = {"joint": 42}
    if how == "wrong_shape":
        state["model"]["src_embed.weight"] = torch.zeros(3, 16)
    if how == "missing_tensor":
        state["model"].pop("out_proj.weight")
    if how == "not_a_tensor":
        state["model"]["encoder.0.ffn.w1.weight"] = "weights"
    if how == "absurd_sizes":
        state["config"]["model"]["d_model"] = 60000
        state["config"]["model"]["heads"] = 1
        state["config"]["model"]["enc_layers"] = 900
    if how == "beyond_bounds":
        state["config"]["model"]["ffn_dim"] = 10**12
    if how == "nan_weights":
        state["model"]["decoder.0.ffn.w2.weight"] = torch.full_like(state["model"]["decoder.0.ffn.w2.weight"], math.nan)
    if how == "weights_not_dict":
        state["model"] = [torch.zeros(2)]
    return state


CASES = [
    "string",
    "list",
    "no_meta",
    "unknown_kind",
    "no_config",
    "invalid_config",
    "unknown_key",
    "no_vocab",
    "bad_vocab_bytes",
    "vocab_not_bytes",
    "wrong_shape",
    "missing_tensor",
    "not_a_tensor",
    "absurd_sizes",
    "beyond_bounds",
    "nan_weights",
    "weights_not_dict",
    "truncated",
    "empty_file",
    "directory",
]


def write_case(tmp_path: Path, good: dict[str, Any], how: str) -> Path:
    path = tmp_path / f"{how}.pt"
    if how == "truncated":
        torch.save(good, path)
        path.write_bytes(path.read_bytes()[:2000])
    elif how == "empty_file":
        path.write_bytes(b"")
    elif how == "directory":
        path.mkdir()
    else:
        torch.save(damaged(good, how), path)
    return path


@pytest.mark.parametrize("how", CASES)
def test_translate_answers_every_bad_checkpoint_with_one_line(tmp_path, good, how):
    path = write_case(tmp_path, good, how)
    one_line_error(run_tcli("translate", "--checkpoint", str(path), input="a dog\n"), str(path.name))


@pytest.mark.parametrize("how", CASES)
def test_library_loading_is_one_line_for_every_command(tmp_path, good, how):
    """The one validation path (read_checkpoint + build_model) every loading command uses, in-process."""
    from transformer_cli.checkpoint import read_checkpoint
    from transformer_cli.export.hf import export_hf
    from transformer_cli.tools.count_params import count_checkpoint

    path = write_case(tmp_path, good, how)
    with pytest.raises(UserError) as err:
        read_checkpoint(path, kind="translation").build_model()
    assert "\n" not in str(err.value) and len(str(err.value)) < 600
    with pytest.raises(UserError):
        export_hf(path, tmp_path / "hf")  # a translation checkpoint, or a broken one: refused either way
    if how not in (
        "wrong_shape",
        "nan_weights",
        "missing_tensor",
        "not_a_tensor",
        "bad_vocab_bytes",
        "absurd_sizes",
        "vocab_not_bytes",
        "no_vocab",
    ):  # count-params counts what is stored and needs no vocabulary
        with pytest.raises(UserError):
            count_checkpoint(path)


def test_the_good_checkpoint_loads(tmp_path, good):
    path = tmp_path / "good.pt"
    torch.save(good, path)
    from transformer_cli.checkpoint import read_checkpoint

    model = read_checkpoint(path, kind="translation").build_model()
    assert sum(p.numel() for p in model.parameters()) > 0


# ----------------------------------------------------------------------------- numeric fuzzing


TRANSLATION_BASE = {
    "data": {"dir": str(TOY), "max_len": 40},
    "vocab": {"size": 100, "max_sentences": 300},
    "model": {"d_model": 16, "heads": 2, "ffn_dim": 32, "enc_layers": 1, "dec_layers": 1, "max_positions": 64},
    "train": {
        "max_steps": 2,
        "max_minutes": 0.05,
        "max_tokens": 300,
        "warmup_steps": 1,
        "eval_every": 2,
        "log_every": 1,
        "precision": "fp32",
    },
    "eval": {"beam": 1, "max_len_b": 3, "max_tokens": 2000},
}
BERT_BASE = {
    "data": {"max_seq_len": 32, "max_predictions": 5},
    "vocab": {"size": 120, "max_sentences": 300},
    "model": {"d_model": 16, "layers": 1, "heads": 2, "ffn_dim": 32, "max_positions": 32},
    "train": {
        "max_steps": 2,
        "max_minutes": 0.05,
        "batch_size": 8,
        "warmup_steps": 1,
        "eval_every": 2,
        "log_every": 1,
        "precision": "fp32",
    },
}
VALUES = [0, -1, math.inf, math.nan, 1e12]


def numeric_keys(schema: type) -> list[str]:
    keys = []
    for section, field in schema.model_fields.items():
        for name, sub in field.annotation.model_fields.items():
            if sub.annotation in (int, float, int | None, float | None, tuple[float, float], float | Literal["auto"]):
                keys.append(f"{section}.{name}")
    return keys


def small_data(tmp_path: Path) -> Path:
    """The first 150 toy pairs (the fuzzed runs stay short)."""
    return toy_subset(tmp_path / "toy", train=150, valid=8)


def small_bert_data(tmp_path: Path) -> Path:
    """The first documents of the BERT toy corpus."""
    folder = tmp_path / "bert_toy"
    folder.mkdir()
    for name, n in (("train.txt", 1200), ("valid.txt", 200)):
        lines = (ROOT / "data" / "bert_toy" / name).read_text(encoding="utf-8").splitlines()[:n]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


# Every (key, value) runs in CI (.ci/run); the README's quick run tries a seeded sample of them.
QUICK_CASES = 12


@pytest.mark.parametrize(
    "kind, every",
    [
        ("translation", False),
        ("bert", False),
        pytest.param("translation", True, marks=pytest.mark.slow),
        pytest.param("bert", True, marks=pytest.mark.slow),
    ],
)
def test_every_numeric_key_fails_cleanly_or_runs_normally(tmp_path, kind, every):
    from transformer_cli.bert.setup import pretrain_bert
    from transformer_cli.translation.setup import train_translation

    schema = TranslationRunConfig if kind == "translation" else BertRunConfig
    base = json.loads(json.dumps(TRANSLATION_BASE if kind == "translation" else BERT_BASE))
    base["data"]["dir"] = str(small_data(tmp_path) if kind == "translation" else small_bert_data(tmp_path))
    keys = numeric_keys(schema)
    assert len(keys) >= 25, keys
    cases = [(n, key, value) for n, key in enumerate(keys) for value in VALUES]
    if not every:
        cases = random.Random(2026).sample(cases, QUICK_CASES)
    outcomes: dict[str, int] = {"error": 0, "ran": 0}
    for n, key, value in cases:
        section, name = key.split(".")
        raw = json.loads(json.dumps(base))
        raw[section][name] = [value, value] if name == "adam_betas" else value
        try:
            cfg = build_config(schema, raw, f"{key}={value}")
            run = tmp_path / f"run{n}_{VALUES.index(value)}"
            if kind == "translation":
                train_translation(cfg, run, device="cpu", quiet=True)
            else:
                pretrain_bert(cfg, run, device="cpu", quiet=True)
        except UserError as e:
            assert "\n" not in str(e), (key, value, str(e))
            outcomes["error"] += 1
            continue
        outcomes["ran"] += 1
        log = read_metrics(run)
        losses = [e["loss"] for e in log if e["event"] == "train"]
        evals = [v for e in log if e["event"] == "eval" for k, v in e.items() if k not in ("event", "step")]
        assert log[-1]["event"] == "end", (key, value)
        assert (not losses or losses[-1] is not None) and None not in evals, (key, value, losses, evals)
        weights = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
        assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point()), (key, value)
    assert outcomes["error"] > 0 and outcomes["ran"] > 0, outcomes
