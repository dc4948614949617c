"""Extractive question answering (SQuAD, `task.kind: span`): questions -> windowed features with start/end labels,
and start/end logits -> answers, as BERT (Devlin et al., 2019, section 4.2-4.3) and HF run_qa.py do.

Features: `[CLS] question [SEP] window [SEP]`, the question cut to `max_query_len` pieces (BERT's run_squad.py;
run_qa.py keeps it whole), the context in windows of what is left of `max_seq_len`, consecutive windows sharing
`doc_stride` pieces (the meaning of run_qa.py's `stride`, the overlap; BERT's run_squad.py steps by it instead).
Each context piece keeps the character range of the context it stands for, so that an answer is cut out of the
context as written ("1,000", "U.S.", accents), never rebuilt from pieces.

Decoding: over all windows of a question, the best span by start + end logit with end >= start and at most
`max_answer_len` pieces; SQuAD v2: no answer ("") when the null score (the [CLS] position's, the least over the
windows) beats that span by more than `null_threshold` (run_qa.py's null_score_diff_threshold).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from transformer_cli.core.errors import UserError, finite_number
from transformer_cli.data.squad import Question, version_2
from transformer_cli.kinds.base import Kind
from transformer_cli.metrics.squad import squad_v1, squad_v2
from transformer_cli.vocab.bert_tokenizer import BertTokenizer

if TYPE_CHECKING:
    from transformer_cli.config import FinetuneRunConfig

CLS = 0  # position of [CLS]: the label of a window without the answer, and the null score's position


@dataclass(frozen=True)
class SpanFeature:
    """One window of one question: `[CLS] question [SEP] window [SEP]`."""

    question: int  # index of its question in the list encoded
    ids: list[int]
    context_start: int  # position of the window's first context piece (after [CLS] question [SEP])
    window: tuple[int, int]  # the window is the context's pieces [first, end)
    # the character ranges of all the context's pieces, one list shared by its windows and questions: a copy per
    # window would take as much memory as the ids again
    context_offsets: Sequence[tuple[int, int]]
    start: int  # label: position of the answer's first piece, CLS when this window does not hold all of it
    end: int  # label: position of its last piece, CLS likewise

    @property
    def types(self) -> list[int]:
        """Token types: 0 up to the first [SEP], 1 after it."""
        return [0] * self.context_start + [1] * (len(self.ids) - self.context_start)

    @property
    def offsets(self) -> list[tuple[int, int] | None]:
        """The character range in the context of each position's piece; None where it is no context piece."""
        first, end = self.window
        return [None] * self.context_start + list(self.context_offsets[first:end]) + [None]


def check_span_sizes(max_seq_len: int, doc_stride: int, max_query_len: int) -> None:
    """The windows must move forward: the pieces left for the context after the longest question, [CLS] and two
    [SEP]s must be more than the overlap."""
    room = max_seq_len - max_query_len - 3
    if min(doc_stride, max_query_len) < 1 or room <= doc_stride:
        raise UserError(
            f"data.doc_stride {doc_stride} must be at least 1 and less than the {room} context pieces a window has "
            f"(max_seq_len {max_seq_len} - max_query_len {max_query_len} - 3 for [CLS] and two [SEP]); "
            "lower doc_stride or max_query_len, or raise max_seq_len"
        )


