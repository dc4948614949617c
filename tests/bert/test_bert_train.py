"""tcli pretrain-bert end to end: metrics, exact resume after SIGKILL, export to HF and back, bad input."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
import torch

from transformer_cli.core.metrics_log import read_metrics

from ..conftest import ON_CPU, TEST_PRECISION, run_killed, run_tcli

CONFIG = """
data: {{dir: {data}, train: train.txt, valid: valid.txt, max_seq_len: 32, max_predictions: 5}}
vocab: {{size: 150}}
model: {{d_model: 32, layers: 2, heads: 4, ffn_dim: 64, max_positions: 64}}
train: {{batch_size: 8, max_steps: {steps}, accum_steps: 2, lr: 0.002, warmup_steps: 3, precision: {precision},
        eval_every: 6, save_every: 2, log_every: 2, seed: 5}}
"""

WORDS = (
    "river mountain city forest king queen soldier farmer ship bridge castle village market storm winter "
    "summer horse wolf tower garden"
).split()
VERBS = "saw built crossed left found guarded painted visited sold watched".split()


def write_corpus(path: Path, docs: int, seed: int) -> None:
    rng = random.Random(seed)
    lines = []
    for _ in range(docs):
        cast = rng.sample(WORDS, 3)
        for _ in range(rng.randint(2, 7)):
            a, b = rng.sample(cast, 2)
            lines.append(f"The {a} {rng.choice(VERBS)} the {b} near the {rng.choice(WORDS)}.")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bert_corpus")
    write_corpus(out / "train.txt", 120, seed=1)
    write_corpus(out / "valid.txt", 20, seed=2)
    return out


def config(tmp_path: Path, data: Path, steps: int = 16) -> Path:
    path = tmp_path / "bert.yaml"
    path.write_text(CONFIG.format(data=data, steps=steps, precision=TEST_PRECISION))
    return path


def events(run: Path) -> list[dict]:
    return read_metrics(run)


def test_pretrain_metrics_and_resume_after_sigkill(tmp_path, corpus):
    cfg = config(tmp_path, corpus)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = run_tcli("pretrain-bert", "--config", str(cfg), "--out", str(straight), "--quiet", *ON_CPU)
    assert done.returncode == 0, done.stderr
    log = events(straight)
    train = [e for e in log if e["event"] == "train"]
    assert {"step", "loss", "mlm_loss", "nsp_loss", "lr", "tokens_per_sec"} <= set(train[0])
    assert train[0]["loss"] == pytest.approx(train[0]["mlm_loss"] + train[0]["nsp_loss"], abs=1e-4)
    evals = [e for e in log if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [6, 12, 16]
    assert {"mlm_loss", "mlm_acc", "nsp_acc", "ppl"} <= set(evals[0]) and 0 <= evals[-1]["mlm_acc"] <= 1
    assert log[-1]["event"] == "end" and "best_mlm_loss" in log[-1]

    crash = run_killed(9, "step", "pretrain-bert", "--config", str(cfg), "--out", str(killed), "--quiet", *ON_CPU)
    assert crash.returncode == -signal.SIGKILL
    resumed = run_tcli(
        "pretrain-bert", "--config", str(cfg), "--out", str(killed), "--resume", "auto", "--quiet", *ON_CPU
    )
    assert resumed.returncode == 0, resumed.stderr
    a = torch.load(straight / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(killed / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_export_hf_loads_in_transformers_and_init_from_hf(tmp_path, corpus):
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install -e .[dev])")
    cfg = config(tmp_path, corpus, steps=4)
    run = tmp_path / "run"
    assert run_tcli("pretrain-bert", "--config", str(cfg), "--out", str(run), "--quiet").returncode == 0
    hf_dir = tmp_path / "hf"
    exported = run_tcli("export-hf", "--checkpoint", str(run / "checkpoints" / "best.pt"), "--out", str(hf_dir))
    assert exported.returncode == 0, exported.stderr
    model = transformers.BertForPreTraining.from_pretrained(str(hf_dir)).eval()
    from transformer_cli.config import BertRunConfig
    from transformer_cli.models.builders import build_bert

    state = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    ours = build_bert(
        BertRunConfig.model_validate(state["config"]).model, state["model"]["embeddings.token.weight"].shape[0]
    )
    ours.load_state_dict(state["model"])
    ours.eval()
    ids = torch.tensor([[2, 10, 11, 12, 3, 13, 14, 3]])
    seg = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]])
    mlm, nsp = ours(ids, seg)
    ref = model(input_ids=ids, token_type_ids=seg)
    assert (mlm - ref.prediction_logits).abs().max() < 1e-4
    assert (nsp - ref.seq_relationship_logits).abs().max() < 1e-4

    again = run_tcli(
        "pretrain-bert",
        "--config",
        str(cfg),
        "--out",
        str(tmp_path / "again"),
        "--init-from-hf",
        str(hf_dir),
        "--set",
        "train.max_steps=1",
        "--set",
        "train.eval_every=1",
        "--quiet",
    )
    assert again.returncode == 0, again.stderr
    start = torch.load(tmp_path / "again" / "checkpoints" / "last.pt", weights_only=True)
    assert start["vocab"] == state["vocab"]  # the exported vocabulary, not a new one
    wrong = run_tcli(
        "pretrain-bert",
        "--config",
        str(cfg),
        "--out",
        str(tmp_path / "wrong"),
        "--init-from-hf",
        str(hf_dir),
        "--set",
        "model.layers=3",
    )
    assert (
        wrong.returncode == 2
        and "num_hidden_layers is 2 but the run's model.layers is 3; set model.layers=2" in wrong.stderr
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "holds no text"),
        ("One sentence here.\nAnother one follows.\n", "holds a single document"),
        ("Lonely.\n\nAlone.\n\nSingle.\n", "no document has two sentences"),
    ],
)
def test_bad_corpora_exit_2_with_one_line(tmp_path, corpus, text, message):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text(text, encoding="utf-8")
    (data / "valid.txt").write_text((corpus / "valid.txt").read_text(), encoding="utf-8")
    result = run_tcli("pretrain-bert", "--config", str(config(tmp_path, data)), "--out", str(tmp_path / "r"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and message in result.stderr
    assert not (tmp_path / "r").exists()  # nothing written for a bad corpus


def test_invalid_utf8_and_seq_len_errors(tmp_path, corpus):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_bytes((corpus / "train.txt").read_bytes() + b"bad \xc3\x28 byte\n")
    (data / "valid.txt").write_text((corpus / "valid.txt").read_text(), encoding="utf-8")
    result = run_tcli("pretrain-bert", "--config", str(config(tmp_path, data)))
    assert result.returncode == 2 and "train.txt line" in result.stderr and "invalid UTF-8" in result.stderr
    too_long = run_tcli("pretrain-bert", "--config", str(config(tmp_path, corpus)), "--set", "data.max_seq_len=128")
    assert too_long.returncode == 2
    assert "data.max_seq_len (128) exceeds model.max_positions (64)" in too_long.stderr
