"""Shared fixtures: tiny models, a sentencepiece vocabulary trained once per session, paths."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest

# One intra-op thread for the whole suite, this process and the tcli processes it starts (they inherit it), unless
# OMP_NUM_THREADS is set: the tests' models are tiny (d_model 16-32), where a second thread costs more in
# synchronisation than it saves, and on a busy machine a waiting OpenMP thread spins while its peer is descheduled.
# One setting for both also keeps the runs a test compares bitwise on the same thread count (the sums of a matmul
# depend on it). Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MULTI30K = SHARED / "data" / "multi30k"
WIKITEXT = SHARED / "data" / "wikitext-2"
TOY = ROOT / "data" / "toy"

needs_multi30k = pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"no Multi30k at {MULTI30K} (../shared absent)")
needs_wikitext = pytest.mark.skipif(not WIKITEXT.is_dir(), reason=f"no WikiText-2 at {WIKITEXT} (../shared absent)")

# The precision of the trained fixtures' runs: fp32 by default; TCLI_TEST_PRECISION=bf16 (or pytest
# --precision bf16) trains them in bf16, so that the tests of inference, attention, translation and BERT on them
# also run where bf16 is what a machine uses (.ci/run does this once; without native bf16 it is emulated, slowly).
PRECISIONS = ("fp32", "bf16")
TEST_PRECISION = os.environ.get("TCLI_TEST_PRECISION", "fp32")
if TEST_PRECISION not in PRECISIONS:
    raise pytest.UsageError(f"TCLI_TEST_PRECISION={TEST_PRECISION!r}: expected one of {', '.join(PRECISIONS)}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="train the tests' fixture runs in this precision (default: $TCLI_TEST_PRECISION or fp32)",
    )


def pytest_configure(config: pytest.Config) -> None:
    global TEST_PRECISION
    chosen = config.getoption("--precision")
    if chosen is not None:  # before the test modules format their configs with it
        TEST_PRECISION = chosen
        os.environ["TCLI_TEST_PRECISION"] = chosen


def pytest_report_header(config: pytest.Config) -> str:
    return f"tcli fixture runs trained in {TEST_PRECISION}"


# Bitwise equality of two trainings (exact resume, the same batches either way) is promised on CPU; the tests of it
# pin the CPU so that they keep testing that promise where CUDA is visible (scripts/gpu_check.sh).
ON_CPU = ("--device", "cpu")


def one_line_error(outcome: Any, *fragments: str) -> str:
    """The one error line a user is promised for a mistake, checked: exit code 2, the last line of stderr is
    the only one that starts with "error: ", no traceback, and each of `fragments` is in it. Returns the line.

    `outcome`: a CompletedProcess (`run_tcli`, `run_tcli_process`), an (exit code, stderr) pair (Typer's
    CliRunner), or the ExceptionInfo of a `UserError` from `pytest.raises` (a library call, no process), whose
    message must be one line.
    """
    if isinstance(outcome, pytest.ExceptionInfo):
        from transformer_cli.core.errors import UserError

        assert isinstance(outcome.value, UserError), repr(outcome.value)
        line = str(outcome.value)
        assert line and "\n" not in line, line
    else:
        code, err = (outcome.returncode, outcome.stderr) if hasattr(outcome, "returncode") else outcome
        assert code == 2, (code, err)
        assert "Traceback" not in err and "internal error" not in err, err
        lines = [x for x in err.splitlines() if x.strip()]
        assert lines and lines[-1].startswith("error: "), err
        assert [x for x in lines if x.startswith("error:")] == lines[-1:], err
        line = lines[-1]
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


def write_hf_bert(
    folder: Path, vocab: list[str], tokenizer_config: dict, layers: int = 2, cls: str = "BertModel"
) -> Path:
    """A tiny Hugging Face BERT folder as transformers saves one: `vocab.txt` (WordPiece, no tokenizer.json),
    `tokenizer_config.json`, and `cls`'s random weights (seed 0; d 32, 2 heads, FFN 64, 64 positions)."""
    import json

    import torch
    import transformers

    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    getattr(transformers, cls)(config).save_pretrained(folder)
    return folder


