"""`tcli translate`: a checkpoint alone (weights, config, vocabulary) translates a file or stdin.

It streams: the input is read a chunk of lines at a time, each chunk is translated in length-sorted batches
and its output written, in input order, before the next is read. Memory does not grow with the input
(only --reference keeps the best translations, for the corpus scores), and the first lines come out
after the first small chunk.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch

from transformer_cli.checkpoint import read_checkpoint
from transformer_cli.core.errors import UserError
from transformer_cli.core.streams import check_outputs, chunks, first_chunk, open_input, writer
from transformer_cli.core.text import LineReader, read_lines
from transformer_cli.metrics.bleu import OLD_DEFAULT, translation_scores, usable_tokenizer
from transformer_cli.models.transformer import Transformer
from transformer_cli.runtime.device import Runtime
from transformer_cli.translation.decode import DecodeOptions, decode_corpus
from transformer_cli.vocab.spm import BOS_ID, EOS_ID, Vocab


@dataclass
class Translator:
    model: Transformer
    src_vocab: Vocab
    tgt_vocab: Vocab
    runtime: Runtime
    bleu_tokenize: str = OLD_DEFAULT  # the checkpoint's eval.bleu_tokenize (old checkpoints: 13a)
    tgt_lang: str = "tgt"  # its data.tgt_lang, which `auto` reads

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto", precision: str = "auto") -> Translator:
        ckpt = read_checkpoint(path, kind="translation")
        model = ckpt.build_model()
        src_vocab, tgt_vocab = ckpt.vocabs
        runtime = Runtime.create(device, precision)
        # Inference needs no fp32 master weights: in bf16/fp16 the weights (and the positions table) are
        # converted once, so no activation or cache is cast back and forth at every decoding step.
        dtype = runtime.autocast_dtype or torch.float32
        e, d = ckpt.cfg.eval, ckpt.cfg.data
        return cls(model.to(runtime.device, dtype).eval(), src_vocab, tgt_vocab, runtime, e.bleu_tokenize, d.tgt_lang)

    @property
    def max_source_pieces(self) -> int:
        """The longest source (in pieces, EOS excluded) the positions table covers."""
        return self.model.positions.size(0) - 2

    def translate(
        self, lines: list[str], opts: DecodeOptions, warn=None, first_line: int = 0
    ) -> list[list[tuple[str, float]]]:
        """n-best (text, score) lists in input order; an empty line gets an empty hypothesis.

        A line longer than the model's positions is cut to what they cover, and `warn(message)` is told
        (with the line number, counting `first_line` lines before `lines`) so that it never happens silently.
        """
        nonempty = [i for i, line in enumerate(lines) if line.strip()]
        sources = self.src_vocab.encode([lines[i] for i in nonempty])
        limit = self.max_source_pieces
        for i, ids in zip(nonempty, sources):
            if len(ids) > limit and warn is not None:
                warn(
                    f"warning: line {first_line + i + 1}: {len(ids)} source pieces, more than the {limit} this "
                    f"model's positions cover (model.max_positions); only the first {limit} are translated"
                )
        with torch.inference_mode():
            hyps = decode_corpus(
                self.model,
                sources,
                opts,
                BOS_ID,
                EOS_ID,
                self.runtime.device,
                self.runtime.context,
                bucketed=self.runtime.kernel_per_shape,
            )
        out: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in lines]
        # What attention maps and alignments re-run: line -> (source ids as decoded, n-best token ids).
        self.token_ids = {i: (ids[:limit], [h.tokens for h in nbest]) for i, ids, nbest in zip(nonempty, sources, hyps)}
        for i, nbest in zip(nonempty, hyps):
            texts = self.tgt_vocab.decode([h.tokens for h in nbest])
            out[i] = [(text, h.score) for text, h in zip(texts, nbest)]
        self.decoded_tokens = sum(len(h[0].tokens) + 1 for h in hyps if h)
        return out


# Written to stdout (a terminal, a pipe), the first chunk is small so that its lines come out within a second or
# two; chunks then double up to MAX_CHUNK_LINES, enough lines for length-sorted batches of similar lengths
# (--max-tokens each). Written to --output, where no one reads the first lines as they come, every chunk is
# MAX_CHUNK_LINES: fewer, fuller batches (streams.first_chunk).
FIRST_CHUNK_LINES = 64
MAX_CHUNK_LINES = 4096


@dataclass
class InspectOptions:
    """What `tcli translate` shows of the attention behind its translations (see transformer_cli/attention.py)."""

    attention_dir: Path | None = None  # heatmaps and .npz of the first `attention_max` non-empty lines
    attention_max: int = 10
    print_alignment: bool = False  # an `i-j` line after each output line
    alignment_layer: int | None = None  # decoder layer; None = the second-to-last
    alignment_unit: str = "piece"  # piece | word


def run_translate(
    checkpoint: Path,
    input_path: Path | None,
    output: Path | None,
    opts: DecodeOptions,
    reference: Path | None = None,
    device: str = "auto",
    precision: str = "auto",
    quiet: bool = False,
    stats_json: Path | None = None,
    inspect: InspectOptions | None = None,
    bleu_tokenize: str | None = None,
) -> dict:
    """Translate as the input streams in, print scores against a reference and speed statistics (stderr).
    `inspect` adds attention heatmaps and/or printed alignments of the chosen hypotheses. BLEU against the
    reference uses `bleu_tokenize` (`auto` or a sacreBLEU tokenizer), by default the checkpoint's."""
    check_outputs(
        [("--output", output), ("--stats-json", stats_json)],
        [("--checkpoint", checkpoint), ("--input", input_path), ("--reference", reference)],
    )
    inspect = inspect or InspectOptions()
    if inspect.attention_dir is not None:
        from transformer_cli.core.figures import require_matplotlib
        from transformer_cli.translation.attention import prepare_folder

        require_matplotlib()
        prepare_folder(inspect.attention_dir)
    refs = read_lines(reference) if reference is not None else None
    with ExitStack() as stack:
        lines = stack.enter_context(open_input(input_path, sys.stdin))
        translator = Translator.from_checkpoint(checkpoint, device, precision)
        tokenize = None
        if refs is not None:  # before the translating: a tokenizer that cannot run wastes none of it
            where = "--bleu-tokenize" if bleu_tokenize is not None else f"{checkpoint}'s eval.bleu_tokenize"
            tokenize = usable_tokenizer(bleu_tokenize or translator.bleu_tokenize, translator.tgt_lang, where)
        layer = None
        if inspect.print_alignment:
            from transformer_cli.translation.attention import resolve_layer

            layer = resolve_layer(inspect.alignment_layer, len(translator.model.decoder))
        write = writer(output, stack)
        first = first_chunk(output, FIRST_CHUNK_LINES, MAX_CHUNK_LINES)
        done = _translate_stream(translator, lines, write, opts, layer, inspect, first, keep_best=refs is not None)
    if refs is not None and len(refs) != done.sentences:
        raise UserError(f"--reference {reference} has {len(refs)} lines but the input has {done.sentences}")
    seconds = done.seconds
    stats = {
        "sentences": done.sentences,
        "tokens": done.tokens,
        "seconds": round(seconds, 3),
        "sentences_per_sec": round(done.sentences / seconds, 2) if seconds else 0.0,
        "tokens_per_sec": round(done.tokens / seconds, 1) if seconds else 0.0,
        "beam": opts.beam,
        "device": str(translator.runtime.device),
        "precision": translator.runtime.precision,
    }
    score_lines: list[str] = []
    if tokenize is not None:
        scores = translation_scores(done.best, refs, tokenize)
        stats.update(bleu=round(scores.bleu, 2), bleu_lc=round(scores.bleu_lc, 2), chrf=round(scores.chrf, 2))
        stats.update(bleu_signature=scores.bleu_signature)
        score_lines = scores.lines()
    # The files first, the report after: a file that cannot be written (--stats-json /dev/full) is the one line on
    # stderr, not a line after the report.
    if stats_json is not None:
        _write_text(stats_json, json.dumps(stats, indent=1) + "\n", "--stats-json")
    written = _write_attention(translator, done.shown, inspect.attention_dir) if inspect.attention_dir else 0
    if score_lines:
        print("\n".join(score_lines), file=sys.stderr)
    if not quiet:
        print(
            f"{stats['sentences']} sentences, {stats['tokens']} tokens in {stats['seconds']:.2f}s: "
            f"{stats['sentences_per_sec']:.1f} sentences/s, {stats['tokens_per_sec']:.0f} tokens/s "
            f"(beam {opts.beam}, {stats['device']}, {stats['precision']})",
            file=sys.stderr,
        )
        if inspect.attention_dir is not None:
            print(f"attention of {written} sentences written to {inspect.attention_dir}", file=sys.stderr)
    return stats


