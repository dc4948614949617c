"""tcli translate streams: the line reader equals decode_utf8, chunked output equals one-chunk output, output
comes before the input ends, memory does not grow with the input, and errors still name the right line."""

from __future__ import annotations

import contextlib
import io
import os
import random
import select
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from transformer_cli.core.errors import UserError
from transformer_cli.core.text import LineReader, decode_utf8
from transformer_cli.translation import translate
from transformer_cli.translation.decode import DecodeOptions

from ..conftest import ROOT, TOY, run_tcli
from ..export.test_average import write_checkpoint

TRICKY = [
    b"",
    b"\xef\xbb\xbf",
    b"\xef\xbb\xbf\n",
    b"\n",
    b"\n\n",
    b"a",
    b"a\n",
    b"a\r\n",
    b"a\r\nb",
    b"a\r\n\r\n\r\nb",
    b"a\rb\rc",
    b"a\rb\rc\r",
    b"\r",
    b"a\rb\nc\n",
    b"a\n\r",
    "h\u00e9\nw\u00f6\r\n\u4e2d\u6587\n".encode(),
    b"x\n\xc3(\n",
    b"ok\nok\n\xff",
    b"a\nb\n\xe4\xb8",
    b"\xe4\xb8\nz",
    b"\xef\xbb\xbf\xef\xbb\xbfx\n",
]


def reader_lines(data: bytes, block_size: int) -> list[str] | str:
    try:
        return list(LineReader(io.BytesIO(data), "f", block_size=block_size))
    except UserError as e:
        return str(e)


def whole_lines(data: bytes) -> list[str] | str:
    try:
        return decode_utf8(data, "f")
    except UserError as e:
        return str(e)


def test_line_reader_gives_what_decode_utf8_gives_for_the_whole_input():
    rng = random.Random(0)
    # endings, multi-byte, BOM, invalid UTF-8, NUL (valid UTF-8, but no text)
    pieces = [b"a", b"\n", b"\r", b"\xc3\xa9", b"\xef\xbb\xbf", b" ", b"\xff", b"\0"]
    generated = [b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 14))) for _ in range(500)]
    assert any(b"\0" in data and b"\xff" in data for data in generated)
    for data in TRICKY + generated:
        if (b"\xff" in data or b"\0" in data) and b"\r" in data and b"\n" not in data:
            continue  # an old-Mac file with invalid UTF-8: see the next test
        for block_size in (1, 2, 3, 64):
            assert reader_lines(data, block_size) == whole_lines(data), (data, block_size)


def test_old_mac_line_endings_and_their_errors():
    assert reader_lines(b"one\rtwo\r\rfour", 2) == ["one", "two", "", "four"]
    # decode_utf8 counts \n and calls this line 1; the reader counts the lines it splits
    assert reader_lines(b"one\rtwo\rthr\xffee\r", 3).startswith("f line 3: invalid UTF-8 (byte 0xff)")
    # decided from the first decide_bytes: \r alone there, so \r ends lines even if a \n comes later
    mixed = b"a\rb\r" + b"c\n"
    assert list(LineReader(io.BytesIO(mixed), "f", block_size=2, decide_bytes=4)) == ["a", "b", "c\n"]


# ----------------------------------------------------------------------------- with a model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, toy_vocab) -> Path:
    """A randomly initialised tiny model (d_model 16, positions 64): decoding is what is under test."""
    return write_checkpoint(tmp_path_factory.mktemp("stream") / "model.pt", toy_vocab, seed=5, step=1)


