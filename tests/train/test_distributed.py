"""torchrun: 2 CPU processes (gloo) give the weights of 1 process with the same global batch; resume across
world sizes; a dead rank ends the job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from transformer_cli.core.metrics_log import read_metrics

from ..bert.test_bert_train import write_corpus
from ..conftest import ROOT, TOY, run_tcli

# adam_eps 1e-5: some gradients are zero in exact arithmetic (the attention key bias: softmax ignores a
# constant shift), and Adam turns their 1e-10 rounding noise into lr-sized steps whose sign depends on
# the summation order; a larger eps keeps those steps negligible so that the comparison sees real errors.
TRANSLATION = """
data: {{dir: {data}, src_lang: src, tgt_lang: tgt, train: train, valid: val, test: null, max_len: 40}}
vocab: {{size: 120}}
model: {{d_model: 32, heads: 4, ffn_dim: 64, enc_layers: 2, dec_layers: 2, dropout: 0.0}}
train: {{max_steps: {steps}, max_tokens: 300, accum_steps: 2, lr: 0.003, warmup_steps: 3, precision: fp32,
        eval_every: 4, log_every: 2, seed: 3, adam_eps: 1.0e-5}}
eval: {{beam: 1, max_len_b: 4, bleu: false}}
"""

BERT = """
data: {{dir: {data}, train: train.txt, valid: valid.txt, max_seq_len: 32, max_predictions: 5}}
vocab: {{size: 150}}
model: {{d_model: 32, layers: 2, heads: 4, ffn_dim: 64, max_positions: 64, dropout: 0.0, attention_dropout: 0.0}}
train: {{batch_size: 9, max_steps: {steps}, lr: 0.002, warmup_steps: 2, precision: fp32, eval_every: 4,
        log_every: 2, seed: 5, adam_eps: 1.0e-5}}
"""


def torchrun(n: int, *args: str, timeout: float = 300, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TCLI_DIST_TIMEOUT": "60"}
    # These tests are about CPU processes (gloo): --device cpu keeps them so where CUDA is visible too
    # (scripts/gpu_check.sh runs the suite there, with one GPU for the two ranks).
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        "-m",
        "transformer_cli",
        *args,
        "--device",
        "cpu",
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist_data")
    for split, n in (("train", 300), ("val", 20)):
        for lang in ("src", "tgt"):
            lines = (TOY / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (out / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_corpus(out / "train.txt", 80, seed=1)
    write_corpus(out / "valid.txt", 15, seed=2)
    return out


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]


def assert_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] - b[key]).abs().max().item() < 1e-5, key


@pytest.mark.parametrize(
    "command, template",
    [("train", TRANSLATION), pytest.param("pretrain-bert", BERT, marks=pytest.mark.slow)],  # BERT: in CI
)
def test_two_processes_equal_one_with_the_same_global_batch(tmp_path, data, command, template):
    config = tmp_path / "c.yaml"
    config.write_text(template.format(data=data, steps=6))
    single = run_tcli(command, "--config", str(config), "--out", str(tmp_path / "one"), "--quiet", "--device", "cpu")
    assert single.returncode == 0, single.stderr
    double = torchrun(2, command, "--config", str(config), "--out", str(tmp_path / "two"), "--quiet")
    assert double.returncode == 0, double.stderr[-3000:]
    assert_close(weights(tmp_path / "one"), weights(tmp_path / "two"))
    log = read_metrics(tmp_path / "two")
    one = read_metrics(tmp_path / "one")
    assert [e["step"] for e in log if e["event"] == "train"] == [2, 4, 6]  # written once, by rank 0
    for a, b in zip([e for e in one if e["event"] == "eval"], [e for e in log if e["event"] == "eval"]):
        key = "valid_loss" if command == "train" else "mlm_loss"
        assert a[key] == pytest.approx(b[key], rel=1e-4)  # evaluation: the numbers of a single process
    assert not any(k.startswith("module.") for k in weights(tmp_path / "two"))


@pytest.mark.parametrize("n", [1, pytest.param(4, marks=pytest.mark.slow)])  # 2 -> 4 processes: in CI
def test_resume_across_world_sizes(tmp_path, data, n):
    config = tmp_path / "c.yaml"
    config.write_text(TRANSLATION.format(data=data, steps=8))
    straight = run_tcli(
        "train", "--config", str(config), "--out", str(tmp_path / "straight"), "--quiet", "--device", "cpu"
    )
    assert straight.returncode == 0, straight.stderr
    run = tmp_path / f"to{n}"
    first = torchrun(2, "train", "--config", str(config), "--out", str(run), "--set", "train.max_steps=4", "--quiet")
    assert first.returncode == 0, first.stderr[-3000:]
    if n == 1:
        second = run_tcli(
            "train", "--config", str(config), "--out", str(run), "--resume", "auto", "--quiet", "--device", "cpu"
        )
    else:
        second = torchrun(n, "train", "--config", str(config), "--out", str(run), "--resume", "auto", "--quiet")
    assert second.returncode == 0, second.stderr[-3000:]
    assert_close(weights(tmp_path / "straight"), weights(run))


def test_a_dead_rank_ends_the_job(tmp_path, data):
    config = tmp_path / "c.yaml"
    config.write_text(TRANSLATION.format(data=data, steps=100000))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TCLI_DIST_TIMEOUT": "60"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "transformer_cli",
        "train",
        "--config",
        str(config),
        "--out",
        str(tmp_path / "run"),
        "--quiet",
        "--device",
        "cpu",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2, workers
    os.kill(int(workers[1]), signal.SIGKILL)
    start = time.time()
    _, err = proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert time.time() - start < 60
    assert "rank" in err.lower()
