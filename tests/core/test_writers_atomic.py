"""Every writer of a user's file is atomic, and the temporaries an interrupted writer left never block the next
run (README, "What tcli guarantees"). Signals need a real process: those cases run `python -m transformer_cli`
in a subprocess; the rest run in this process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_cli.core.files import write_atomic

from ..conftest import ROOT
from ..test_promises import BERT, bert_text, tcli, write_config, write_translation_checkpoint


def finished_pid() -> int:
    """The PID of a process that has ended: what a SIGKILLed writer leaves in its temporaries' names."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("writers")
    bert = {**BERT, "data": {**BERT["data"], "dir": str(bert_text(root / "bert_toy"))}}
    config = write_config(root / "bert.yaml", bert)
    run = root / "run"
    code, err = tcli("pretrain-bert", "--config", config, "--out", run, "--quiet", "--device", "cpu")
    assert code == 0, err
    return {
        "run": run,
        "bert": run / "checkpoints" / "last.pt",
        "tr1": write_translation_checkpoint(root / "a.pt", 1),
        "tr2": write_translation_checkpoint(root / "b.pt", 2),
    }


def test_an_interrupted_atomic_write_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(b"new", target)
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"] and target.read_bytes() == b"old"


# What each writer leaves when SIGKILL stops it, and the run that must neither be blocked nor keep it.
STALE = {
    "export-hf": lambda f, out: (
        out,
        [".model.safetensors.tmp{pid}", ".config.json.tmp{pid}"],
        ["--checkpoint", f["bert"]],
    ),
    "average": lambda f, out: (out.parent, [".avg.pt.tmp{pid}"], ["--checkpoints", f["tr1"], f["tr2"]]),
    "plot": lambda f, out: (out.parent, [".c.png.tmp{pid}"], [f["run"]]),
    "export-ct2": lambda f, out: (
        out,
        [".export.tmp{pid}/model.bin", ".sentencepiece.model.tmp{pid}"],
        ["--checkpoint", f["tr1"]],
    ),
}


@pytest.mark.parametrize("command", list(STALE))
@pytest.mark.parametrize("force", [False, True])
def test_the_next_run_removes_the_temporaries_a_killed_writer_left(files, tmp_path, command, force):
    if command == "plot":
        pytest.importorskip("matplotlib")
    if command == "export-ct2":
        pytest.importorskip("ctranslate2")
    out = tmp_path / {"export-hf": "hf", "export-ct2": "ct2", "average": "avg.pt", "plot": "c.png"}[command]
    folder, stale, args = STALE[command](files, out)
    pid = finished_pid()
    for name in stale:
        path = folder / name.format(pid=pid)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    live = []
    if force or command in ("average", "plot"):  # (an export refuses a folder a live writer is using)
        live = [folder / f".{out.name}.tmp{os.getppid()}"]  # the temporary of a live process: kept
        live[0].write_bytes(b"live")
    code, err = tcli(command, *args, "--out", out, *(["--force"] if force and command != "plot" else []))
    assert code == 0, err
    left = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    assert left == [p.name for p in live], left


def run_with_signal(args: list[str], when: str, sig: int, tmp_path: Path) -> subprocess.CompletedProcess:
    """`tcli ARGS` in a process that sends itself `sig` while it writes a file whose name contains `when`."""
    script = f"""
import os, signal, sys
from transformer_cli.core import files
original = os.fsync
def fsync(fd):
    if {when!r} in os.readlink(f"/proc/self/fd/{{fd}}"):
        os.kill(os.getpid(), {int(sig)})
    return original(fd)
os.fsync = fsync
from transformer_cli.cli import main
sys.argv = ["tcli"] + sys.argv[1:]
main()
"""
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_export_hf_leaves_no_temporary_and_the_next_export_runs(files, tmp_path, sig, code):
    out = tmp_path / "hf"
    done = run_with_signal(
        ["export-hf", "--checkpoint", files["bert"], "--out", out], "model.safetensors", sig, tmp_path
    )
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert tcli("export-hf", "--checkpoint", files["bert"], "--out", out, "--force")[0] == 0


def test_an_export_interrupted_between_its_files_changes_nothing(files, tmp_path):
    """The files of an export appear together: a signal while a later file is written (tokenizer.json, after the
    weights and config.json) leaves the folder as it was, so the next export needs no --force."""
    out = tmp_path / "hf"
    done = run_with_signal(["export-hf", "--checkpoint", files["bert"], "--out", out], "tokenizer.json", 2, tmp_path)
    assert done.returncode == 130, done.stderr
    assert sorted(p.name for p in out.iterdir()) == []
    assert tcli("export-hf", "--checkpoint", files["bert"], "--out", out)[0] == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_average_leaves_no_temporary(files, tmp_path, sig, code):
    out = tmp_path / "avg.pt"
    done = run_with_signal(
        ["average", "--checkpoints", files["tr1"], files["tr2"], "--out", out], "avg.pt", sig, tmp_path
    )
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_after_the_work_is_done_prints_no_traceback(files, tmp_path):
    """A Ctrl-C while the interpreter shuts down (atexit handlers) cannot undo a finished export."""
    out = tmp_path / "hf"
    script = """
import atexit, os, signal, sys
atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))
from transformer_cli.cli import main
sys.argv = ["tcli"] + sys.argv[1:]
main()
"""
    args = ["export-hf", "--checkpoint", str(files["bert"]), "--out", str(out)]
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert json.loads((out / "config.json").read_text())["model_type"] == "bert"