@dataclass
class _Streamed:
    """What a run keeps across chunks: totals, and only what the user asked to be kept."""

    sentences: int = 0
    tokens: int = 0  # generated target pieces of the best hypotheses, EOS included
    seconds: float = 0.0  # spent translating (not reading, writing or waiting for input)
    best: list[str] = field(default_factory=list)  # --reference: the best translation of every line
    shown: list[tuple[int, list[int], list[int], str, str]] = field(default_factory=list)
    # --attention: (line index, source ids, target ids, line, translation) of the first non-empty lines


def _translate_stream(
    translator: Translator,
    lines: LineReader,
    write: Callable[[str], None],
    opts: DecodeOptions,
    layer: int | None,
    inspect: InspectOptions,
    first: int,
    keep_best: bool,
) -> _Streamed:
    """Translate chunk by chunk (`first` lines, then doubling), writing each chunk's output before reading on."""
    done = _Streamed()
    for chunk in chunks(lines, first, MAX_CHUNK_LINES):
        start = time.perf_counter()
        results = translator.translate(
            chunk, opts, warn=lambda message: print(message, file=sys.stderr), first_line=done.sentences
        )
        done.seconds += time.perf_counter() - start
        done.tokens += translator.decoded_tokens
        alignments = _alignments(translator, results, layer, inspect.alignment_unit) if layer is not None else None
        write(
            "".join(
                _format(done.sentences + i, nbest, opts.nbest, alignments[i] if alignments else None)
                for i, nbest in enumerate(results)
            )
        )
        if keep_best:
            done.best.extend(nbest[0][0] for nbest in results)
        if inspect.attention_dir is not None:
            wanted = inspect.attention_max - len(done.shown)
            chosen = sorted(i for i, (_, hyps) in translator.token_ids.items() if hyps)[: max(wanted, 0)]
            done.shown += [
                (
                    done.sentences + i,
                    translator.token_ids[i][0],
                    translator.token_ids[i][1][0],
                    chunk[i],
                    results[i][0][0],
                )
                for i in chosen
            ]
        done.sentences += len(chunk)
    return done


