"""Parallel data: errors on bad input, filtering, and the bucketed token batches."""

from __future__ import annotations

import random

import pytest

from transformer_cli.datasets.text import read_lines
from transformer_cli.datasets.translation import collate, encode_parallel, read_parallel, token_batches
from transformer_cli.errors import UserError

from .conftest import MULTI30K, needs_multi30k


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    with pytest.raises(UserError) as err:
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")
    message = str(err.value)
    assert "a.en has 3 lines" in message and "a.de has 2" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.en"
    path.write_bytes("good line\nsecond ok\nthird \xff bad\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"bad\.en line 3: invalid UTF-8"):
        read_lines(path)


def test_crlf_and_bom_are_read_as_text(tmp_path):
    path = tmp_path / "x.en"
    path.write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n")
    assert read_lines(path) == ["one", "two"]


def test_empty_and_long_pairs_are_dropped_as_pairs(toy_vocab):
    src = ["a dog runs", "", "the cat", "word " * 60, "ok"]
    tgt = ["ein hund", "leer", "", "kurz", "gut"]
    data = encode_parallel(src, tgt, toy_vocab, toy_vocab, max_len=20)
    assert data.dropped_empty == 2 and data.dropped_long == 1
    assert data.src_text == ["a dog runs", "ok"] and data.tgt_text == ["ein hund", "gut"]


def test_collate_shifts_target_and_pads():
    from transformer_cli.datasets.translation import ParallelData

    data = ParallelData(src=[[5, 6], [7]], tgt=[[8, 9, 10], [11]], src_text=["", ""], tgt_text=["", ""])
    batch = collate(data, [0, 1], pad_id=0, bos_id=2, eos_id=3)
    assert batch.src.tolist() == [[5, 6, 3], [7, 3, 0]]
    assert batch.tgt_in.tolist() == [[2, 8, 9, 10], [2, 11, 0, 0]]
    assert batch.labels.tolist() == [[8, 9, 10, 3], [11, 3, 0, 0]]
    assert batch.tokens == 6


def lengths(n: int, seed: int = 0):
    rng = random.Random(seed)
    src = [rng.randint(1, 40) for _ in range(n)]
    tgt = [max(1, s + rng.randint(-3, 5)) for s in src]
    return src, tgt


def test_token_batches_cover_every_sentence_once_within_budget():
    src, tgt = lengths(3000)
    batches = token_batches(src, tgt, max_tokens=600, seed=1, epoch=0)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(3000))
    for b in batches:
        width = max(max(src[i], tgt[i]) + 1 for i in b)
        assert len(b) * width <= 600 or len(b) == 1


def test_token_batches_depend_only_on_seed_and_epoch():
    src, tgt = lengths(500)
    assert token_batches(src, tgt, 300, seed=1, epoch=2) == token_batches(src, tgt, 300, seed=1, epoch=2)
    assert token_batches(src, tgt, 300, seed=1, epoch=2) != token_batches(src, tgt, 300, seed=1, epoch=3)
    assert token_batches(src, tgt, 300, seed=1, epoch=2) != token_batches(src, tgt, 300, seed=2, epoch=2)


@needs_multi30k
def test_bucketing_keeps_padding_low_on_multi30k():
    from transformer_cli.vocab import train_vocab

    src_lines = read_lines(MULTI30K / "train.en")
    tgt_lines = read_lines(MULTI30K / "train.de")
    vocab = train_vocab(src_lines[:8000] + tgt_lines[:8000], size=4000)
    data = encode_parallel(src_lines, tgt_lines, vocab, vocab, max_len=200)
    src = [len(s) for s in data.src]
    tgt = [len(t) for t in data.tgt]
    real = padded = 0
    for spec in token_batches(src, tgt, 2200, seed=1, epoch=0):
        batch = collate(data, spec, 0, 2, 3)
        real += batch.tokens + batch.src_tokens
        padded += batch.labels.numel() + batch.src.numel()
    assert 1 - real / padded < 0.10


@pytest.mark.parametrize("longest", [60, 3000])  # keys packed with positions in 64 bits, and the argsort path
def test_token_batches_sort_by_width_then_target_then_source(longest):
    rng = random.Random(longest)
    src = [rng.randint(1, longest) for _ in range(500)]
    tgt = [rng.randint(1, longest) for _ in range(500)]
    width = [max(s, t) + 1 for s, t in zip(src, tgt)]
    plan = token_batches(src, tgt, max_tokens=2 * longest, seed=1, epoch=0, shuffle=False)
    expected = sorted(range(500), key=lambda i: (width[i], tgt[i], src[i]))  # a stable sort: ties keep the input order
    assert plan.order.tolist() == expected
    for batch in plan:
        assert len(batch) * max(width[i] for i in batch) <= 2 * longest or len(batch) == 1
    shuffled = token_batches(src, tgt, max_tokens=2 * longest, seed=1, epoch=0)
    assert sorted(shuffled.order.tolist()) == list(range(500))
    assert shuffled == token_batches(src, tgt, 2 * longest, 1, 0)
