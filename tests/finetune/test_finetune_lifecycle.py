"""Fine-tuning on the shared lifecycle: the trainer's evaluate_each_epoch (on a toy task, no data files), and a
fine-tuning run directory as train/lifecycle.py makes every run's (run.json, vocab/ with the tokenizer, no data/)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from transformer_cli.config import FinetuneTrainConfig
from transformer_cli.runtime.device import Runtime
from transformer_cli.train.loop import Trainer


@dataclass
class _Batch:
    x: torch.Tensor

    counts = {"items": 1}
    throughput_tokens = 1
    rows = 1

    def shard(self, rank: int, world: int) -> _Batch:
        return self

    def to(self, device: torch.device) -> _Batch:
        return _Batch(self.x.to(device))


class _ToyTask:
    """Five batches an epoch; the evaluation is a fixed sequence of scores (never better after the first: patience)."""

    kind = "finetune"
    throughput_key = "tokens_per_sec"
    examples_key = None
    best_metric, best_mode = "score", "max"

    def __init__(self, each_epoch: bool):
        self.evaluate_each_epoch = each_epoch
        torch.manual_seed(0)
        self.model = nn.Linear(2, 1)
        self.evaluated: list[int] = []

    def epoch_batches(self, epoch: int) -> list[int]:
        return list(range(5))

    def make_batch(self, spec: int, epoch: int) -> _Batch:
        return _Batch(torch.full((1, 2), float(spec)))

    def step_loss(self, model, batch, norms):
        loss = model(batch.x).pow(2).mean()
        return loss, {"loss": (loss.detach(), 1)}

    def summarize(self, averages):
        return {"loss": averages["loss"]}

    def evaluate(self, model, runtime):
        self.evaluated.append(len(self.evaluated))
        return {"score": 1.0 if len(self.evaluated) == 1 else 0.5}

    def checkpoint_meta(self):
        return {}

    def final_report(self, ckpt_dir, runtime):
        return []


def _eval_steps(tmp_path: Path, each_epoch: bool, **train) -> list[int]:
    task = _ToyTask(each_epoch)
    cfg = FinetuneTrainConfig(eval_every=4, log_every=100, precision="fp32", warmup_ratio=0.0, **train)
    Trainer(task, cfg, tmp_path, Runtime.create("cpu", "fp32"), quiet=True).run()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    return [e["step"] for e in map(json.loads, lines) if e["event"] == "eval"]


@pytest.mark.parametrize("each_epoch", [False, True])
def test_evaluate_each_epoch_adds_the_epoch_ends(tmp_path, each_epoch):
    steps = _eval_steps(tmp_path, each_epoch, max_epochs=3)
    # every 4 updates and the run's end (step 15) in any case; the ends of epochs 1 and 2 (5, 10) only when asked
    assert steps == ([4, 5, 8, 10, 12, 15] if each_epoch else [4, 8, 12, 15])
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))[:2] == ["best.pt", "last.pt"]


def test_epoch_evaluations_count_for_patience(tmp_path):
    # best at step 4, then 5 and 8 are no better: patience 2 stops at step 8, inside epoch 2
    assert _eval_steps(tmp_path, True, max_epochs=3, patience=2) == [4, 5, 8]