def answer_pieces(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """(first, last) piece of the characters [start, end) of the context: the first piece ending after `start`
    and the last beginning before `end`, so an answer that starts or ends inside a piece takes all of it; None
    when no piece covers any of them. Whitespace at the answer's ends is not part of it (no piece holds any)."""
    first = next((i for i, (_, e) in enumerate(offsets) if e > start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


def span_features(
    questions: Sequence[Question],
    tokenizer: BertTokenizer,
    max_seq_len: int = 384,
    doc_stride: int = 128,
    max_query_len: int = 64,
) -> list[SpanFeature]:
    """The windows of every question, in order; labels from each question's first answer (as run_qa.py and
    BERT train on), CLS for a question without one."""
    check_span_sizes(max_seq_len, doc_stride, max_query_len)
    # run_qa.py strips the question's leading whitespace: some SQuAD questions have a lot of it
    query_ids = tokenizer.encode([q.question.lstrip() for q in questions])
    contexts = list(dict.fromkeys(q.context for q in questions))  # SQuAD asks ~5 questions of each context
    pieces = dict(zip(contexts, tokenizer.encode_with_offsets(contexts)))
    features = []
    for n, (q, query) in enumerate(zip(questions, query_ids)):
        ids, offsets = pieces[q.context]
        query = query[:max_query_len]
        head = [tokenizer.cls_id, *query, tokenizer.sep_id]
        room = max_seq_len - len(head) - 1
        answer = None
        if q.answers:
            a = q.answers[0]
            text = a.text.strip()
            begin = a.start + len(a.text) - len(a.text.lstrip())
            answer = answer_pieces(offsets, begin, begin + len(text))
        for w0 in _window_starts(len(ids), room, room - doc_stride):
            w1 = min(w0 + room, len(ids))
            start = end = CLS
            # a window without the whole answer is labelled CLS in v1 too, as run_qa.py and BERT do: dropping it
            # would train only on windows that hold an answer, yet decoding compares spans across every window
            # of a question, and this is what teaches the model to score spans low where there is none
            if answer is not None and w0 <= answer[0] and answer[1] < w1:
                start, end = len(head) + answer[0] - w0, len(head) + answer[1] - w0
            features.append(
                SpanFeature(n, [*head, *ids[w0:w1], tokenizer.sep_id], len(head), (w0, w1), offsets, start, end)
            )
    return features


def _window_starts(pieces: int, room: int, step: int) -> list[int]:
    """Window starts 0, step, 2 step, ... up to the first window that reaches the end (tokenizers' overflow)."""
    starts = [0]
    while starts[-1] + room < pieces:
        starts.append(starts[-1] + step)
    return starts


# ----------------------------------------------------------------------------- batches


@dataclass
class SpanBatch:
    input_ids: Tensor  # (B, T)
    segment_ids: Tensor  # (B, T)
    starts: Tensor  # (B,) start labels
    ends: Tensor  # (B,) end labels
    real_tokens: int
    pad_id: int = 0

    @property
    def labels(self) -> Tensor:
        """(B, 2): each row's start and end label, as the head takes them."""
        return torch.stack([self.starts, self.ends], dim=1)

    @property
    def items(self) -> int:
        return self.rows

    @property
    def counts(self) -> dict[str, int]:
        return {"items": self.rows}

    @property
    def throughput_tokens(self) -> int:
        return self.real_tokens

    @property
    def rows(self) -> int:
        return self.input_ids.size(0)

    def shard(self, rank: int, world: int) -> SpanBatch | None:
        """Rows rank, rank + world, ... of a global batch; None if there are none."""
        if world == 1:
            return self
        ids = self.input_ids[rank::world]
        if ids.size(0) == 0:
            return None
        parts = (ids, self.segment_ids[rank::world], self.starts[rank::world], self.ends[rank::world])
        return SpanBatch(*parts, int(ids.ne(self.pad_id).sum()), self.pad_id)

    def to(self, device: torch.device) -> SpanBatch:
        nb = device.type == "cuda"
        moved = (t.to(device, non_blocking=nb) for t in (self.input_ids, self.segment_ids, self.starts, self.ends))
        return SpanBatch(*moved, self.real_tokens, self.pad_id)


def collate_spans(
    features: Sequence[SpanFeature], rows: Sequence[int], pad_id: int, length: int | None = None
) -> SpanBatch:
    """Rows of `features` padded to the longest of them (or to `length`)."""
    T = length or max(len(features[r].ids) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    types = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(features[r].ids)
        ids[i, :n] = torch.tensor(features[r].ids)
        types[i, features[r].context_start : n] = 1
    starts = torch.tensor([features[r].start for r in rows], dtype=torch.long)
    ends = torch.tensor([features[r].end for r in rows], dtype=torch.long)
    return SpanBatch(ids, types, starts, ends, sum(len(features[r].ids) for r in rows), pad_id)


# ----------------------------------------------------------------------------- logits -> answers


@dataclass(frozen=True)
class Span:
    """A candidate answer: characters [start, end) of the context."""

    text: str
    start: int
    end: int
    score: float  # start logit + end logit
    start_logit: float
    end_logit: float
    probability: float = 0.0  # softmax of the scores over the n-best list


@dataclass(frozen=True)
class SpanPrediction:
    id: str
    text: str  # the answer; "" for "no answer" (SQuAD v2), or when no span could be taken
    n_best: list[Span]  # the best spans, best first, each character range once
    null_score: float  # start + end logit at CLS, the least over the question's windows
    null_diff: float  # null_score - the best span's score (inf without one): evaluate-v2.0.py's no-answer score


def decode_spans(
    questions: Sequence[Question],
    features: Sequence[SpanFeature],
    start_logits: Sequence[Sequence[float]] | np.ndarray | Tensor,
    end_logits: Sequence[Sequence[float]] | np.ndarray | Tensor,
    max_answer_len: int = 30,
    n_best: int = 20,
    version_2: bool = False,
    null_threshold: float = 0.0,
) -> list[SpanPrediction]:
    """One prediction per question, in order, from the logits of each feature (rows may be padded beyond
    the feature's length: only its context positions count)."""
    if max_answer_len < 1 or n_best < 1:
        raise UserError(f"max_answer_len ({max_answer_len}) and n_best ({n_best}) must be at least 1")
    # per question: (char start, char end) -> (score, start logit, end logit), the best over its windows
    spans: list[dict[tuple[int, int], tuple[float, float, float]]] = [{} for _ in questions]
    null = [math.inf] * len(questions)
    for f, feature in enumerate(features):
        s = np.asarray(_row(start_logits, f), dtype=np.float64)
        e = np.asarray(_row(end_logits, f), dtype=np.float64)
        null[feature.question] = min(null[feature.question], float(s[CLS] + e[CLS]))
        found = spans[feature.question]
        context = questions[feature.question].context
        for where, scores in _best_in_window(context, feature, s, e, max_answer_len, n_best):
            if where not in found or found[where][0] < scores[0]:
                found[where] = scores
    out = []
    for q, question in enumerate(questions):
        ranked = sorted(spans[q].items(), key=lambda item: -item[1][0])[:n_best]
        weights = [math.exp(score - ranked[0][1][0]) for _, (score, _, _) in ranked]  # the best is 1: no overflow
        total = sum(weights)
        best = [
            Span(question.context[a:b], a, b, score, start, end, w / total)
            for ((a, b), (score, start, end)), w in zip(ranked, weights)
        ]
        diff = null[q] - best[0].score if best else math.inf
        text = best[0].text if best else ""
        if version_2 and diff > null_threshold:
            text = ""
        out.append(SpanPrediction(question.id, text, best, null[q], diff))
    return out


def _row(logits: Sequence[Sequence[float]] | np.ndarray | Tensor, i: int) -> np.ndarray:
    row = logits[i]
    return row.detach().float().cpu().numpy() if isinstance(row, Tensor) else np.asarray(row)


def _best_in_window(
    context: str, feature: SpanFeature, s: np.ndarray, e: np.ndarray, max_len: int, n_best: int
) -> list[tuple[tuple[int, int], tuple[float, float, float]]]:
    """The `n_best` best spans of one window as ((char start, char end), (score, start logit, end logit)), each
    character range once. Every valid (start, end) is scored, not only the 20 best starts by the 20 best ends
    as run_qa.py does (which can miss the best valid span)."""
    first, last = feature.window
    if last == first:
        return []
    c0, c1 = feature.context_start, feature.context_start + last - first  # the window's positions
    offsets = feature.context_offsets
    ends = np.concatenate([e[c0:c1], np.full(max_len - 1, -np.inf)])
    band = np.lib.stride_tricks.sliding_window_view(ends, max_len)  # (n, max_len): row i, ends i .. i+max_len-1
    scores = (s[c0:c1, None] + band).ravel()  # (n * max_len,): start i, end i + k at i * max_len + k
    found: dict[tuple[int, int], tuple[float, float, float]] = {}
    # the best few first (some are skipped: duplicates, pieces without text); the whole order only if they run out
    few = min(scores.size, 4 * n_best)
    best = np.argpartition(-scores, few - 1)[:few]
    for order in (best[np.argsort(-scores[best], kind="stable")], np.argsort(-scores, kind="stable")):
        for flat in order.tolist():
            score = float(scores[flat])
            if not math.isfinite(score) or len(found) == n_best:
                return list(found.items())
            a, b = c0 + flat // max_len, c0 + flat // max_len + flat % max_len
            char_start, char_end = offsets[first + a - c0][0], offsets[first + b - c0][1]
            raw = context[char_start:char_end]
            text = raw.strip()
            # a span ending at a piece that stands for no character of its own (sentencepiece's lone "▁") would
            # end in the whitespace before the next word; one of such pieces alone is no answer
            char_start += len(raw) - len(raw.lstrip())
            char_end = char_start + len(text)
            if text and (char_start, char_end) not in found:
                found[(char_start, char_end)] = (score, float(s[a]), float(e[b]))
        if few == scores.size:
            break
    return list(found.items())


# ----------------------------------------------------------------------------- the kind (task.kind: span)


@dataclass(frozen=True)
class SpanSettings:
    """What a QA model's windows and decoding take, stored in its checkpoint (FinetuneMeta.settings): `tcli
    predict` and `tcli evaluate` cut and decode as its training did."""

    doc_stride: int = 128
    max_query_len: int = 64
    max_answer_len: int = 30
    n_best: int = 20
    null_threshold: float = 0.0
    version_2: bool = False  # trained on SQuAD v2 (some questions unanswerable): it may answer nothing

    def state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: Any, source: str) -> SpanSettings:
        try:
            settings = cls(**state)
        except TypeError:
            settings = None
        ints = ("doc_stride", "max_query_len", "max_answer_len", "n_best")
        if (
            settings is None
            or not all(type(getattr(settings, k)) is int and getattr(settings, k) >= 1 for k in ints)
            or not isinstance(settings.version_2, bool)
            or not finite_number(settings.null_threshold)
        ):
            raise UserError(f"{source}: the stored settings of its span head are damaged; use another checkpoint")
        return replace(settings, null_threshold=float(settings.null_threshold))


@dataclass
class SpanFeatures:
    """Every window of a list of questions, with what the shared fine-tuning code reads of features."""

    windows: list[SpanFeature]
    truncated: int = 0  # questions cut to max_query_len
    words_lost: int = 0

    def __post_init__(self) -> None:
        self.ids = [w.ids for w in self.windows]
        # predict_logits keeps these positions of each row's logits: all of them, (T, 2) per window
        self.first_pieces = [slice(0, len(w.ids)) for w in self.windows]

    def __len__(self) -> int:
        return len(self.windows)


class SpanExtraction(Kind):
    """Extractive QA: the answer is a span of the context, chosen by a start and an end logit at every position
    (BertQuestionAnswering); scored by SQuAD's exact match and F1 (v2's rules when a question has no answer)."""

    name = "span"
    per_token = True
    has_label_set = False
    fewest_labels = most_labels = 0
    hf_class = "BertForQuestionAnswering"
    problem_type = None

    def outputs(self, labels: Sequence[str]) -> int:
        return 2

    def hf_labels(self, labels: Sequence[str]) -> list[str]:
        return ["LABEL_0", "LABEL_1"]  # transformers' default for its 2 outputs

    def describe_outputs(self, labels: Sequence[str]) -> str:
        return "start and end logits"

    def settings_of(self, cfg: FinetuneRunConfig, data: Any) -> SpanSettings:
        d, t = cfg.data, cfg.task
        v2 = version_2(data.train) or version_2(data.valid)
        return SpanSettings(d.doc_stride, d.max_query_len, t.max_answer_len, t.n_best, t.null_threshold, v2)

    def read_settings(self, state: Any, source: str) -> SpanSettings:
        return SpanSettings.from_state(state, source)

    def head(self, encoder: Any, outputs: int, dropout: float) -> nn.Module:
        from transformer_cli.models.heads import BertQuestionAnswering

        return BertQuestionAnswering(encoder)

    def features(self, meta: Any, examples: list[Any]) -> SpanFeatures:
        s: SpanSettings = meta.settings
        windows = span_features(examples, meta.tokenizer, meta.max_seq_len, s.doc_stride, s.max_query_len)
        cut = sum(n > s.max_query_len for n in map(len, meta.tokenizer.encode([q.question.lstrip() for q in examples])))
        return SpanFeatures(windows, cut)

    def collate(self, features: Any, rows: Sequence[int], pad_id: int, length: int | None) -> SpanBatch:
        return collate_spans(features.windows, rows, pad_id, length)

    def describe_features(self, meta: Any, split: str, examples: list[Any], features: Any) -> str:
        n = features.truncated
        cut = f"; {n:,} question{'s' if n != 1 else ''} cut to max_query_len" if n else ""
        v2 = f", {sum(not q.answers for q in examples):,} unanswerable" if version_2(examples) else ""
        return f"{split}: {len(examples):,} questions{v2} in {len(features):,} windows{cut}"

    def decide_examples(
        self, meta: Any, examples: list[Any], features: Any, logits: list[Tensor]
    ) -> tuple[list[Any], list[float]]:
        """One SpanPrediction per question, and its confidence: the answer's probability among the n best, or
        for no answer that of the null score against the best span."""
        s: SpanSettings = meta.settings
        starts, ends = [row[:, 0] for row in logits], [row[:, 1] for row in logits]
        preds = decode_spans(
            examples, features.windows, starts, ends, s.max_answer_len, s.n_best, s.version_2, s.null_threshold
        )
        probs = [p.n_best[0].probability if p.text else 1 / (1 + math.exp(-min(p.null_diff, 700))) for p in preds]
        return preds, probs

    def score(self, meta: Any, metrics: Sequence[str], examples: list[Any], preds: list[Any]) -> dict[str, float]:
        """SQuAD's scores: evaluate-v1.1.py's, or evaluate-v2.0.py's (HasAns_, NoAns_, the best threshold of the
        no-answer score) when the questions or the model are v2."""
        golds = {q.id: [a.text for a in q.answers] for q in examples}
        texts = {p.id: p.text for p in preds}
        if not (version_2(examples) or meta.settings.version_2):
            return squad_v1(golds, texts)
        null_diffs = {p.id: p.null_diff for p in preds}
        v2 = squad_v2(golds, texts, null_diffs, meta.settings.null_threshold)
        out = {"exact_match": v2["exact"], "f1": v2["f1"]}
        out.update({k: float(v) for k, v in v2.items() if k.startswith(("HasAns_", "NoAns_", "best_"))})
        return {k: v for k, v in out.items() if not k.endswith("_total")}

    def format(self, meta: Any, example: Any, pred: Any, prob: float) -> str:
        start = pred.n_best[0].start if pred.text else None
        return json.dumps({"id": example.id, "answer": pred.text, "score": round(prob, 6), "start": start}) + "\n"
