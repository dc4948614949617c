"""BERT: masking statistics, NSP pairs, losses at masked positions only, HF equivalence, bad input."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from transformer_cli.config import BertRunConfig, load_config
from transformer_cli.core.errors import UserError
from transformer_cli.data.bert import (
    IGNORE,
    IS_NEXT,
    NOT_NEXT,
    SpecialIds,
    check_corpus,
    collate_pairs,
    make_instances,
    mask_tokens,
    read_documents,
    split_sentences,
)
from transformer_cli.models.bert import Bert

IDS = SpecialIds(pad=0, cls=2, sep=3, mask=4, first_normal=5, vocab_size=60)


def synthetic_docs(n_docs: int = 40, seed: int = 0, max_sentences: int = 12) -> list[list[list[int]]]:
    """Documents of 1-max_sentences sentences, each a run of 3-12 token ids."""
    rng = random.Random(seed)
    return [
        [[rng.randrange(5, 60) for _ in range(rng.randint(3, 12))] for _ in range(rng.randint(1, max_sentences))]
        for _ in range(n_docs)
    ]


def test_masking_statistics_and_specials_never_masked():
    docs = synthetic_docs(200)
    instances = make_instances(docs, 64, 0.1, random.Random(1))
    input_ids, _, _ = collate_pairs(instances, IDS)
    masked, labels = mask_tokens(input_ids, IDS, 0.15, 20, torch.Generator().manual_seed(0))
    special = (input_ids == IDS.pad) | (input_ids == IDS.cls) | (input_ids == IDS.sep)
    chosen = labels != IGNORE
    assert not (chosen & special).any()
    assert torch.equal(masked[special], input_ids[special])
    assert torch.equal(labels[chosen], input_ids[chosen])
    share = chosen.sum().item() / (~special).sum().item()
    assert 0.14 < share < 0.16
    n = chosen.sum().item()
    to_mask = (masked[chosen] == IDS.mask).sum().item() / n
    unchanged = (masked[chosen] == input_ids[chosen]).sum().item() / n
    assert 0.77 < to_mask < 0.83
    assert 0.08 < unchanged < 0.13  # 10% kept, plus random draws that hit the same token
    assert 0.07 < 1 - to_mask - unchanged < 0.12
    assert (masked[chosen] >= IDS.first_normal).logical_or(masked[chosen] == IDS.mask).all()


def test_masks_are_fresh_per_draw_but_reproducible_from_the_seed():
    input_ids, _, _ = collate_pairs(make_instances(synthetic_docs(), 64, 0.1, random.Random(1)), IDS)
    a = mask_tokens(input_ids, IDS, 0.15, 20, torch.Generator().manual_seed(5))[1]
    b = mask_tokens(input_ids, IDS, 0.15, 20, torch.Generator().manual_seed(5))[1]
    c = mask_tokens(input_ids, IDS, 0.15, 20, torch.Generator().manual_seed(6))[1]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_max_predictions_caps_masked_positions():
    input_ids, _, _ = collate_pairs(make_instances(synthetic_docs(), 128, 0.0, random.Random(2)), IDS)
    _, labels = mask_tokens(input_ids, IDS, 0.5, 7, torch.Generator().manual_seed(0))
    assert labels.ne(IGNORE).sum(1).max().item() == 7


def test_nsp_balanced_and_is_next_pairs_really_consecutive():
    docs = synthetic_docs(300)
    instances = make_instances(docs, 64, 0.1, random.Random(3))
    labels = [x.is_next for x in instances]
    assert 0.45 < sum(labels) / len(labels) < 0.55
    for x in instances:
        assert len(x) <= 64
        assert len(docs[x.a.doc]) >= 2  # one-sentence documents only serve as random B sides
        if x.is_next:
            assert x.b.doc == x.a.doc and x.b.start == x.a.end  # B starts where A ends
            junction = docs[x.a.doc][x.a.end - 1][-1:] + docs[x.b.doc][x.b.start][:1]
            assert x.tokens_a[-1:] + x.tokens_b[:1] == junction  # truncation kept the A|B boundary
        else:
            assert x.b.doc != x.a.doc
    input_ids, segments, nsp = collate_pairs(instances[:5], IDS)
    assert set(nsp.tolist()) <= {IS_NEXT, NOT_NEXT}
    first = instances[0]
    assert input_ids[0, 0] == IDS.cls and input_ids[0, len(first.tokens_a) + 1] == IDS.sep
    a_len = len(first.tokens_a) + 2
    assert segments[0, :a_len].eq(0).all() and segments[0, a_len : len(first)].eq(1).all()


def test_short_sequences_appear_at_the_requested_rate():
    """short_seq_prob draws a random shorter target length; at 1.0 every target is uniform in [2, max]."""
    docs = synthetic_docs(300, seed=4, max_sentences=60)
    mean = {
        p: sum(map(len, xs)) / len(xs)
        for p in (0.0, 0.1, 1.0)
        for xs in [make_instances(docs, 128, p, random.Random(0))]
    }
    assert mean[0.0] > 95  # filled up to max_seq_len (125 content tokens) save document ends
    assert mean[1.0] < 0.7 * mean[0.0]
    assert mean[1.0] < mean[0.1] < mean[0.0]


def tiny_bert(norm_first: bool = False) -> Bert:
    torch.manual_seed(0)
    return Bert(
        vocab_size=60,
        d_model=32,
        layers=2,
        heads=4,
        ffn_dim=64,
        max_positions=64,
        dropout=0.0,
        attention_dropout=0.0,
        norm_first=norm_first,
    ).eval()


def batch(seed: int = 0):
    instances = make_instances(synthetic_docs(seed=seed), 40, 0.1, random.Random(seed))[:6]
    input_ids, segments, nsp = collate_pairs(instances, IDS)
    masked, labels = mask_tokens(input_ids, IDS, 0.15, 20, torch.Generator().manual_seed(seed))
    return masked, segments, labels, nsp


def test_masked_position_logits_equal_full_computation():
    model = tiny_bert()
    ids, seg, labels, nsp = batch()
    full_logits, nsp_logits = model(ids, seg)
    keep = labels != IGNORE
    out = model(ids, seg, labels, nsp)
    ref_mlm = F.cross_entropy(full_logits[keep], labels[keep], reduction="sum")
    assert out.mlm_loss.item() == pytest.approx(ref_mlm.item(), rel=1e-5)
    assert out.nsp_loss.item() == pytest.approx(F.cross_entropy(nsp_logits, nsp, reduction="sum").item(), rel=1e-5)
    assert out.mlm_count == keep.sum().item()
    assert out.mlm_correct.item() == (full_logits[keep].argmax(-1) == labels[keep]).sum().item()


@pytest.mark.parametrize("norm_first", [False, True])
def test_first_only_encoding_equals_the_full_encoders_first_position(norm_first):
    """A [CLS] classifier's encoding (the last block for position 0 alone) gives the full encoder's first row and
    the same gradients, padding included; the other rows would differ if the query, residual or FFN took
    another position's row (the batch has padding, and 2 layers so the block before it is a full one)."""
    model = tiny_bert(norm_first).train()  # training mode: the path fine-tuning takes (dropout 0 here)
    ids, seg, _, _ = batch()
    assert ids.eq(0).any(), "the batch should hold padding"
    full = model.encode(ids, seg)  # (B, T, d)
    first = model.encode(ids, seg, first_only=True)  # (B, 1, d)
    assert first.shape == (ids.size(0), 1, 32)
    torch.testing.assert_close(first, full[:, :1], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(full[:, 1:2], first, atol=1e-3)
    weights = torch.randn(first.shape)
    grads = []
    for out in (full[:, :1], first):
        model.zero_grad()
        (out * weights).sum().backward(retain_graph=True)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6, msg=name)