def _alignments(
    translator: Translator, results: list[list[tuple[str, float]]], layer: int, unit: str
) -> list[list[str]]:
    """The alignment line of every output hypothesis (an empty line for an empty input line)."""
    from transformer_cli.translation.attention import alignment_lines

    keys = [(i, k) for i, (_, hyps) in translator.token_ids.items() for k in range(len(hyps))]
    pairs = [(translator.token_ids[i][0], translator.token_ids[i][1][k]) for i, k in keys]
    found = alignment_lines(
        translator.model,
        translator.src_vocab,
        translator.tgt_vocab,
        pairs,
        layer,
        unit,
        BOS_ID,
        EOS_ID,
        translator.runtime.device,
        translator.runtime.context,
    )
    out = [[""] * len(nbest) for nbest in results]
    for (i, k), line in zip(keys, found):
        out[i][k] = line
    return out


def _write_attention(
    translator: Translator, shown: list[tuple[int, list[int], list[int], str, str]], folder: Path
) -> int:
    """Heatmaps and weights of the best hypotheses of the lines `_translate_stream` kept, one line at a time
    (memory holds one line's maps); a line over ATTENTION_MAX_PIECES pieces a side is left out, with a note."""
    from transformer_cli.translation.attention import ATTENTION_MAX_PIECES, attention_maps, write_attention

    written = 0
    for i, source_ids, target_ids, line, translation in shown:
        if max(len(source_ids), len(target_ids)) + 1 > ATTENTION_MAX_PIECES:
            print(
                f"note: line {i + 1} has {len(source_ids) + 1} source and {len(target_ids) + 1} target pieces, "
                f"over the {ATTENTION_MAX_PIECES} that --attention records; no maps written for it",
                file=sys.stderr,
            )
            continue
        (maps,) = attention_maps(
            translator.model,
            translator.src_vocab,
            translator.tgt_vocab,
            [(source_ids, target_ids)],
            BOS_ID,
            EOS_ID,
            translator.runtime.device,
            translator.runtime.context,
        )
        write_attention(folder, i, maps, line, translation)
        written += 1
    return written


def _write_text(path: Path, text: str, option: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write: {e.strerror or e}") from None


def _format(index: int, nbest: list[tuple[str, float]], n: int, alignments: list[str] | None = None) -> str:
    """The output of one input line; with alignments, each hypothesis line is followed by its `i-j` line."""
    rows = [text if n == 1 else f"{index}\t{score:.4f}\t{text}" for text, score in (nbest if n > 1 else nbest[:1])]
    if alignments is not None:
        rows = [line for k, row in enumerate(rows) for line in (row, alignments[k] if k < len(alignments) else "")]
    return "".join(row + "\n" for row in rows)
