"""The one trainer shared by translation, BERT pretraining and fine-tuning: `train()` orchestrates,
`train_step()` does one update.

A task (translation, BERT, fine-tuning) supplies the model, the epoch's batch order, the loss of a batch and the
evaluation; the trainer owns optimisation, precision, accumulation, clipping, the schedule,
checkpoints (atomic, exact resume), signals, logging and early stopping.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import random
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from transformer_cli import __version__
from transformer_cli.checkpoint import Checkpoint, serialize
from transformer_cli.config import TrainConfig
from transformer_cli.core.console import say
from transformer_cli.core.errors import UserError
from transformer_cli.core.files import write_atomic
from transformer_cli.core.metrics_log import MetricsLog
from transformer_cli.runtime.device import Runtime, release_free_memory
from transformer_cli.train.optim import (
    build_optimizer,
    build_scheduler,
    check_optimizer_state,
    check_scheduler_state,
    optimizer_settings,
    optimizer_step,
)
from transformer_cli.train.stop import saved_stop_reason, stop_reason


class Task(Protocol):
    """What the trainer needs from a model family."""

    kind: str  # "translation" | "bert": stored in checkpoints
    model: nn.Module
    throughput_key: str  # name of the tokens/s field in train events
    examples_key: str | None  # name of the examples/s field (sequences per second) in train events, if any
    best_metric: str  # eval key that selects best.pt
    best_mode: str  # "max" or "min"
    # Also evaluate (and save a step checkpoint) at the end of every epoch, besides every train.eval_every
    # updates: fine-tuning's epochs are short and its recipes compare epochs. The last epoch's end is evaluated
    # as every run's end is; patience counts these evaluations too.
    evaluate_each_epoch: bool

    def epoch_batches(self, epoch: int) -> list[Any]: ...  # the epoch's batch specs, from seed and epoch
    def make_batch(self, spec: Any, epoch: int) -> Any: ...  # spec -> batch with .counts, .throughput_tokens, .to()
    def step_loss(
        self, model: nn.Module, batch: Any, norms: dict[str, int]
    ) -> tuple[Tensor, dict[str, tuple[Tensor, int]]]: ...  # (objective, sums)
    def summarize(self, averages: dict[str, float]) -> dict[str, float]: ...  # train event fields
    def evaluate(self, model: nn.Module, runtime: Runtime) -> dict[str, float]: ...
    def checkpoint_meta(self) -> dict[str, Any]: ...
    def final_report(self, ckpt_dir: Path, runtime: Runtime) -> list[dict[str, Any]]: ...  # test scores


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0  # epochs completed before the current one
    batch_in_epoch: int = 0  # next batch spec of the current epoch
    best: float | None = None
    bad_evals: int = 0
    train_seconds: float = 0.0  # time spent in training steps, summed over resumes
    wall_seconds: float = 0.0


@dataclass
class _Interval:
    """Sums over one logging interval; read (with a host sync) only when logging."""

    sums: dict[str, list] = field(default_factory=dict)
    tokens: int = 0
    rows: int = 0  # sequences (examples) trained on
    seconds: float = 0.0
    grad_norm: Tensor | None = None
    steps: int = 0
    data_wait: float = 0.0  # seconds the steps waited for their batches

    def add(self, stats: dict[str, tuple[Tensor, int]]) -> None:
        for key, (total, count) in stats.items():
            entry = self.sums.setdefault(key, [0.0, 0])
            entry[0] = entry[0] + total
            entry[1] += count

    def record(self, grad_norm: Tensor, tokens: int, rows: int, seconds: float) -> None:
        self.grad_norm = grad_norm if self.grad_norm is None else self.grad_norm + grad_norm
        self.steps += 1
        self.tokens += tokens
        self.rows += rows
        self.seconds += seconds

    def state_dict(self, sums: dict[str, tuple[float, int]]) -> dict[str, Any]:
        """What a checkpoint keeps of an interval that a save cut in two, so that the resumed run's next train
        event averages the same updates as an uninterrupted run's; `sums` are the losses summed over all ranks."""
        return {
            "sums": {k: [total, count] for k, (total, count) in sums.items()},
            "tokens": self.tokens,
            "rows": self.rows,
            "seconds": self.seconds,
            "grad_norm": None if self.grad_norm is None else float(self.grad_norm),
            "steps": self.steps,
            "data_wait": self.data_wait,
        }

    @classmethod
    def restored(cls, saved: dict[str, Any] | None, with_sums: bool) -> _Interval:
        """The interval a checkpoint saved (none: an empty one). The losses were summed over all ranks, so one
        rank (`with_sums`) takes them and the others start from zero."""
        if saved is None:
            return cls()
        sums = {k: [total, count] if with_sums else [0.0, 0] for k, (total, count) in saved["sums"].items()}
        return cls(
            sums=sums,
            tokens=saved["tokens"],
            rows=saved["rows"],
            seconds=saved["seconds"],
            grad_norm=None if saved["grad_norm"] is None else torch.tensor(saved["grad_norm"]),
            steps=saved["steps"],
            data_wait=saved["data_wait"],
        )


