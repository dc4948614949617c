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

# Bitwise equality of two trainings (exact resume, the same batches either way) is promised on CPU; the tests of it
# pin the CPU so that they keep testing that promise where CUDA is visible (scripts/gpu_check.sh).
ON_CPU = ("--device", "cpu")


def run_tcli(
    *args: str, cwd: Path | None = None, input: str | None = None, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m transformer_cli ARGS` in a subprocess (the way a user runs it)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "transformer_cli", *args],
        cwd=cwd or ROOT,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


KILLER = """
import os, signal, sys
from transformer_cli.train import loop, metrics
from transformer_cli import files
MODE, KILL_STEP = sys.argv[1], int(sys.argv[2])
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
original_step, original_replace, original_write = loop.Trainer.train_step, os.replace, loop.write_atomic
original_log, original_evaluate = metrics.MetricsLog.log, loop.Trainer._evaluate_here
def train_step(self, *args, **kwargs):
    if MODE == "step" and self.state.step == KILL_STEP:
        die()
    return original_step(self, *args, **kwargs)
def replace(src, dst):
    if MODE == "replace" and str(dst).endswith("last.pt") and f"step_{KILL_STEP}.pt" in os.listdir(dst.parent):
        die()  # the temporary file is written, the rename never happens
    return original_replace(src, dst)
def write_atomic(data, path):
    if MODE == "write" and path.name.startswith(f"step_{KILL_STEP}"):
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data[: len(data) // 2])  # half a checkpoint on disk, then the kill
        die()
    return original_write(data, path)
def log(self, event, step, **values):
    if MODE == "metrics" and event == "train" and step == KILL_STEP:
        with open(self.path, "a") as f:
            f.write('{"event": "train", "step": ')  # a line cut short
        die()
    if MODE == "end" and event in ("test", "end"):
        die()
    return original_log(self, event, step, **values)
def evaluate_here(self):
    if MODE == "eval" and self.state.step == KILL_STEP:
        die()
    return original_evaluate(self)
loop.Trainer.train_step, loop.write_atomic, loop.Trainer._evaluate_here = train_step, write_atomic, evaluate_here
metrics.MetricsLog.log = log
files.os.replace = replace  # the rename inside write_atomic
if MODE == "test":
    from transformer_cli.tasks import translation
    translation.TranslationTask.final_report = lambda *a, **k: die()
from transformer_cli.cli import main
sys.argv = ["tcli", *sys.argv[3:]]
main()
"""


def run_killed(kill_step: int, where: str, *args: str) -> subprocess.CompletedProcess:
    """Run tcli ARGS and SIGKILL it at a chosen point (`where`): "step" before update kill_step + 1;
    "replace" inside the rename of last.pt once step_<kill_step>.pt is written; "write" with half of
    step_<kill_step>.pt written to its temporary file; "metrics" halfway through the train event of
    step kill_step; "eval" at the start of the evaluation at step kill_step; "test" at the start of the
    final test evaluation (translation); "end" before the test/end events are logged."""
    return subprocess.run(
        [sys.executable, "-c", KILLER, where, str(kill_step), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def toy_subset(folder: Path, train: int, valid: int, newline: str = "\n") -> Path:
    """The first `train` toy pairs and the first `valid` of val and test, written to `folder` (created),
    each line ended by `newline`."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("val", valid), ("test", valid)):
        for lang in ("src", "tgt"):
            lines = (TOY / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (folder / f"{split}.{lang}").write_bytes("".join(line + newline for line in lines).encode())
    return folder


@pytest.fixture(scope="session")
def toy_vocab():
    """A small joint sentencepiece vocabulary over the bundled toy corpus (trained once)."""
    from transformer_cli.datasets.text import read_lines
    from transformer_cli.vocab import train_vocab

    lines = read_lines(TOY / "train.src") + read_lines(TOY / "train.tgt")
    return train_vocab(lines, size=200)
