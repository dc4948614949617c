"""Properties of the translation model and its decoding: each test can fail on a real bug."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_cli.models.layers import MultiHeadAttention, dropout_attention, sinusoidal_positions
from transformer_cli.models.losses import IGNORE, projected_smoothed_cross_entropy, smoothed_cross_entropy
from transformer_cli.models.transformer import Transformer
from transformer_cli.translation.decode import beam_search, greedy_search, memory_slots, reference_beam_search

PAD, BOS, EOS = 0, 2, 3


def tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    args = dict(
        src_vocab_size=40,
        tgt_vocab_size=40,
        d_model=32,
        heads=4,
        ffn_dim=64,
        enc_layers=2,
        dec_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    args.update(kw)
    return Transformer(**args).eval()


def random_src(B: int, T: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 40, (B, T), generator=g)


def test_positional_encoding_formula():
    d = 16
    table = sinusoidal_positions(50, d)
    for i in (0, 1, 7, 49):
        for j in range(d // 2):
            angle = i / 10000 ** (2 * j / d)
            assert table[i, 2 * j].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[i, 2 * j + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_changes_no_real_position(norm_first):
    model = tiny(norm_first=norm_first)
    src, tgt = random_src(3, 7), random_src(3, 5, seed=2)
    ref = model(src, tgt)
    padded_src = torch.cat([src, torch.full((3, 4), PAD)], 1)
    padded_tgt = torch.cat([tgt, torch.full((3, 3), PAD)], 1)
    out = model(padded_src, padded_tgt)
    torch.testing.assert_close(out[:, :5], ref, atol=1e-5, rtol=1e-5)


def test_padding_of_other_rows_changes_nothing():
    model = tiny()
    a, b = random_src(1, 6), random_src(1, 9, seed=3)
    tgt = random_src(1, 4, seed=4)
    alone = model(a, tgt)
    batch_src = torch.cat([torch.cat([a, torch.full((1, 3), PAD)], 1), b])
    together = model(batch_src, torch.cat([tgt, tgt]))
    torch.testing.assert_close(together[:1], alone, atol=1e-5, rtol=1e-5)


def test_causal_mask_future_token_never_changes_earlier_output():
    model = tiny()
    src, tgt = random_src(2, 6), random_src(2, 8, seed=5)
    base = model(src, tgt)
    changed = tgt.clone()
    changed[:, 5:] = (changed[:, 5:] + 7) % 36 + 4
    out = model(src, changed)
    torch.testing.assert_close(out[:, :5], base[:, :5], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out[:, 5:], base[:, 5:], atol=1e-3)


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_with_cache_equals_full_forward(norm_first):
    model = tiny(norm_first=norm_first)
    src, tgt = random_src(3, 7), random_src(3, 6, seed=6)
    src[0, 5:] = PAD
    full = model(src, tgt)  # (B, T, V)
    memory, pad_mask = model.encode(src)
    state = model.start_decoding(memory, pad_mask, max_len=6)
    steps = [model.decode_step(tgt[:, t : t + 1], state) for t in range(6)]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_cross_attention_groups_beams_without_copying_memory():
    """Rows r*B of hypotheses attend to their own sentence's keys (the beam layout of decode_step)."""
    model = tiny()
    src, tgt = random_src(2, 5), random_src(2, 3, seed=7)
    memory, pad_mask = model.encode(src)
    state = model.start_decoding(memory, pad_mask, max_len=3)
    rows = tgt.repeat_interleave(3, dim=0)  # (6, 3): three identical beams per sentence
    out = torch.stack([model.decode_step(rows[:, t : t + 1], state) for t in range(3)], 1)
    ref = model(src, tgt).repeat_interleave(3, dim=0)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_beam_one_equals_greedy():
    model = tiny()
    src = random_src(6, 8, seed=8)
    src[1, 4:] = PAD
    greedy = greedy_search(model, src, BOS, EOS, max_len_a=1.0, max_len_b=5)
    beam = beam_search(model, src, BOS, EOS, beam=1, max_len_a=1.0, max_len_b=5)
    assert [h[0].tokens for h in beam] == greedy
    assert any(len(g) > 0 for g in greedy)


