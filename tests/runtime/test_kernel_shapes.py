"""The matmul shapes a workload brings after warm-up (runtime/kernel_shapes.py), and oneDNN's kernel count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_cli.core.buckets import buckets_upto
from transformer_cli.models.transformer import Transformer
from transformer_cli.runtime.kernel_shapes import (
    GemmShapes,
    created_again,
    creation_ms,
    ending_sentences_at_random,
    onednn_creations,
)
from transformer_cli.translation.decode import (
    BEAM_STEPS,
    SMALL,
    DecodeOptions,
    decode_corpus,
    memory_slots,
    sentence_slots,
)

BOS, EOS = 2, 3


def test_gemm_shapes_record_linear_matmul_and_attention_in_inference_mode():
    x, w = torch.randn(6, 5, 8), torch.randn(12, 8)
    q = torch.randn(2, 4, 7, 16)
    with torch.inference_mode(), GemmShapes() as shapes:  # composite ops arrive undecomposed here
        F.linear(x, w)
        F.scaled_dot_product_attention(q, q[:, :, :3], q[:, :, :3])
        shapes.mark()
        F.linear(x, w)  # seen: not new
        torch.matmul(q, q.transpose(-2, -1))
    assert ("mm", 1, 30, 12, 8, "float32") in shapes.seen
    assert {("bmm", 8, 7, 3, 16, "float32"), ("bmm", 8, 7, 16, 3, "float32")} <= shapes.seen  # q k^T, then p v
    assert shapes.new == {("bmm", 8, 7, 7, 16, "float32")}


def _lengths(n: int, rng: np.random.Generator) -> list[int]:
    return np.clip(rng.lognormal(np.log(12.0), 0.35, n).round(), 8, 60).astype(int).tolist()


VOCAB, HEADS, D_K = 200, 4, 8
BEAM_OPTS = DecodeOptions(beam=5, max_tokens=600)


@pytest.fixture(scope="module")
def beam_shapes() -> GemmShapes:
    """The matmul shapes of a beam search over 400 sentences of lognormal lengths, with a tiny model whose
    sentences end at random steps (so batches shrink as they do with a trained one)."""
    torch.manual_seed(0)
    model = Transformer(VOCAB, VOCAB, HEADS * D_K, HEADS, 64, 1, 1, dropout=0.0, max_positions=128).eval()
    ending_sentences_at_random(model, EOS)
    rng = np.random.default_rng(0)
    sources = [rng.integers(5, VOCAB, k).tolist() for k in _lengths(400, rng)]
    with torch.inference_mode(), GemmShapes() as shapes:
        decode_corpus(model, sources, BEAM_OPTS, BOS, EOS, torch.device("cpu"), bucketed=True)
    return shapes


def test_beam_search_decodes_in_a_few_row_counts(beam_shapes: GemmShapes):
    """As sentences finish, the decoding steps run on sentence_slots(active sentences) sentences, powers of two
    below SMALL and bucket(n, steps=BEAM_STEPS) above: the vocabulary projection (a decoding step's alone) sees
    only row counts of that set, times the beam."""
    beam = BEAM_OPTS.beam
    rows = {s[2] for s in beam_shapes.seen if s[0] == "mm" and s[3] == VOCAB}
    small = {1, 2, 4, 8, 16}
    allowed = {n * beam for n in small} | {
        n * beam for n in buckets_upto(BEAM_OPTS.max_tokens, steps=BEAM_STEPS) if n >= SMALL
    }
    assert {sentence_slots(n) for n in range(1, SMALL + 1)} == small
    assert rows <= allowed
    assert {r // beam for r in rows} & small  # the tails were decoded at powers of two
    assert len(rows) > 4  # the batch did shrink through several sizes
    assert len(allowed & set(range(1, 40 * beam + 1))) <= 10  # 1..40 sentences: 1, 2, 4, 8, 16, 20, 24, 28, 32, 40


def test_beam_search_cross_attention_takes_the_halvings_of_one_count_per_width(beam_shapes: GemmShapes):
    """The encoder and the decoding steps' cross-attention run on memory_slots(n, full) sentences, full the
    bucket of a whole batch of that source width (the last, smaller batch too): per width, a few counts."""
    # q k^T of a step: (slots * heads) matrices of (beam, d_k) x (d_k, width); the encoder's have M = width >= 9
    counts: dict[int, set[int]] = {}
    for op, batch, m, width, k, _ in beam_shapes.seen:
        if op == "bmm" and m == BEAM_OPTS.beam and k == D_K:
            counts.setdefault(width, set()).add(batch // HEADS)
    assert len(counts) >= 4
    for width, seen in counts.items():
        full = sentence_slots(BEAM_OPTS.max_tokens // width)
        assert seen <= {memory_slots(n, full) for n in range(1, full + 1)}, width
    assert sum(len(seen) for seen in counts.values()) > len(counts)  # the memory did shrink


@pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="torch does not multiply bf16 through oneDNN on this CPU"
)
def test_onednn_creations_count_a_new_shape_once():
    w = torch.randn(56, 72, dtype=torch.bfloat16)
    with onednn_creations() as first:
        F.linear(torch.randn(44, 72, dtype=torch.bfloat16), w)
    with onednn_creations() as again:
        F.linear(torch.randn(44, 72, dtype=torch.bfloat16), w)  # the same shape: from the kernel cache
    assert first["created"] == 1 and again["created"] == 0


def test_a_kernel_created_again_is_one_whose_line_differs_only_in_its_time():
    mm = "onednn_verbose,v1,primitive,create:cache_miss,cpu,matmul,brg_matmul:avx512_core_bf16,undef,src:bf16"
    misses = [f"{mm},,80x64:64x192,0.42", f"{mm},,80x64:64x64,0.29", f"{mm},,80x64:64x192,0.39"]
    assert created_again(misses) == 1
    assert created_again(misses[:2]) == 0
    assert creation_ms(misses) == pytest.approx(0.42 + 0.29 + 0.39)
    assert creation_ms([]) == 0


def test_beam_search_without_buckets_runs_exact_shapes():
    """Where matmuls compile nothing per shape (fp32 on a CPU, GPUs), `decode_corpus` pads nothing: each batch is
    as wide as its longest source, and every step carries only the active sentences' rows, some of them counts
    the bucketed search never takes (that padding changes no hypothesis: tests/test_transformer.py)."""
    torch.manual_seed(0)
    model = Transformer(VOCAB, VOCAB, HEADS * D_K, HEADS, 64, 1, 1, dropout=0.0, max_positions=128).eval()
    ending_sentences_at_random(model, EOS)
    rng = np.random.default_rng(1)
    lengths = _lengths(120, rng)
    sources = [rng.integers(5, VOCAB, k).tolist() for k in lengths]
    for bucketed in (False, True):
        with torch.inference_mode(), GemmShapes() as shapes:
            decode_corpus(model, sources, BEAM_OPTS, BOS, EOS, torch.device("cpu"), bucketed=bucketed)
        rows = {s[2] for s in shapes.seen if s[0] == "mm" and s[3] == VOCAB}
        # The encoder's attention: (sentences * heads) matrices of (width, d_k) x (d_k, width).
        widths = {s[2] for s in shapes.seen if s[0] == "bmm" and s[2] == s[3] and s[4] == D_K}
        if not bucketed:
            assert max(lengths) + 1 in widths  # the first batch: its longest source and EOS, unpadded
            assert {r // BEAM_OPTS.beam for r in rows} - {sentence_slots(n) for n in range(1, 200)}  # odd counts
        else:
            assert {r // BEAM_OPTS.beam for r in rows} <= {sentence_slots(n) for n in range(1, 200)}


def test_translate_buckets_only_where_kernels_are_compiled_per_shape(monkeypatch):
    from transformer_cli.runtime.device import Runtime
    from transformer_cli.translation import translate

    seen = []
    monkeypatch.setattr(translate, "decode_corpus", lambda *a, bucketed, **k: seen.append(bucketed) or [])

    class Vocab:
        def encode(self, lines):
            return [[5, 6] for _ in lines]

    model = Transformer(VOCAB, VOCAB, HEADS * D_K, HEADS, 64, 1, 1, max_positions=32).eval()
    for precision in ("fp32", "bf16"):
        runtime = Runtime.create("cpu", precision)
        translate.Translator(model, Vocab(), Vocab(), runtime).translate(["a b"], BEAM_OPTS)
        assert seen[-1] is runtime.kernel_per_shape is (precision == "bf16")
