"""Preprocessed data: the on-disk format (readable with numpy), streaming reads, worker processes, reuse on
resume, data.preprocessed and vocab.model, and every way such a folder can be wrong."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from transformer_cli.core import text as text_mod
from transformer_cli.core.errors import UserError
from transformer_cli.core.text import read_lines, stream_lines
from transformer_cli.data import shards

from ..conftest import ON_CPU, ROOT, TOY, one_line_error, run_tcli, toy_subset
from ..translation.test_train_translate import events, tiny_config

BERT_TOY = TOY.parent / "bert_toy"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return toy_subset(tmp_path_factory.mktemp("toy_shards"), train=300, valid=20)


@pytest.fixture(scope="module")
def preprocessed(tmp_path_factory, data) -> Path:
    """`tcli preprocess` of the tiny config, once for the module (tests copy it before damaging it)."""
    tmp = tmp_path_factory.mktemp("pre")
    out = tmp / "pre"
    result = run_tcli("preprocess", "--config", str(tiny_config(tmp, data)), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def read_split(folder: Path, name: str, dtype: str) -> list[list[int]]:
    """The format as the README describes it, read with numpy alone."""
    tokens = np.fromfile(folder / f"{name}.bin", dtype=dtype)
    offsets = np.fromfile(folder / f"{name}.idx", dtype="<i8")
    return [tokens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


def copy_folder(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for path in src.rglob("*"):
        if path.is_file():
            (dst / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (dst / path.relative_to(src)).write_bytes(path.read_bytes())
    return dst


def test_format_is_readable_with_numpy_and_equals_sentencepiece(preprocessed, data):
    from transformer_cli.vocab.spm import Vocab

    manifest = json.loads((preprocessed / "manifest.json").read_text())
    assert manifest["format"] == shards.FORMAT and manifest["dtype"] == "<u2"
    vocab = Vocab.load(preprocessed / "vocab" / "joint.model")
    max_len = manifest["settings"]["max_len"]
    for split in ("train", "val", "test"):
        src, tgt = (vocab.encode(read_lines(data / f"{split}.{lang}")) for lang in ("src", "tgt"))
        kept = [i for i in range(len(src)) if split != "train" or max(len(src[i]), len(tgt[i])) <= max_len]
        assert read_split(preprocessed, f"{split}.src", manifest["dtype"]) == [src[i] for i in kept]
        assert read_split(preprocessed, f"{split}.tgt", manifest["dtype"]) == [tgt[i] for i in kept]
        assert manifest["splits"][split]["counts"] == {"lines": len(src), "pairs": len(kept)}
        assert manifest["splits"][split]["dropped"]["too_long"] == len(src) - len(kept)
    assert read_lines(preprocessed / "val.ref") == read_lines(data / "val.tgt")
    assert manifest["sources"]["train.src"] == shards.describe_file(data / "train.src")
    # the fingerprint a checkpoint keeps, found in the same read as the lines' index, is that of the files
    assert manifest["data_fingerprint"] == text_mod.fingerprint([data / "train.src", data / "train.tgt"])


def test_dropped_pairs_are_counted_by_reason(tmp_path, preprocessed):
    from transformer_cli.vocab.spm import Vocab

    model = preprocessed / "vocab" / "joint.model"
    vocab = Vocab.load(model)
    folder = toy_subset(tmp_path / "d", train=300, valid=20)
    src, tgt = read_lines(folder / "train.src"), read_lines(folder / "train.tgt")
    short = [
        i for i in range(len(src)) if max(len(vocab.encode([src[i], tgt[i]])[0]), len(vocab.encode([tgt[i]])[0])) <= 60
    ]
    before = json.loads((preprocessed / "manifest.json").read_text())["splits"]["train"]["dropped"]["too_long"]
    src[short[0]], src[short[1]] = "", "word " * 200
    (folder / "train.src").write_text("".join(line + "\n" for line in src))
    out = tmp_path / "pre"
    result = run_tcli(
        "preprocess", "--config", str(tiny_config(tmp_path, folder)), "--out", str(out), "--set", f"vocab.model={model}"
    )
    assert result.returncode == 0, result.stderr
    split = json.loads((out / "manifest.json").read_text())["splits"]["train"]
    assert split["dropped"] == {"empty_side": 1, "too_long": before + 1}
    assert split["counts"] == {"lines": 300, "pairs": 300 - 2 - before}


def test_worker_processes_write_the_same_arrays(tmp_path, data, toy_vocab, monkeypatch):
    from transformer_cli.data.translation import SplitFiles, preprocess_parallel

    monkeypatch.setattr(shards, "BLOCK_LINES", 64)  # several blocks in flight, out-of-order completion possible
    splits = [
        SplitFiles("train", data / "train.src", data / "train.tgt", 12, False),
        SplitFiles("val", data / "val.src", data / "val.tgt", None, True),
    ]
    folders = []
    for workers in (0, 2):
        folder = tmp_path / f"w{workers}"
        folder.mkdir()
        stats = preprocess_parallel(folder, splits, (toy_vocab, toy_vocab), quiet=True, workers=workers)
        folders.append((folder, stats))
    (a, stats_a), (b, stats_b) = folders
    assert stats_a == stats_b and stats_a["train"]["dropped"]["too_long"] > 0
    for name in ("train.src.bin", "train.src.idx", "train.tgt.bin", "train.tgt.idx", "val.ref", "val.tgt.bin"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_stream_lines_equals_read_lines_across_block_boundaries(tmp_path, newline):
    rng = random.Random(0)
    lines = ["".join(rng.choice("abcäöü€ 𝄞") for _ in range(rng.randint(0, 30))) for _ in range(200)]
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(line + newline for line in lines).encode())
    for block in (1, 7, 64, 1 << 20):
        got = [line for chunk in stream_lines(path, block_bytes=block) for line in chunk]
        assert got == read_lines(path) == [line.strip("\r") for line in lines], block


CASES = [
    b"",
    b"\n",
    b"\n\n",
    b"a",
    b"a\n",
    b"a\nb",
    b"\xef\xbb\xbf",
    b"\xef\xbb\xbf\n",
    b"\xef\xbb\xbfa\r\nb\r\n",
    b"a\rb\rc",
    b"a\rb\r",
    b"\r\r\n",
    "x€\n𝄞\n\nä".encode(),
    b"a\r\nb\nc\r\n\r\n",
]


@pytest.mark.parametrize("data", CASES)
def test_blocks_read_anywhere_give_the_lines_of_stream_lines(tmp_path, data):
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    want = [line for chunk in stream_lines(path) for line in chunk]
    for block, chunk_bytes in ((1, 1 << 22), (2, 1), (3, 2), (100, 3)):
        index = text_mod.index_lines(path, block, chunk_bytes=chunk_bytes)
        assert index.lines == len(want) and index.size == len(data)
        assert index.sha256 == hashlib.sha256(data).hexdigest()
        got = [line for b in index.blocks() for line in text_mod.read_block(b)]
        assert got == want, (block, chunk_bytes)


def test_blocks_of_a_long_file_across_chunks(tmp_path):
    rng = random.Random(1)
    lines = ["".join(rng.choice("ab €\r") for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    path = tmp_path / "t.txt"
    path.write_text("\n".join(lines), encoding="utf-8", newline="")
    want = read_lines(path)
    index = text_mod.index_lines(path, 128, chunk_bytes=1000)
    assert len(index.starts) == -(-len(want) // 128) + 1
    assert [line for b in index.blocks() for line in text_mod.read_block(b)] == want
    path.write_text("\n".join(lines[:-1]), encoding="utf-8", newline="")  # changed after indexing
    with pytest.raises(UserError, match="changed while it was being read"):
        [text_mod.read_block(b) for b in index.blocks()]


def test_index_lines_names_the_line_of_invalid_utf8(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"ok\n" * 1000 + b"bad \xff\n" + b"ok\n")
    for chunk_bytes in (7, 100, 1 << 22):
        with pytest.raises(UserError, match=r"t\.txt line 1001: invalid UTF-8"):
            text_mod.index_lines(path, 10, chunk_bytes=chunk_bytes)


@pytest.mark.parametrize("bad, message", [(b"\0", "a NUL byte"), (b"\xff", "invalid UTF-8")])
def test_a_nul_byte_is_no_text_wherever_a_file_is_read(tmp_path, bad, message):
    """/dev/zero saved to a file, or a NUL inside a line, was tokenised as text (and translated, exit 0): every
    reader names the first line that is no text, the earliest of a NUL and invalid UTF-8."""
    from transformer_cli.core.text import LineReader, decode_utf8

    path = tmp_path / "t.txt"
    data = b"ok\n" * 1000 + b"two " + bad + b"\n" + b"bad \xff \0\n"
    path.write_bytes(data)
    expected = rf"t\.txt line 1001: {message}"
    for chunk_bytes in (7, 100, 1 << 22):
        with pytest.raises(UserError, match=expected):
            text_mod.index_lines(path, 10, chunk_bytes=chunk_bytes)
    with pytest.raises(UserError, match=expected):
        for _ in stream_lines(path, block_bytes=100):
            pass
    with pytest.raises(UserError, match=expected):
        decode_utf8(data, str(path))
    with pytest.raises(UserError, match=expected):
        list(LineReader(open(path, "rb"), str(path), block_size=64))


def test_stream_lines_names_the_line_of_invalid_utf8_in_a_later_block(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"ok\n" * 1000 + b"bad \xff\n" + b"ok\n")
    with pytest.raises(UserError, match=r"t\.txt line 1001: invalid UTF-8"):
        for _ in stream_lines(path, block_bytes=100):
            pass


def test_reservoir_is_bounded_seeded_and_keeps_small_inputs_whole():
    lines = [f"line {i}" for i in range(10_000)] + ["", "  "]
    sample = shards.reservoir(iter(lines), 500, seed=3)
    assert len(sample) == 500 and len(set(sample)) == 500 and set(sample) <= set(lines)
    assert sample == shards.reservoir(iter(lines), 500, seed=3) != shards.reservoir(iter(lines), 500, seed=4)
    assert shards.reservoir(iter(lines[:100] + [""]), 500, seed=3) == lines[:100]
    low = sum(int(s.split()[1]) < 5000 for s in sample)
    assert 180 < low < 320  # uniform over the stream, not its head


def test_reservoir_holds_at_most_max_chars_and_stays_uniform():
    lines = [f"{i:05d}" + "x" * (i % 7) for i in range(20_000)]  # 5 to 11 characters
    sample = shards.reservoir(iter(lines), 10_000, seed=1, max_chars=20_000)
    assert sum(map(len, sample)) <= 20_000 and len(sample) > 1_500 and len(set(sample)) == len(sample)
    assert sample == shards.reservoir(iter(lines), 10_000, seed=1, max_chars=20_000)
    low = sum(int(s[:5]) < 10_000 for s in sample)
    assert abs(low / len(sample) - 0.5) < 0.06  # the first half of the stream is not favoured
    assert shards.reservoir(iter(lines[:100]), 10_000, seed=1, max_chars=20_000) == lines[:100]


def test_run_without_preprocess_equals_run_with_it(tmp_path, data, preprocessed):
    """One command (the run preprocesses into its own data/) and two (tcli preprocess, data.preprocessed) train
    the same model on the same batches."""
    config = tiny_config(tmp_path, data, steps=6)
    one, two = tmp_path / "one", tmp_path / "two"
    assert run_tcli("train", "--config", str(config), "--out", str(one), "--quiet", *ON_CPU).returncode == 0
    result = run_tcli(
        "train",
        "--config",
        str(config),
        "--out",
        str(two),
        "--quiet",
        *ON_CPU,
        "--set",
        f"data.preprocessed={preprocessed}",
    )
    assert result.returncode == 0, result.stderr
    losses = [[e["loss"] for e in events(run) if e["event"] == "train"] for run in (one, two)]
    assert losses[0] == losses[1] and len(losses[0]) >= 3
    assert (one / "vocab" / "joint.model").read_bytes() == (two / "vocab" / "joint.model").read_bytes()
    assert not (two / "data").exists()  # the given folder is used, nothing is tokenised again


def test_resume_tokenises_nothing_and_changed_text_is_preprocessed_again(tmp_path, data):
    config = tiny_config(tmp_path, data, steps=4)
    run = tmp_path / "run"
    assert run_tcli("train", "--config", str(config), "--out", str(run)).returncode == 0
    stamp = {p.name: p.stat().st_mtime_ns for p in (run / "data").iterdir()}
    again = run_tcli(
        "train", "--config", str(config), "--out", str(run), "--resume", "auto", "--set", "train.max_steps=6"
    )
    assert again.returncode == 0, again.stderr
    assert "tokenising" not in again.stderr and "up to date" in again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (run / "data").iterdir()} == stamp
    # A run killed before its first checkpoint, started again on other text, rebuilds its data/ (the manifest's
    # hashes differ).
    fresh = tmp_path / "fresh"
    (fresh / "data").mkdir(parents=True)
    marker = {**json.loads((run / "run.json").read_text()), "status": "running", "checkpointed": False}
    (fresh / "run.json").write_text(json.dumps(marker))  # as a run killed before its first save left it
    for path in (run / "data").iterdir():
        if path.is_file():
            (fresh / "data" / path.name).write_bytes(path.read_bytes())
    other = toy_subset(tmp_path / "other", train=200, valid=20)
    result = run_tcli(
        "train", "--config", str(tiny_config(tmp_path, other, steps=2)), "--out", str(fresh), "--resume", "auto"
    )
    assert result.returncode == 0 and "tokenising" in result.stderr, result.stderr
    manifest = json.loads((fresh / "data" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["counts"]["pairs"] == 200


def test_a_hand_edited_manifest_is_refused_naming_what_is_wrong(tmp_path, preprocessed):
    """A manifest whose keys are not of their types (a KeyError in training), or whose counts are negative (-3
    documents in the training log), is damaged; a split the config needs and the manifest lacks is named."""
    import json
    import shutil

    from transformer_cli.core.errors import UserError
    from transformer_cli.data.shards import read_manifest

    original = json.loads((preprocessed / "manifest.json").read_text())
    first = next(iter(original["splits"]))
    for edit, fragment in (
        (lambda m: m["splits"][first]["counts"].update(pairs=-3), f"split '{first}': its files, counts"),
        (lambda m: m["splits"][first].pop("files"), f"split '{first}'"),
        (lambda m: m["splits"][first].pop("tokens"), f"split '{first}': its files, counts, tokens"),
        (lambda m: m["splits"][first].update(dropped=[0]), f"split '{first}': its files, counts, tokens and dropped"),
        # positive but wrong: the training log would report them
        (
            lambda m: m["splits"][first]["counts"].update(pairs=m["splits"][first]["counts"]["pairs"] + 1),
            f"split '{first}': it says",
        ),
        (
            lambda m: m["splits"][first]["counts"].pop("pairs"),
            f"split '{first}': it says no pairs .src side., the files hold",
        ),
        (
            lambda m: m["splits"][first]["tokens"].update(tgt=7),
            f"split '{first}': it says 7 tgt tokens, the files hold",
        ),
        (lambda m: m["splits"][first]["counts"].update(lines=1), f"split '{first}': its 1 lines are not its"),
        (lambda m: m.update(splits=[]), "no splits"),
        (lambda m: m.update(vocab_files="joint"), "vocab_files"),
        (lambda m: m.update(vocab_sha256={}), "vocab_sha256"),
        (lambda m: m.update(dtype="<f4"), "dtype '<f4'"),
    ):
        folder = copy_folder(preprocessed, tmp_path / "edited")
        manifest = json.loads(json.dumps(original))
        edit(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(UserError, match=f"manifest.json is damaged .{fragment}"):
            read_manifest(folder, "translation")
        shutil.rmtree(folder)
    with pytest.raises(UserError, match="has no split 'nope'"):
        read_manifest(preprocessed, "translation").split("nope")
    # a reference file of the same size with one line more (BLEU would pair hypotheses with the wrong lines)
    split = next(name for name, s in original["splits"].items() if f"{name}.ref" in s["files"])
    folder = copy_folder(preprocessed, tmp_path / "edited")
    ref = folder / f"{split}.ref"
    ref.write_bytes(ref.read_bytes().replace(b" ", b"\n", 1))
    with pytest.raises(UserError, match=f"split '{split}': it says {original['splits'][split]['counts']['pairs']} ref"):
        read_manifest(folder, "translation")


def test_damaged_preprocessed_folders_are_one_line_errors(tmp_path, data, preprocessed):
    config = str(tiny_config(tmp_path, data, steps=2))

    def train(folder: Path, *more: str):
        return run_tcli(
            "train",
            "--config",
            config,
            "--out",
            str(tmp_path / f"r{len(list(tmp_path.iterdir()))}"),
            "--set",
            f"data.preprocessed={folder}",
            *more,
        )

    one_line_error(train(tmp_path / "nowhere"), "is not a folder", "tcli preprocess")
    interrupted = copy_folder(preprocessed, tmp_path / "interrupted")
    (interrupted / "manifest.json").unlink()
    one_line_error(train(interrupted), "no manifest.json", "did not finish")
    truncated = copy_folder(preprocessed, tmp_path / "truncated")
    with open(truncated / "train.tgt.bin", "r+b") as f:
        f.truncate((truncated / "train.tgt.bin").stat().st_size - 2)
    one_line_error(train(truncated), "train.tgt.bin has", "truncated")
    missing = copy_folder(preprocessed, tmp_path / "missing")
    (missing / "val.src.idx").unlink()
    one_line_error(train(missing), "val.src.idx is missing")
    revocab = copy_folder(preprocessed, tmp_path / "revocab")
    (revocab / "vocab" / "joint.model").write_bytes(b"junk")
    one_line_error(train(revocab), "joint.model is missing or differs")
    damaged = copy_folder(preprocessed, tmp_path / "damaged")
    (damaged / "manifest.json").write_text("{not json")
    one_line_error(train(damaged), "manifest.json is damaged")
    lacking = copy_folder(preprocessed, tmp_path / "lacking")  # a KeyError once the run folder had been written
    manifest = json.loads((lacking / "manifest.json").read_text())
    del manifest["splits"]["val"]
    (lacking / "manifest.json").write_text(json.dumps(manifest))
    runs = set(tmp_path.iterdir())
    one_line_error(train(lacking), "has no split 'val'")
    assert set(tmp_path.iterdir()) == runs  # no run folder
    one_line_error(train(preprocessed, "--set", "data.max_len=10"), "data.max_len is 10", "preprocessed with 60")
    one_line_error(train(preprocessed, "--set", "vocab.size=100"), "vocab.size is 100")
    one_line_error(train(preprocessed, "--set", "data.valid=test"), "data.valid is 'test'")
    bert = run_tcli(
        "pretrain-bert",
        "--config",
        str(TOY.parents[1] / "configs" / "bert_quickstart.yaml"),
        "--out",
        str(tmp_path / "b"),
        "--set",
        f"data.preprocessed={preprocessed}",
    )
    one_line_error(bert, "holds translation data, not bert data")


def test_resume_with_preprocessed_data_of_other_text_or_vocabulary_is_refused(tmp_path, data, preprocessed):
    config = str(tiny_config(tmp_path, data, steps=2))
    run = tmp_path / "run"
    assert run_tcli("train", "--config", config, "--out", str(run), "--quiet").returncode == 0
    other_text = toy_subset(tmp_path / "other", train=250, valid=20)
    other = tmp_path / "other_pre"
    assert (
        run_tcli("preprocess", "--config", config, "--out", str(other), "--set", f"data.dir={other_text}").returncode
        == 0
    )
    one_line_error(
        run_tcli(
            "train",
            "--config",
            config,
            "--out",
            str(run),
            "--resume",
            "auto",
            "--set",
            "train.max_steps=4",
            "--set",
            f"data.preprocessed={other}",
        ),
        "training data differ",
    )
    # The same text tokenised with another vocabulary (as a folder built with another vocab.model would be).
    revocab = copy_folder(preprocessed, tmp_path / "revocab")
    other_model = tmp_path / "other.model"
    assert (
        run_tcli("preprocess", "--config", config, "--out", str(tmp_path / "p90"), "--set", "vocab.size=90").returncode
        == 0
    )
    other_model.write_bytes((tmp_path / "p90" / "vocab" / "joint.model").read_bytes())
    (revocab / "vocab" / "joint.model").write_bytes(other_model.read_bytes())
    manifest = json.loads((revocab / "manifest.json").read_text())
    manifest["vocab_sha256"]["joint"] = shards.sha256_bytes(other_model.read_bytes())
    (revocab / "manifest.json").write_text(json.dumps(manifest))
    one_line_error(
        run_tcli(
            "train",
            "--config",
            config,
            "--out",
            str(run),
            "--resume",
            "auto",
            "--set",
            "train.max_steps=4",
            "--set",
            f"data.preprocessed={revocab}",
        ),
        "another vocabulary",
    )
    resumed = run_tcli(
        "train",
        "--config",
        config,
        "--out",
        str(run),
        "--resume",
        "auto",
        "--set",
        "train.max_steps=4",
        "--set",
        f"data.preprocessed={preprocessed}",
    )
    assert resumed.returncode == 0, resumed.stderr  # the same text and vocabulary: resuming from it is fine


def test_preprocess_command_guards_its_folder(tmp_path, data):
    config = str(tiny_config(tmp_path, data))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    one_line_error(run_tcli("preprocess", "--config", config, "--out", str(foreign)), "not empty")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").write_text("4194304999\n")  # a longer PID left by an earlier holder: replaced, not overwritten
    assert run_tcli("preprocess", "--config", config, "--out", str(out)).returncode == 0
    assert (out / ".lock").read_text() == f"{os.getpid()}\n"  # (this process: run_tcli runs tcli in it)
    (out / "bert_sample_map_0123abcd.npy").write_bytes(b"")  # what pretrain-bert caches beside the arrays
    again = run_tcli("preprocess", "--config", config, "--out", str(out))
    assert again.returncode == 0 and "up to date" in again.stderr, again.stderr
    one_line_error(
        run_tcli("preprocess", "--config", config, "--out", str(out), "--set", "data.max_len=20"),
        "other settings (max_len)",
        "--force",
    )
    forced = run_tcli("preprocess", "--config", config, "--out", str(out), "--set", "data.max_len=20", "--force")
    assert forced.returncode == 0, forced.stderr
    assert json.loads((out / "manifest.json").read_text())["settings"]["max_len"] == 20
    bad = toy_subset(tmp_path / "bad", train=50, valid=5)
    (bad / "train.tgt").write_text("one\ntwo\n")
    one_line_error(
        run_tcli("preprocess", "--config", config, "--out", str(tmp_path / "o2"), "--set", f"data.dir={bad}"),
        "train.src has 50 lines",
        "train.tgt has 2",
    )
    assert not (tmp_path / "o2" / "manifest.json").exists()


def test_vocab_model_is_used_as_given_and_checked(tmp_path, data, preprocessed):
    config = str(tiny_config(tmp_path, data, steps=2))
    model = preprocessed / "vocab" / "joint.model"
    run = tmp_path / "run"
    result = run_tcli("train", "--config", config, "--out", str(run), "--quiet", "--set", f"vocab.model={model}")
    assert result.returncode == 0, result.stderr
    assert (run / "vocab" / "joint.model").read_bytes() == model.read_bytes()
    one_line_error(
        run_tcli(
            "train",
            "--config",
            config,
            "--out",
            str(tmp_path / "r2"),
            "--set",
            f"vocab.model={tmp_path / 'none.model'}",
        ),
        "vocab.model",
        "is not a file",
    )
    import io

    import sentencepiece as spm

    lines = read_lines(data / "train.src")
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buffer, vocab_size=60, minloglevel=2
    )  # sentencepiece's default ids: unk 0, bos 1, eos 2, no pad
    (tmp_path / "default.model").write_bytes(buffer.getvalue())
    one_line_error(
        run_tcli(
            "train",
            "--config",
            config,
            "--out",
            str(tmp_path / "r3"),
            "--set",
            f"vocab.model={tmp_path / 'default.model'}",
        ),
        "pad/unk/bos/eos ids -1/0/1/2",
        "--pad_id=0",
    )
    one_line_error(
        run_tcli(
            "train",
            "--config",
            config,
            "--out",
            str(tmp_path / "r4"),
            "--set",
            f"vocab.model={model}",
            "--set",
            "vocab.joint=false",
            "--set",
            "model.share_embeddings=false",
        ),
        "vocab.model",
        "vocab.joint: true",
    )


def test_bert_documents_stream_into_the_same_structure(tmp_path):
    """Sentences and document boundaries written by the streaming, block-wise preprocessing equal those of
    reading the whole file (read_documents + encode_documents), wherever the blocks are cut."""
    from transformer_cli.bert.setup import train_bert_vocab
    from transformer_cli.data.bert import encode_documents, read_documents

    text = BERT_TOY / "train.txt"
    docs_text = read_documents(text, "text", split=True)
    from transformer_cli.config import BertRunConfig

    vocab = train_bert_vocab([s for d in docs_text for s in d], BertRunConfig())
    expected = encode_documents(vocab, docs_text)
    for block, workers in ((3, 0), (17, 2), (20_000, 0)):
        folder = tmp_path / f"b{block}"
        folder.mkdir()
        stats = shards.preprocess_documents(
            folder, {"train": text_mod.index_lines(text, block)}, vocab, "text", True, quiet=True, workers=workers
        )
        sentences = read_split(folder, "train.text", "<u2")
        starts = np.fromfile(folder / "train.docs", dtype="<i8").tolist()
        got = [sentences[a:b] for a, b in zip(starts, starts[1:])]
        assert got == expected, block
        assert stats["train"]["counts"]["documents"] == len(expected)


def test_document_starts_that_next_sentence_prediction_cannot_use_are_damage(tmp_path):
    """train.docs rewritten as one document passed the order checks and failed with a ValueError in the epoch
    plan, after the run folder had been written; the preprocessed text checks what the text's reading checks."""
    from transformer_cli.data.shards import _check_docs

    for starts, fragment in (
        ([0, 9], r"1 document\(s\)"),
        ([0, 1, 2, 3], r"3 document\(s\), the longest of 1 sentence"),
    ):
        path = tmp_path / "train.docs"
        np.array(starts, "<i8").tofile(path)
        with pytest.raises(UserError, match=fragment):
            _check_docs(path, starts[-1])
    np.array([0, 1, 3], "<i8").tofile(path)
    _check_docs(path, 3)