def test_beam_search_is_batch_invariant_and_sorted():
    model = tiny()
    src = random_src(4, 6, seed=9)
    together = beam_search(model, src, BOS, EOS, beam=4, nbest=4, max_len_b=6)
    for i in range(4):
        alone = beam_search(model, src[i : i + 1], BOS, EOS, beam=4, nbest=4, max_len_b=6)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        scores = [h.score for h in together[i]]
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("lenpen", [0.6, 1.0, 1.4])
def test_fast_beam_search_equals_plain_reference(lenpen):
    """Cache, batching, grouped cross-attention, finished-sentence removal and the single top-k change
    no result: every n-best list equals the plain one-sentence, no-cache search (fp32)."""
    model = tiny()
    with torch.no_grad():  # make EOS likely enough that hypotheses finish at many different steps
        model.out_proj.weight[EOS] *= 4
    src = random_src(7, 9, seed=12)
    for i, length in enumerate([9, 3, 6, 1, 8, 5, 2]):
        src[i, length:] = PAD
    fast = beam_search(model, src, BOS, EOS, beam=4, lenpen=lenpen, nbest=4, max_len_a=1.0, max_len_b=4)
    lengths = set()
    for i in range(src.size(0)):
        row = src[i : i + 1, : int(src[i].ne(PAD).sum())]
        plain = reference_beam_search(model, row, BOS, EOS, beam=4, lenpen=lenpen, nbest=4, max_len_a=1.0, max_len_b=4)
        assert [h.tokens for h in fast[i]] == [h.tokens for h in plain]
        assert [h.score for h in fast[i]] == pytest.approx([h.score for h in plain], abs=1e-5)
        lengths.update(len(h.tokens) for h in plain)
    assert len(lengths) >= 4  # hypotheses ended at several lengths, not only at the limit


def test_beam_scores_are_length_normalised_log_probs():
    """The reported score equals the model's summed log-probability of the tokens / length**lenpen."""
    model = tiny()
    src = random_src(2, 5, seed=10)
    hyps = beam_search(model, src, BOS, EOS, beam=3, lenpen=0.6, max_len_b=6)
    for i, nbest in enumerate(hyps):
        h = nbest[0]
        seq = torch.tensor([[BOS] + h.tokens + [EOS]])
        logp = F.log_softmax(model(src[i : i + 1], seq[:, :-1]), -1)[0]
        total = logp.gather(-1, seq[0, 1:, None]).sum().item()
        assert h.score == pytest.approx(total / (len(h.tokens) + 1) ** 0.6, abs=1e-4)


def test_beam_respects_max_length():
    model = tiny()
    src = random_src(3, 4, seed=11)
    for nbest in beam_search(model, src, BOS, EOS, beam=3, max_len_a=0.0, max_len_b=3):
        assert all(len(h.tokens) <= 2 for h in nbest)  # 3 tokens including EOS


def test_shared_and_tied_embeddings():
    model = tiny(share_embeddings=True, tie_output=True)
    assert model.src_embed.weight is model.tgt_embed.weight is model.out_proj.weight
    untied = tiny(share_embeddings=False, tie_output=False, tgt_vocab_size=50)
    assert untied.out_proj.weight is not untied.tgt_embed.weight
    assert untied.out_proj.weight.shape == (50, 32)
    with pytest.raises(ValueError, match="one vocabulary"):
        tiny(share_embeddings=True, tgt_vocab_size=50)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("rows, vocab", [(10, 30), (300, 5000)])  # the second spans several chunks
def test_smoothed_cross_entropy_matches_pytorch_value_and_gradient(epsilon, rows, vocab):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(rows, vocab, generator=g, dtype=torch.float64)).requires_grad_()
    target = torch.randint(0, vocab, (rows,), generator=g)
    out = smoothed_cross_entropy(logits, target, epsilon)
    (0.7 * out.loss).backward()
    ours = logits.grad.clone()
    logits.grad = None
    ref = F.cross_entropy(logits, target, label_smoothing=epsilon, reduction="sum")
    (0.7 * ref).backward()
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-9)
    assert out.nll.item() == pytest.approx(F.cross_entropy(logits, target, reduction="sum").item(), rel=1e-9)
    torch.testing.assert_close(ours, logits.grad, rtol=1e-9, atol=1e-12)


