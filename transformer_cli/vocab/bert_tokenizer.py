"""The tokenizer of a model to fine-tune: a tcli sentencepiece vocabulary, or a Hugging Face folder's own
tokenizer (its tokenizer.json, or a WordPiece vocab.txt rebuilt as the fast BertTokenizer does), so that the
pieces are exactly those the encoder was pretrained on.

A fine-tuned checkpoint carries its tokenizer as bytes (`state()`): predict, evaluate and export need nothing
else. The `tokenizers` library is imported only for an HF tokenizer (the `finetune` extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformer_cli.core.errors import UserError

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise UserError("a Hugging Face tokenizer needs the tokenizers package: pip install -e '.[finetune]'") from None
    return tokenizers


class BertTokenizer:
    """Pieces for texts and words, and the special ids BERT inputs need.

    kind "sentencepiece": `data` is a tcli BERT vocabulary (its .model bytes); kind "hf": `data` is a
    tokenizers JSON (tokenizer.json)."""

    def __init__(self, kind: str, data: bytes, source: str = "the tokenizer"):
        self.kind, self.data = kind, bytes(data)
        if kind == "sentencepiece":
            from transformer_cli.vocab.spm import Vocab, check_bert_vocab

            try:
                self.vocab = Vocab(self.data)
            except Exception:  # sentencepiece raises RuntimeError, or worse, for bytes it cannot parse
                raise UserError(f"{source}: not a valid sentencepiece model") from None
            check_bert_vocab(self.vocab, source)
            self.size = len(self.vocab)
            ids = [self.vocab.piece_to_id(p) for p in SPECIALS]
        elif kind == "hf":
            try:
                self.tok = _tokenizers().Tokenizer.from_str(self.data.decode("utf-8"))
            except Exception as e:  # tokenizers raises its own Exception type for a malformed JSON
                raise UserError(f"{source}: not a readable tokenizers JSON ({str(e)[:120]})") from None
            # transformers turns a tokenizer.json's own truncation and padding off at each call: so does tcli (a
            # stored max_length of 2 cut every example to 2 pieces, and a fixed padding put [PAD]s inside them)
            self.tok.no_truncation()
            self.tok.no_padding()
            # ids run up to the largest one (a vocab.txt with a token twice has gaps): the embedding must hold it
            self.size = max(self.tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
            ids = [self.tok.token_to_id(p) for p in SPECIALS]
            if None in ids:
                missing = SPECIALS[ids.index(None)]
                raise UserError(f"{source}: the tokenizer has no {missing} token; it is not a BERT tokenizer")
        else:
            raise UserError(f"{source}: unknown tokenizer kind {kind!r}")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id = ids

    def __len__(self) -> int:
        return self.size

    @property
    def model_bytes(self) -> bytes:
        """The tokenizer's file (a .model or tokenizer.json): what a run's vocab/ folder holds."""
        return self.data

    @property
    def file_name(self) -> str:
        """Its name in a run's vocab/ folder."""
        return "bert.model" if self.kind == "sentencepiece" else "tokenizer.json"

    def encode(self, texts: list[str]) -> list[list[int]]:
        """The pieces of each text, without special tokens."""
        if self.kind == "sentencepiece":
            return self.vocab.encode(texts)
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """The pieces of each text (those `encode` gives) and, for each piece, the (begin, end) character offsets
        of the original text it came from, whitespace left out: `text[begin:end]` is what the piece stands for as
        written ("1,000", "U.S.", "café"), whatever the tokenizer's normalisation did to it. A piece that stands
        for no character of its own (sentencepiece's lone "▁", the second piece of an NFKC expansion) gets an
        empty range where the text it belongs to begins."""
        if self.kind == "hf":
            return [(e.ids, list(e.offsets)) for e in self.tok.encode_batch(texts, add_special_tokens=False)]
        out = []
        for text, (ids, raw) in zip(texts, self.vocab.encode_with_offsets(texts)):
            offsets = []
            for begin, end in raw:
                surface = text[begin:end]
                stripped = surface.strip()
                if stripped:
                    begin += len(surface) - len(surface.lstrip())
                    end = begin + len(stripped)
                else:
                    begin = end
                offsets.append((begin, end))
            out.append((ids, offsets))
        return out

    def encode_words(self, words: list[str]) -> list[list[int]]:
        """The pieces of each word of a pre-split sentence; a word that yields none gets [UNK], so that every
        word has a first piece to be labelled at."""
        if not words:
            return []
        if self.kind == "sentencepiece":
            pieces = self.vocab.encode(words)
        else:
            enc = self.tok.encode(words, is_pretokenized=True, add_special_tokens=False)
            pieces = [[] for _ in words]
            for piece, word in zip(enc.ids, enc.word_ids):
                if word is not None:
                    pieces[word].append(piece)
        return [p or [self.unk_id] for p in pieces]

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "data": self.data}

    @classmethod
    def from_state(cls, state: Any, source: str) -> BertTokenizer:
        if not isinstance(state, dict) or not isinstance(state.get("data"), bytes | bytearray):
            raise UserError(f"{source}: the stored tokenizer is missing or damaged")
        return cls(str(state.get("kind")), state["data"], source)