class _Feeder:
    """The batches of the next update, in order from batch `start` of an epoch's plan.

    On a GPU a background thread makes them one update ahead (reading the token arrays, padding, drawing the
    masks on the host) while the current update runs on the device; on a CPU the cores are busy with the update
    itself, so they are made when needed. Either way the same batches come in the same order (each batch's
    randomness is seeded from its place in the epoch), so exact resume does not depend on it.
    """

    def __init__(self, task: Task, specs: Any, start: int, epoch: int, accum: int, background: bool):
        self.task, self.specs, self.epoch, self.accum = task, specs, epoch, accum
        self.position = start
        self.thread = None
        if background:
            self.queue: queue.Queue = queue.Queue(maxsize=1)
            self.stopped = threading.Event()
            self.thread = threading.Thread(target=self._produce, name="tcli-batches", daemon=True)
            self.thread.start()

    def _make(self) -> list[Any]:
        group = self.specs[self.position : self.position + self.accum]
        self.position += len(group)
        return [self.task.make_batch(spec, self.epoch) for spec in group]

    def _produce(self) -> None:
        try:
            while self.position < len(self.specs) and not self.stopped.is_set():
                item: Any = self._make()
                while not self.stopped.is_set():
                    try:
                        self.queue.put(item, timeout=0.1)
                        break
                    except queue.Full:  # the training step still runs
                        continue
        except BaseException as e:  # handed to the training loop, raised there
            self.queue.put(e)

    def next(self) -> list[Any]:
        if self.thread is None:
            return self._make()
        item = self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        if self.thread is not None:
            self.stopped.set()
            self.thread.join(timeout=5)


