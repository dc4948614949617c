"""Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one run.

The mean of the last few checkpoints of a run usually translates a little better than any one of them
(Vaswani et al., 2017, average the last 5 or 20). The checkpoints must describe the same model: the
same kind, model section and vocabulary; anything else is refused with one line naming the two files.
The result is a checkpoint like any other (config, vocabulary, tcli metadata) without optimizer state.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import torch

from transformer_cli.checkpoint import Checkpoint, read_checkpoint, serialize
from transformer_cli.core.errors import UserError
from transformer_cli.core.files import RUN_MARKER, remove_stale_temporaries, same_file, write_atomic
from transformer_cli.export.folders import check_writable_file

# What only a resumed training run needs: an average is never resumed.
_TRAINING_ONLY = ("optimizer", "scheduler", "scaler", "rng", "train_state")
_STEP_FILE = re.compile(r"step_(\d+)\.pt")


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """The state to save for the mean of `paths`' weights (fp32 sums; tied tensors averaged once).

    Raises a one-line UserError for a missing or damaged file, fewer than two files, a file given twice, or
    checkpoints that differ in kind, model section or vocabulary.
    """
    if len(paths) < 2:
        raise UserError(f"averaging needs at least two checkpoints, got {len(paths)}")
    check_distinct(paths)
    first = read_checkpoint(paths[0])
    total, owner = _fp32_weights(first)
    steps = [_step(first)]
    for path in paths[1:]:
        ckpt = read_checkpoint(path)
        check_compatible(first, ckpt)
        if (other := other_run(first, ckpt)) is not None:
            print(f"warning: {other}: the mean of two runs' weights is rarely a good model", file=sys.stderr)
        for name, t in _fp32_weights(ckpt)[0].items():
            total[name] += t
        steps.append(_step(ckpt))
        del ckpt
    mean = {name: (t / len(paths)).to(first.weights[name].dtype) for name, t in total.items()}  # the stored dtype
    state = {k: v for k, v in first.state.items() if k not in _TRAINING_ONLY}
    state["model"] = {name: mean[owner[name]] for name in owner}  # tied names share one tensor, as in the model
    state["tcli"] = {**first.state["tcli"], "averaged": {"checkpoints": [str(p) for p in paths], "steps": steps}}
    return state


def _fp32_weights(ckpt: Checkpoint) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The checkpoint's validated weights in fp32, one entry per storage of the model (tied names share one), and
    each name's owner: the first name of its storage. The ties are the model's, not the file's: a file converted
    to another dtype (`{k: v.half()}`) stores tied weights as separate tensors."""
    model = ckpt.build_model()  # names, shapes and finiteness checked against the config
    first_name: dict[int, str] = {}
    out, owner = {}, {}
    for name, t in model.state_dict().items():
        if t.data_ptr() not in first_name:
            first_name[t.data_ptr()] = name
            out[name] = t.detach().to(torch.float32, copy=True)
        owner[name] = first_name[t.data_ptr()]
    return out, owner


def _step(ckpt: Checkpoint) -> int | None:
    """The checkpoint's training step; an average is refused as an input (its checkpoints would count as one)."""
    averaged = (ckpt.state.get("tcli") or {}).get("averaged")
    if isinstance(averaged, dict):
        steps = ", ".join(map(str, averaged.get("steps") or [])) or "unknown steps"
        raise UserError(
            f"{ckpt.path} is itself an average (of steps {steps}): its checkpoints would weigh as one; "
            "average the step checkpoints it was made from"
        )
    train_state = ckpt.state.get("train_state")
    return train_state.get("step") if isinstance(train_state, dict) else None


def check_compatible(a: Checkpoint, b: Checkpoint) -> None:
    """One-line refusal naming both files when b is not the same model as a."""
    where = f"{a.path} and {b.path}"
    if a.kind != b.kind:
        raise UserError(f"cannot average {where}: one holds a {a.kind} model, the other a {b.kind} model")
    if a.kind == "finetune":  # the task and its head, the encoder's sizes and the tokenizer, from the metadata
        _check_same_task(a, b, where)
    ours, theirs = a.cfg.model.model_dump(), b.cfg.model.model_dump()
    differ = [k for k in ours if ours[k] != theirs.get(k)]
    if differ:
        k = differ[0]
        raise UserError(f"cannot average {where}: model.{k} is {ours[k]} in one and {theirs.get(k)} in the other")
    if a.state.get("vocab") != b.state.get("vocab"):
        raise UserError(f"cannot average {where}: they were trained with different vocabularies")
    if a.kind == "translation":
        ours, theirs = (f"{c.cfg.data.src_lang}->{c.cfg.data.tgt_lang}" for c in (a, b))
        if ours != theirs:
            raise UserError(f"cannot average {where}: one translates {ours}, the other {theirs}")


