"""Fine-tuning a BERT on the shared trainer: classification, regression and tagging heads, length-bucketed
batches padded to their longest member, dev evaluation with the task's metrics, best.pt by the task's score.

The run lifecycle is run.py's (the directory lock, config.yaml, resume checks, the finished-run rule); what
differs is that the data are small labelled files tokenised in memory by the starting model's own tokenizer
(no sentencepiece training, no token arrays), so this module drives those pieces itself.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_cli import task_metrics
from transformer_cli.config import FinetuneRunConfig, FinetuneTrainConfig
from transformer_cli.console import say
from transformer_cli.datasets.bert import length_batches
from transformer_cli.datasets.labeled import TaggedSentence
from transformer_cli.errors import UserError
from transformer_cli.files import write_atomic
from transformer_cli.finetuned import (
    Features,
    FinetuneMeta,
    build_classifier,
    collate,
    decide,
    encode_tagged,
    encode_texts,
    length_order,
    predict_logits,
)
from transformer_cli.run import (
    RunDirectory,
    _checkpoint_to_resume,
    check_resume_config,
    check_training_memory,
)
from transformer_cli.runtime import Runtime
from transformer_cli.tasks.finetune_setup import LabelledData, read_labelled, resolve_init
from transformer_cli.train.loop import Trainer, resume_requested
from transformer_cli.train.stop import saved_stop_reason

EVAL_ROWS = 64  # dev examples per evaluation batch (length-sorted: little padding)


def features_of(meta: FinetuneMeta, examples: list[Any]) -> Features:
    """Examples (with labels as ids, floats or tag ids) -> encoded features under the model's tokenizer."""
    index = {label: i for i, label in enumerate(meta.labels)}
    if meta.kind == "tagging":
        sentences = [ex.words for ex in examples]
        tagged = all(ex.tags is not None for ex in examples)
        tags = [[index[t] for t in ex.tags] for ex in examples] if tagged else None
        return encode_tagged(meta.tokenizer, sentences, tags, meta.max_seq_len)
    pairs = [ex.pair or "" for ex in examples] if any(ex.pair is not None for ex in examples) else None
    labelled = all(ex.label is not None for ex in examples)
    labels = None
    if labelled:
        labels = [float(ex.label) if meta.kind == "regression" else index[ex.label] for ex in examples]
    return encode_texts(meta.tokenizer, [ex.text for ex in examples], pairs, labels, meta.max_seq_len)


def score(meta: FinetuneMeta, metrics: tuple[str, ...], examples: list[Any], preds: list[Any]) -> dict[str, float]:
    """The task's metrics of predictions (ids, floats or tag-id lists) against the examples' labels, and
    "score": their mean (GLUE's score of a task), which selects best.pt."""
    if meta.kind == "tagging":
        gold = [list(ex.tags) for ex in examples]
        pred = [[meta.labels[i] for i in p] + ["O"] * (len(g) - len(p)) for p, g in zip(preds, gold)]
    elif meta.kind == "regression":
        gold, pred = [float(ex.label) for ex in examples], preds
    else:
        index = {label: i for i, label in enumerate(meta.labels)}
        gold, pred = [index[ex.label] for ex in examples], preds
    results = task_metrics.compute(metrics, pred, gold)
    results["score"] = task_metrics.main_value(results, metrics)
    return results


