"""tcli's processes run under mimalloc where it is installed (transformer_cli/runtime/malloc.py): how the process starts
itself again, and when it does not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from transformer_cli.runtime import cpu, malloc

LIB = "/site-packages/cmeel.prefix/lib/libmimalloc.so"


@pytest.fixture
def installed(monkeypatch):
    monkeypatch.setattr(malloc, "library", lambda: LIB)


def test_the_same_command_again_with_mimalloc_preloaded(installed):
    argv, env = malloc.start_with_mimalloc(
        ["train", "--config", "c.yaml"], {"PATH": "/bin", "LD_PRELOAD": "/opt/libtrace.so"}
    )
    assert argv == [sys.executable, *sys.orig_argv[1:]]
    assert env["LD_PRELOAD"] == f"{LIB}:/opt/libtrace.so"  # first, so that its malloc is the one found
    assert env["MIMALLOC_PURGE_DELAY"] == "-1" and env[malloc.STARTED] == LIB and env["PATH"] == "/bin"


def test_a_users_mimalloc_setting_wins(installed):
    _, env = malloc.start_with_mimalloc(["train"], {"MIMALLOC_PURGE_DELAY": "100"})
    assert env["MIMALLOC_PURGE_DELAY"] == "100"


@pytest.mark.parametrize(
    "environ",
    [
        {"TCLI_MALLOC": "system"},
        {malloc.STARTED: LIB},  # the started process itself: no second start
        {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},  # the user's own allocator
        {"LD_PRELOAD": "libtcmalloc_minimal.so.4"},
    ],
)
def test_no_start_where_the_process_keeps_its_allocator(installed, environ):
    assert malloc.start_with_mimalloc(["train"], environ) is None


AMX = "flags : fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16"
EPYC = "flags : fpu avx2 avx512f avx512_bf16"


@pytest.mark.parametrize("flags", [AMX, EPYC, ""])
@pytest.mark.parametrize("args", [["pretrain-bert", "--config", "train"], ["finetune"], ["glue"], ["--help"], []])
def test_bert_training_runs_under_mimalloc_on_cpus_with_amx_only(installed, monkeypatch, flags, args):
    """BERT pretraining trains faster under mimalloc on a Xeon with AMX, slower on an AVX-512 BF16 EPYC
    (measured: docs/benchmarks/speed.md, "Memory"); translation training is faster under it on both, and what
    does not train keeps the C library's malloc."""
    monkeypatch.setattr(cpu, "flags", lambda: flags)
    started = malloc.start_with_mimalloc(args, {})
    assert (started is not None) == (flags == AMX and args[:1] in (["pretrain-bert"], ["finetune"], ["glue"]))
    assert malloc.start_with_mimalloc(["train"], {}) is not None
    assert malloc.start_with_mimalloc(["translate"], {}) is None


def test_no_start_without_mimalloc(monkeypatch):
    monkeypatch.setattr(malloc, "library", lambda: None)
    assert malloc.start_with_mimalloc(["train"], {}) is None


SCRIPT = """
import os, sys
from transformer_cli.runtime import cpu, malloc
print("before", os.getpid(), flush=True)
malloc.restart_with_mimalloc()
print("after", os.getpid(), malloc.in_use(), sys.argv[1:])
"""


@pytest.mark.skipif(malloc.library() is None, reason="mimalloc (the cmeel-mimalloc wheel) is not installed")
@pytest.mark.parametrize("choice, expected", [("auto", "mimalloc"), ("system", "system")])
def test_a_process_restarts_itself_once_under_mimalloc(choice, expected):
    """The same pid and arguments run again, once, with mimalloc serving malloc; TCLI_MALLOC=system keeps glibc."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", malloc.STARTED)}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, "train", "--y"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "TCLI_MALLOC": choice},
    )
    assert result.returncode == 0, result.stderr
    lines = [line.split(" ", 2) for line in result.stdout.splitlines()]
    befores = [pid for word, pid, *_ in lines if word == "before"]
    (after,) = [rest for word, *rest in lines if word == "after"]
    assert len(befores) == (2 if choice == "auto" else 1) and set(befores) == {after[0]}
    assert after[1] == f"{expected} ['train', '--y']"


def test_an_unknown_choice_is_a_one_line_error():
    """Checked before the command line is read (`--help` would exit 0), so a regression writes no run."""
    result = subprocess.run(
        [sys.executable, "-m", "transformer_cli", "train", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TCLI_MALLOC": "jemalloc"},
    )
    assert result.returncode == 2
    assert result.stderr == "error: TCLI_MALLOC='jemalloc': expected auto (the default) or system\n"