def run_tcli(*args: str, cwd: Path | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    """`tcli ARGS` in this process, through the same `main()` a user's command runs: exit code, stdout, stderr.

    For tests of messages, exit codes and files; a subprocess per command would pay the interpreter's and
    torch's start-up each time. Where the process itself is the subject (signals, kills, locks held by
    another process, what gets imported, torchrun, streaming through pipes) use `run_tcli_process`.
    Warnings reach stderr as they would in a fresh interpreter; an exception that escapes `main()` (a bug)
    is exit code 1 with its traceback on stderr, as Python would print it.
    """
    from transformer_cli.cli import main

    stdin = io.TextIOWrapper(io.BytesIO((input or "").encode()), encoding="utf-8")
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    saved = sys.argv, sys.stdin, sys.stdout, sys.stderr, os.getcwd()
    # main() ignores SIGINT/SIGTERM once a command's work is done (for the interpreter's shutdown): in this
    # process that would outlive the command, so the handlers are put back after it.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    with warnings.catch_warnings():
        warnings.resetwarnings()  # Python's defaults, not pytest's capture
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        try:
            os.chdir(cwd or ROOT)
            sys.argv, sys.stdin, sys.stdout, sys.stderr = ["tcli", *args], stdin, stdout, stderr
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=stderr)
        except BaseException:  # noqa: B036 - what the interpreter does with an uncaught exception
            traceback.print_exc(file=stderr)
            code = 1
        finally:
            sys.argv, sys.stdin, sys.stdout, sys.stderr = saved[:4]
            os.chdir(saved[4])
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    out, err = (stream.buffer.getvalue().decode("utf-8", "replace") for stream in (stdout, stderr))
    return subprocess.CompletedProcess(["tcli", *args], code, out, err)


def tcli(*args: str) -> tuple[int, str]:
    """`run_tcli` for a test that looks at the exit code and stderr only."""
    result = run_tcli(*args)
    return result.returncode, result.stderr


def run_tcli_process(
    *args: str, cwd: Path | None = None, input: str | None = None, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m transformer_cli ARGS` in a subprocess (the way a user runs it), for tests whose subject is the
    process: its signals, its exit by a kill, its imports, a lock it holds."""
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


def run_tcli_without_torch(*args: str) -> subprocess.CompletedProcess:
    """`tcli ARGS` in a fresh interpreter that reports on its last stderr line whether torch was imported
    (`torch imported: False`): the start-up cost a command pays is the subject."""
    code = (
        "import sys\nfrom transformer_cli.cli import main\n"
        f"sys.argv = {['tcli', *args]!r}\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
        "print(f\"torch imported: {'torch' in sys.modules}\", file=sys.stderr)\nsys.exit(code)\n"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


KILLER = """
import os, signal, sys
from transformer_cli.train import loop
from transformer_cli.core import metrics_log
from transformer_cli.core import files
MODE, KILL_STEP = sys.argv[1], int(sys.argv[2])
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
original_step, original_replace, original_write = loop.Trainer.train_step, os.replace, loop.write_atomic
original_log, original_evaluate = metrics_log.MetricsLog.log, loop.Trainer._evaluate_here
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
metrics_log.MetricsLog.log = log
files.os.replace = replace  # the rename inside write_atomic
if MODE == "test":
    from transformer_cli.translation import task as translation
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


@contextlib.contextmanager
def fails_if_it_hangs(what: str, seconds: int = 10):
    """A block that must not block (a FIFO opened by mistake would wait forever): SIGALRM after `seconds`
    turns a hang into an AssertionError naming `what`."""

    def hung(*_):
        raise AssertionError(f"{what} blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


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
    from transformer_cli.core.text import read_lines
    from transformer_cli.vocab.spm import train_vocab

    lines = read_lines(TOY / "train.src") + read_lines(TOY / "train.tgt")
    return train_vocab(lines, size=200)
