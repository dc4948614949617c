"""End to end: tcli train / translate as a user runs them, signals, and errors (exit code 2). Exact resume after
SIGKILL at many points: tests/test_faults.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from transformer_cli.core.metrics_log import read_metrics

from ..conftest import (
    ROOT,
    TEST_PRECISION,
    one_line_error,
    run_tcli,
    run_tcli_process,
    run_tcli_without_torch,
    toy_subset,
)

TINY = """
data: {{dir: {data}, src_lang: src, tgt_lang: tgt, train: train, valid: val, test: test, max_len: 60}}
vocab: {{size: 120}}
model: {{d_model: 32, heads: 4, ffn_dim: 64, enc_layers: 2, dec_layers: 2, dropout: 0.1}}
train: {{max_steps: {steps}, max_tokens: 400, accum_steps: 2, lr: 0.003, warmup_steps: 5, precision: {precision},
        eval_every: 6, save_every: 2, log_every: 2, seed: 3}}
eval: {{beam: 2, max_len_b: 5}}
"""


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    """The first lines of the toy corpus: an epoch of about 20 batches."""
    return toy_subset(tmp_path_factory.mktemp("toy_small"), train=500, valid=30)


def tiny_config(tmp_path: Path, data: Path, steps: int = 24) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.format(data=data, steps=steps, precision=TEST_PRECISION))
    return path


def events(run: Path) -> list[dict]:
    return read_metrics(run)


def test_sigterm_saves_last_and_resume_continues(tmp_path, small_data):
    config = tiny_config(tmp_path, small_data, steps=100000)
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "transformer_cli",
            "train",
            "--config",
            str(config),
            "--out",
            str(run),
            "--set",
            "train.save_every=1000",
            "--set",
            "train.eval_every=1000",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "metrics.jsonl").exists():
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert state["train_state"]["step"] >= 2
    assert "resume with --resume auto" in err
    again = run_tcli(
        "train",
        "--config",
        str(config),
        "--out",
        str(run),
        "--resume",
        "auto",
        "--set",
        f"train.max_steps={state['train_state']['step'] + 2}",
        "--quiet",
    )
    assert again.returncode == 0, again.stderr
    assert events(run)[-1]["event"] == "end" and events(run)[-1]["step"] == state["train_state"]["step"] + 2


def test_train_then_translate_end_to_end(tmp_path, small_data):
    config = tiny_config(tmp_path, small_data, steps=12)
    run = tmp_path / "run"
    result = run_tcli("train", "--config", str(config), "--out", str(run))
    assert result.returncode == 0, result.stderr
    ckpt = run / "checkpoints"
    assert {"best.pt", "last.pt"} <= {p.name for p in ckpt.iterdir()}
    assert len(list(ckpt.glob("step_*.pt"))) == 3  # keep_last default
    assert (run / "config.yaml").exists() and (run / "vocab" / "joint.model").exists()
    assert list((run / "tb").glob("events.out.tfevents.*"))
    log = events(run)
    train = [e for e in log if e["event"] == "train"]
    assert set(train[0]) == {
        "event",
        "step",
        "epoch",
        "loss",
        "lr",
        "grad_norm",
        "tgt_tokens_per_sec",
        "data_wait_s",
        "rss_mb",
    }
    assert all(e["tgt_tokens_per_sec"] > 0 for e in train)
    evals = [e for e in log if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [6, 12] and {"valid_loss", "valid_ppl", "bleu", "chrf"} <= set(evals[0])
    assert log[-1]["event"] == "end" and {"best_bleu", "wall_s"} <= set(log[-1])
    assert "BLEU" in result.stderr and "nrefs:1" in result.stderr  # sacreBLEU signature printed

    lines = ["A girl takes a new doctor.", "", "The egg carries the white boat."]
    out = run_tcli("translate", "--checkpoint", str(ckpt / "best.pt"), "--beam", "3", input="\n".join(lines) + "\n")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split("\n")) == 4 and out.stdout.split("\n")[1] == ""
    assert "sentences/s" in out.stderr

    nbest = run_tcli(
        "translate",
        "--checkpoint",
        str(ckpt / "last.pt"),
        "--beam",
        "3",
        "--nbest",
        "2",
        "--input",
        str(small_data / "test.src"),
        "--reference",
        str(small_data / "test.tgt"),
        "--stats-json",
        str(tmp_path / "stats.json"),
        "--quiet",
    )
    assert nbest.returncode == 0, nbest.stderr
    rows = nbest.stdout.splitlines()
    assert len(rows) == 60 and rows[0].split("\t")[0] == "0" and rows[-1].split("\t")[0] == "29"
    assert "BLEU" in nbest.stderr and "chrF" in nbest.stderr and "sentences/s" not in nbest.stderr
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["sentences"] == 30 and stats["tokens_per_sec"] > 0 and "bleu" in stats


def test_new_run_refuses_to_overwrite_and_resume_checks_data(tmp_path, small_data):
    config = tiny_config(tmp_path, small_data, steps=2)
    run = tmp_path / "run"
    assert run_tcli("train", "--config", str(config), "--out", str(run), "--quiet").returncode == 0
    again = run_tcli("train", "--config", str(config), "--out", str(run), "--quiet")
    assert again.returncode == 2 and "already holds a run" in again.stderr
    other = tmp_path / "other"
    other.mkdir()
    for f in small_data.iterdir():
        (other / f.name).write_text(f.read_text().replace("dog", "cat"))
    changed = run_tcli(
        "train", "--config", str(config), "--out", str(run), "--resume", "auto", "--quiet", "--set", f"data.dir={other}"
    )
    assert (
        changed.returncode == 2
        and "training data differ from those" in changed.stderr
        and f"files under {other}" in changed.stderr
    )
    model = run_tcli(
        "train", "--config", str(config), "--out", str(run), "--resume", "auto", "--quiet", "--set", "model.ffn_dim=48"
    )
    assert model.returncode == 2 and "model.ffn_dim changed (64 -> 48)" in model.stderr


def test_bad_data_gets_one_line_errors(tmp_path, small_data):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in small_data.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    config = tiny_config(tmp_path, bad, steps=2)
    (bad / "train.tgt").write_text("only\ntwo lines\n")
    one_line_error(
        run_tcli("train", "--config", str(config), "--out", str(tmp_path / "r1")),
        "train.src has 500 lines",
        "train.tgt has 2",
    )
    (bad / "train.tgt").write_bytes((small_data / "train.tgt").read_bytes().replace(b"\n", b"\n\xc3(", 1))
    one_line_error(
        run_tcli("train", "--config", str(config), "--out", str(tmp_path / "r2")), "train.tgt line 2: invalid UTF-8"
    )
    (bad / "train.tgt").unlink()
    one_line_error(
        run_tcli("train", "--config", str(config), "--out", str(tmp_path / "r3")), "data file not found", "train.tgt"
    )


def test_bad_config_and_options_get_one_line_errors(tmp_path, small_data):
    config = tiny_config(tmp_path, small_data, steps=2)
    one_line_error(run_tcli("train", "--config", str(tmp_path / "missing.yaml")), "config file not found")
    one_line_error(
        run_tcli("train", "--config", str(config), "--set", "model.heads=5"),
        "model.d_model (32) must be divisible by model.heads (5)",
        str(config),
    )
    one_line_error(
        run_tcli("train", "--config", str(config), "--set", "train.warmup=3"), "train.warmup: unknown key", str(config)
    )
    one_line_error(run_tcli("train", "--config", str(config), "--resume", "yes"), "--resume 'yes'")
    one_line_error(
        run_tcli("train", "--config", str(config), "--device", "cuda", "--out", str(tmp_path / "r"))
        if not torch.cuda.is_available()
        else run_tcli("train", "--config", "nope.yaml"),
        "cuda" if not torch.cuda.is_available() else "nope.yaml",
    )


def test_a_bad_config_fails_before_torch_is_imported(tmp_path, small_data):
    """A mistake in the config or the options costs the user no torch start-up."""
    config = tiny_config(tmp_path, small_data, steps=2)
    bert = tmp_path / "bert.yaml"
    bert.write_text("model: {d_model: 32, heads: 4}\n")
    for command, cfg, extra in (
        ("train", config, ("--set", "model.heads=5")),
        ("train", config, ("--resume", "yes")),
        ("pretrain-bert", bert, ("--set", "train.warmup=3")),
    ):
        result = run_tcli_without_torch(command, "--config", str(cfg), *extra)
        *lines, imported = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert imported == "torch imported: False", (command, extra)


def test_translate_errors(tmp_path):
    one_line_error(run_tcli("translate", "--checkpoint", str(tmp_path / "none.pt")), "checkpoint not found")
    text = tmp_path / "text.pt"
    text.write_text("not a checkpoint")
    one_line_error(run_tcli("translate", "--checkpoint", str(text)), "is not a readable tcli checkpoint")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    one_line_error(run_tcli("translate", "--checkpoint", str(foreign)), "is not a tcli checkpoint")
    bert = tmp_path / "bert.pt"
    torch.save({"tcli": {"kind": "bert"}, "model": {}}, bert)
    one_line_error(
        run_tcli("translate", "--checkpoint", str(bert)),
        "holds a bert model, not a translation model; use it with tcli fill-mask",
    )


def test_help_and_module_entry_point():
    result = run_tcli_process("--help")
    assert result.returncode == 0 and "train" in result.stdout and "translate" in result.stdout


def test_time_budget_stops_with_a_final_evaluation(tmp_path, small_data):
    config = tiny_config(tmp_path, small_data, steps=100000)
    run = tmp_path / "run"
    result = run_tcli(
        "train",
        "--config",
        str(config),
        "--out",
        str(run),
        "--quiet",
        "--set",
        "train.max_minutes=0.05",
        "--set",
        "train.eval_every=100000",
        "--set",
        "data.test=null",
    )
    assert result.returncode == 0, result.stderr
    log = events(run)
    assert log[-1]["event"] == "end" and log[-1]["stop"] == "max_minutes"
    assert 3 <= log[-1]["wall_s"] < 60
    assert log[-2]["event"] == "eval" and log[-2]["step"] == log[-1]["step"] and "wall_s" in log[-2]