def test_background_feeder_gives_the_same_batches_in_order_and_passes_errors_on():
    """The GPU path prepares batches in a thread one update ahead: the same batches, in the same groups, as
    making them when needed (exact resume does not depend on the device); an error in a batch reaches the
    training loop."""
    import torch

    from transformer_cli.train.loop import _Feeder

    class Task:
        def make_batch(self, spec, epoch):
            if spec == 13:
                raise UserError("bad batch 13")
            return torch.full((2,), spec * 10 + epoch)

    specs = list(range(11))
    for start in (0, 3):
        plain = _Feeder(Task(), specs, start, epoch=2, accum=3, background=False)
        threaded = _Feeder(Task(), specs, start, epoch=2, accum=3, background=True)
        done = start
        while done < len(specs):
            a, b = plain.next(), threaded.next()
            assert [t.tolist() for t in a] == [t.tolist() for t in b] and len(a) == min(3, len(specs) - done)
            done += len(a)
        threaded.close()
    failing = _Feeder(Task(), list(range(10, 16)), 0, epoch=0, accum=2, background=True)
    assert len(failing.next()) == 2
    with pytest.raises(UserError, match="bad batch 13"):
        failing.next()
    failing.close()


def test_release_finds_the_mapping_and_drops_its_pages(preprocessed):
    """TokenArray.release must reach the mmap behind the numpy array (numpy keeps a memoryview as its base):
    after it, none of the corpus' pages are counted in this process's mapping."""
    manifest = shards.read_manifest(preprocessed, "translation")
    array = manifest.array("train", "src")
    assert shards.mapping_of(array.tokens) is not None and shards.mapping_of(array.offsets) is not None
    int(array.tokens.sum())  # touch every page

    def mapped_kb() -> int:
        lines = Path("/proc/self/smaps").read_text().splitlines()
        for i, line in enumerate(lines):
            if line.endswith(str(array.path)):
                return int(next(x for x in lines[i + 1 :] if x.startswith("Rss:")).split()[1])
        return 0

    if not Path("/proc/self/smaps").exists():
        pytest.skip("no /proc/self/smaps here")
    assert mapped_kb() > 0
    array.release()
    assert mapped_kb() == 0


