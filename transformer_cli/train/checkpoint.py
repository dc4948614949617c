"""Checkpoints: one self-describing file, written atomically, loaded without running code."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

from transformer_cli.errors import UserError


def serialize(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def write_atomic(data: bytes, path: Path) -> None:
    """Temporary file, fsync, rename: a kill at any moment leaves the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | Path, kind: str | None = None) -> dict[str, Any]:
    """Load with weights_only=True (a checkpoint cannot run code); errors are one line.

    `kind` ("translation" or "bert") rejects a checkpoint of another model.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged or foreign file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} is not a readable tcli checkpoint ({first[:200]})") from None
    if not isinstance(state, dict) or "tcli" not in state or "model" not in state:
        raise UserError(f"{path} is not a tcli checkpoint (no tcli metadata); pass a file from <run>/checkpoints/")
    if kind is not None and state["tcli"].get("kind") != kind:
        raise UserError(f"{path} holds a {state['tcli'].get('kind')} model, not a {kind} model")
    return state