def tokenizer_of_hf_folder(folder: Path) -> BertTokenizer:
    """The folder's own tokenizer, as transformers' AutoTokenizer loads it: tokenizer.json if there, else its
    WordPiece vocab.txt, with the settings of tokenizer_config.json (do_lower_case, strip_accents,
    tokenize_chinese_chars, and BertTokenizerFast's defaults where it leaves them out). A BERT tokenizer.json
    takes them too: BertTokenizerFast sets its BertNormalizer from them, whatever tokenizer.json says."""
    config = folder / "tokenizer_config.json"
    settings = _json_object(config) if config.is_file() else {}
    path = folder / "tokenizer.json"
    if path.is_file():
        data = path.read_bytes()
        if _bert_tokenizer_class(folder, settings):
            data = _with_normalizer_flags(data, _flags(settings, config), str(path))
        return BertTokenizer("hf", data, str(path))
    vocab = folder / "vocab.txt"
    if not vocab.is_file():
        raise UserError(
            f"{folder}: no tokenizer.json or vocab.txt; fine-tuning needs the model's own tokenizer "
            "(a folder written by tcli export-hf, or a BERT folder with its WordPiece vocab.txt)"
        )
    flags = _flags(settings, config)
    try:
        wordpiece = _tokenizers().implementations.BertWordPieceTokenizer(
            str(vocab),
            lowercase=flags["do_lower_case"],
            strip_accents=flags["strip_accents"],
            handle_chinese_chars=flags["tokenize_chinese_chars"],
            clean_text=True,
        )
    except Exception as e:  # tokenizers raises its own types for a vocabulary it cannot read or use
        raise UserError(f"{vocab}: not a usable WordPiece vocabulary ({str(e).splitlines()[0][:120]})") from None
    return BertTokenizer("hf", wordpiece.to_str().encode("utf-8"), str(vocab))


# BertTokenizerFast's settings of its BertNormalizer and their defaults (strip_accents None: as do_lower_case)
BERT_FLAGS = (("do_lower_case", True), ("strip_accents", None), ("tokenize_chinese_chars", True))


def _flags(settings: dict, config: Path) -> dict[str, bool | None]:
    flags = {}
    for key, default in BERT_FLAGS:
        value = settings.get(key, default)
        if not (isinstance(value, bool) or (value is None and default is None)):  # as transformers refuses them
            raise UserError(
                f"{config}: {key} is {str(value)[:40]!r}; it must be true or false"
                f"{' (or null)' if default is None else ''}"
            )
        flags[key] = value
    return flags


def _bert_tokenizer_class(folder: Path, settings: dict) -> bool:
    """Whether AutoTokenizer makes a BertTokenizer(Fast) of the folder: tokenizer_config.json names that class,
    or names none and config.json is a BERT's (tcli export-hf names PreTrainedTokenizerFast)."""
    named = settings.get("tokenizer_class")
    if named is not None:
        return named in ("BertTokenizer", "BertTokenizerFast")
    model = folder / "config.json"
    return model.is_file() and _json_object(model).get("model_type", "bert") == "bert"


def _with_normalizer_flags(data: bytes, flags: dict[str, bool | None], source: str) -> bytes:
    try:
        spec = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UserError(f"{source}: not a readable tokenizers JSON ({str(e)[:120]})") from None
    normalizer = spec.get("normalizer") if isinstance(spec, dict) else None
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        return data  # (BertTokenizerFast changes only a BertNormalizer)
    wanted = {
        "lowercase": flags["do_lower_case"],
        "strip_accents": flags["strip_accents"],
        "handle_chinese_chars": flags["tokenize_chinese_chars"],
    }
    if all(normalizer.get(key) == value for key, value in wanted.items()):
        return data  # the file's own bytes: a run started from it resumes with the same tokenizer hash
    normalizer.update(wanted)
    return json.dumps(spec, ensure_ascii=False).encode("utf-8")


def _json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UserError(f"cannot read {path} as JSON: {str(e)[:120]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data


def pack(
    a: list[int], b: list[int] | None, max_len: int, cls_id: int, sep_id: int
) -> tuple[list[int], list[int], bool]:
    """`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` and its token types, cut to `max_len` positions by removing
    the last piece of the longer side until it fits (HF's longest_first); returns (ids, types, truncated)."""
    a, b = list(a), (list(b) if b is not None else None)
    budget = max_len - (3 if b is not None else 2)
    truncated = len(a) + len(b or []) > budget
    while len(a) + len(b or []) > budget:
        if b is None or len(a) > len(b):
            a.pop()
        else:
            b.pop()
    ids = [cls_id, *a, sep_id]
    types = [0] * len(ids)
    if b is not None:
        ids += [*b, sep_id]
        types += [1] * (len(b) + 1)
    return ids, types, truncated
