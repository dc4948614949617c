"""Trainer.update, the trainer driven with the caller's own batches (scripts/gpu_measure.py times it): the same
update as run() takes, and a trainer built without a run directory writes nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from transformer_cli.config import TrainConfig
from transformer_cli.runtime.device import Runtime
from transformer_cli.train.loop import Trainer


@dataclass
class _Batch:
    x: torch.Tensor
    y: torch.Tensor

    @property
    def counts(self) -> dict[str, int]:
        return {"rows": self.x.size(0)}

    @property
    def throughput_tokens(self) -> int:
        return self.x.size(0)

    @property
    def rows(self) -> int:
        return self.x.size(0)

    def shard(self, rank: int, world: int) -> _Batch:
        return self

    def to(self, device: torch.device) -> _Batch:
        return _Batch(self.x.to(device), self.y.to(device))


def _batch(i: int) -> _Batch:
    g = torch.Generator().manual_seed(i)
    return _Batch(torch.randn(3, 4, generator=g), torch.randn(3, 1, generator=g))


class _Regression:
    """A linear model behind dropout on four fixed batches an epoch; its loss is the summed squared error per row."""

    kind = "toy"
    throughput_key = "tokens_per_sec"
    examples_key = None
    best_metric, best_mode = "loss", "min"
    evaluate_each_epoch = False

    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Dropout(0.5), nn.Linear(4, 1))

    def epoch_batches(self, epoch: int) -> list[int]:
        return list(range(4))

    def make_batch(self, spec: int, epoch: int) -> _Batch:
        return _batch(spec)

    def step_loss(self, model: nn.Module, batch: _Batch, norms: dict[str, int]):
        loss = (model(batch.x) - batch.y).pow(2).sum()
        return loss / norms["rows"], {"loss": (loss.detach(), batch.rows)}

    def summarize(self, averages: dict[str, float]) -> dict[str, float]:
        return {"loss": averages["loss"]}

    def evaluate(self, model: nn.Module, runtime: Runtime) -> dict[str, float]:
        return {"loss": 1.0}

    def checkpoint_meta(self) -> dict:
        return {}

    def final_report(self, ckpt_dir, runtime) -> list:
        return []


CFG = TrainConfig(max_steps=3, warmup_steps=2, lr=0.1, log_every=1, eval_every=100, precision="fp32")


def test_update_is_the_step_that_run_takes(tmp_path):
    runtime = Runtime.create("cpu", "fp32")
    trained = Trainer(_Regression(), CFG, tmp_path, runtime, quiet=True)
    torch.manual_seed(1)  # the dropout masks
    trained.run()
    events = map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
    logged = [e["loss"] for e in events if e["event"] == "train"]

    driven = Trainer(_Regression(), CFG, None, runtime, quiet=True)
    torch.manual_seed(1)
    losses = [driven.update([_batch(i)]) for i in range(3)]
    assert [float(out["loss"]) for out in losses] == pytest.approx(logged, rel=1e-6)
    for name, weight in driven.model.state_dict().items():
        assert torch.equal(weight, trained.model.state_dict()[name]), name
    assert driven.scheduler.last_epoch == trained.scheduler.last_epoch == 3  # the schedule stepped too
    assert driven.optimizer.state_dict()["state"][0]["step"] == trained.optimizer.state_dict()["state"][0]["step"]


def test_a_trainer_without_a_run_directory_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = Trainer(_Regression(), CFG, None, Runtime.create("cpu", "fp32"), quiet=True)
    before = trainer.model[1].weight.detach().clone()
    out = trainer.update([_batch(0), _batch(1)])  # two micro-batches, one update
    assert set(out) == {"loss"} and out["loss"].dim() == 0
    assert not torch.equal(before, trainer.model[1].weight)
    with pytest.raises(ValueError, match="run directory"):
        trainer.run()
    assert list(tmp_path.iterdir()) == []
