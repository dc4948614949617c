"""Sentencepiece vocabularies: trained once per run from the training text, saved, and carried as bytes
inside every checkpoint so that a checkpoint alone is enough to translate."""

from __future__ import annotations

import io
import itertools
import random
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm

from transformer_cli.core.cjk import IDEOGRAPH_CLASS, cjk_share
from transformer_cli.core.errors import UserError
from transformer_cli.core.text import stream_lines

# sentencepiece's trainer gives other pieces on another thread count (1, 2 and 4 threads: three different
# vocabularies of the toy corpus), so it is fixed, not the machine's cores: the same data and settings give the
# same vocabulary on every machine.
TRAIN_THREADS = 2

# split_cjk: a character the text never holds (a private-use one) marks the bounds sentencepiece's trainer may not
# merge across (its pretokenization_delimiter, dropped from the pieces). With one on each side of every ideograph no
# piece holds an ideograph and anything else, so the model itself encodes each ideograph as a token of its own:
# nothing marks the text at encoding, and decoding gives it back without added spaces.
_CJK_BOUND = "\ue000"
_IDEOGRAPH = re.compile(f"([{IDEOGRAPH_CLASS}])")

# sentencepiece's advice: cover 99.95% of the characters of text with a rich character set (Chinese, Japanese),
# all of them otherwise (vocab.character_coverage: auto).
CJK_COVERAGE = 0.9995
CJK_LANGS = frozenset({"zh", "ja", "ko", "cmn", "yue", "wuu", "zho", "chi", "jpn", "kor", "lzh"})

# Ids fixed for every tcli vocabulary.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class Vocab:
    """A sentencepiece model plus the special ids the models rely on."""

    def __init__(self, model_bytes: bytes):
        self.model_bytes = bytes(model_bytes)
        if not self.model_bytes:  # sentencepiece takes it as a model of no pieces, and logs at every lookup
            raise RuntimeError("the file is empty, not a sentencepiece model")
        self.sp = spm.SentencePieceProcessor(model_proto=self.model_bytes)
        self.pad_id, self.unk_id = self.sp.pad_id(), self.sp.unk_id()
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()
        self._offsets_form: str | None = None  # how this sentencepiece gives offsets: found at first use

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and other.model_bytes == self.model_bytes

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self.sp.encode(lines)

    def encode_with_offsets(self, lines: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """The pieces of each line (those `encode` gives) and the (begin, end) character offsets of the line, as
        given before sentencepiece's normalisation, that each piece stands for."""
        if self._offsets_form is None:
            self._offsets_form = _offsets_form(self.sp)
        if self._offsets_form == "offset_mapping":
            return [
                (m["ids"], [tuple(o) for o in m["offsets"]]) for m in self.sp.encode(lines, out_type="offset_mapping")
            ]
        if self._offsets_form == "immutable_proto":
            protos = self.sp.encode(lines, out_type="immutable_proto")
            pieces = [[(p.id, p.begin, p.end) for p in proto.pieces] for proto in protos]
        else:
            pieces = [_piece_offsets(data) for data in self.sp.encode(lines, out_type="serialized_proto")]
        return [_in_characters(line, line_pieces) for line, line_pieces in zip(lines, pieces)]

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.sp.decode(ids)

    def piece_to_id(self, piece: str) -> int:
        return self.sp.piece_to_id(piece)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.model_bytes)

    @classmethod
    def load(cls, path: Path) -> Vocab:
        try:
            return cls(path.read_bytes())
        except (OSError, RuntimeError) as e:
            raise UserError(f"cannot load the vocabulary {path}: {e}") from None


def _offsets_form(sp: spm.SentencePieceProcessor) -> str:
    """The fastest form of an encoding with offsets that this sentencepiece gives: "offset_mapping" (character
    offsets, in the newest releases), "immutable_proto" (byte offsets; refused after 0.2.0), else the
    "serialized_proto" every release gives, read here ("proto" would need protobuf installed, and is the
    serialized bytes in 0.2.0)."""
    for form in ("offset_mapping", "immutable_proto"):
        try:
            sp.encode(["a b"], out_type=form)
        except Exception:  # an unknown form is a ValueError in some releases, a RuntimeError in others
            continue
        return form
    return "serialized_proto"


