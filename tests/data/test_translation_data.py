"""Parallel data: errors on bad input, filtering, and the bucketed token batches."""

from __future__ import annotations

import random

import pytest

from transformer_cli.core.buckets import bucket, buckets_upto
from transformer_cli.core.errors import UserError
from transformer_cli.core.text import read_lines
from transformer_cli.data.translation import (
    ParallelData,
    batch_rows,
    collate,
    encode_parallel,
    read_parallel,
    token_batches,
)

from ..conftest import MULTI30K, needs_multi30k


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
    from transformer_cli.data.translation import ParallelData

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
    from transformer_cli.vocab.spm import train_vocab

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
    width = [bucket(max(s, t) + 1) for s, t in zip(src, tgt)]
    plan = token_batches(src, tgt, max_tokens=2 * longest, seed=1, epoch=0, shuffle=False)
    # Widest first: a stable sort reversed (ties in reverse input order).
    expected = sorted(range(500), key=lambda i: (width[i], tgt[i], src[i]))[::-1]
    assert plan.order.tolist() == expected
    for j, batch in enumerate(plan):
        assert len(batch) * max(width[i] for i in batch) <= 2 * longest or len(batch) == 1
        assert len(batch) == batch_rows(2 * longest, width[batch[0]]) or j == len(plan) - 1
    shuffled = token_batches(src, tgt, max_tokens=2 * longest, seed=1, epoch=0)
    assert sorted(shuffled.order.tolist()) == list(range(500))
    assert shuffled == token_batches(src, tgt, 2 * longest, 1, 0)


@pytest.mark.parametrize("multiple", [1, 2, 8])
def test_batches_take_few_shapes_all_from_the_declared_set(multiple):
    """Every batch is (batch_rows(max_tokens, max(S, T)), S) / (…, T) with S and T from the bucket set: at most
    (number of widths)**2 shapes whatever the corpus, and the last, short batch is filled with empty rows."""
    src, tgt = lengths(3000, seed=multiple)
    data = ParallelData(src=[[5] * n for n in src], tgt=[[6] * n for n in tgt], src_text=[], tgt_text=[])
    widths = buckets_upto(bucket(41 + 5 + 1, multiple), multiple)
    shapes = set()
    for epoch in range(3):
        plan = token_batches(src, tgt, max_tokens=600, seed=1, epoch=epoch, multiple=multiple)
        for spec in plan:
            batch = collate(data, spec, 0, 2, 3, multiple=multiple, max_tokens=600)
            (rows, S), T = batch.src.shape, batch.labels.size(1)
            assert S in widths and T in widths and rows == batch_rows(600, max(S, T)) >= len(spec)
            assert batch.tgt_in.shape == batch.labels.shape == (rows, T)
            assert batch.tokens == sum(tgt[i] + 1 for i in spec)  # filler rows carry no labels
            filler = slice(len(spec), None)
            assert (batch.labels[filler] == 0).all() and (batch.src[filler, 0] == 3).all()
            assert (batch.tgt_in[filler, 0] == 2).all()
            shapes.add((rows, S, T))
    assert len(shapes) <= len(widths) ** 2
    if multiple == 2:
        print(f"{len(shapes)} batch shapes over 3 epochs, widths {widths}")


def test_padding_rows_change_no_loss(toy_vocab):
    """A batch filled up with empty rows gives the same summed loss as the batch alone."""
    import torch

    from transformer_cli.models.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(64, 64, d_model=16, heads=2, ffn_dim=32, enc_layers=1, dec_layers=1, dropout=0.0).eval()
    data = ParallelData(src=[[5, 6, 7], [8]], tgt=[[9, 10], [11, 12, 13]], src_text=[], tgt_text=[])
    alone = collate(data, [0, 1], 0, 2, 3)
    filled = collate(data, [0, 1], 0, 2, 3, max_tokens=40)
    assert filled.src.size(0) > alone.src.size(0)
    a = model(alone.src, alone.tgt_in, labels=alone.labels, label_smoothing=0.1)
    b = model(filled.src, filled.tgt_in, labels=filled.labels, label_smoothing=0.1)
    assert torch.allclose(a.loss, b.loss, atol=1e-5) and int(a.tokens) == int(b.tokens)


def test_a_training_file_that_is_no_regular_file_is_refused_before_it_is_opened(tmp_path):
    """A FIFO blocked the run forever (no writer), /dev/zero never ended its first line: training files are read
    more than once, so they must be regular files (a link to one is fine). An alarm turns a hang into a failure."""
    import os

    from transformer_cli.core.files import check_file
    from transformer_cli.core.text import fingerprint, index_lines, stream_lines

    from ..conftest import fails_if_it_hangs

    fifo, zero, real, link = tmp_path / "fifo.txt", tmp_path / "zero.txt", tmp_path / "real.txt", tmp_path / "l.txt"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    real.write_text("a b\n")
    link.symlink_to(real)
    with fails_if_it_hangs("a read of a FIFO or /dev/zero (opened before it was checked)"):
        for path in (fifo, zero):
            for read in (lambda p: index_lines(p, 16), lambda p: fingerprint([p]), lambda p: next(stream_lines(p))):
                with pytest.raises(UserError, match="is not a regular file"):
                    read(path)
            with pytest.raises(UserError, match="is a FIFO, device or socket, not a regular file"):
                check_file(path, "data: {path} {what}".replace("{path}", str(path)))
        assert index_lines(link, 16).lines == 1 and fingerprint([link])
