"""Fault injection: SIGKILL at seeded points of a run (steps, evaluations, inside checkpoint and metrics writes,
the final test evaluation); every resumed run must end bitwise equal to an uninterrupted one."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
import torch

from transformer_cli.core.metrics_log import read_metrics

from ..conftest import ON_CPU, TEST_PRECISION, run_killed, run_tcli, toy_subset

STEPS = 16
CONFIG = """
data: {{dir: {data}, src_lang: src, tgt_lang: tgt, train: train, valid: val, test: test, max_len: 60}}
vocab: {{size: 120}}
model: {{d_model: 32, heads: 4, ffn_dim: 64, enc_layers: 2, dec_layers: 2, dropout: 0.1}}
train: {{max_steps: {steps}, max_tokens: 400, accum_steps: 2, lr: 0.003, warmup_steps: 5, precision: {precision},
        eval_every: 6, save_every: 2, log_every: 2, seed: 3, keep_last: 2}}
eval: {{beam: 2, max_len_b: 5}}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    """Small toy data, the config, and one uninterrupted run to compare against."""
    root = tmp_path_factory.mktemp("faults")
    data = toy_subset(root / "data", train=300, valid=10)  # 10: evaluations and the test split decode little
    config = root / "tiny.yaml"
    config.write_text(CONFIG.format(data=data, steps=STEPS, precision=TEST_PRECISION))
    done = run_tcli("train", "--config", str(config), "--out", str(root / "straight"), "--quiet", *ON_CPU)
    assert done.returncode == 0, done.stderr
    return config, root / "straight"


def state_of(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)


def assert_same_end(a: Path, b: Path) -> None:
    """Weights and optimizer state bitwise equal; the same train/eval/test/end events, each once."""
    sa, sb = state_of(a), state_of(b)
    for key in sa["model"]:
        assert torch.equal(sa["model"][key], sb["model"][key]), key
    for pa, pb in zip(sa["optimizer"]["state"].values(), sb["optimizer"]["state"].values()):
        for name in pa:
            assert torch.equal(torch.as_tensor(pa[name]), torch.as_tensor(pb[name])), name
    assert sa["train_state"]["step"] == sb["train_state"]["step"] == STEPS

    def events(run: Path) -> list[tuple]:
        return [(e["event"], e["step"]) for e in read_metrics(run)]

    assert events(a) == events(b)
    assert sum(1 for e in events(b) if e[0] == "end") == 1
    leftovers = [p.name for p in (b / "checkpoints").iterdir() if ".tmp" in p.name]
    assert not leftovers, leftovers  # temporary files of killed writes are cleaned up
    assert len(list((b / "tb").glob("events.out.tfevents.*"))) >= 1


def seeded_points(n: int, seed: int = 2026) -> list[tuple[str, int]]:
    """Kill points drawn from a fixed seed; saves happen at even steps, evaluations every 6."""
    rng = random.Random(seed)
    points = {("test", 0), ("write", STEPS)}  # always: the final test evaluation and the final save
    while len(points) < n:
        where = rng.choice(["step", "replace", "write", "metrics", "eval"])
        if where in ("replace", "write"):
            step = rng.choice(range(2, STEPS + 1, 2))
        elif where == "eval":
            step = rng.choice([6, 12, STEPS])
        else:
            step = rng.randrange(1, STEPS)
            step += where == "metrics" and step % 2  # train events are logged at even steps
        points.add((where, step))
    return sorted(points)


# Every point runs in CI (.ci/run); the README's quick run keeps one kill inside training and the one in the final
# test evaluation (with the kill inside the first checkpoint's write below).
QUICK = {("step", 6), ("test", 0)}


@pytest.mark.parametrize(
    "where, step",
    [pytest.param(*p, marks=() if p in QUICK else pytest.mark.slow) for p in seeded_points(10)],
    ids=lambda x: str(x),
)
def test_sigkill_then_resume_ends_bitwise_equal(tmp_path, setup, where, step):
    config, straight = setup
    run = tmp_path / "run"
    crash = run_killed(step, where, "train", "--config", str(config), "--out", str(run), "--quiet", *ON_CPU)
    assert crash.returncode == -signal.SIGKILL, crash.stderr
    resumed = run_tcli("train", "--config", str(config), "--out", str(run), "--resume", "auto", "--quiet", *ON_CPU)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_end(straight, run)
    again = run_tcli("train", "--config", str(config), "--out", str(run), "--resume", "auto", *ON_CPU)
    assert again.returncode == 0 and "nothing to do" in again.stderr  # a finished run stays finished


def test_kill_before_the_first_checkpoint_starts_over_cleanly(tmp_path, setup):
    config, straight = setup
    run = tmp_path / "run"
    crash = run_killed(2, "write", "train", "--config", str(config), "--out", str(run), "--quiet", *ON_CPU)
    assert crash.returncode == -signal.SIGKILL
    assert not list(run.glob("checkpoints/*.pt")) and '"step": 2' in (run / "metrics.jsonl").read_text()
    resumed = run_tcli("train", "--config", str(config), "--out", str(run), "--resume", "auto", "--quiet", *ON_CPU)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_end(straight, run)
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 1


def test_a_save_inside_a_logging_interval_resumes_the_same_train_events(tmp_path, setup):
    """Saved at step 3, logged every 4 updates, killed after step 4: the resumed run's train event at step 4 still
    averages updates 1-4 (the checkpoint keeps the interval's sums), as the uninterrupted run's does."""
    config, _ = setup
    extra = ("--set", "train.save_every=3", "--set", "train.log_every=4", "--set", "train.max_steps=8")
    straight, run = tmp_path / "straight", tmp_path / "run"
    done = run_tcli("train", "--config", str(config), "--out", str(straight), "--quiet", *extra, *ON_CPU)
    assert done.returncode == 0, done.stderr
    crash = run_killed(4, "step", "train", "--config", str(config), "--out", str(run), "--quiet", *extra, *ON_CPU)
    assert crash.returncode == -signal.SIGKILL, crash.stderr
    assert state_of(run)["train_state"]["step"] == 3 and state_of(run)["train_state"]["interval"]["steps"] == 3
    resumed = run_tcli(
        "train", "--config", str(config), "--out", str(run), "--resume", "auto", "--quiet", *extra, *ON_CPU
    )
    assert resumed.returncode == 0, resumed.stderr

    def train_events(run: Path) -> list[dict]:
        timing = ("tgt_tokens_per_sec", "data_wait_s", "rss_mb")
        return [{k: v for k, v in e.items() if k not in timing} for e in read_metrics(run) if e["event"] == "train"]

    assert [e["step"] for e in train_events(straight)] == [4, 8]
    assert train_events(run) == train_events(straight)