def test_mlm_loss_ignores_unmasked_and_padding_positions():
    model = tiny_bert()
    ids, seg, labels, nsp = batch(1)
    base = model(ids, seg, labels, nsp).mlm_loss
    relabelled = labels.clone()
    relabelled[(labels == IGNORE) & (ids != IDS.pad)] = IGNORE  # no-op on purpose: unmasked already ignored
    assert model(ids, seg, relabelled, nsp).mlm_loss.item() == pytest.approx(base.item())
    padded_ids = torch.cat([ids, torch.zeros(ids.size(0), 5, dtype=torch.long)], 1)
    padded_seg = torch.cat([seg, torch.zeros_like(seg[:, :5])], 1)
    padded_labels = torch.cat([labels, torch.full((ids.size(0), 5), IGNORE)], 1)
    out = model(padded_ids, padded_seg, padded_labels, nsp)
    assert out.mlm_loss.item() == pytest.approx(base.item(), rel=1e-5)
    # Changing the label of an unmasked position (it stays IGNORE) or a padded position's token changes nothing.
    ids2 = padded_ids.clone()
    ids2[:, -1] = 0
    assert model(ids2, padded_seg, padded_labels, nsp).mlm_loss.item() == pytest.approx(base.item(), rel=1e-5)


def test_mlm_gradient_only_reaches_through_masked_positions():
    """The loss does not depend on the logits of unmasked positions: perturbing the MLM bias of a token that
    is never a target changes the loss only through the softmax normaliser at masked positions."""
    model = tiny_bert()
    ids, seg, labels, nsp = batch(2)
    out = model(ids, seg, labels, nsp)
    (out.mlm_loss / out.mlm_count).backward()
    assert model.mlm_bias.grad.abs().sum() > 0
    n_masked = labels.ne(IGNORE).sum().item()
    # d loss / d bias sums (softmax - onehot) over the masked rows only: it totals zero per row.
    assert model.mlm_bias.grad.sum().item() == pytest.approx(0.0, abs=1e-5 * n_masked)


