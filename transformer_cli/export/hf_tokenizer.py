"""A Hugging Face fast tokenizer (tokenizer.json) that encodes exactly like a tcli BERT vocabulary.

tcli encodes text with sentencepiece; `AutoTokenizer.from_pretrained(folder)` must give the same ids.
The tokenizers-library pipeline is rebuilt from the sentencepiece model itself, in sentencepiece's order:
  normalizer    the model's own precompiled character map (nmt_nfkc unless the model says otherwise),
                then its whitespace rules (strip, collapse runs of spaces, spaces -> "▁");
  pre-tokenizer Metaspace: the "▁" dummy prefix sentencepiece adds to every encoded text;
  model         Unigram with the pieces and their log-probabilities (a char model too: its pieces are single
                characters, so both split every character apart), or BPE with merges ranked by the
                score of the merged piece (sentencepiece's BPE merges the best-scoring pair first);
                an unknown character becomes [UNK] (id 1), consecutive unknowns one [UNK], as in sentencepiece;
  post-processor [CLS] A [SEP] (single) and [CLS] A [SEP] B [SEP] with token types 0 / 1 (pairs).
The JSON is written directly (the tokenizers library is not a tcli dependency); the layout follows what
`tokenizers.Tokenizer.to_str()` writes, and HF's `convert_slow_tokenizer.SpmConverter` is the reference
for the sentencepiece details.
"""

from __future__ import annotations

import base64
from typing import Any

from transformer_cli.vocab.spm import Vocab

SPACE = "▁"  # U+2581, sentencepiece's visible space
# sentencepiece_model.proto: ModelProto.SentencePiece.Type and TrainerSpec.ModelType
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE, CHAR = 1, 2, 4
SPECIALS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


def model_proto(vocab: Vocab) -> Any:
    """The parsed sentencepiece ModelProto of a vocabulary."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(vocab.model_bytes)
    return proto


def tokenizer_json(vocab: Vocab) -> dict[str, Any]:
    """The tokenizer.json document for a tcli BERT vocabulary ([PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4)."""
    proto = model_proto(vocab)
    spec = proto.normalizer_spec
    ids = {piece: vocab.piece_to_id(piece) for piece in SPECIALS.values()}
    prepend = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "always", "split": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added(i, piece) for piece, i in sorted(ids.items(), key=lambda kv: kv[1])],
        "normalizer": _normalizer(spec),
        "pre_tokenizer": prepend if spec.add_dummy_prefix else None,
        "post_processor": _template(ids["[CLS]"], ids["[SEP]"]),
        "decoder": prepend
        if spec.add_dummy_prefix
        else {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        "model": _model(proto),
    }


def _added(i: int, piece: str) -> dict[str, Any]:
    return {
        "id": i,
        "content": piece,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _replace(pattern: str, content: str, regex: bool = False) -> dict[str, Any]:
    return {"type": "Replace", "pattern": {"Regex" if regex else "String": pattern}, "content": content}


def _normalizer(spec: Any) -> dict[str, Any]:
    steps = []
    if spec.precompiled_charsmap:
        steps.append(
            {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(spec.precompiled_charsmap).decode("ascii")}
        )
    if spec.remove_extra_whitespaces:  # only spaces: sentencepiece leaves other whitespace alone
        steps += [_replace(r"\A +| +\z", "", regex=True), _replace(" {2,}", " ", regex=True)]
    if spec.escape_whitespaces:
        steps.append(_replace(" ", SPACE))
    if spec.add_dummy_prefix:
        # Metaspace adds no prefix to a text that already starts with "▁"; sentencepiece always adds one.
        steps.append(_replace(rf"\A{SPACE}", SPACE * 2, regex=True))
    return {"type": "Sequence", "normalizers": steps}


def _template(cls_id: int, sep_id: int) -> dict[str, Any]:
    def special(piece: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": piece, "type_id": type_id}}

    def sequence(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    return {
        "type": "TemplateProcessing",
        "single": [special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0)],
        "pair": [special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0), sequence("B", 1), special("[SEP]", 1)],
        "special_tokens": {
            piece: {"id": piece, "ids": [i], "tokens": [piece]} for piece, i in (("[CLS]", cls_id), ("[SEP]", sep_id))
        },
    }


def _model(proto: Any) -> dict[str, Any]:
    pieces = [(p.piece, p.score, p.type) for p in proto.pieces]
    unk_id = proto.trainer_spec.unk_id
    byte_fallback = bool(proto.trainer_spec.byte_fallback)
    # A char model's pieces are single characters: as a Unigram model it has one segmentation, the same.
    if proto.trainer_spec.model_type in (UNIGRAM, CHAR):
        return {
            "type": "Unigram",
            "unk_id": unk_id,
            "vocab": [[piece, score] for piece, score, _ in pieces],
            "byte_fallback": byte_fallback,
        }
    if proto.trainer_spec.model_type == BPE:
        return {
            "type": "BPE",
            "dropout": None,
            "unk_token": pieces[unk_id][0],
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": byte_fallback,
            "ignore_merges": False,
            "vocab": {piece: i for i, (piece, _, _) in enumerate(pieces)},
            "merges": bpe_merges(pieces),
        }
    raise ValueError(f"sentencepiece model type {proto.trainer_spec.model_type} has no HF equivalent here")


def bpe_merges(pieces: list[tuple[str, float, int]]) -> list[list[str]]:
    """Every split of a normal piece into two normal pieces, best-scoring merged piece first.

    Sentencepiece's BPE merges, at each step, the adjacent pair whose concatenation is the piece with the
    highest score; ranking the merges by that score makes the tokenizers library merge in the same order.
    """
    normal = {piece: (score, i) for i, (piece, score, kind) in enumerate(pieces) if kind == NORMAL}
    ranked = []
    for piece, (score, i) in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-score, i, left, right))
    return [[left, right] for _, _, left, right in sorted(ranked)]


def tokenizer_config(max_positions: int) -> dict[str, Any]:
    """tokenizer_config.json: a PreTrainedTokenizerFast over tokenizer.json, with BERT's special tokens."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **SPECIALS,
        "model_max_length": max_positions,
        "padding_side": "right",
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
    }


def special_tokens_map() -> dict[str, str]:
    return dict(SPECIALS)