def _in_characters(line: str, pieces: list[tuple[int, int, int]]) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids, character offsets) from (id, begin byte, end byte) of each piece of `line`."""
    char_at = [0] * (len(line.encode("utf-8")) + 1)
    at = 0
    for i, ch in enumerate(line):
        size = len(ch.encode("utf-8"))
        char_at[at : at + size] = [i] * size
        at += size
    char_at[at] = len(line)
    return [p for p, _, _ in pieces], [(char_at[b], char_at[e]) for _, b, e in pieces]


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def _piece_offsets(data: bytes) -> list[tuple[int, int, int]]:
    """(id, begin, end) of each piece of a serialized SentencePieceText: its field 2 holds the pieces, each with
    id (field 2), begin (4) and end (5) as varints; the other fields (text, surface, score) are skipped."""
    pieces, i = [], 0
    while i < len(data):
        key, i = _varint(data, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(data, i)
            continue
        if wire in (1, 5):  # a fixed 64- or 32-bit value (the score is a float)
            i += 8 if wire == 1 else 4
            continue
        if wire != 2:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        size, i = _varint(data, i)
        if key >> 3 == 2:
            fields, j, end = {}, i, i + size
            while j < end:
                k, j = _varint(data, j)
                if k & 7 == 0:
                    fields[k >> 3], j = _varint(data, j)
                elif k & 7 == 2:
                    length, j = _varint(data, j)
                    j += length
                else:
                    j += 8 if k & 7 == 1 else 4
            pieces.append((fields.get(2, 0), fields.get(4, 0), fields.get(5, 0)))
        i += size
    return pieces


def train_vocab(
    lines: Iterable[str],
    size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    max_sentences: int = 1_000_000,
    seed: int = 1,
    pad_piece: str = "<pad>",
    unk_piece: str = "<unk>",
    control_symbols: tuple[str, ...] = (),
    bos_eos: bool = True,
    source: str = "the training text",
    split_cjk: bool = False,
) -> Vocab:
    """Train a sentencepiece model in memory; `size` is an upper bound (small corpora get fewer pieces).

    Ids: pad 0, unk 1, then bos 2 and eos 3 (`bos_eos`), then `control_symbols` in order.
    `source` names the text in errors. `split_cjk`: no piece joins a CJK ideograph to another character (but
    sentencepiece's word-start mark), so that every ideograph is a token, as in the Chinese BERTs.
    """
    sample = [line for line in lines if line.strip()]
    if not sample:
        raise UserError(f"cannot train a vocabulary: {source} holds no text")
    if len(sample) > max_sentences:
        sample = random.Random(seed).sample(sample, max_sentences)
    bounds = {}
    if split_cjk:
        sample = [_IDEOGRAPH.sub(rf"{_CJK_BOUND}\1{_CJK_BOUND}", line.replace(_CJK_BOUND, "")) for line in sample]
        bounds = {"pretokenization_delimiter": _CJK_BOUND}
    out = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample),
            model_writer=out,
            vocab_size=size,
            model_type=model_type,
            character_coverage=character_coverage,
            hard_vocab_limit=False,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID if bos_eos else -1,
            eos_id=EOS_ID if bos_eos else -1,
            pad_piece=pad_piece,
            unk_piece=unk_piece,
            control_symbols=list(control_symbols),
            input_sentence_size=0,  # all of `sample`, already drawn above (spm refuses sizes 1-100)
            shuffle_input_sentence=False,
            minloglevel=2,
            num_threads=TRAIN_THREADS,
            **bounds,
        )
    except RuntimeError as e:
        detail = " ".join(str(e).split())
        chars = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", detail)
        if chars:
            raise UserError(
                f"vocab.size {size} is too small for {source}: its characters and the special pieces "
                f"need {chars.group(2)}; raise vocab.size or lower vocab.character_coverage"
            ) from None
        detail = detail[:200]
        raise UserError(
            f"sentencepiece could not train a vocabulary of up to {size} pieces on {source} "
            f"({len(sample)} lines): {detail}; a small corpus needs a smaller vocab.size, or add text"
        ) from None
    return Vocab(out.getvalue())


def resolve_coverage(value: float | str, langs: Iterable[str], text: Iterable[str]) -> float:
    """vocab.character_coverage as a number: `auto` is CJK_COVERAGE when a language code is Chinese, Japanese or
    Korean (zh, zh-TW, ja_JP, ...) or when the `text` (a sample of the training lines) is mostly CJK, else 1.0."""
    if value != "auto":
        return float(value)
    if any(lang.lower().replace("_", "-").split("-")[0] in CJK_LANGS for lang in langs):
        return CJK_COVERAGE
    return CJK_COVERAGE if cjk_share("".join(text)) > 0.5 else 1.0


def head_lines(paths: Iterable[Path], lines: int = 10_000) -> Iterator[str]:
    """The first `lines` lines of each file (what vocab.character_coverage: auto looks at)."""
    for path in paths:
        blocks = stream_lines(path)
        yield from itertools.islice(itertools.chain.from_iterable(blocks), lines)
        blocks.close()


def load_model_file(path: str | Path, key: str = "vocab.model") -> Vocab:
    """A user's own sentencepiece model (`vocab.model`); a missing or unreadable file is one line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{key}: {path} is not a file; give the path of a sentencepiece .model")
    return Vocab.load(path)


def check_translation_vocab(vocab: Vocab, source: str) -> None:
    """Translation models rely on <pad> 0, <unk> 1, <s> 2, </s> 3 (the ids tcli trains vocabularies with)."""
    have = (vocab.pad_id, vocab.unk_id, vocab.bos_id, vocab.eos_id)
    if have != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise UserError(
            f"{source} has pad/unk/bos/eos ids {'/'.join(map(str, have))}, tcli needs 0/1/2/3: train it "
            "with spm_train --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3, or leave vocab.model unset"
        )


BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4 in every tcli BERT vocabulary


def check_bert_vocab(vocab: Vocab, source: str) -> None:
    ids = [vocab.piece_to_id(p) for p in BERT_SPECIALS]
    if ids != list(range(len(BERT_SPECIALS))):
        raise UserError(
            f"{source}: the vocabulary does not hold {', '.join(BERT_SPECIALS)} at ids 0-4; it is not a BERT vocabulary"
        )
