"""Shared fixtures: tiny models, a sentencepiece vocabulary trained once per session, paths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MULTI30K = SHARED / "data" / "multi30k"
WIKITEXT = SHARED / "data" / "wikitext-2"
TOY = ROOT / "data" / "toy"

needs_multi30k = pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"no Multi30k at {MULTI30K} (../shared absent)")
needs_wikitext = pytest.mark.skipif(not WIKITEXT.is_dir(), reason=f"no WikiText-2 at {WIKITEXT} (../shared absent)")


def run_tcli(*args: str, cwd: Path | None = None, input: str | None = None, timeout: float = 300,
             env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m transformer_cli ARGS` in a subprocess (the way a user runs it)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "transformer_cli", *args], cwd=cwd or ROOT, input=input,
                          capture_output=True, text=True, timeout=timeout, env=full_env)


KILLER = """
import os, signal, sys
from transformer_cli.train import checkpoint, loop
KILL_STEP, WHERE = int(sys.argv[1]), sys.argv[2]
original_step, original_replace = loop.Trainer.train_step, os.replace
def train_step(self, *args, **kwargs):
    if WHERE == "step" and self.state.step == KILL_STEP:
        os.kill(os.getpid(), signal.SIGKILL)
    return original_step(self, *args, **kwargs)
def replace(src, dst):
    if WHERE == "save" and str(dst).endswith("last.pt") and f"step_{KILL_STEP}.pt" in os.listdir(os.path.dirname(dst)):
        os.kill(os.getpid(), signal.SIGKILL)  # the temporary file is written, the rename never happens
    return original_replace(src, dst)
loop.Trainer.train_step = train_step
checkpoint.os.replace = replace
from transformer_cli.cli import main
sys.argv = ["tcli", *sys.argv[3:]]
main()
"""


def run_killed(kill_step: int, where: str, *args: str) -> subprocess.CompletedProcess:
    """Run tcli ARGS and SIGKILL it before update `kill_step + 1` (where="step") or inside the rename
    of last.pt once step_<kill_step>.pt is written (where="save")."""
    return subprocess.run([sys.executable, "-c", KILLER, str(kill_step), where, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def toy_vocab():
    """A small joint sentencepiece vocabulary over the bundled toy corpus (trained once)."""
    from transformer_cli.datasets.text import read_lines
    from transformer_cli.vocab import train_vocab

    lines = read_lines(TOY / "train.src") + read_lines(TOY / "train.tgt")
    return train_vocab(lines, size=200)