def test_smoothed_cross_entropy_in_bf16_keeps_fp32_accuracy():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 1000, generator=g).bfloat16().requires_grad_()
    target = torch.randint(0, 1000, (64,), generator=g)
    out = smoothed_cross_entropy(logits, target, 0.1)
    ref = F.cross_entropy(logits.float(), target, label_smoothing=0.1, reduction="sum")
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-5)
    out.loss.backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("rows", [5, 600])  # one chunk; several, the last one partial
def test_projected_loss_equals_projection_then_loss(rows):
    """The fused vocabulary projection + loss gives the value and the gradients (rows and weight) of F.linear
    followed by the loss; under bf16 autocast, those of the same two steps under autocast."""
    V, d = 5000, 24
    g = torch.Generator().manual_seed(rows)
    h0, w0 = torch.randn(rows, d, generator=g), torch.randn(V, d, generator=g) * 0.2
    target = torch.randint(0, V, (rows,), generator=g)
    target[::7] = IGNORE
    for autocast in (False, True):
        results = []
        for fused in (True, False):
            h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                if fused:
                    out = projected_smoothed_cross_entropy(h, w, target, 0.1)
                else:
                    out = smoothed_cross_entropy(F.linear(h, w), target, 0.1)
            out.loss.backward()
            assert w.grad.dtype == torch.float32
            results.append((out.loss.detach(), out.nll, h.grad, w.grad))
        tol = dict(atol=2e-2, rtol=2e-2) if autocast else dict(atol=1e-4, rtol=1e-5)
        for a, b in zip(*results):
            torch.testing.assert_close(a.float(), b.float(), **tol)