def test_sentence_splitter():
    text = 'Dr. Smith arrived at 5 p.m. yesterday. He met J. Doe! Was it fun? "Yes." It was 3.5 km away.'
    assert split_sentences(text) == [
        "Dr. Smith arrived at 5 p.m. yesterday.",
        "He met J. Doe!",
        "Was it fun?",
        '"Yes."',
        "It was 3.5 km away.",
    ]


def test_wikitext_documents(tmp_path):
    path = tmp_path / "w.txt"
    path.write_text(
        " \n = Alpha = \n \n A first line . A second one .\n \n = = Section = = \n More text here .\n"
        " = Beta = \n Beta text . And more .\n",
        encoding="utf-8",
    )
    docs = read_documents(path, "wikitext", split=True)
    assert docs == [["A first line .", "A second one .", "More text here ."], ["Beta text .", "And more ."]]


def test_bad_corpora_get_clear_errors(tmp_path):
    with pytest.raises(UserError, match="holds no text"):
        check_corpus([], "empty.txt", "text", False)
    with pytest.raises(UserError, match="single document"):
        check_corpus([[[5, 6], [7]]], "one.txt", "text", False)
    with pytest.raises(UserError, match="no document has two sentences"):
        check_corpus([[[5, 6]], [[7]]], "short.txt", "text", False)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\nok\n\xff\xfe broken\n")
    with pytest.raises(UserError, match=r"bad\.txt line 4: invalid UTF-8"):
        read_documents(bad, "text", split=False)


