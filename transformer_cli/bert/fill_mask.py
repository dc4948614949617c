"""`tcli fill-mask`: the top-k pieces a BERT checkpoint predicts for every [MASK] of a line.

A line is encoded as training encodes text: the text between the literal "[MASK]" markers goes
through the checkpoint's sentencepiece model, the parts are joined by the [MASK] id, and the whole
becomes `[CLS] ... [SEP]` (one segment). Scores are softmax probabilities over the whole vocabulary
at each masked position (what the Hugging Face fill-mask pipeline reports).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_cli.core.errors import UserError
from transformer_cli.models.bert import Bert
from transformer_cli.vocab.spm import Vocab

MASK = "[MASK]"
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 2, 3, 4


@dataclass
class Prediction:
    token: str  # the sentencepiece piece ('▁' marks a word start)
    id: int
    score: float  # probability


@dataclass
class MaskResult:
    position: int  # index in the model input ([CLS] is position 0)
    predictions: list[Prediction]  # best first


def encode_masked(vocab: Vocab, text: str) -> list[int]:
    """[CLS] piece ids of the text between [MASK] markers, joined by the [MASK] id, [SEP]."""
    parts = vocab.encode(text.split(MASK))
    ids = [CLS_ID]
    for k, part in enumerate(parts):
        if k:
            ids.append(MASK_ID)
        ids.extend(part)
    return [*ids, SEP_ID]


def check_lines(lines: list[str], encoded: list[list[int]], max_positions: int) -> None:
    """A line without [MASK], or longer than the model's positions, is a one-line error naming the line."""
    for number, (text, ids) in enumerate(zip(lines, encoded), 1):
        if MASK not in text:
            raise UserError(f"line {number} has no {MASK} to fill: {text[:60]!r}")
        if len(ids) > max_positions:
            raise UserError(
                f"line {number}: {len(ids)} pieces with [CLS] and [SEP], more than the "
                f"{max_positions} positions of this model (model.max_positions); shorten the line"
            )


def fill_mask(
    model: Bert,
    vocab: Vocab,
    lines: list[str],
    top_k: int,
    device: torch.device,
    context: Callable | None = None,
    batch_size: int = 32,
) -> list[list[MaskResult]]:
    """The top_k predictions at every [MASK] of every line (lines checked with `check_lines` first)."""
    from transformer_cli.data.translation import pad_sequences

    encoded = [encode_masked(vocab, text) for text in lines]
    check_lines(lines, encoded, model.embeddings.position.num_embeddings)
    k = min(top_k, len(vocab))
    results: list[list[MaskResult]] = []
    for start in range(0, len(encoded), batch_size):
        ids = pad_sequences(encoded[start : start + batch_size], PAD_ID).to(device)  # (B, T)
        with torch.inference_mode(), context() if context is not None else contextlib.nullcontext():
            hidden = model.encode(ids, torch.zeros_like(ids))  # (B, T, d)
            rows, positions = ids.eq(MASK_ID).nonzero(as_tuple=True)  # (M,), (M,)
            probs = model.mlm_logits(hidden[rows, positions]).float().softmax(-1)  # (M, V)
        top = probs.topk(k, dim=-1)
        batch: list[list[MaskResult]] = [[] for _ in range(ids.size(0))]
        for row, pos, scores, tokens in zip(
            rows.tolist(), positions.tolist(), top.values.tolist(), top.indices.tolist()
        ):
            batch[row].append(
                MaskResult(pos, [Prediction(vocab.sp.id_to_piece(t), t, s) for t, s in zip(tokens, scores)])
            )
        results.extend(batch)
    return results


def format_plain(text: str, masks: list[MaskResult]) -> str:
    lines = [text]
    for n, mask in enumerate(masks, 1):
        shown = "  ".join(f"{p.token} {p.score:.4f}" for p in mask.predictions)
        lines.append(f"  [MASK] {n} (position {mask.position}): {shown}")
    return "\n".join(lines) + "\n"


def format_json(text: str, masks: list[MaskResult]) -> str:
    return (
        json.dumps(
            {
                "text": text,
                "masks": [
                    {
                        "position": m.position,
                        "predictions": [{"token": p.token, "id": p.id, "score": p.score} for p in m.predictions],
                    }
                    for m in masks
                ],
            },
            ensure_ascii=False,
        )
        + "\n"
    )


def run_fill_mask(
    checkpoint: Path,
    text: str | None,
    input_path: Path | None,
    top_k: int = 5,
    as_json: bool = False,
    device: str = "auto",
) -> list[list[MaskResult]]:
    """Read the lines (TEXT or --input), predict, print one block (or one JSON object) per line."""
    from transformer_cli.checkpoint import read_checkpoint
    from transformer_cli.core.streams import open_input
    from transformer_cli.core.text import read_lines
    from transformer_cli.runtime.device import Runtime

    if text is not None and input_path is not None:
        raise UserError("give the text to fill (an argument) or --input FILE, not both")
    if text is not None:
        lines, name = [text], "the text"
    elif input_path is not None and str(input_path) != "-":
        lines, name = read_lines(input_path), str(input_path)
    else:  # no --input, or --input -: stdin, as translate and predict read it
        with open_input(None, sys.stdin) as reader:
            lines, name = list(reader), reader.name
    if not lines:
        raise UserError(f"{name} is empty")
    ckpt = read_checkpoint(checkpoint, kind="bert")
    runtime = Runtime.create(device, "fp32")
    model = ckpt.build_model().to(runtime.device).eval()
    results = fill_mask(model, ckpt.vocabs[0], lines, top_k, runtime.device)
    fmt = format_json if as_json else format_plain
    sys.stdout.write("".join(fmt(line, masks) for line, masks in zip(lines, results)))
    sys.stdout.flush()
    return results
