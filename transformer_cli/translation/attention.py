"""Looking inside a translation model: the attention weights behind a chosen translation, and hard alignments.

Decoding never records anything: beam search runs on its fast path (SDPA, key/value cache). Afterwards
the chosen hypothesis is fed back teacher-forced (source + EOS into the encoder, BOS + hypothesis into
the decoder), with every attention module asked to also hand over its softmax weights
(`MultiHeadAttention.record`). Row t of the decoder maps belongs to the position that predicts target
piece t (the last one predicts EOS); its decoder input is BOS for t = 0, else piece t - 1.

Hard alignments follow fairseq's `extract_hard_alignment`: for each target piece (EOS excluded), the
source piece (EOS excluded) with the largest weight in the heads-average of one decoder layer's
cross-attention; pairs are printed `i-j` (source index - target index, 0-based).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from transformer_cli.core.errors import UserError
from transformer_cli.core.files import check_not_a_run_part
from transformer_cli.models.transformer import Transformer
from transformer_cli.vocab.spm import Vocab

WORD_START = "\u2581"  # sentencepiece's word-boundary mark
# --attention records the weights of lines up to this many pieces a side (EOS included): every layer and head
# of one such line is at most a few hundred MB, where a line of thousands of pieces would need gigabytes.
ATTENTION_MAX_PIECES = 512


@dataclass
class AttentionMaps:
    """The softmax weights of one sentence pair, every layer and head (fp32 numpy arrays)."""

    src_pieces: list[str]  # source pieces, then "</s>"
    tgt_pieces: list[str]  # target pieces, then "</s>": what each decoder position predicts
    encoder: np.ndarray  # (L_enc, H, S, S) encoder self-attention
    decoder: np.ndarray  # (L_dec, H, T, T) decoder self-attention (causal)
    cross: np.ndarray  # (L_dec, H, T, S) encoder-decoder attention

    @property
    def decoder_inputs(self) -> list[str]:
        """The decoder's input pieces, position by position: <s>, then the target pieces."""
        return ["<s>", *self.tgt_pieces[:-1]]

    def save_npz(self, path: Path, source: str, translation: str) -> None:
        """Written atomically (in memory first): a kill never leaves a truncated file under the final name."""
        import io

        from transformer_cli.core.files import remove_stale_temporaries, write_atomic

        buffer = io.BytesIO()
        np.savez_compressed(
            buffer,
            encoder=self.encoder,
            decoder=self.decoder,
            cross=self.cross,
            src_pieces=np.array(self.src_pieces),
            tgt_pieces=np.array(self.tgt_pieces),
            source=np.array(source),
            translation=np.array(translation),
        )
        remove_stale_temporaries(path.parent, path.name, live_writers=True)
        write_atomic(buffer.getvalue(), path)


@contextlib.contextmanager
def capture(model: Transformer) -> Iterator[dict[str, list[list[Tensor]]]]:
    """Within the block every attention module of `model` records its weights: per kind ("encoder",
    "decoder", "cross"), one list per layer receiving a (B, H, T, S) tensor per call."""
    modules = {
        "encoder": [block.self_attn for block in model.encoder],
        "decoder": [block.self_attn for block in model.decoder],
        "cross": [block.cross_attn for block in model.decoder],
    }
    records: dict[str, list[list[Tensor]]] = {kind: [] for kind in modules}
    try:
        for kind, layers in modules.items():
            for module in layers:
                module.record = []
                records[kind].append(module.record)
        yield records
    finally:
        for layers in modules.values():
            for module in layers:
                module.record = None


def teacher_forced_attention(
    model: Transformer,
    pairs: list[tuple[list[int], list[int]]],
    bos_id: int,
    eos_id: int,
    device: torch.device,
    context: Callable | None = None,
    batch_size: int = 32,
    kinds: tuple[str, ...] = ("encoder", "decoder", "cross"),
) -> list[dict[str, np.ndarray]]:
    """Attention weights of (source ids, target ids) pairs (no specials), fed teacher-forced.

    Returns, per pair, those of {"encoder": (L, H, S, S), "decoder": (L, H, T, T), "cross": (L, H, T, S)}
    named in `kinds`, with S = source length + 1 (EOS) and T = target length + 1 (EOS), padding cut away.
    """
    from transformer_cli.data.translation import pad_sequences

    out: list[dict[str, np.ndarray]] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        src = pad_sequences([s for s, _ in chunk], model.pad_id, suffix=eos_id).to(device)  # (B, S)
        tgt_in = pad_sequences([t for _, t in chunk], model.pad_id, prefix=bos_id).to(device)  # (B, T)
        with torch.inference_mode(), capture(model) as records, context() if context else contextlib.nullcontext():
            model(src, tgt_in)
        stacked = {
            kind: torch.stack([layer[0] for layer in records[kind]], 1).float().cpu()  # (B, L, H, T, S)
            for kind in kinds
        }
        for row, (s, t) in enumerate(chunk):
            S, T = len(s) + 1, len(t) + 1
            size = {"encoder": (S, S), "decoder": (T, T), "cross": (T, S)}
            out.append({kind: stacked[kind][row, :, :, : size[kind][0], : size[kind][1]].numpy() for kind in kinds})
    return out