@pytest.mark.parametrize(
    "docs, fmt, split, advice",
    [
        ([[[5], [6]]], "wikitext", False, "reads data.format: wikitext, where a ' = Title = ' line starts each"),
        ([[[5], [6]]], "text", True, "reads data.format: text, where blank lines separate them"),
        ([[[5]], [[6]]], "text", False, "reads one sentence per line (data.split_sentences: false)"),
        ([[[5]], [[6]]], "wikitext", True, "splits lines into sentences (data.split_sentences: true)"),
    ],
)
def test_a_checkpoints_reading_is_explained_not_changed(docs, fmt, split, advice):
    """tcli evaluate reads a file as its checkpoint's data.format / split_sentences say, which the user cannot change
    there: the advice says how the file is read, never to change the format."""
    with pytest.raises(UserError) as e:
        check_corpus(docs, "in.txt", fmt, split)
    assert advice in str(e.value) and "use data.format" not in str(e.value) and "set data." not in str(e.value)


def test_max_seq_len_above_max_positions_names_both_keys():
    with pytest.raises(UserError, match=r"data\.max_seq_len \(256\) exceeds model\.max_positions \(128\)"):
        load_config(BertRunConfig, None, ["train.max_steps=1", "data.max_seq_len=256", "model.max_positions=128"])


def test_hf_equivalence_of_logits(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install -e .[dev])")
    from transformer_cli.export.hf import from_hf_state_dict, hf_config, to_hf_state_dict

    cfg = load_config(
        BertRunConfig,
        None,
        [
            "train.max_steps=1",
            "model.d_model=32",
            "model.layers=2",
            "model.heads=4",
            "model.ffn_dim=64",
            "model.max_positions=64",
            "data.max_seq_len=64",
        ],
    )
    torch.manual_seed(0)
    ours = Bert(vocab_size=60, d_model=32, layers=2, heads=4, ffn_dim=64, max_positions=64).eval()
    with torch.no_grad():  # non-trivial LayerNorm and bias values, so a swapped name cannot hide
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**hf_config(cfg.model, 60))).eval()
    missing, unexpected = theirs.load_state_dict(to_hf_state_dict(ours.state_dict(), 2), strict=False)
    assert not unexpected and all("decoder" in m for m in missing)  # the tied decoder weight/bias
    theirs.tie_weights()
    ids, seg, _, _ = batch(3)
    ids[0, -3:] = 0  # padding in one row
    attention = (ids != 0).long()
    mlm, nsp = ours(ids, seg)
    ref = theirs(input_ids=ids, token_type_ids=seg, attention_mask=attention)
    real = attention.bool()
    assert (mlm[real] - ref.prediction_logits[real]).abs().max() < 1e-4
    assert (nsp - ref.seq_relationship_logits).abs().max() < 1e-4
    back = from_hf_state_dict(to_hf_state_dict(ours.state_dict(), 2), 2)
    assert all(torch.equal(back[k], v) for k, v in ours.state_dict().items())


def test_pre_norm_bert_normalises_before_each_sublayer_and_once_at_the_end():
    """norm_first: x + Sublayer(LN(x)) in every block, then one LayerNorm; post-norm has no final norm, so its
    parameter names (and every checkpoint written before pre-norm existed) stay as they were."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=60, d_model=32, layers=2, heads=4, ffn_dim=64, max_positions=64)
    model = Bert(**sizes, dropout=0.0, attention_dropout=0.0, norm_first=True).eval()
    for p in model.parameters():  # LayerNorm gains and biases away from 1 and 0, so that each one shows
        torch.nn.init.normal_(p, std=0.3)
    ids, seg, _, _ = batch(3)
    pad_mask = ids.eq(model.pad_id)
    x = model.embeddings(ids, seg)
    for block in model.encoder:
        x = x + block.self_attn(block.attn_sub.norm(x), pad_mask)
        x = x + block.ffn(block.ffn_sub.norm(x))
    expected = model.final_norm(x)
    torch.testing.assert_close(model.encode(ids, seg), expected)
    post = Bert(**sizes).state_dict()
    assert not [k for k in post if k.startswith("final_norm")]
    assert set(model.state_dict()) - set(post) == {"final_norm.weight", "final_norm.bias"}