class _StopSignal:
    """SIGINT/SIGTERM set a flag; the loop saves last.pt after the current step and exits."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        self.received = signum
        # A second Ctrl-C behaves as usual (KeyboardInterrupt) for a user who will not wait.
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def resume_requested(resume: bool) -> bool:
    """`--resume auto`, or a job that torchrun restarted (--max-restarts): both continue from last.pt."""
    return resume or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


# Updates in a row whose gradients are NaN or infinite before a run is stopped as diverged. Such updates
# are skipped (the weights stay finite); fp16's gradient scaler skips overflowing steps by design while it
# finds its scale, so it gets more room.
NONFINITE_LIMIT = {"fp16": 30}
NONFINITE_DEFAULT = 5


class Trainer:
    """Owns the optimisation state of one run; `run()` trains until a stop condition.

    Under torchrun every rank builds the same global sequence of batches from the seed and takes
    a disjoint share of each (rows rank, rank + W, ...), so what the model sees does not depend on the
    number of processes; losses are normalised by the global batch's counts. Rank 0 alone evaluates,
    logs and writes checkpoints (of the unwrapped model).
    """

    def __init__(self, task: Task, cfg: TrainConfig, run_dir: Path | None, runtime: Runtime, quiet: bool = False):
        """`run_dir` None: a trainer that only takes `update()`s (nothing is written); `run()` needs one."""
        self.task, self.cfg, self.run_dir, self.runtime = task, cfg, run_dir, runtime
        self.quiet = quiet or not runtime.is_main
        self.ckpt_dir = None if run_dir is None else run_dir / "checkpoints"
        self.model = task.model.to(runtime.device)
        self.optimizer = build_optimizer(self.model, cfg, runtime.device)
        steps_per_epoch = math.ceil(len(task.epoch_batches(0)) / cfg.accum_steps)
        epoch_steps = steps_per_epoch * cfg.max_epochs if cfg.max_epochs else None
        limits = [s for s in (cfg.max_steps, epoch_steps) if s]
        self.total_steps = min(limits) if limits else None  # None: only train.max_minutes ends the run
        self.scheduler = build_scheduler(self.optimizer, cfg, self.total_steps)
        self.scaler = runtime.grad_scaler()
        self.state = TrainState()
        self.wall_start = time.perf_counter()
        self.nonfinite_limit = NONFINITE_LIMIT.get(runtime.precision, NONFINITE_DEFAULT)
        self.nonfinite_steps: list[int] = []  # the current run of updates skipped for NaN/inf gradients
        self.interval = _Interval()  # the updates since the last train event
        self.on_saved: Callable[[int], None] = lambda step: None  # told after each write of last.pt
        self.run_meta: dict[str, Any] = {}  # what the run adds to each checkpoint (the dev data's hash)
        self._seed_ranks()

    def restore(self, ckpt: Checkpoint) -> None:
        """Continue from a checkpoint (already validated and checked against the config by the runner)."""
        try:
            self._restore(ckpt.state)
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:  # a damaged optimizer or RNG state
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(
                f"{ckpt.path} cannot be resumed: its training state does not load ({first}); resume from an "
                "intact last.pt or choose another --out"
            ) from None
        say(self.quiet, f"resumed from {ckpt.path} at step {self.state.step} (epoch {self.state.epoch + 1})")
        self._seed_ranks()

    def _seed_ranks(self) -> None:
        if self.runtime.distributed:
            # Each rank draws its own dropout masks (the initial weights came from one shared seed).
            torch.manual_seed(hash((self.cfg.seed, self.state.step, self.runtime.rank)) & 0x7FFF_FFFF)

    def _wrap(self) -> nn.Module:
        model: nn.Module = self.model
        if self.runtime.distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.runtime.device.index] if self.runtime.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        return torch.compile(model) if self.cfg.compile else model

    def run(self, finished: str | None = None) -> dict[str, Any]:
        """Train until a stop condition; then log the test scores (if the task has them) and the end event.

        `finished` (why the restored run has nothing left to train) skips straight to the end: a run killed
        during its final test evaluation ends exactly as an uninterrupted one would.
        """
        if self.run_dir is None:
            raise ValueError("Trainer.run() needs a run directory (a trainer built without one only takes update())")
        state = self.state
        self.metrics = MetricsLog(self.run_dir, resume_step=state.step or None, enabled=self.runtime.is_main)
        try:
            reason = finished or self._train()
            if reason == "signal":
                self.metrics.close()
                self.runtime.barrier()
                say(
                    self.quiet,
                    f"stopped by signal at step {state.step}; last.pt saved, resume with --resume auto "
                    "(a tcli glue run: the same command again)",
                )
                sys.exit(128 + (self.signal_received or signal.SIGTERM))
            return self._end(reason)
        finally:
            self.metrics.close()

    def _end(self, reason: str) -> dict[str, Any]:
        state, task = self.state, self.task
        wall = self.elapsed()
        if self.runtime.is_main and self.cfg.average_last:
            self._average_last(self.cfg.average_last)
        for test in task.final_report(self.ckpt_dir, self.runtime) if self.runtime.is_main else []:
            self.metrics.log("test", state.step, **test)
        end = self.metrics.log(
            "end", state.step, **{f"best_{task.best_metric}": state.best}, wall_s=round(wall, 1), stop=reason
        )
        self.metrics.close()
        self.runtime.barrier()
        say(self.quiet, f"done at step {state.step} ({reason}), best {task.best_metric} {state.best}, {wall:.0f}s")
        return end

    def _average_last(self, n: int) -> None:
        """train.average_last: the mean of the last n step checkpoints as averaged.pt, scored on the
        validation set (an "averaged" event; translation also scores it on the test split)."""
        from transformer_cli.export.average import average_checkpoints

        steps = sorted(self.ckpt_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))[-n:]
        if len(steps) < 2:
            say(self.quiet, f"train.average_last: {len(steps)} step checkpoint(s), nothing to average")
            return
        state = average_checkpoints(steps)
        write_atomic(serialize(state), self.ckpt_dir / "averaged.pt")
        self.model.load_state_dict(state["model"])
        self.model.eval()
        with torch.inference_mode():
            results = self.task.evaluate(self.model, self.runtime)
        self.metrics.log("averaged", self.state.step, **results, checkpoints=[p.name for p in steps])
        shown = "  ".join(f"{k} {v:.4g}" for k, v in results.items() if isinstance(v, float))
        say(self.quiet, f"averaged.pt (mean of {', '.join(p.name for p in steps)}): {shown}")

    def _train(self) -> str:
        """The training loop proper; returns why it stopped."""
        cfg, state, task = self.cfg, self.state, self.task
        reason = saved_stop_reason(cfg, self._state_dict())  # a resumed run may have nothing left to do
        if reason is not None:
            return reason
        step_model = self._wrap()
        bar = _progress(self.total_steps, state.step, self.quiet)
        self.signal_received = None
        with _StopSignal() as stop:
            try:
                while reason is None:
                    specs = task.epoch_batches(state.epoch)
                    if self.runtime.device.type == "cpu":
                        release_free_memory()  # planning the epoch made corpus-sized temporaries
                    feeder = _Feeder(
                        task,
                        specs,
                        state.batch_in_epoch,
                        state.epoch,
                        cfg.accum_steps,
                        background=self.runtime.device.type == "cuda",
                    )
                    while state.batch_in_epoch < len(specs) and reason is None:
                        t0 = time.perf_counter()
                        batches = feeder.next()
                        self.interval.data_wait += time.perf_counter() - t0
                        grad_norm, finite = self.train_step(step_model, batches, self.interval)
                        state.step += 1
                        self._check_finite(finite)
                        state.batch_in_epoch += len(batches)
                        tokens, rows = sum(b.throughput_tokens for b in batches), sum(b.rows for b in batches)
                        self.interval.record(grad_norm, tokens, rows, time.perf_counter() - t0)
                        bar.update(1)
                        if state.step % cfg.log_every == 0:
                            self._log_train(self.interval, bar)
                            self.interval = _Interval()
                        reason = self._after_step(*self._agree(stop.received is not None, self._out_of_time()))
                    if reason is None:
                        state.epoch += 1
                        state.batch_in_epoch = 0
                        reason = stop_reason(cfg, state.step, state.epoch, False, state.bad_evals)
                        if reason is not None:
                            self._evaluate_and_save(step_file=True, evaluate=state.step % cfg.eval_every != 0)
            finally:
                if "feeder" in locals():
                    feeder.close()
                bar.close()
                self.signal_received = stop.received
        if self.nonfinite_steps and reason != "signal":  # the run ends on skipped (NaN/inf) updates
            self._diverged(f"at its last updates, steps {self.nonfinite_steps[0]}-{self.nonfinite_steps[-1]}")
        return reason

    def _check_finite(self, finite: bool) -> None:
        """Count updates skipped for NaN/inf gradients; too many in a row end the run as diverged."""
        if finite:
            self.nonfinite_steps = []
            return
        self.nonfinite_steps.append(self.state.step)
        if len(self.nonfinite_steps) >= self.nonfinite_limit:
            first, last = self.nonfinite_steps[0], self.nonfinite_steps[-1]
            self._diverged(f"at steps {first}-{last} ({len(self.nonfinite_steps)} in a row)")

    def _diverged(self, where: str) -> None:
        raise UserError(
            f"training diverged: the loss or gradients were NaN or infinite {where}; those updates "
            "were skipped and the checkpoints saved before are kept; lower train.lr, raise "
            "train.warmup_steps or check train.adam_eps / train.weight_decay, then start a new run"
        )

    def _out_of_time(self) -> bool:
        limit = self.cfg.max_minutes
        return limit is not None and self.elapsed() >= 60 * limit

    def elapsed(self) -> float:
        """Wall seconds of the run so far, over all its sessions."""
        return self.state.wall_seconds + time.perf_counter() - self.wall_start

    def _agree(self, signalled: bool, out_of_time: bool) -> tuple[bool, bool]:
        """Ranks stop together: what any rank sees (a signal, the time limit) stops all after the same step."""
        if not self.runtime.distributed:
            return signalled, out_of_time
        total = self.runtime.all_reduce_sum([float(signalled), float(out_of_time)])
        return total[0] > 0, total[1] > 0

    def train_step(self, model: nn.Module, batches: list[Any], interval: _Interval) -> tuple[Tensor, bool]:
        """One update over `batches` (the global micro-batches of gradient accumulation); returns the grad norm
        and whether it was finite (a NaN/inf update is skipped)."""
        model.train()
        rt = self.runtime
        norms: dict[str, int] = {}
        for batch in batches:
            for key, count in batch.counts.items():
                norms[key] = norms.get(key, 0) + count
        for i, batch in enumerate(batches):
            share = batch.shard(rt.rank, rt.world_size)
            # A rank whose share is empty still runs (DDP needs every rank's backward): one row, weight 0.
            weight = float(rt.world_size) if share is not None else 0.0
            share = (share or batch.shard(0, batch.rows)).to(rt.device)
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or not rt.distributed else model.no_sync()
            with sync:
                with rt.context():
                    objective, stats = self.task.step_loss(model, share, norms)
                # DDP averages gradients over ranks; the objective is already a share of the global mean.
                self.scaler.scale(objective * weight if weight != 1.0 else objective).backward()
            # A rank without rows adds nothing but still knows the keys, which the ranks sum together when logging.
            interval.add(stats if weight else {key: (0.0, 0) for key in stats})
        grad_norm, finite = optimizer_step(self.optimizer, self.scaler, self.cfg.clip_norm)
        if finite:
            self.scheduler.step()
        else:  # a skipped update is still a step of the schedule; torch would warn that the optimizer did not step
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
                self.scheduler.step()
        return grad_norm, finite

    def update(self, batches: list[Any]) -> dict[str, Tensor]:
        """`train_step` on the caller's own batches, outside `run()`: no step count, log or checkpoint.
        Returns the update's mean losses by key, as tensors (no host sync). scripts/gpu_measure.py times it."""
        interval = _Interval()
        self.train_step(self.model, batches, interval)
        return {key: total / max(count, 1) for key, (total, count) in interval.sums.items()}

    def _after_step(self, signalled: bool, out_of_time: bool) -> str | None:
        """Evaluate / save on schedule; return why training stops now, or None."""
        cfg, step = self.cfg, self.state.step
        reason = stop_reason(cfg, step, self.state.epoch, out_of_time, bad_evals=0)  # patience: after evaluating
        if step % cfg.eval_every == 0 or reason or self._epoch_evaluation_due():
            self._evaluate_and_save(step_file=True, evaluate=True)
            if reason is None:
                reason = stop_reason(cfg, step, self.state.epoch, False, self.state.bad_evals)
                if reason is not None:
                    say(self.quiet, f"early stopping: no better {self.task.best_metric} in {cfg.patience} evaluations")
        elif step % (cfg.save_every or cfg.eval_every) == 0:
            self._save(best=False, step_file=True)
        elif signalled:
            self._save(best=False, step_file=False)
        return reason or ("signal" if signalled else None)

    def _epoch_evaluation_due(self) -> bool:
        """Task.evaluate_each_epoch: this update ended an epoch that is not the run's last (whose end the loop
        evaluates after counting the epoch)."""
        state, max_epochs = self.state, self.cfg.max_epochs
        return (
            self.task.evaluate_each_epoch
            and state.batch_in_epoch >= len(self.task.epoch_batches(state.epoch))
            and not (max_epochs is not None and state.epoch + 1 >= max_epochs)
        )

    def _evaluate_and_save(self, step_file: bool, evaluate: bool) -> None:
        improved = self._evaluate() if evaluate else False
        self._save(best=improved, step_file=step_file)
        if self.runtime.device.type == "cpu":
            release_free_memory()

    def _evaluate(self) -> bool:
        """Rank 0 evaluates (the numbers of a single process); every rank learns the outcome."""
        state = self.state
        better = self._evaluate_here() if self.runtime.is_main else False
        best = math.nan if state.best is None else state.best
        best, bad_evals, better = self.runtime.broadcast([best, state.bad_evals, float(better)])
        state.best = None if math.isnan(best) else best
        state.bad_evals = int(bad_evals)
        return bool(better)

    def _evaluate_here(self) -> bool:
        t0 = time.perf_counter()
        self.model.eval()
        with torch.inference_mode():
            results = self.task.evaluate(self.model, self.runtime)
        self.model.train()
        state, task = self.state, self.task
        self.metrics.log(
            "eval", state.step, **results, eval_s=round(time.perf_counter() - t0, 2), wall_s=round(self.elapsed(), 1)
        )
        broken = [k for k, v in results.items() if isinstance(v, float) and not math.isfinite(v)]
        if broken:
            raise UserError(
                f"training diverged: the validation {broken[0]} is NaN or infinite at step {state.step}; "
                "the checkpoints saved before are kept; lower train.lr or check train.weight_decay / "
                "train.adam_eps, then start a new run"
            )
        value = results[task.best_metric]
        better = math.isfinite(value) and (
            state.best is None or (value > state.best if task.best_mode == "max" else value < state.best)
        )
        if better:
            state.best, state.bad_evals = value, 0
        else:
            state.bad_evals += 1
        shown = "  ".join(f"{k} {v:.4g}" for k, v in results.items() if isinstance(v, float))
        say(self.quiet, f"eval step {state.step}: {shown}" + ("  (best)" if better else ""))
        return better

    def _save(self, best: bool, step_file: bool) -> None:
        """Serialise once; write step_N.pt, best.pt and last.pt atomically; prune old step files (rank 0)."""
        interval = self.interval.state_dict(self._summed_losses(self.interval))  # every rank takes part in the sum
        if not self.runtime.is_main:
            return
        state = self.state
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        train_state = {**self._state_dict(), "interval": interval}
        for name, tensor in self.model.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise UserError(
                    f"training diverged: {name} became NaN or infinite by step {state.step}; nothing "
                    "was saved for this step and the checkpoints saved before are kept; lower train.lr "
                    "or check train.weight_decay / train.adam_eps, then start a new run"
                )
        data = serialize(
            {
                "tcli": {"kind": self.task.kind, "version": __version__},
                **self.task.checkpoint_meta(),
                **self.run_meta,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "train_state": train_state,
                "rng": rng,
            }
        )
        if step_file and self.cfg.keep_last > 0:
            write_atomic(data, self.ckpt_dir / f"step_{state.step}.pt")
            steps = sorted(self.ckpt_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
            for old in steps[: -self.cfg.keep_last]:
                old.unlink(missing_ok=True)
        if best:
            write_atomic(data, self.ckpt_dir / "best.pt")
        write_atomic(data, self.ckpt_dir / "last.pt")
        self.on_saved(state.step)

    def _state_dict(self) -> dict[str, Any]:
        state = self.state
        return {
            "step": state.step,
            "epoch": state.epoch,
            "batch_in_epoch": state.batch_in_epoch,
            "best": state.best,
            "bad_evals": state.bad_evals,
            "train_seconds": state.train_seconds,
            "wall_seconds": self.elapsed(),
        }

    def _restore(self, ckpt: dict[str, Any]) -> None:
        steps = ckpt["train_state"]["step"]
        settings, base_lrs = optimizer_settings(self.optimizer), list(self.scheduler.base_lrs)  # the config's
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        check_optimizer_state(self.optimizer, steps, settings)
        self.scheduler.load_state_dict(ckpt["scheduler"])
        check_scheduler_state(self.scheduler, steps, base_lrs)
        self.scaler.load_state_dict(ckpt["scaler"])
        ts, state = ckpt["train_state"], self.state
        state.step, state.epoch, state.batch_in_epoch = ts["step"], ts["epoch"], ts["batch_in_epoch"]
        state.best, state.bad_evals = ts["best"], ts["bad_evals"]
        state.train_seconds, state.wall_seconds = ts["train_seconds"], ts["wall_seconds"]
        # Checkpoints written before the interval was saved have none: the next train event then averages fewer updates.
        self.interval = _Interval.restored(ts.get("interval"), with_sums=self.runtime.is_main)
        torch.set_rng_state(ckpt["rng"]["torch"])
        random.setstate(_as_random_state(ckpt["rng"]["python"]))
        if "cuda" in ckpt["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])

    def _summed_losses(self, interval: _Interval) -> dict[str, tuple[float, int]]:
        """The interval's (loss sum, count) of each key, over all ranks (a host sync)."""
        keys = sorted(interval.sums)
        flat = self.runtime.all_reduce_sum([float(interval.sums[k][i]) for k in keys for i in (0, 1)])
        return {k: (flat[2 * j], int(flat[2 * j + 1])) for j, k in enumerate(keys)}

    def _log_train(self, interval: _Interval, bar) -> None:
        """The one host sync of an interval: read the summed losses (over all ranks) and grad norms."""
        averages = {k: total / max(count, 1) for k, (total, count) in self._summed_losses(interval).items()}
        fields = self.task.summarize(averages)
        self.state.train_seconds += interval.seconds
        seconds = interval.seconds if interval.seconds > 0 else float("inf")
        tps = interval.tokens / seconds
        examples = {}
        if self.task.examples_key is not None:
            examples[self.task.examples_key] = round(interval.rows / seconds, 1)
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = float(interval.grad_norm) / max(interval.steps, 1)
        self.metrics.log(
            "train",
            self.state.step,
            epoch=self.state.epoch + 1,
            **fields,
            lr=lr,
            grad_norm=grad_norm,
            **{self.task.throughput_key: round(tps, 1)},
            **examples,
            data_wait_s=round(interval.data_wait, 4),
            rss_mb=round(resident_mb(), 1),
        )
        bar.set_postfix_str(f"loss {fields['loss']:.3f}  lr {lr:.2e}  {tps:,.0f} tok/s", refresh=False)
        if bar.disable and not self.quiet:
            print(
                f"step {self.state.step}  epoch {self.state.epoch + 1}  loss {fields['loss']:.4f}  lr {lr:.3g}  "
                f"grad_norm {grad_norm:.3f}  {tps:,.0f} tok/s",
                file=sys.stderr,
                flush=True,
            )


def resident_mb() -> float:
    """This process's resident memory in MB (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _as_random_state(value) -> tuple:
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


def _progress(total: int, initial: int, quiet: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc="train",
        unit="step",
        dynamic_ncols=True,
        disable=quiet or not sys.stderr.isatty(),
        file=sys.stderr,
    )
