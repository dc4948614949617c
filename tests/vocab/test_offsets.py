"""BertTokenizer.encode_with_offsets: the pieces `encode` gives, each with the characters of the text it stands for."""

from __future__ import annotations

import pytest

from transformer_cli.vocab.bert_tokenizer import BertTokenizer
from transformer_cli.vocab.spm import train_vocab

TEXTS = [
    "Attendance was 71,088 at Levi's Stadium in the U.S. on February 7, 2016.",
    "Ünïcode  café ½ ﬁne — the  Ōtsuka  𝔘nit   ",
    "   Leading spaces, a\ttab and\na newline.",
    "北京是中国的首都，人口约2,189万。東京は日本の首都です。",
    "",
]
CORPUS = TEXTS[:4] * 5 + [f"The quick brown fox jumps over the lazy dog {i} times." for i in range(50)]


def spm_tokenizer(model_type: str = "unigram", size: int = 300) -> BertTokenizer:
    vocab = train_vocab(
        CORPUS,
        size,
        model_type,
        pad_piece="[PAD]",
        unk_piece="[UNK]",
        control_symbols=("[CLS]", "[SEP]", "[MASK]"),
        bos_eos=False,
    )
    return BertTokenizer("sentencepiece", vocab.model_bytes)


def hf_tokenizer(lowercase: bool = True) -> BertTokenizer:
    implementations = pytest.importorskip("tokenizers.implementations", reason="the finetune extra (tokenizers)")
    wordpiece = implementations.BertWordPieceTokenizer(lowercase=lowercase, strip_accents=lowercase or None)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wordpiece.train_from_iterator(CORPUS, vocab_size=200, special_tokens=specials, show_progress=False)
    return BertTokenizer("hf", wordpiece.to_str().encode("utf-8"))


@pytest.fixture(scope="module", params=["spm-unigram", "spm-char", "hf-lower", "hf-cased"])
def tokenizer(request) -> BertTokenizer:
    kind, variant = request.param.split("-")
    if kind == "spm":
        return spm_tokenizer(variant, 300 if variant == "unigram" else 500)
    return hf_tokenizer(variant == "lower")


def test_the_pieces_are_those_of_encode(tokenizer):
    assert [ids for ids, _ in tokenizer.encode_with_offsets(TEXTS)] == tokenizer.encode(TEXTS)


def test_offsets_cover_the_text_in_order_without_whitespace(tokenizer):
    for text, (ids, offsets) in zip(TEXTS, tokenizer.encode_with_offsets(TEXTS)):
        assert len(offsets) == len(ids)
        previous_end = 0
        for begin, end in offsets:
            assert previous_end <= begin <= end <= len(text)
            assert text[begin:end] == text[begin:end].strip()
            previous_end = end
        # round trip: the pieces' characters, in order, are the text's without its whitespace
        assert "".join(text[b:e] for b, e in offsets) == "".join(text.split())


def test_pieces_map_back_to_the_text_as_written():
    (ids, offsets), *_ = spm_tokenizer().encode_with_offsets(["Ünïcode ½ at 71,088 in the U.S."])
    text = "Ünïcode ½ at 71,088 in the U.S."
    covered = [text[b:e] for b, e in offsets if e > b]
    assert "½" in covered  # NFKC reads it as "1⁄2": its pieces still stand for the one character
    hf = hf_tokenizer(lowercase=True)
    (_, offsets), *_ = hf.encode_with_offsets(["Ōtsuka Café"])
    assert [("Ōtsuka Café")[b:e] for b, e in offsets][0].startswith("Ō")  # lower-cased, accents stripped: Ō as written


@pytest.mark.parametrize("form", ["offset_mapping", "immutable_proto", "serialized_proto"])
def test_every_form_of_sentencepiece_offsets_gives_the_same(form):
    """The forms different sentencepiece releases give (the newest's character offsets, 0.2.0's immutable
    protos, the serialized protos read here) agree, on texts long enough for offsets of several varint bytes
    (past 127 and 16,383) in the serialized form."""
    vocab = spm_tokenizer().vocab
    texts = [*TEXTS, " ".join(TEXTS) * 300]
    assert len(texts[-1].encode()) > 1 << 14
    try:
        vocab.sp.encode(["a b"], out_type=form)
    except Exception:
        pytest.skip(f"this sentencepiece has no out_type={form!r}")
    want = vocab.encode_with_offsets(texts)  # the form found for this sentencepiece
    vocab._offsets_form = form
    assert vocab.encode_with_offsets(texts) == want
    assert [ids for ids, _ in want] == vocab.encode(texts)
