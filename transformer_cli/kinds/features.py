"""Examples -> encoded features under a model's tokenizer: `[CLS] a [SEP] (b [SEP])` for texts and pairs, or
`[CLS] pieces [SEP]` with a tag at each word's first piece for tagging. The kinds (kinds/<name>.py) choose which,
and what a label becomes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformer_cli.models.losses import IGNORE
from transformer_cli.vocab.bert_tokenizer import BertTokenizer, pack


@dataclass
class Features:
    """Encoded examples: ids and token types per example, its label (a class id, a float, a multi-hot row, or
    per-position tags with IGNORE), and, for tagging, the position of each word's first piece."""

    ids: list[list[int]] = field(default_factory=list)
    types: list[list[int]] = field(default_factory=list)
    labels: list[Any] = field(default_factory=list)
    first_pieces: list[list[int]] = field(default_factory=list)
    truncated: int = 0  # examples cut to max_seq_len
    words_lost: int = 0  # tagging: words cut off with them (predicted as the first label, scored as wrong)

    def __len__(self) -> int:
        return len(self.ids)


def encode_texts(
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    labels: Sequence[Any] | None,
    max_len: int,
) -> Features:
    """`[CLS] a [SEP] (b [SEP])` for each example, cut to `max_len` (longest side first)."""
    a_ids = tokenizer.encode(list(texts))
    b_ids = tokenizer.encode(list(pairs)) if pairs is not None else [None] * len(a_ids)
    out = Features()
    for i, (a, b) in enumerate(zip(a_ids, b_ids)):
        ids, types, cut = pack(a, b, max_len, tokenizer.cls_id, tokenizer.sep_id)
        out.ids.append(ids)
        out.types.append(types)
        out.labels.append(labels[i] if labels is not None else None)
        out.truncated += cut
    return out


def encode_tagged(
    tokenizer: BertTokenizer, sentences: Sequence[Sequence[str]], tags: Sequence[Sequence[int]] | None, max_len: int
) -> Features:
    """`[CLS] pieces [SEP]` for each sentence; a word's tag sits at its first piece, IGNORE elsewhere."""
    out = Features()
    for i, words in enumerate(sentences):
        ids, labels, firsts = [tokenizer.cls_id], [IGNORE], []
        for j, pieces in enumerate(tokenizer.encode_words(list(words))):
            if len(ids) + len(pieces) > max_len - 1:
                pieces = pieces[: max(0, max_len - 1 - len(ids))]
                if not pieces:
                    break
            firsts.append(len(ids))
            ids += pieces
            labels += [tags[i][j] if tags is not None else IGNORE] + [IGNORE] * (len(pieces) - 1)
        if len(firsts) < len(words) or len(ids) + 1 > max_len:
            out.truncated += 1
            out.words_lost += len(words) - len(firsts)
        ids, labels = ids[: max_len - 1] + [tokenizer.sep_id], labels[: max_len - 1] + [IGNORE]
        out.ids.append(ids)
        out.types.append([0] * len(ids))
        out.labels.append(labels)
        out.first_pieces.append(firsts)
    return out
