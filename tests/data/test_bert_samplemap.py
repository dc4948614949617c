"""BERT sample map: chunks cut once by the rule, per-epoch NSP draws as arrays, lazy batches equal to today's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from transformer_cli.data import bert
from transformer_cli.data.bert import (
    DOC,
    END,
    FIRST,
    IS_NEXT,
    NOT_NEXT,
    TARGET,
    Instance,
    Span,
    SpecialIds,
    _truncate_pair,
    build_sample_map,
    is_sample_map_of,
    make_batch,
    make_plan_batch,
    plan_epoch,
    sample_map_cached,
    sentence_targets,
    truncated_lengths,
)
from transformer_cli.data.shards import ranges

IDS = SpecialIds(pad=0, cls=2, sep=3, mask=4, first_normal=5, vocab_size=60)


def corpus(n_docs: int, seed: int = 0, max_sentences: int = 12, max_len: int = 12):
    """(tokens uint16, offsets, doc_starts): documents of 1..max_sentences sentences of 1..max_len tokens."""
    rng = np.random.default_rng(seed)
    doc_starts = np.concatenate([[0], np.cumsum(rng.integers(1, max_sentences + 1, n_docs))])
    offsets = np.concatenate([[0], np.cumsum(rng.integers(1, max_len + 1, doc_starts[-1]))])
    return rng.integers(IDS.first_normal, IDS.vocab_size, offsets[-1]).astype(np.uint16), offsets, doc_starts


def reference_chunks(offsets, doc_starts, targets) -> np.ndarray:
    """The chunk rule sentence by sentence, as _instances_of_document walks a document."""
    out = []
    for d in range(len(doc_starts) - 1):
        first, stop = int(doc_starts[d]), int(doc_starts[d + 1])
        if stop - first < 2:
            continue
        chunks, start, length = [], first, 0
        for i in range(first, stop):
            length += int(offsets[i + 1] - offsets[i])
            if (length >= targets[start] and i + 1 - start >= 2) or i == stop - 1:
                chunks.append([d, start, i + 1, int(targets[start])])
                start, length = i + 1, 0
        if chunks[-1][END] - chunks[-1][FIRST] == 1:
            lone = chunks.pop()
            chunks[-1][END] = lone[END]
        out += chunks
    return np.array(out, dtype=np.int64).reshape(-1, 4)


def test_truncated_lengths_equal_truncate_pair():
    rng = np.random.default_rng(0)
    cases = [(a, b, m) for m in range(2, 24) for a in range(30) for b in range(30)]
    cases += [tuple(int(x) for x in rng.integers([0, 0, 2], [300, 300, 510])) for _ in range(1000)]
    expected = []
    for a, b, m in cases:
        ta, tb = list(range(a)), list(range(b))
        _truncate_pair(ta, tb, m)
        expected.append((len(ta), len(tb)))
    a, b, m = (np.array(c) for c in zip(*cases))
    keep_a, keep_b = truncated_lengths(a, b, m)
    assert np.array_equal(np.stack([keep_a, keep_b], 1), np.array(expected))


@pytest.mark.parametrize("max_seq_len, short_seq_prob, seed", [(16, 0.0, 0), (32, 0.3, 1), (64, 1.0, 2), (8, 0.1, 3)])
def test_sample_map_follows_the_chunk_rule(max_seq_len, short_seq_prob, seed):
    _, offsets, doc_starts = corpus(400, seed)
    sample_map = build_sample_map(offsets, doc_starts, max_seq_len, short_seq_prob, seed)
    targets = sentence_targets(len(offsets) - 1, max_seq_len, short_seq_prob, seed)
    assert sample_map.dtype == np.int64
    assert np.array_equal(sample_map, reference_chunks(offsets, doc_starts, targets))
    assert is_sample_map_of(sample_map, offsets, doc_starts, max_seq_len, short_seq_prob)
    doc, first, end = sample_map[:, DOC], sample_map[:, FIRST], sample_map[:, END]
    assert (end - first >= 2).all()
    assert ((doc_starts[doc] <= first) & (end <= doc_starts[doc + 1])).all()
    # chunks tile exactly the sentences of the documents of two sentences or more
    covered = np.zeros(len(offsets) - 1, dtype=int)
    for f, e in zip(first, end):
        covered[f:e] += 1
    sizes = np.diff(doc_starts)
    assert np.array_equal(covered, np.repeat(sizes >= 2, sizes).astype(int))


def test_targets_and_merged_last_sentences():
    _, offsets, doc_starts = corpus(400, 4)
    assert (build_sample_map(offsets, doc_starts, 32, 0.0, 1)[:, TARGET] == 29).all()
    targets = build_sample_map(offsets, doc_starts, 32, 0.5, 1)[:, TARGET]
    assert targets.min() >= 2 and targets.max() == 29 and 0.3 < (targets < 29).mean() < 0.6
    # the corpus exercises the merge: some chunk ends at its document's end one sentence after the rule's end
    sample_map = build_sample_map(offsets, doc_starts, 16, 0.0, 1)
    first, end = sample_map[:, FIRST], sample_map[:, END]
    tokens_before_last = offsets[end - 1] - offsets[first]
    assert ((end - first > 2) & (tokens_before_last >= 13) & (end == doc_starts[sample_map[:, DOC] + 1])).any()


def test_tampered_maps_are_not_maps_of_the_corpus():
    _, offsets, doc_starts = corpus(200, 5)
    good = build_sample_map(offsets, doc_starts, 32, 0.1, 0)
    assert is_sample_map_of(good, offsets, doc_starts, 32, 0.1)
    assert not is_sample_map_of(good, offsets, doc_starts, 32, 0.0)  # short targets where none may be
    longest = build_sample_map(offsets, doc_starts, 32, 0.0, 0)
    assert not is_sample_map_of(longest, offsets, doc_starts, 64, 0.0)  # targets, and ends, too short
    assert not is_sample_map_of(good[1:], offsets, doc_starts, 32, 0.1)
    assert not is_sample_map_of(good.astype(np.int32), offsets, doc_starts, 32, 0.1)
    shifted = good.copy()
    shifted[3, END] += 1
    assert not is_sample_map_of(shifted, offsets, doc_starts, 32, 0.1)


def spans_of(tokens):
    """TokenArray.spans for a token array in memory."""
    return lambda starts, lengths: np.asarray(tokens[ranges(starts, lengths)], dtype=np.int64)


def spans(plan, offsets, doc_starts):
    """Per-sample (A tokens, B tokens, B's document) before truncation."""
    first = plan.sample_map[:, FIRST]
    len_a = offsets[plan.a_end] - offsets[first]
    len_b = offsets[plan.b_end] - offsets[plan.b_start]
    b_doc = np.searchsorted(doc_starts, plan.b_start, side="right") - 1
    return len_a, len_b, b_doc


def test_pairs_follow_nsp():
    _, offsets, doc_starts = corpus(7000, 6)
    sample_map = build_sample_map(offsets, doc_starts, 32, 0.1, 0)
    assert len(sample_map) > 10_000
    plan = plan_epoch(sample_map, offsets, doc_starts, 32, 16, seed=0, epoch=0)
    doc, first, end, target = sample_map.T
    len_a, len_b, b_doc = spans(plan, offsets, doc_starts)
    assert 0.48 < plan.is_next.mean() < 0.52
    assert ((first < plan.a_end) & (plan.a_end < end)).all()
    nxt, other = plan.is_next, ~plan.is_next
    assert (plan.b_start[nxt] == plan.a_end[nxt]).all() and (plan.b_end[nxt] == end[nxt]).all()
    assert (b_doc[other] != doc[other]).all()
    assert len(np.unique(b_doc[other])) > 0.5 * (len(doc_starts) - 1)  # B documents are drawn from all of them
    # NotNext B: sentences from a random start until it holds max(1, target - len(A)) tokens or its document ends
    b_doc_end = doc_starts[b_doc + 1]
    wanted = np.maximum(1, target - len_a)
    assert (plan.b_end[other] <= b_doc_end[other]).all()
    assert ((len_b >= wanted) | (plan.b_end == b_doc_end))[other].all()
    shorter = offsets[plan.b_end - 1] - offsets[plan.b_start]
    assert ((plan.b_end - 1 == plan.b_start) | (shorter < wanted))[other].all()
    assert np.array_equal(plan.lengths, np.minimum(len_a + len_b, 29) + 3)
    assert (plan.lengths <= 32).all()


def test_epochs_are_deterministic_complete_and_equal_in_size():
    tokens, offsets, doc_starts = corpus(300, 7)
    sample_map = build_sample_map(offsets, doc_starts, 32, 0.1, 0)
    n, batch_size = len(sample_map), 7
    plans = [plan_epoch(sample_map, offsets, doc_starts, 32, batch_size, seed=3, epoch=e) for e in range(3)]
    again = plan_epoch(sample_map, offsets, doc_starts, 32, batch_size, seed=3, epoch=1)
    for name in ("a_end", "b_start", "b_end", "is_next", "order", "batch_order"):
        assert np.array_equal(getattr(plans[1], name), getattr(again, name))
        assert not np.array_equal(getattr(plans[1], name), getattr(plans[2], name))

    def batch(plan, i):
        spec = plan[i]
        return make_plan_batch(
            plan, spec, spans_of(tokens), offsets, IDS, 0.15, 20, torch.Generator().manual_seed(spec.number)
        )

    assert all(
        torch.equal(getattr(batch(plans[1], 5), f), getattr(batch(again, 5), f))
        for f in ("input_ids", "segment_ids", "mlm_labels", "nsp_labels")
    )
    for plan in plans:
        assert len(plan) == math.ceil(n / batch_size)
        rows = np.concatenate([spec.rows for spec in plan])
        assert np.array_equal(np.sort(rows), np.arange(n))  # every sample exactly once
        assert [spec.number for spec in plan] == list(range(len(plan)))
        assert sorted(len(spec.rows) for spec in plan)[1:] == [batch_size] * (len(plan) - 1)
        assert [s.number for s in plan[3:6]] == [3, 4, 5] and np.array_equal(plan[-1].rows, plan[len(plan) - 1].rows)
        pool = 100 * batch_size  # inside a pool, batches are cut from samples sorted by length
        assert all((np.diff(plan.lengths[plan.order[i : i + pool]]) >= 0).all() for i in range(0, n, pool))
    with pytest.raises(IndexError):
        plans[0][len(plans[0])]


def test_plan_batches_equal_todays_collate_and_masks(tmp_path):
    tokens, offsets, doc_starts = corpus(200, 8, max_len=20)  # sentences long enough to need truncation
    for name, array in (("tokens", tokens), ("offsets", offsets)):
        np.save(tmp_path / f"{name}.npy", array)
    tokens, offsets = (np.load(tmp_path / f"{name}.npy", mmap_mode="r") for name in ("tokens", "offsets"))
    sample_map = build_sample_map(offsets, doc_starts, 24, 0.2, 1)
    plan = plan_epoch(sample_map, offsets, doc_starts, 24, 8, seed=1, epoch=2)
    sentence = lambda i: tokens[offsets[i] : offsets[i + 1]].tolist()  # noqa: E731
    truncated = 0
    for spec in plan:
        instances = []
        for r in spec.rows:
            doc, first = int(sample_map[r, DOC]), int(sample_map[r, FIRST])
            a = [t for s in range(first, plan.a_end[r]) for t in sentence(s)]
            b = [t for s in range(plan.b_start[r], plan.b_end[r]) for t in sentence(s)]
            truncated += len(a) + len(b) > 21
            _truncate_pair(a, b, 21)
            instances.append(
                Instance(
                    a,
                    b,
                    bool(plan.is_next[r]),
                    Span(doc, first, plan.a_end[r]),
                    Span(-1, plan.b_start[r], plan.b_end[r]),
                )
            )
        want = make_batch(instances, IDS, 0.15, 20, torch.Generator().manual_seed(spec.number), multiple=8)
        got = make_plan_batch(
            plan, spec, spans_of(tokens), offsets, IDS, 0.15, 20, torch.Generator().manual_seed(spec.number), multiple=8
        )
        for field in ("input_ids", "segment_ids", "mlm_labels", "nsp_labels"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
        assert (got.masked, got.real_tokens) == (want.masked, want.real_tokens)
        assert got.input_ids.size(1) % 8 == 0 and got.input_ids.ne(IDS.pad).sum(1).max() <= 24
        assert set(got.nsp_labels.tolist()) <= {IS_NEXT, NOT_NEXT}
    assert truncated > 10


def test_sample_map_cache_is_reused_and_a_bad_file_rebuilt(tmp_path, monkeypatch):
    _, offsets, doc_starts = corpus(300, 9)
    builds = []
    real_build = bert.build_sample_map
    monkeypatch.setattr(bert, "build_sample_map", lambda *args: builds.append(args) or real_build(*args))
    fresh = real_build(offsets, doc_starts, 32, 0.1, 5)

    first = sample_map_cached(tmp_path, offsets, doc_starts, 32, 0.1, 5)
    second = sample_map_cached(tmp_path, offsets, doc_starts, 32, 0.1, 5)
    assert len(builds) == 1 and isinstance(second, np.memmap)
    assert np.array_equal(first, fresh) and np.array_equal(second, fresh)
    (path,) = tmp_path.glob("*.npy")
    sample_map_cached(tmp_path, offsets, doc_starts, 32, 0.1, 6)  # another seed: another file
    assert len(builds) == 2 and len(list(tmp_path.glob("*.npy"))) == 2
    assert not list(tmp_path.glob("*tmp*"))

    data = path.read_bytes()
    wrong = fresh.copy()
    wrong[[0, 1], END] += [1, -1]  # loads fine, but is not this corpus's map
    for bad in (data[: len(data) // 2], b"", b"not an npy file", None):
        if bad is None:
            np.save(path, wrong)
        else:
            path.write_bytes(bad)
        before = len(builds)
        assert np.array_equal(sample_map_cached(tmp_path, offsets, doc_starts, 32, 0.1, 5), fresh)
        assert len(builds) == before + 1
        assert path.read_bytes() == data
    assert np.array_equal(sample_map_cached(None, offsets, doc_starts, 32, 0.1, 5), fresh)
