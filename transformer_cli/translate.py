"""`tcli translate`: a checkpoint alone (weights, config, vocabulary) translates a file or stdin."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from transformer_cli.config import TranslationRunConfig
from transformer_cli.datasets.text import decode_utf8, read_lines
from transformer_cli.decode import DecodeOptions, decode_corpus
from transformer_cli.errors import UserError
from transformer_cli.models.builders import build_transformer
from transformer_cli.models.transformer import Transformer
from transformer_cli.tasks.translation import vocab_from_checkpoint
from transformer_cli.train.checkpoint import load_checkpoint
from transformer_cli.train.runtime import Runtime
from transformer_cli.vocab import BOS_ID, EOS_ID, Vocab


@dataclass
class Translator:
    model: Transformer
    src_vocab: Vocab
    tgt_vocab: Vocab
    runtime: Runtime

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto", precision: str = "auto") -> Translator:
        state = load_checkpoint(path, kind="translation")
        cfg = TranslationRunConfig.model_validate(state["config"])
        src_vocab, tgt_vocab = vocab_from_checkpoint(state)
        model = build_transformer(cfg.model, len(src_vocab), len(tgt_vocab))
        model.load_state_dict(state["model"])
        runtime = Runtime.create(device, precision)
        # Inference needs no fp32 master weights: in bf16/fp16 the weights (and the positions table) are
        # converted once, so no activation or cache is cast back and forth at every decoding step.
        dtype = runtime.autocast_dtype or torch.float32
        return cls(model.to(runtime.device, dtype).eval(), src_vocab, tgt_vocab, runtime)

    def translate(self, lines: list[str], opts: DecodeOptions) -> list[list[tuple[str, float]]]:
        """n-best (text, score) lists in input order; an empty line gets an empty hypothesis."""
        nonempty = [i for i, line in enumerate(lines) if line.strip()]
        sources = self.src_vocab.encode([lines[i] for i in nonempty])
        with torch.inference_mode():
            hyps = decode_corpus(self.model, sources, opts, BOS_ID, EOS_ID, self.runtime.device, self.runtime.context)
        out: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in lines]
        for i, nbest in zip(nonempty, hyps):
            texts = self.tgt_vocab.decode([h.tokens for h in nbest])
            out[i] = [(text, h.score) for text, h in zip(texts, nbest)]
        self.decoded_tokens = sum(len(h[0].tokens) + 1 for h in hyps if h)
        return out


def _read_input(path: Path | None, stdin: TextIO) -> list[str]:
    if path is None or str(path) == "-":
        return decode_utf8(stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode(), "<stdin>")
    return read_lines(path)


def run_translate(checkpoint: Path, input_path: Path | None, output: Path | None, opts: DecodeOptions,
                  reference: Path | None = None, device: str = "auto", precision: str = "auto", quiet: bool = False,
                  stats_json: Path | None = None) -> dict:
    """Translate, write the output, print scores against a reference and speed statistics (stderr)."""
    translator = Translator.from_checkpoint(checkpoint, device, precision)
    lines = _read_input(input_path, sys.stdin)
    refs = read_lines(reference) if reference is not None else None
    if refs is not None and len(refs) != len(lines):
        raise UserError(f"--reference {reference} has {len(refs)} lines but the input has {len(lines)}")
    start = time.perf_counter()
    results = translator.translate(lines, opts)
    seconds = time.perf_counter() - start
    text = "".join(_format(i, nbest, opts.nbest) for i, nbest in enumerate(results))
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        output.write_text(text, encoding="utf-8")
    stats = {"sentences": len(lines), "tokens": translator.decoded_tokens, "seconds": round(seconds, 3),
             "sentences_per_sec": round(len(lines) / seconds, 2) if seconds else 0.0,
             "tokens_per_sec": round(translator.decoded_tokens / seconds, 1) if seconds else 0.0,
             "beam": opts.beam, "device": str(translator.runtime.device), "precision": translator.runtime.precision}
    if refs is not None:
        from transformer_cli.evaluate import translation_scores

        scores = translation_scores([nbest[0][0] for nbest in results], refs)
        stats.update(bleu=round(scores.bleu, 2), bleu_lc=round(scores.bleu_lc, 2), chrf=round(scores.chrf, 2))
        print("\n".join(scores.lines()), file=sys.stderr)
    if not quiet:
        print(f"{stats['sentences']} sentences, {stats['tokens']} tokens in {stats['seconds']:.2f}s: "
              f"{stats['sentences_per_sec']:.1f} sentences/s, {stats['tokens_per_sec']:.0f} tokens/s "
              f"(beam {opts.beam}, {stats['device']}, {stats['precision']})", file=sys.stderr)
    if stats_json is not None:
        stats_json.write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    return stats


def _format(index: int, nbest: list[tuple[str, float]], n: int) -> str:
    if n == 1:
        return nbest[0][0] + "\n"
    return "".join(f"{index}\t{score:.4f}\t{text}\n" for text, score in nbest)