def test_reads_with_pread_equal_the_arrays_and_map_no_page(preprocessed):
    """gather/spans (pread) return what numpy reads from the files, and training reads through them leave
    nothing of the corpus mapped (a mapped read would map 64 KB around every sentence it touches)."""
    from transformer_cli.data.translation import ShardedPairs

    manifest = shards.read_manifest(preprocessed, "translation")
    sentences = read_split(preprocessed, "train.src", manifest.data["dtype"])
    array = manifest.array("train", "src")
    rows = np.random.default_rng(0).permutation(len(sentences))[:50]
    flat, lengths = array.gather(rows)
    assert flat.dtype == np.int64 and lengths.tolist() == [len(sentences[r]) for r in rows]
    assert flat.tolist() == [t for r in rows for t in sentences[r]]
    tokens = np.fromfile(preprocessed / "train.src.bin", dtype=manifest.data["dtype"])
    starts, spans = np.array([0, 5, 17, len(tokens) - 3]), np.array([3, 0, 9, 3])
    assert array.spans(starts, spans).tolist() == [t for a, n in zip(starts, spans) for t in tokens[a : a + n]]
    assert array.gather(np.zeros(0, np.int64))[0].size == 0
    assert array.lengths().dtype == np.uint16 and array.lengths().tolist() == [len(s) for s in sentences]

    if not Path("/proc/self/smaps").exists():
        pytest.skip("no /proc/self/smaps here")
    pairs = ShardedPairs(manifest, "train")
    pairs.src.release()
    pairs.tgt.release()
    for start in range(0, len(pairs), 16):
        pairs.batch(np.arange(start, min(start + 16, len(pairs))))
    smaps = Path("/proc/self/smaps").read_text().splitlines()
    mapped = [
        int(next(x for x in smaps[i + 1 :] if x.startswith("Rss:")).split()[1])
        for i, line in enumerate(smaps)
        if line.endswith(("train.src.bin", "train.tgt.bin"))
    ]
    assert mapped and sum(mapped) <= 8  # at most the last page each, read when the arrays were opened


