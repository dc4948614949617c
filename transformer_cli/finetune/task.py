"""Fine-tuning a BERT on the shared trainer: the head of the task's kind (transformer_cli/kinds/), length-bucketed
batches padded to their longest member, dev evaluation with the task's metrics (at every epoch's end too:
`evaluate_each_epoch`), best.pt by the task's score.

The run lifecycle is train/lifecycle.py's, through `finetune/setup.FinetuneSetup`; this module is the Task the
shared trainer drives.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from transformer_cli.config import FinetuneRunConfig
from transformer_cli.core.console import say
from transformer_cli.data.bert import length_batches
from transformer_cli.data.labeled import LabelledData
from transformer_cli.kinds.finetuned import Features, FinetuneMeta, batch_width, collate, evaluate_examples, features_of
from transformer_cli.runtime.device import Runtime


class FinetuneTask:
    """The Task protocol of train/loop.py for a fine-tuning run."""

    kind = "finetune"
    throughput_key = "tokens_per_sec"
    examples_key = "examples_per_sec"  # as run_glue.py reports its speed
    best_metric, best_mode = "score", "max"
    evaluate_each_epoch = True

    def __init__(
        self,
        cfg: FinetuneRunConfig,
        meta: FinetuneMeta,
        model: nn.Module,
        data: LabelledData,
        quiet: bool,
        bucketed: bool = True,
    ):
        """`bucketed`: batch widths from a few sizes (`finetuned.batch_width`), where the runtime's matmuls compile a
        kernel per shape (`Runtime.kernel_per_shape`)."""
        self.cfg, self.meta, self.model, self.data, self.quiet = cfg, meta, model, data, quiet
        self.bucketed = bucketed
        self.train = features_of(meta, data.train)
        self.valid = features_of(meta, data.valid)
        self.more_valid = {split: features_of(meta, examples) for split, examples in data.more_valid.items()}
        self.fingerprint = data.fingerprint()
        self._plan: tuple[int, list[list[int]]] | None = None

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """Batches of similar lengths, their order shuffled: a function of (seed, epoch) alone."""
        if self._plan is None or self._plan[0] != epoch:
            rng = random.Random(hash((self.cfg.train.seed, epoch)) & 0x7FFF_FFFF)
            lengths = [len(ids) for ids in self.train.ids]
            self._plan = (epoch, length_batches(lengths, self.cfg.train.batch_size, rng))
        return self._plan[1]

    def make_batch(self, spec: list[int], epoch: int) -> Any:
        t = self.cfg.train
        longest = max(len(self.train.ids[r]) for r in spec)
        limit = self.meta.max_seq_len
        length = limit if t.pad_to_max else batch_width(longest, t.pad_to_multiple, limit, self.bucketed)
        return collate(self.train, spec, self.meta.tokenizer.pad_id, self.meta.kind, max(length, longest))

    def step_loss(self, model: nn.Module, batch: Any, norms: dict[str, int]) -> tuple[Tensor, dict]:
        out = model(batch.input_ids, batch.segment_ids, batch.labels)
        return out.loss / max(norms["items"], 1), {"loss": (out.loss.detach(), batch.items)}

    def summarize(self, averages: dict[str, float]) -> dict[str, float]:
        return {"loss": averages["loss"]}

    def evaluate(self, model: nn.Module, runtime: Runtime) -> dict[str, float]:
        """The dev set's metrics and score (and those of any further dev split, as "<split>/<metric>"); a
        classifier whose every prediction is one class is named in the log."""
        results = self._evaluate_split(model, runtime, self.valid, self.data.valid, "dev")
        for split, features in self.more_valid.items():
            more = self._evaluate_split(model, runtime, features, self.data.more_valid[split], split)
            results.update({f"{split}/{key}": value for key, value in more.items()})
        return results

    def _evaluate_split(
        self, model: nn.Module, runtime: Runtime, features: Features, examples: list[Any], name: str
    ) -> dict[str, float]:
        tune = self.cfg.task.threshold == "tune" and features is self.valid  # (the split that selects best.pt)
        results, preds = evaluate_examples(model, self.meta, self.data.metrics, examples, features, runtime, tune=tune)
        if tune:
            results["threshold"] = self.meta.threshold
        note = self.meta.task_kind.note(self.meta, preds, name)
        if note is not None:
            say(self.quiet, note)
        return results

    def final_report(self, ckpt_dir: Path, runtime: Runtime) -> list[dict[str, Any]]:
        return []

    def checkpoint_meta(self) -> dict[str, Any]:
        return {
            "config": self.cfg.model_dump(mode="json"),
            "finetune": {**self.meta.state(), "metrics": list(self.data.metrics)},
            "data_fingerprint": self.fingerprint,
        }