def other_run(a: Checkpoint, b: Checkpoint) -> str | None:
    """What says that b comes from another training run than a (its seed, its training data), or None: the mean
    of independently trained weights is a worse model than either, though it has the same shapes."""
    for what, ours, theirs in (
        ("train.seed", a.cfg.train.seed, b.cfg.train.seed),
        ("training data", a.state.get("data_fingerprint"), b.state.get("data_fingerprint")),
    ):
        if ours != theirs:
            return f"{b.path} was trained with another {what} than {a.path}"
    return None


def _check_same_task(a: Checkpoint, b: Checkpoint, where: str) -> None:
    ours, theirs = a.finetune, b.finetune
    if ours.kind != theirs.kind:
        raise UserError(f"cannot average {where}: one is a {ours.kind} model, the other a {theirs.kind} model")
    if list(ours.labels) != list(theirs.labels):
        raise UserError(
            f"cannot average {where}: their label sets differ ({', '.join(ours.labels[:4])} against "
            f"{', '.join(theirs.labels[:4])}); average checkpoints of one fine-tuning run"
        )
    our_state, their_state = ours.state(), theirs.state()
    for key in ("encoder", "vocab_size", "tokenizer"):
        if our_state[key] != their_state[key]:
            raise UserError(f"cannot average {where}: their {key} differs; average checkpoints of one fine-tuning run")


def check_distinct(paths: list[Path]) -> None:
    """Refuse a checkpoint given twice (`a.pt ./a.pt`, a link to it, or a copy of the same bytes): its weights
    would count twice, and the result would not be the mean of the checkpoints the message names."""
    files: dict[tuple[int, int], Path] = {}
    sizes: dict[int, list[Path]] = {}
    digests: dict[Path, str] = {}

    def digest(path: Path) -> str:
        if path not in digests:
            digests[path] = _digest(path)
        return digests[path]

    for path in paths:
        try:
            info = path.stat()
        except OSError:
            continue  # read_checkpoint names the missing file
        same = files.get((info.st_dev, info.st_ino))
        if same is None:  # a copy has the same size: only files of equal size are hashed
            same = next((p for p in sizes.get(info.st_size, []) if digest(p) == digest(path)), None)
            how = "identical copies"
        else:
            how = "the same file"
        if same is not None:
            raise UserError(f"{same} and {path} are {how}: each checkpoint may be averaged once; remove one of them")
        files[(info.st_dev, info.st_ino)] = path
        sizes.setdefault(info.st_size, []).append(path)


def _digest(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return f"unreadable {path}"  # read_checkpoint names it
    return digest.hexdigest()


def checkpoints_to_average(checkpoints: list[Path] | None, run: Path | None, last: int | None) -> list[Path]:
    """The files named by `--checkpoints A B ...`, or by `--run DIR --last N`; exactly one of the two."""
    if (checkpoints is None) == (run is None):
        raise UserError("pass either --checkpoints A B ... or --run DIR --last N")
    if run is None:
        if last is not None:
            raise UserError("--last needs --run DIR")
        return checkpoints
    if last is None:
        raise UserError("--run needs --last N: how many of the newest step checkpoints to average")
    return last_step_checkpoints(run, last)


def last_step_checkpoints(run_dir: Path, n: int) -> list[Path]:
    """The `n` newest step_<N>.pt of a run directory, oldest first, by step number."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        raise UserError(f"--run {run_dir}: no checkpoints/ folder; pass a run directory written by tcli train")
    found = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_FILE.fullmatch(p.name)))
    if len(found) < n:
        raise UserError(
            f"--last {n}: {folder} holds only {len(found)} step_<N>.pt checkpoint(s) "
            "(train.keep_last sets how many a run keeps)"
        )
    return [p for _, p in found[-n:]]


def check_not_a_run_checkpoint(out: Path) -> None:
    """A run's own checkpoint files (last.pt, best.pt, averaged.pt, step_<N>.pt in a run's checkpoints/) are no
    --out, --force or not: an average in place of last.pt cannot be resumed, one in place of best.pt is not it."""
    try:
        folder = out.resolve().parent
    except (OSError, RuntimeError):  # a link loop: the write names it
        return
    own = out.name in ("last.pt", "best.pt", "averaged.pt") or _STEP_FILE.fullmatch(out.name)
    if own and folder.name == "checkpoints" and (folder.parent / RUN_MARKER).is_file():
        raise UserError(
            f"--out {out} is the run {folder.parent}'s own {out.name}; write the average beside it "
            f"(e.g. {folder.parent / 'avg.pt'})"
        )


def write_average(paths: list[Path], out: Path, force: bool = False) -> dict[str, Any]:
    """Average `paths` into the checkpoint `out` (atomically; an existing file only with `force`)."""
    check_writable_file(out)
    check_not_a_run_checkpoint(out)
    remove_stale_temporaries(out.parent, out.name, live_writers=True)  # of an interrupted average to `out`
    if out.exists() and not force:
        raise UserError(f"{out} exists; pass --force to overwrite it")
    if any(same_file(out, p) for p in paths):  # hard and symbolic links included
        raise UserError(f"--out {out} is one of the checkpoints being averaged; write the average elsewhere")
    state = average_checkpoints(paths)
    write_atomic(serialize(state), out)
    return state