def attention_maps(
    model: Transformer,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    pairs: list[tuple[list[int], list[int]]],
    bos_id: int,
    eos_id: int,
    device: torch.device,
    context: Callable | None = None,
) -> list[AttentionMaps]:
    """`teacher_forced_attention` with the pieces as labels."""
    weights = teacher_forced_attention(model, pairs, bos_id, eos_id, device, context)
    return [
        AttentionMaps(pieces(src_vocab, s) + ["</s>"], pieces(tgt_vocab, t) + ["</s>"], **w)
        for (s, t), w in zip(pairs, weights)
    ]


def pieces(vocab: Vocab, ids: list[int]) -> list[str]:
    return [vocab.sp.id_to_piece(i) for i in ids]


# ----------------------------------------------------------------------------- hard alignments


def resolve_layer(layer: int | None, layers: int) -> int:
    """--alignment-layer: None = the second-to-last decoder layer (the last one of a 1-layer decoder);
    negative values count from the end. Out of range is a one-line error."""
    if layer is None:
        return max(layers - 2, 0)
    if not -layers <= layer < layers:
        raise UserError(
            f"--alignment-layer {layer}: this model's decoder has {layers} layers "
            f"(0..{layers - 1}, or -1..-{layers} from the end)"
        )
    return layer % layers


def hard_alignment(cross: np.ndarray, layer: int) -> list[tuple[int, int]]:
    """(source piece, target piece) pairs: for every target piece, the source piece with the largest
    heads-averaged weight in `layer`. cross: (L, H, T, S) with EOS last on both axes; EOS is excluded."""
    attn = cross[layer].mean(0)[:-1, :-1]  # (T - 1, S - 1)
    if attn.shape[0] == 0 or attn.shape[1] == 0:
        return []
    return [(int(i), j) for j, i in enumerate(attn.argmax(1))]


def word_index(piece_list: list[str]) -> list[int]:
    """The word each piece belongs to: a piece that starts with '▁' starts a new word."""
    index, out = -1, []
    for k, piece in enumerate(piece_list):
        if k == 0 or piece.startswith(WORD_START):
            index += 1
        out.append(index)
    return out


def to_words(pairs: list[tuple[int, int]], src_pieces: list[str], tgt_pieces: list[str]) -> list[tuple[int, int]]:
    """Piece pairs -> word pairs (a word pair is aligned when any of their pieces are), sorted by target
    word, then source word. The piece lists exclude EOS."""
    src_word, tgt_word = word_index(src_pieces), word_index(tgt_pieces)
    return sorted({(src_word[i], tgt_word[j]) for i, j in pairs}, key=lambda p: (p[1], p[0]))


def alignment_lines(
    model: Transformer,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    pairs: list[tuple[list[int], list[int]]],
    layer: int,
    unit: str,
    bos_id: int,
    eos_id: int,
    device: torch.device,
    context: Callable | None = None,
    batch_size: int = 32,
) -> list[str]:
    """The `i-j` pairs of each (source ids, translation ids), space-separated (fairseq's format), in pieces
    or words. Batch by batch, keeping only the cross-attention: memory stays flat over a long input."""
    lines = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        weights = teacher_forced_attention(model, chunk, bos_id, eos_id, device, context, batch_size, ("cross",))
        for (s, t), w in zip(chunk, weights):
            found = hard_alignment(w["cross"], layer)
            if unit == "word":
                found = to_words(found, pieces(src_vocab, s), pieces(tgt_vocab, t))
            lines.append(" ".join(f"{i}-{j}" for i, j in found))
    return lines


# ----------------------------------------------------------------------------- files


def write_attention(folder: Path, index: int, maps: AttentionMaps, source: str, translation: str) -> list[Path]:
    """`{index:04d}_{cross,cross_heads,encoder,decoder}.png` heatmaps and `{index:04d}.npz` in folder."""
    from transformer_cli.core.figures import heatmaps

    stem = f"{index:04d}"
    src, tgt, dec_in = maps.src_pieces, maps.tgt_pieces, maps.decoder_inputs
    last = maps.cross.shape[0] - 1
    figures = [
        (
            "cross",
            [(f"layer {k}", m.mean(0)) for k, m in enumerate(maps.cross)],
            tgt,
            src,
            "cross-attention (heads averaged)",
            "source",
            "target (predicted)",
        ),
        (
            "cross_heads",
            [(f"head {h}", m) for h, m in enumerate(maps.cross[last])],
            tgt,
            src,
            f"cross-attention, layer {last}, every head",
            "source",
            "target (predicted)",
        ),
        (
            "encoder",
            [(f"layer {k}", m.mean(0)) for k, m in enumerate(maps.encoder)],
            src,
            src,
            "encoder self-attention (heads averaged)",
            "source (key)",
            "source (query)",
        ),
        (
            "decoder",
            [(f"layer {k}", m.mean(0)) for k, m in enumerate(maps.decoder)],
            dec_in,
            dec_in,
            "decoder self-attention (heads averaged)",
            "decoder input (key)",
            "decoder input (query)",
        ),
    ]
    paths = []
    for name, panels, rows, cols, title, xlabel, ylabel in figures:
        path = folder / f"{stem}_{name}.png"
        heatmaps(path, panels, rows, cols, f"line {index}: {title}", xlabel, ylabel)
        paths.append(path)
    npz = folder / f"{stem}.npz"
    maps.save_npz(npz, source, translation)
    return [*paths, npz]


def prepare_folder(folder: Path) -> None:
    """Create the --attention folder (before any decoding), or fail in one line."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--attention {folder} is a file; give a folder")
    check_not_a_run_part(folder, "--attention")  # a run's checkpoints/ or vocab/ holds the run's own files
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--attention {folder}: cannot create the folder: {e.strerror or e}") from None