@pytest.mark.slow
def test_sigkill_during_preprocess_prints_no_worker_traceback(tmp_path):
    """The workers of a killed preprocess find their pipe broken: they exit without a word."""
    from ..conftest import toy_subset

    data = toy_subset(tmp_path / "toy", 3000, 8)
    for lang in ("src", "tgt"):  # over IN_PROCESS_BYTES: worker processes are used
        text = (data / f"train.{lang}").read_text()
        (data / f"train.{lang}").write_text(text * 40)
    config = write_config(tmp_path / "c.yaml", {"data": {"dir": str(data)}, "vocab": {"size": 100}})
    child = subprocess.Popen(
        [sys.executable, "-m", "transformer_cli", "preprocess", "--config", str(config), "--out", str(tmp_path / "p")],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((tmp_path / "p").glob("train.*.bin")):
        time.sleep(0.2)
    os.kill(child.pid, signal.SIGKILL)
    _, err = child.communicate(timeout=60)
    time.sleep(2)  # the workers notice the broken pipe
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    shutil.rmtree(tmp_path / "p", ignore_errors=True)


def test_an_atomic_write_never_replaces_a_fifo_device_or_folder(tmp_path):
    """The rename would put a regular file where a FIFO or a device (/dev/null, /dev/full) was: `tcli plot --out
    /dev/full` run as root replaced the device. Refused in one line; a link is replaced as before (the file it
    names keeps its bytes)."""
    from transformer_cli.core.errors import UserError

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    for path, what in ((fifo, "a device, FIFO or socket"), (folder, "a folder")):
        with pytest.raises(UserError, match=f"is {what}, not a file"):
            write_atomic(b"x", path)
    for name, target in (("to_fifo", fifo), ("to_folder", folder), ("to_device", Path("/dev/null"))):
        (tmp_path / name).symlink_to(target)  # `plot --out /dev/stdout` as root replaced the link /dev/stdout
        with pytest.raises(UserError, match="is a link to (a device, FIFO or socket|a folder), not a file"):
            write_atomic(b"x", tmp_path / name)
        assert (tmp_path / name).is_symlink()
    assert fifo.is_fifo() and folder.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "folder", "to_device", "to_fifo", "to_folder"]
    for system in ("/dev/stdout", "/dev/null", "/dev/tcli-new", "/proc/self/fd/1", "/sys/tcli"):
        # /dev/stdout is a link to stdout's file when that is one: the rename would replace the system's link
        with pytest.raises(UserError, match="a folder of the system, not a file to write"):
            write_atomic(b"x", Path(system))
    assert not os.path.exists("/dev/tcli-new")
    target, link = tmp_path / "target", tmp_path / "link"
    target.write_bytes(b"kept")
    link.symlink_to(target)
    write_atomic(b"new", link)
    assert target.read_bytes() == b"kept" and not link.is_symlink() and link.read_bytes() == b"new"


def test_average_refuses_an_output_that_is_a_link_to_an_input(files, tmp_path):
    """A hard or symbolic link to one of the averaged checkpoints is that checkpoint (os.path.samefile)."""
    for make in (os.link, os.symlink):
        out = tmp_path / f"out_{make.__name__}.pt"
        make(files["tr1"], out)
        code, err = tcli("average", "--checkpoints", files["tr1"], files["tr2"], "--out", out, "--force")
        assert code == 2 and "is one of the checkpoints being averaged" in err, err


def test_symbolic_link_loops_are_one_line_errors(files, tmp_path):
    """A loop of links as a checkpoint, an --output, --stats-json or an averaged checkpoint: one line (it was a
    RuntimeError traceback from Path.resolve)."""
    loop, other = tmp_path / "L1", tmp_path / "L2"
    loop.symlink_to(other)
    other.symlink_to(loop)
    source = tmp_path / "in.txt"
    source.write_text("a b c\n")
    cases = [
        (["translate", "--checkpoint", loop, "--input", source], "is a symbolic link to nothing"),
        (["translate", "--checkpoint", files["tr1"], "--input", source, "--output", loop], "loop of symbolic links"),
        (["translate", "--checkpoint", files["tr1"], "--input", source, "--stats-json", loop], "loop of symbolic"),
        (["average", "--checkpoints", loop, files["tr2"], "--out", tmp_path / "avg.pt"], "symbolic link to nothing"),
    ]
    for args, message in cases:
        code, err = tcli(*args)
        assert code == 2 and message in err and err.count("\n") == 1, (args, err)


def test_a_closed_stdout_or_stdin_is_one_line(files, tmp_path):
    """`>&-` / `<&-` leave Python's sys.stdout / sys.stdin None: a write was an AttributeError traceback, or
    (count-params) its table was dropped with exit code 0."""
    source = tmp_path / "in.txt"
    source.write_text("a b c\n")
    for args, fd in (
        (["translate", "--checkpoint", files["tr1"], "--input", source], 1),
        (["count-params", "--checkpoint", files["tr1"]], 1),
        (["translate", "--checkpoint", files["tr1"]], 0),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "transformer_cli", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            preexec_fn=lambda fd=fd: os.close(fd),  # as the shell's >&- or <&- leaves it
        )
        name = "input" if fd == 0 else "output"
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert f"standard {name} is closed" in result.stderr, result.stderr