def test_preprocess_never_loads_torch(tmp_path, data):
    """`tcli preprocess` runs without importing torch (whose start-up costs more than the rest of preprocessing a
    small corpus): the setups import it only to build a task."""
    argv = ["tcli", "preprocess", "--config", str(tiny_config(tmp_path, data)), "--out", str(tmp_path / "p"), "--quiet"]
    code = (
        "import sys\nfrom transformer_cli.cli import main\n"
        f"sys.argv = {argv!r}\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\nprint('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    assert (tmp_path / "p" / "manifest.json").is_file()


def test_workers_stop_when_the_parent_ignores_sigterm():
    """Pool.terminate stops its workers with SIGTERM. A parent that ignores SIGTERM (tcli's main() does once a
    command's work is done; ignored signals are inherited by the processes it starts) must still be able to
    stop its workers: before the fix the parent waited for them forever."""
    code = (
        "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "from transformer_cli.data.shards import Workers\n"
        "with Workers([], 2) as w:\n"
        "    pass\n"
        "print('stopped')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr


def test_a_vocabulary_copied_in_by_hand_is_not_used_to_tokenise_again(tmp_path, data, preprocessed, toy_vocab):
    """vocab.json records the sha256 of the model files it describes: a foreign joint.model (another vocab.size's)
    copied over the folder's is trained anew when the folder is preprocessed again, not used to tokenise (the
    manifest would have named the config's vocab.size over another vocabulary)."""
    folder = tmp_path / "pre"
    shutil.copytree(preprocessed, folder)
    (folder / "vocab" / "joint.model").write_bytes(toy_vocab.model_bytes)
    again = run_tcli("preprocess", "--config", str(tiny_config(tmp_path, data)), "--out", str(folder))
    assert again.returncode == 0, again.stderr
    original = (preprocessed / "vocab" / "joint.model").read_bytes()
    assert (folder / "vocab" / "joint.model").read_bytes() == original
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["vocab_sha256"] == json.loads((preprocessed / "manifest.json").read_text())["vocab_sha256"]
    record = json.loads((folder / "vocab" / "vocab.json").read_text())
    assert record["files_sha256"] == {"joint.model": hashlib.sha256(original).hexdigest()}


def test_a_bert_manifest_whose_counts_differ_from_its_files_is_damage():
    """BERT's counts (sentences, documents) and tokens are what its arrays hold; the training log reports them."""
    from transformer_cli.data.shards import _count_damage

    held = {"rows text": 10, "tokens text": 40, "documents": 3}
    split = {"counts": {"lines": 12, "documents": 3, "sentences": 10}, "tokens": {"text": 40}}
    assert _count_damage(split, held) is None
    for key, value, fragment in (
        ("counts", {"lines": 12, "documents": 4, "sentences": 10}, "it says 4 documents, the files hold 3"),
        ("counts", {"lines": 12, "documents": 3, "sentences": 9}, r"it says 9 sentences \(text side\)"),
        ("counts", {"lines": 12, "documents": 3}, "it says no sentences"),
        ("tokens", {"text": 41}, "it says 41 text tokens, the files hold 40"),
        ("tokens", {}, "it says no text tokens"),
    ):
        assert re.search(fragment, _count_damage({**split, key: value}, held) or ""), (key, value)


def test_a_refused_preprocessing_leaves_a_new_or_empty_folder_as_it_found_it(tmp_path, data):
    """A vocab.size the text cannot fill, or no pairs left under data.max_len, is found after the lock (and the
    vocabulary) were written: the folder is removed again, or emptied again."""
    config = str(tiny_config(tmp_path, data))
    for setting, fragment in (("vocab.size=16", "vocab.size 16 is too small"), ("data.max_len=1", "no sentence pairs")):
        new, empty = tmp_path / "new", tmp_path / "empty"
        empty.mkdir(exist_ok=True)
        for out in (new, empty):
            one_line_error(
                run_tcli("preprocess", "-q", "--config", config, "--out", str(out), "--set", setting), fragment
            )
        assert not new.exists() and [p.name for p in empty.iterdir() if p.name != ".lock"] == []


def test_held_out_text_that_is_the_training_text_under_another_name_is_refused(tmp_path, data):
    """Split names that differ but files that hold the training text (a copy, a link): the scores would be of
    text the model trains on. Refused while the files are read, before a folder is made."""
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    for side in ("src", "tgt"):
        (copy / f"dup.{side}").symlink_to(copy / f"train.{side}")
    config = str(tiny_config(tmp_path, copy))
    for key in ("valid", "test"):
        out = tmp_path / f"out_{key}"
        result = run_tcli("preprocess", "-q", "--config", config, "--out", str(out), "--set", f"data.{key}=dup")
        one_line_error(result, f"data.{key} 'dup' holds the same text as data.train 'train'")
        assert not out.exists()
    text = tmp_path / "bert"
    shutil.copytree(BERT_TOY, text)
    shutil.copy(text / "train.txt", text / "again.txt")
    bert = tmp_path / "bert.yaml"
    bert.write_text(
        f"data: {{dir: {text}, train: train.txt, valid: again.txt, format: text}}\ntrain: {{max_steps: 1}}\n"
    )
    result = run_tcli("preprocess", "-q", "--config", str(bert), "--out", str(tmp_path / "b"))
    one_line_error(result, "data.valid", "again.txt holds the same text as data.train")
    bert.write_text(
        f"data: {{dir: {text}, train: train.txt, valid: train.txt, format: text}}\ntrain: {{max_steps: 1}}\n"
    )
    one_line_error(run_tcli("preprocess", "--config", str(bert), "--out", str(tmp_path / "b")), "are both 'train.txt'")
