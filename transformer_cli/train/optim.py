"""AdamW and the learning-rate schedules."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from transformer_cli.config import TrainConfig
from transformer_cli.core.errors import finite_number, quote


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay only on matrices (not on biases, LayerNorm gains or positions tables)."""
    decay, no_decay = [], []
    for p in dict.fromkeys(model.parameters()):  # tied weights once
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel exists for CPU and CUDA and does the whole update in one pass over the parameters.
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps, fused=device.type in ("cpu", "cuda")
    )


# A parameter group's settings, fixed by the config (lr, adam_betas, adam_eps, weight_decay may not change on resume).
SETTINGS = ("initial_lr", "betas", "eps", "weight_decay")


def optimizer_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's SETTINGS, as plain numbers: those a resumed state must have."""
    return [{key: _plain(group.get(key)) for key in SETTINGS} for group in optimizer.param_groups]


def _plain(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:  # (a tensor lr, as some optimizer options keep it)
        return float(value)
    return float(value) if finite_number(value) else value


def check_optimizer_state(optimizer: torch.optim.Optimizer, steps: int, settings: list[dict[str, Any]]) -> None:
    """AdamW's state as loaded from a checkpoint of `steps` updates: each group's `settings` (those of the
    optimizer the config builds) and a finite current lr of 0 or more, every state attached to a parameter, and
    for each parameter that has one, a step of at most `steps` and two moments of the parameter's shape, finite,
    the second not negative. load_state_dict takes anything and the first update would fail on it (or train on
    NaN moments, or on fresh ones); raise ValueError naming the first problem."""
    orphans = [key for key in optimizer.state if not isinstance(key, torch.Tensor)]
    if orphans:  # saved ids that match no parameter: torch keeps their state aside, and AdamW starts afresh
        raise ValueError(f"the optimizer state names parameter {quote(orphans[0], 40)}, which no parameter group holds")
    for number, (group, expected) in enumerate(zip(optimizer.param_groups, settings, strict=True)):
        lr = _plain(group.get("lr"))  # a NaN lr trained NaN weights until "diverged"
        if not (finite_number(lr) and lr >= 0):
            raise ValueError(f"the optimizer's lr of parameter group {number} is {quote(group.get('lr'), 40)}")
        for key, value in expected.items():
            if _plain(group.get(key)) != value:  # betas (0.9,) failed at the first update, eps -1 trained on
                raise ValueError(
                    f"the optimizer's {key} of parameter group {number} is {quote(group.get(key), 40)}, "
                    f"where the config gives {value}"
                )
    for index, p in enumerate(q for group in optimizer.param_groups for q in group["params"]):
        state = optimizer.state.get(p)
        if not state:
            continue  # a parameter that never had a gradient
        for key in ("step", "exp_avg", "exp_avg_sq"):
            value = state.get(key)
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"the optimizer state of parameter {index} lacks {key}")
            if key != "step" and value.shape != p.shape:
                raise ValueError(
                    f"the optimizer's {key} of parameter {index} has shape {tuple(value.shape)}, not {tuple(p.shape)}"
                )
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"the optimizer's {key} of parameter {index} holds NaN or infinite values")
            if key == "exp_avg_sq" and bool((value < 0).any()):  # a mean of squares: NaN at the first update
                raise ValueError(f"the optimizer's exp_avg_sq of parameter {index} holds negative values")
            if key == "step" and not (value.numel() == 1 and 0 <= float(value) <= steps):
                raise ValueError(f"the optimizer's step of parameter {index} is {value.tolist()}, of {steps} updates")


def check_scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int, base_lrs: list[float]) -> None:
    """The schedule as loaded from a checkpoint of `steps` updates: it took one step per update (skipped ones too),
    from `base_lrs` (the config's train.lr), and its last rates are finite, one per parameter group. load_state_dict
    takes anything: a damaged step failed at the first update, after the run's logs were opened; raise ValueError
    naming the first problem."""
    at = scheduler.last_epoch
    if not isinstance(at, int) or isinstance(at, bool) or at != steps:
        raise ValueError(f"the schedule is at step {quote(at, 40)}, the train state at {steps}")
    if not isinstance(scheduler.base_lrs, list) or _plain(scheduler.base_lrs) != _plain(base_lrs):
        raise ValueError(
            f"the schedule's base_lrs is {quote(scheduler.base_lrs, 60)}, where the config gives {base_lrs}"
        )
    rates = getattr(scheduler, "_last_lr", None)  # (base_lrs, the config's, are a finite rate per group)
    if not (isinstance(rates, list) and len(rates) == len(scheduler.optimizer.param_groups)):
        raise ValueError(f"the schedule's _last_lr is {quote(rates, 60)}, not a rate per parameter group")
    if not all(finite_number(rate) for rate in rates):
        raise ValueError(f"the schedule's _last_lr is {quote(rates, 60)}")


def optimizer_step(
    optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, clip_norm: float
) -> tuple[torch.Tensor, bool]:
    """The update after backward, for the trainer and the scripts that time it: unscale, clip the gradients'
    norm to clip_norm (0: measured, not clipped), step unless that norm is NaN/inf (a skipped update; fp16's
    scaler skips overflowing steps itself), update the scaler, zero the gradients.
    Returns the norm and whether it was finite."""
    scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_norm if clip_norm > 0 else float("inf"))
    finite = math.isfinite(float(grad_norm))  # the step's one host sync
    if scaler.is_enabled() or finite:
        scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach(), finite


def lr_factor(step: int, schedule: str, warmup: int, total: int | None) -> float:
    """Multiplier of the peak lr at update `step` (1-based): linear warmup, then the schedule's decay."""
    step = max(step, 1)
    if warmup and step < warmup:
        return step / warmup
    if schedule == "inverse_sqrt":
        return math.sqrt(max(warmup, 1) / step)
    if schedule == "linear":
        if not total or total <= warmup:
            return 1.0
        return max(0.0, (total - step) / (total - warmup))
    return 1.0


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total: int | None):
    # LambdaLR calls the function with the number of scheduler steps taken so far (0 before the first
    # update); the update about to run is step + 1.
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s + 1, cfg.schedule, cfg.warmup_steps, total)
    )