@pytest.fixture(autouse=True)
def one_thread():
    """A model this small decodes faster on one thread of a busy machine (and the subprocess uses one too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def toy_lines(n: int, start: int = 0) -> list[str]:
    source = (TOY / "test.src").read_text(encoding="utf-8").splitlines()
    return [source[(start + i) % len(source)] for i in range(n)]


def run(
    checkpoint: Path,
    input_path: Path,
    tmp_path: Path,
    first: int,
    most: int,
    monkeypatch,
    inspect: translate.InspectOptions | None = None,
    **options,
) -> tuple[bytes, str]:
    """run_translate in this process with chunks of `first`, ... `most` lines: (output bytes, stderr)."""
    monkeypatch.setattr(translate, "FIRST_CHUNK_LINES", first)
    monkeypatch.setattr(translate, "MAX_CHUNK_LINES", most)
    output = tmp_path / f"out_{first}_{most}.txt"
    stderr = io.StringIO()
    opts = DecodeOptions(**{"beam": 3, "max_len_a": 0.5, "max_len_b": 3, "max_tokens": 300, **options})
    with contextlib.redirect_stderr(stderr):
        translate.run_translate(
            checkpoint, input_path, output, opts, device="cpu", precision="fp32", quiet=True, inspect=inspect
        )
    return output.read_bytes(), stderr.getvalue()


@pytest.mark.parametrize("nbest, alignments", [(1, False), (2, True)])
def test_chunked_output_equals_one_chunk(checkpoint, tmp_path, monkeypatch, nbest, alignments):
    lines = toy_lines(60)
    for i in (0, 7, 8, 31, 59):
        lines[i] = ""
    lines[45] = " ".join(toy_lines(8))  # more pieces than the 64 positions: a warning naming line 46
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    inspect = translate.InspectOptions(print_alignment=alignments)
    # One sentence per batch in both runs: chunking is what is compared, byte for byte. Batches of other
    # sizes give the same hypotheses with scores equal to fp32 rounding (test_transformer's batch tests),
    # which can flip the printed fourth decimal, so whole-file and chunked batching are not compared here.
    one = {"nbest": nbest, "max_tokens": 1}
    whole = run(checkpoint, path, tmp_path, 10**6, 10**6, monkeypatch, inspect, **one)
    chunked = run(checkpoint, path, tmp_path, 3, 8, monkeypatch, inspect, **one)
    assert chunked == whole
    out, err = whole
    rows = out.decode().split("\n")[:-1]
    assert len(rows) == (55 * nbest + 5) * (2 if alignments else 1)  # an empty line: one empty hypothesis
    assert err.startswith("warning: line 46: ") and err.count("warning") == 1
    # an old Mac file (\r alone) translates as the same lines
    path.write_bytes("\r".join(lines).encode() + b"\r")
    assert run(checkpoint, path, tmp_path, 3, 8, monkeypatch, inspect, **one) == whole


def read_line(stream, timeout: float) -> bytes:
    """One line from a pipe, failing instead of hanging when none comes within `timeout` seconds."""
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no output line within {timeout}s; got {data!r}"
        byte = os.read(stream.fileno(), 1)
        assert byte, f"output ended early; got {data!r}"
        data += byte
    return data


def test_output_comes_before_the_input_ends(checkpoint, tmp_path, monkeypatch):
    lines = toy_lines(40)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "transformer_cli",
            "translate",
            "--checkpoint",
            str(checkpoint),
            "--beam",
            "3",
            "--max-len-a",
            "0.5",
            "--max-len-b",
            "3",
            "--device",
            "cpu",
            "--precision",
            "fp32",
            "--quiet",
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        proc.stdin.write("".join(line + "\n" for line in lines[:3]).encode())
        proc.stdin.flush()
        first = read_line(proc.stdout, timeout=120)  # stdin still open: the 3 lines come out without more
        proc.stdin.write("".join(line + "\n" for line in lines[3:]).encode())
        proc.stdin.close()
        rest, err = proc.stdout.read(), proc.stderr.read()
        assert proc.wait(timeout=120) == 0, err.decode()
    finally:
        proc.kill()
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert first + rest == run(checkpoint, path, tmp_path, 10**6, 10**6, monkeypatch)[0]


class EchoTranslator:
    """Stands in for the model (the memory under test is the streaming's): each line translates to itself
    reversed. Records the size of every chunk it is given."""

    def __init__(self):
        self.runtime = translate.Runtime.create("cpu", "fp32")
        self.decoded_tokens, self.token_ids, self.chunks = 0, {}, []

    def translate(self, lines, opts, warn=None, first_line=0):
        self.chunks.append(len(lines))
        return [[(line[::-1], 0.0)] for line in lines]


def test_chunks_ramp_up_on_stdout_and_are_full_from_the_first_into_a_file(tmp_path, monkeypatch, capsys):
    """To stdout someone may read the first lines as they come: 16, 32, ... lines; into --output, full chunks
    from the start (fewer, fuller batches: a 1,000-line file in one chunk)."""
    monkeypatch.setattr(translate, "FIRST_CHUNK_LINES", 16)
    monkeypatch.setattr(translate, "MAX_CHUNK_LINES", 64)
    echo = EchoTranslator()
    monkeypatch.setattr(translate.Translator, "from_checkpoint", lambda *args: echo)
    path = tmp_path / "in.txt"
    path.write_text("\n".join(toy_lines(200)) + "\n", encoding="utf-8")
    translate.run_translate(Path("unused.pt"), path, None, DecodeOptions(), quiet=True)
    assert echo.chunks == [16, 32, 64, 64, 24] and len(capsys.readouterr().out.splitlines()) == 200
    echo.chunks = []
    translate.run_translate(Path("unused.pt"), path, tmp_path / "out.txt", DecodeOptions(), quiet=True)
    assert echo.chunks == [64, 64, 64, 8]
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == [line[::-1] for line in toy_lines(200)]


def test_memory_does_not_grow_with_the_input(tmp_path, monkeypatch):
    monkeypatch.setattr(translate, "FIRST_CHUNK_LINES", 16)
    monkeypatch.setattr(translate, "MAX_CHUNK_LINES", 256)
    peaks, echo = {}, EchoTranslator()
    monkeypatch.setattr(translate.Translator, "from_checkpoint", lambda *args: echo)
    for n in (5000, 50000):
        lines = toy_lines(n)
        path, output = tmp_path / f"in_{n}.txt", tmp_path / f"out_{n}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        del lines
        echo.chunks = []
        tracemalloc.start()
        translate.run_translate(Path("unused.pt"), path, output, DecodeOptions(), quiet=True)
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert max(echo.chunks) == 256 and sum(echo.chunks) == n
        assert output.read_text(encoding="utf-8").splitlines() == [line[::-1] for line in toy_lines(n)]
    # Holding every line would cost about 4 MB more at 50000 lines; a chunk and a 64 KiB block of lines do not
    # grow (measured: 554 and 558 kB).
    assert peaks[50000] < 1.2 * peaks[5000], peaks


def test_errors_name_the_line_and_come_in_one_line(checkpoint, tmp_path, monkeypatch):
    reader = LineReader(io.BytesIO(b"one\ntwo\nth\xffree\nfour\n"), "f")
    assert [next(reader), next(reader)] == ["one", "two"]  # the lines before an invalid one, then its error
    with pytest.raises(UserError, match="^f line 3: invalid UTF-8"):
        next(reader)
    path = tmp_path / "in.txt"
    path.write_bytes("".join(line + "\n" for line in toy_lines(40)).encode() + b"caf\xc3(\n" + b"A dog.\n")
    with pytest.raises(UserError, match=rf"^{path} line 41: invalid UTF-8 \(byte 0xc3\); save the file as UTF-8$"):
        run(checkpoint, path, tmp_path, 4, 8, monkeypatch)
    assert len((tmp_path / "out_4_8.txt").read_text().splitlines()) == 40  # the lines before it are written

    reference = tmp_path / "ref.txt"
    reference.write_text("one\ntwo\n")
    args = ["translate", "--checkpoint", str(checkpoint), "--reference", str(reference), "--beam", "2"]
    result = run_tcli(*args, input="A dog.\nA cat.\nTwo cats.\n")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"error: --reference {reference} has 2 lines but the input has 3"]
    assert len(result.stdout.splitlines()) == 3


def test_an_output_that_is_the_file_stdout_writes_to_is_refused(tmp_path, monkeypatch):
    """`translate --stats-json /dev/stdout > out.txt` reopened out.txt with truncation and lost the translations.
    Where the results go to stdout, another output naming stdout's file (by any name) is refused before any work;
    a terminal or pipe behind stdout, or the results going to a file, is fine."""
    from transformer_cli.core.errors import UserError
    from transformer_cli.core.streams import check_outputs

    out = tmp_path / "out.txt"
    with open(out, "w") as redirected:
        monkeypatch.setattr(sys, "stdout", redirected)
        for name in (out, Path(f"/proc/self/fd/{redirected.fileno()}")):  # (/dev/stdout: fd 1, pytest's here)
            with pytest.raises(UserError, match="--stats-json .* is the file standard output writes to"):
                check_outputs([("--output", None), ("--stats-json", name)], [])
        check_outputs([("--output", tmp_path / "t.txt"), ("--stats-json", out)], [])
        check_outputs([("--output", None), ("--stats-json", tmp_path / "stats.json")], [])
    read, write = os.pipe()
    with os.fdopen(write, "w") as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        check_outputs([("--output", None), ("--stats-json", Path(f"/proc/self/fd/{write}"))], [])
    os.close(read)


def test_an_output_that_is_the_file_stdin_reads_is_refused(tmp_path, monkeypatch):
    """`predict -o in.txt < in.txt` emptied in.txt after reading its first chunk (4,096 lines), then predicted
    what was left of it: the rest of the input was lost. With the input on stdin, an output naming stdin's file
    (by any name) is refused before any work; with --input FILE, stdin is not read and may be anything."""
    from transformer_cli.core.errors import UserError
    from transformer_cli.core.streams import check_outputs

    source = tmp_path / "in.txt"
    source.write_text("a b\n")
    with open(source) as redirected:
        monkeypatch.setattr(sys, "stdin", redirected)
        for name in (source, Path(f"/proc/self/fd/{redirected.fileno()}")):
            for given in (None, Path("-")):
                with pytest.raises(UserError, match="--output .* is the file standard input reads from"):
                    check_outputs([("--output", name)], [("--checkpoint", tmp_path / "m.pt"), ("--input", given)])
            with pytest.raises(UserError, match="--stats-json .* is the file standard input reads from"):
                check_outputs([("--output", None), ("--stats-json", name)], [("--input", None)])
        check_outputs([("--output", source)], [("--input", tmp_path / "other.txt")])
        check_outputs([("--output", tmp_path / "out.txt")], [("--input", None)])


def test_a_line_without_end_from_a_device_or_pipe_is_bounded(tmp_path, monkeypatch):
    """`predict --input /dev/zero` filled the memory until the kernel killed it: a stream that is no regular file
    gets MAX_STREAM_LINE_BYTES per line; a regular file's long line is read whole (the file bounds it)."""
    from transformer_cli.core import text
    from transformer_cli.core.errors import UserError

    if Path("/dev/zero").exists():
        with pytest.raises(UserError, match=r"/dev/zero: line 1 has over 64 MiB and no line end"):
            with text.open_lines("/dev/zero") as reader:
                next(iter(reader))
    monkeypatch.setattr(text, "MAX_STREAM_LINE_BYTES", 1000)
    read, write = os.pipe()
    with os.fdopen(write, "wb") as w:
        w.write(b"ok\n" + b"x" * 5000)
    with pytest.raises(UserError, match="line 2 has over 0 MiB"):
        with text.LineReader(os.fdopen(read, "rb", buffering=0), "<pipe>", block_size=256) as reader:
            assert next(iter(reader)) == "ok"
            next(iter(reader))
    long = tmp_path / "long.txt"
    long.write_bytes(b"ok\n" + b"x" * 5000)
    with text.open_lines(long, block_size=256) as reader:
        assert [len(line) for line in reader] == [2, 5000]
