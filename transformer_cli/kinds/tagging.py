"""Tagging: a tag per word (CoNLL files), read at each word's first piece (the other pieces carry no label);
every position's hidden state, a linear layer to the tags and softmax cross-entropy; scored by conlleval's
entity F1. Words beyond max_seq_len are tagged O without being read (and scored as such)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from transformer_cli.kinds.base import Kind, Meta
from transformer_cli.kinds.features import Features, encode_tagged


class Tagging(Kind):
    name = "tagging"
    per_token = True
    fewest_labels = 1
    hf_class = "BertForTokenClassification"
    problem_type = None

    def features(self, meta: Meta, examples: list[Any]) -> Features:
        index = {label: i for i, label in enumerate(meta.labels)}
        tagged = all(ex.tags is not None for ex in examples)
        tags = [[index[t] for t in ex.tags] for ex in examples] if tagged else None
        return encode_tagged(meta.tokenizer, [ex.words for ex in examples], tags, meta.max_seq_len)

    def decide(self, meta: Meta, logits: list[Tensor]) -> tuple[list[Any], list[float]]:
        """Per-word tag ids, and the sentence's mean probability."""
        preds: list[Any] = []
        probs: list[float] = []
        for row in logits:
            p = row.softmax(-1)
            preds.append(p.argmax(-1).tolist())
            probs.append(float(p.max(-1).values.mean()) if p.numel() else 1.0)
        return preds, probs

    def scored(self, meta: Meta, examples: list[Any], preds: list[Any]) -> tuple[list[Any], list[Any]]:
        gold = [list(ex.tags) for ex in examples]
        return [[meta.labels[i] for i in p] + ["O"] * (len(g) - len(p)) for p, g in zip(preds, gold)], gold

    def warnings(self, meta: Meta, examples: list[Any], preds: list[Any]) -> list[str]:
        # tagged O below, unread: said, as translate says of a long line
        return [
            f"warning: line {ex.line}: {len(pred)} of its {len(ex.words)} words fit the model's max_seq_len "
            f"({meta.max_seq_len} pieces); the other {len(ex.words) - len(pred)} are tagged O without being read: "
            "split the sentence"
            for ex, pred in zip(examples, preds)
            if len(pred) < len(ex.words)
        ]

    def format(self, meta: Meta, example: Any, pred: Any, prob: float) -> str:
        tags = [meta.labels[i] for i in pred] + ["O"] * (len(example.words) - len(pred))  # cut off: O
        return "".join(f"{w} {t}\n" for w, t in zip(example.words, tags)) + "\n"