def test_projected_loss_backward_touches_the_softmax_only_in_matmuls():
    """The fused loss's backward reads the saved (M, V) softmax in its two matmuls and makes no other pass over
    a vocabulary-sized tensor: the smoothing constant, the one-hot target and the row weights are applied in
    the d-sized space (a pass over (M, V) costs as much as a matmul at small d)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    M, V, d = 64, 3000, 16
    g = torch.Generator().manual_seed(3)
    h = torch.randn(M, d, generator=g, requires_grad=True)
    w = (torch.randn(V, d, generator=g) * 0.2).requires_grad_()
    target = torch.randint(0, V, (M,), generator=g)
    target[::5] = IGNORE
    out = projected_smoothed_cross_entropy(h, w, target, 0.1)

    class VocabularySized(TorchDispatchMode):
        ops: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            if any(t.numel() >= M * V for t in tensors):
                self.ops.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with VocabularySized() as mode:
        out.loss.backward()
    assert mode.ops <= {"mm", "t", "transpose"}, mode.ops
    assert "mm" in mode.ops


def test_loss_ignores_padding_positions():
    model = tiny()
    src, tgt = random_src(2, 5), random_src(2, 4, seed=12)
    labels = tgt.clone()
    labels[0, 2:] = PAD
    out = model(src, tgt, labels=labels, label_smoothing=0.1)
    assert out.tokens.item() == 6
    logits = model(src, tgt)
    keep = labels.ne(PAD)
    ref = F.cross_entropy(logits[keep], labels[keep], label_smoothing=0.1, reduction="sum")
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-5)
    # Changing the prediction targets at padded positions cannot change the loss.
    tgt2 = tgt.clone()
    tgt2[0, 3] = 9
    assert model(src, tgt2, labels=labels).loss.item() == pytest.approx(model(src, tgt, labels=labels).loss.item())


def test_model_overfits_one_batch():
    torch.manual_seed(0)
    model = tiny().train()
    src, tgt = random_src(4, 6), random_src(4, 5, seed=13)
    labels = torch.cat([tgt[:, 1:], torch.full((4, 1), EOS)], 1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        out = model(src, tgt, labels=labels)
        (out.loss / out.tokens).backward()
        opt.step()
        opt.zero_grad()
    assert (out.loss / out.tokens).item() < 0.05


def test_cpu_dropout_rate_scale_gradient_and_seed():
    from transformer_cli.models.layers import Dropout

    drop = Dropout(0.1).train()
    x = torch.ones(400, 1000, requires_grad=True)
    torch.manual_seed(0)
    y = drop(x)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - 0.1) < 0.003
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # d(sum)/dx = mask / (1 - p)
    torch.manual_seed(0)
    assert torch.equal(drop(x), y)  # the default generator: seeded and resumable
    assert not torch.equal(drop(x), y)
    assert torch.equal(drop.eval()(x), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_dropout_converts_its_mask_once(dtype):
    """The mask is made in the activations' dtype, and forward and backward multiply by it directly: one
    conversion of a mask-sized tensor (bool to that dtype, when it is made). A bool mask made each product convert
    it again, in forward and in backward."""
    from torch.profiler import ProfilerActivity, profile

    from transformer_cli.models.layers import Dropout

    x = torch.randn(6, 7, 32, dtype=dtype, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        y = Dropout(0.1).train()(x)
        y.backward(torch.ones_like(y))
    copies = [e for e in prof.events() if e.name == "aten::copy_" and e.input_shapes[:1] == [list(x.shape)]]
    assert len(copies) == 1
    kept = y.detach() != 0
    torch.testing.assert_close(x.grad, kept.to(dtype) / 0.9)  # the gradient through the same mask


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_dropout_scales_in_one_pass_each_way_with_the_values_of_two(dtype):
    """Forward and backward each apply mask and scale in one pass over the activations (addcmul), where a product
    and then an in-place scaling took two; the values are those of the two passes (x * mask is x or 0, and both
    round x * scale once)."""
    from torch.profiler import ProfilerActivity, profile

    from transformer_cli.models.layers import Dropout

    x = (torch.randn(6, 7, 32) * 10).to(dtype).requires_grad_()
    g = torch.randn(6, 7, 32).to(dtype)
    torch.manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        y = Dropout(0.1).train()(x)
        y.backward(g)
    passes = [
        e.name
        for e in prof.events()
        if e.name in ("aten::mul", "aten::mul_", "aten::addcmul", "aten::div", "aten::where")
        and list(x.shape) in e.input_shapes
    ]
    assert len(passes) == 2, passes
    mask = (y.detach() != 0).to(dtype)
    assert torch.equal(y, x.detach().mul(mask).mul_(1 / 0.9))
    assert torch.equal(x.grad, g.mul(mask).mul_(1 / 0.9))


@pytest.mark.parametrize("causal", [False, True])
def test_training_attention_with_dropout_on_cpu_is_sdpa_with_a_cheaper_mask(causal):
    """dropout_attention (CPU training with attention dropout): at p ~ 0 it is SDPA with the same masks; at
    p = 0.5 about half the weights are dropped and the rest scaled by 2, so outputs average to SDPA's; a row
    of only padded keys (an empty batch row) gives finite outputs and gradients; no bernoulli_ draw."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 6, 8, requires_grad=True) for _ in range(3))
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 4:] = True
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad[:, None, None, :], is_causal=causal)
    torch.testing.assert_close(dropout_attention(q, k, v, pad, causal, 1e-9), reference, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        many = torch.stack([dropout_attention(q, k, v, pad, causal, 0.5) for _ in range(4000)])
    standard_error = many.std(0) / 4000**0.5
    assert ((many.mean(0) - reference).abs() <= 5 * standard_error + 1e-6).all()  # unbiased
    assert (standard_error > 0.002).any()  # the weights were dropped
    pad[2] = True  # sentence 2 has no key at all
    out = dropout_attention(q, k, v, pad, causal, 0.1)
    out.sum().backward()
    assert out.isfinite().all() and all(t.grad.isfinite().all() for t in (q, k, v))

    class Ops(TorchDispatchMode):
        seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(str(func))
            return func(*args, **(kwargs or {}))

    attn = MultiHeadAttention(16, 2, dropout=0.1).train()
    with Ops() as ops:
        attn(torch.randn(2, 5, 16), pad_mask=torch.zeros(2, 5, dtype=torch.bool), causal=causal).sum().backward()
    assert "aten.bmm.default" in ops.seen and not any("bernoulli" in op for op in ops.seen)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_training_attention_copies_no_weights_but_its_dropout_mask_once(dtype):
    """dropout_attention's padding mask is added to the scores (its backward passes the gradient on as it is,
    bitwise the same weights as masked_fill's), and the dropout mask is made in the scores' dtype: in forward and
    backward one copy of a (B, H, T, S) tensor is left, the mask's conversion when it is made. masked_fill copied
    the scores, then their gradient."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 6, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 4:] = True
    pad[2] = True  # a row with no key: averages the values, as before
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out = dropout_attention(q, k, v, pad, False, 0.1)
        out.sum().backward()
    weights = [3, 2, 6, 6]
    copies = [
        e.name for e in prof.events() if e.name in ("aten::copy_", "aten::clone") and e.input_shapes[:1] == [weights]
    ]
    assert copies == ["aten::copy_"]
    assert out.isfinite().all() and all(t.grad.isfinite().all() for t in (q, k, v))


@pytest.mark.parametrize("full", [None, 19, 40, 100])
def test_beam_search_output_is_the_same_with_and_without_row_padding(full):
    """Filling the batch up to a bucket size with copies of a sentence, and the encoder and cross-attention up
    to a fraction of `full` sentences (more than the decoder's rows), changes no hypothesis."""
    model = tiny()
    src = random_src(19, 7, seed=4)  # 19 sentences: run as 20, then fewer as they finish
    src[::3, 4:] = PAD
    padded = beam_search(model, src, BOS, EOS, beam=3, nbest=3, max_len_b=8, full=full)
    plain = beam_search(model, src, BOS, EOS, beam=3, nbest=3, max_len_b=8, pad_rows=False)
    assert [[h.tokens for h in hyps] for hyps in padded] == [[h.tokens for h in hyps] for hyps in plain]
    for a, b in zip(padded, plain):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_memory_slots_are_the_fewest_halvings_that_hold_the_sentences():
    for full in (1, 7, 40, 448, 512):
        levels = {full}
        while min(levels) > 1:
            levels.add((min(levels) + 1) // 2)
        for need in range(1, full + 1):
            slots = memory_slots(need, full)
            assert slots in levels and slots >= need
            assert slots in (full, 1) or (slots + 1) // 2 < need  # one halving fewer would not hold them
        assert len({memory_slots(n, full) for n in range(1, full + 1)}) == len(levels)


def test_a_step_over_fewer_sentences_than_the_memory_gives_their_rows_of_the_full_step():
    """Rows of the first sentences only (the others finished): the attention keeps the memory's shape, and each
    row's logits equal those it has when every sentence's rows are there."""
    model = tiny()
    src, tgt = random_src(4, 6), random_src(4, 3, seed=7)
    memory, pad_mask = model.encode(src)
    rows = tgt.repeat_interleave(2, dim=0)  # (8, 3): two beams per sentence
    full = model.start_decoding(memory, pad_mask, max_len=3, rows_per_sentence=2)
    few = model.start_decoding(memory, pad_mask, max_len=3, rows_per_sentence=2)
    for t in range(3):
        all_rows = model.decode_step(rows[:, t : t + 1], full)
        first_rows = model.decode_step(rows[:6, t : t + 1], few)  # sentences 0-2 of the memory's 4
        torch.testing.assert_close(first_rows, all_rows[:6], atol=1e-5, rtol=1e-5)
        few.select_rows(torch.arange(6))


def test_half_precision_decoding_with_fp32_memory_computes_the_step_attention_in_fp32():
    """memory_dtype=float32 for a bf16 model (how beam search decodes on a CPU): the cross-attention keys stay
    fp32, the step returns bf16 logits close to the fp32 model's, under autocast as without it."""
    model = tiny()
    src, tgt = random_src(3, 7), random_src(3, 4, seed=6)
    with torch.no_grad():
        reference = model(src, tgt)
    half = tiny().to(torch.bfloat16)
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), torch.inference_mode():
            memory, pad_mask = half.encode(src)
            state = half.start_decoding(memory, pad_mask, max_len=4, memory_dtype=torch.float32)
            assert all(k.dtype == v.dtype == torch.float32 for k, v in state.memory_kv)
            steps = torch.stack([half.decode_step(tgt[:, t : t + 1], state) for t in range(4)], 1)
        assert steps.dtype == torch.bfloat16
        torch.testing.assert_close(steps.float(), reference, atol=0.1, rtol=0.05)


@pytest.mark.parametrize(
    "flags, device, expected",
    [
        ("flags : fpu avx2 avx512_bf16 amx_tile amx_bf16", "cpu", None),  # AMX: bf16 steps were faster
        ("flags : fpu avx2 avx512f avx512_bf16", "cpu", torch.float32),  # oneDNN's kernels cost, MKL's fp32 not
        ("flags : fpu avx2 fma", "cpu", torch.float32),
        ("", "cpu", torch.float32),  # no /proc/cpuinfo
        ("flags : fpu avx2 fma", "cuda", None),
    ],
)
def test_decoding_keeps_cross_attention_memory_in_fp32_on_cpus_without_amx(monkeypatch, flags, device, expected):
    from transformer_cli.runtime import cpu
    from transformer_cli.translation import decode

    monkeypatch.setattr(cpu, "flags", lambda: flags)
    assert decode.step_memory_dtype(torch.device(device)) is expected


@pytest.mark.parametrize("which", ["translation", "bert"])
def test_bf16_autocast_training_step_keeps_the_residual_stream_in_bf16(which):
    """Under a CPU's bf16 autocast the residual stream is bf16 (`layers.residual_dtype`): in a training step,
    forward and backward, no activation of the stream's size, (B, T, d), is converted between fp32 and bf16 but
    each embeddings' output (and its gradient, back). With an fp32 stream, every linear layer's input was cast in
    forward and its gradient back in backward. Outside autocast nothing is converted; the loss stays within bf16's
    precision of the fp32 step's."""
    from transformer_cli.models.bert import Bert

    B, T, d = 6, 11, 32
    g = torch.Generator().manual_seed(5)
    if which == "translation":
        embeddings = 2  # source and target
        model = tiny(dropout=0.1).train()
        src, tgt = random_src(B, T), random_src(B, T, seed=2)

        def loss():
            return model(src, tgt, tgt, 0.1).loss
    else:
        embeddings = 1
        torch.manual_seed(0)
        model = Bert(40, d_model=d, layers=2, heads=4, ffn_dim=64, max_positions=64).train()
        ids = torch.randint(4, 40, (B, T), generator=g)
        labels = torch.full_like(ids, IGNORE)
        labels[:, 2::4] = ids[:, 2::4]

        def loss():
            out = model(ids, torch.zeros_like(ids), labels, torch.zeros(B, dtype=torch.long))
            return out.mlm_loss + out.nsp_loss

    class Conversions(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.casts: list[tuple[torch.dtype, torch.dtype]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            src = args[0] if args and isinstance(args[0], torch.Tensor) else None
            stream = src is not None and src.is_floating_point() and src.numel() == B * T * d and src.size(-1) == d
            if stream and isinstance(out, torch.Tensor) and out.dtype != src.dtype and out.is_floating_point():
                self.casts.append((src.dtype, out.dtype))
            return out

    values = {}
    for autocast in (False, True):
        torch.manual_seed(1)  # the same dropout masks
        with Conversions() as mode:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                value = loss()
            value.backward()
        model.zero_grad(set_to_none=True)
        values[autocast] = value.item()
        expected = [(torch.float32, torch.bfloat16)] * embeddings + [(torch.bfloat16, torch.float32)] * embeddings
        assert sorted(mode.casts, key=str) == (sorted(expected, key=str) if autocast else []), mode.casts
    assert values[True] == pytest.approx(values[False], rel=0.02)