class FinetuneTask:
    """The Task protocol of train/loop.py for a fine-tuning run."""

    kind = "finetune"
    throughput_key = "tokens_per_sec"
    best_metric, best_mode = "score", "max"

    def __init__(self, cfg: FinetuneRunConfig, meta: FinetuneMeta, model: nn.Module, data: LabelledData, quiet: bool):
        self.cfg, self.meta, self.model, self.data, self.quiet = cfg, meta, model, data, quiet
        self.train = features_of(meta, data.train)
        self.valid = features_of(meta, data.valid)
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
        length = self.meta.max_seq_len if t.pad_to_max else -(-longest // t.pad_to_multiple) * t.pad_to_multiple
        return collate(self.train, spec, self.meta.tokenizer.pad_id, self.meta.kind, max(length, longest))

    def step_loss(self, model: nn.Module, batch: Any, norms: dict[str, int]) -> tuple[Tensor, dict]:
        out = model(batch.input_ids, batch.segment_ids, batch.labels)
        return out.loss / max(norms["items"], 1), {"loss": (out.loss.detach(), batch.items)}

    def summarize(self, averages: dict[str, float]) -> dict[str, float]:
        return {"loss": averages["loss"]}

    def evaluate(self, model: nn.Module, runtime: Runtime) -> dict[str, float]:
        """The dev set's metrics and score; a classifier whose every prediction is one class is named in the log."""
        batches = length_order(self.valid, EVAL_ROWS)
        logits = predict_logits(
            model, self.valid, batches, self.meta.tokenizer.pad_id, self.meta.kind, runtime.device, runtime.context
        )
        preds, _ = decide(self.meta.kind, logits)
        results = score(self.meta, self.data.metrics, self.data.valid, preds)
        if self.meta.kind == "classification" and len(set(preds)) == 1:
            say(self.quiet, f"note: every dev prediction is {self.meta.labels[preds[0]]!r} (one class)")
        return results

    def final_report(self, ckpt_dir: Path, runtime: Runtime) -> list[dict[str, Any]]:
        return []

    def checkpoint_meta(self) -> dict[str, Any]:
        return {
            "config": self.cfg.model_dump(mode="json"),
            "finetune": {**self.meta.state(), "metrics": list(self.data.metrics)},
            "data_fingerprint": self.fingerprint,
        }


class FinetuneTrainer(Trainer):
    """The shared trainer, plus a dev evaluation at the end of every epoch (the last epoch's is the trainer's)."""

    def _after_step(self, signalled: bool, out_of_time: bool) -> str | None:
        cfg, state = self.cfg, self.state
        epoch_end = state.batch_in_epoch >= len(self.task.epoch_batches(state.epoch))
        last_epoch = cfg.max_epochs is not None and state.epoch + 1 >= cfg.max_epochs
        scheduled = state.step % cfg.eval_every == 0 or bool(cfg.max_steps and state.step >= cfg.max_steps)
        early = None
        if epoch_end and not last_epoch and not scheduled and not out_of_time:
            self._evaluate_and_save(step_file=True, evaluate=True)
            if cfg.patience and state.bad_evals >= cfg.patience:
                early = "early_stopping"
                say(self.quiet, f"early stopping: no better {self.task.best_metric} in {cfg.patience} evaluations")
        return super()._after_step(signalled, out_of_time) or early


def resolved_train(train: FinetuneTrainConfig, batches_per_epoch: int) -> FinetuneTrainConfig:
    """train.warmup_ratio as a number of warmup steps (of all the run's updates)."""
    if not train.warmup_ratio:
        return train
    limits = [train.max_steps] if train.max_steps else []
    if train.max_epochs:
        limits.append(math.ceil(batches_per_epoch / train.accum_steps) * train.max_epochs)
    if not limits:
        raise UserError("train.warmup_ratio needs train.max_steps or train.max_epochs (or set train.warmup_steps)")
    return train.model_copy(update={"warmup_steps": max(1, round(train.warmup_ratio * min(limits)))})


def finetune(
    cfg: FinetuneRunConfig, run_dir: Path, device: str = "auto", resume: bool = False, quiet: bool = False
) -> dict[str, Any]:
    """`tcli finetune`: labelled data + a starting encoder -> a fine-tuned classifier; returns the end event.

    The order of run.py's lifecycle: lock, read and check everything (checkpoint, config, data, the starting
    model), only then write; a refused run changes nothing on disk."""
    runtime = Runtime.create(device, cfg.train.precision)
    quiet, resume = quiet or not runtime.is_main, resume_requested(resume)
    directory = RunDirectory(run_dir, "finetune")
    try:
        if runtime.is_main:
            directory.acquire()
        ckpt = _checkpoint_to_resume(directory, resume, quiet)
        data = read_labelled(cfg)
        finished = None
        if ckpt is not None:
            check_resume_config(ckpt.state["config"], cfg.model_dump(mode="json"), ckpt.path)
            if ckpt.state.get("data_fingerprint") != data.fingerprint():
                raise UserError(
                    f"the training data differ from those {ckpt.path} was trained on; resume with the "
                    "same files or use a new --out"
                )
            finished = saved_stop_reason(cfg.train, ckpt.state["train_state"])
            step = ckpt.state["train_state"]["step"]
            if finished and directory.finished_step() == step:
                say(quiet, f"{run_dir} finished at step {step} ({finished}); nothing to do")
                return {"event": "end", "step": step, "stop": finished, "already_finished": True}
            meta, weights, described = ckpt.finetune, None, f"resumed {ckpt.path}"
        else:
            source = resolve_init(cfg, data)
            meta = FinetuneMeta(
                data.kind,
                list(data.labels),
                source.encoder,
                source.vocab_size,
                source.tokenizer,
                cfg.data.max_seq_len,
                cfg.model.classifier_dropout,
            )
            weights, described = source.weights, source.description
        model, task = _build(cfg, meta, weights, data, quiet)
        check_training_memory(sum(p.numel() for p in model.parameters()), 0, runtime.device)
        if runtime.is_main:
            directory.start(cfg, fresh=ckpt is None)
            tokenizer_file = "bert.model" if meta.tokenizer.kind == "sentencepiece" else "tokenizer.json"
            write_atomic(meta.tokenizer.data, directory.path / "vocab" / tokenizer_file)
            say(quiet, f"run directory {run_dir}; {runtime.describe()}")
        _describe(task, described, quiet)
        trainer = FinetuneTrainer(task, resolved_train(cfg.train, len(task.epoch_batches(0))), run_dir, runtime, quiet)
        trainer.on_saved = directory.saved
        if ckpt is not None:
            trainer.restore(ckpt)
        end = trainer.run(finished=finished)
        if runtime.is_main:
            directory.finish(end["step"])
        return end
    finally:
        directory.release()
        runtime.shutdown()


def _build(
    cfg: FinetuneRunConfig, meta: FinetuneMeta, weights: dict[str, Tensor] | None, data: LabelledData, quiet: bool
) -> tuple[nn.Module, FinetuneTask]:
    """The model (seeded; the starting weights loaded, the head new) and the task with its encoded data."""
    if meta.max_seq_len > meta.encoder.max_positions:
        raise UserError(
            f"data.max_seq_len ({meta.max_seq_len}) exceeds the model's {meta.encoder.max_positions} positions; "
            f"set data.max_seq_len={meta.encoder.max_positions}"
        )
    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    model = build_classifier(meta)
    if weights is not None:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not unexpected and all(k.startswith("classifier.") for k in missing), (missing, unexpected)
    return model, FinetuneTask(cfg, meta, model, data, quiet)


def _describe(task: FinetuneTask, source: str, quiet: bool) -> None:
    meta = task.meta
    n_params = sum(p.numel() for p in task.model.parameters())
    labels = f"{len(meta.labels)} labels" if meta.labels else "regression"
    say(quiet, f"model: {source}; {n_params:,} parameters; {meta.kind} ({labels}); tokenizer {meta.tokenizer.kind}")
    for name, feats in (("train", task.train), ("valid", task.valid)):
        cut = f"; {feats.truncated:,} cut to max_seq_len {meta.max_seq_len}" if feats.truncated else ""
        lost = f" ({feats.words_lost:,} words lost)" if feats.words_lost else ""
        say(quiet, f"{name}: {len(feats):,} examples{cut}{lost}")
    if isinstance(task.data.train[0], TaggedSentence) and task.train.truncated:
        say(quiet, "tagging: words beyond max_seq_len are not trained on; raise data.max_seq_len to keep them")
