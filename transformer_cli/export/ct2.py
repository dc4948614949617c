"""CTranslate2 export of a translation checkpoint: `tcli export-ct2` writes a folder `ctranslate2.Translator` loads.

The model spec is built directly with `ctranslate2.specs` (as CTranslate2's own fairseq and OpenNMT-py
converters do), tcli's weights mapped one to one:
  embeddings       token embeddings, scaled by sqrt(d_model) (CT2's `scale_embeddings`); shared or tied
                   matrices are given once per role, CT2 aliases equal arrays when it saves
  positions        tcli's sinusoidal table itself (P[i, 2j] = sin, P[i, 2j+1] = cos), row i = position i
  self-attention   qkv_proj, already fused as [Q; K; V] like CT2's linear[0]; out_proj -> linear[1]
  cross-attention  q_proj -> linear[0], kv_proj fused as [K; V] like CT2's linear[1]; out_proj -> linear[2]
  FFN              w1 -> linear_0, w2 -> linear_1
  LayerNorms       the norm of each Add&Norm -> that sub-layer's layer_norm (post-norm: after the residual,
                   pre-norm: before the sub-layer); pre-norm's enc_norm / dec_norm -> the stacks' final norms
Special tokens as in tcli: pad 0 <pad>, unk 1 <unk>, bos 2 <s>, eos 3 </s>; the source gets EOS appended,
the target starts from BOS. The sentencepiece model(s) are copied next to the model for tokenisation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_cli.checkpoint import read_checkpoint
from transformer_cli.core.errors import UserError
from transformer_cli.core.files import write_atomic
from transformer_cli.export.folders import prepare_folder, write_staged
from transformer_cli.vocab.spm import Vocab

QUANTIZATIONS = ("int8", "int8_float32", "bfloat16", "float16")
LAYER_NORM_EPS = 1e-5  # torch's nn.LayerNorm default, which tcli's translation model uses
# What a CTranslate2 model folder holds: replaced by an export with --force.
CT2_FILES = (
    "model.bin",
    "config.json",
    "shared_vocabulary.json",
    "shared_vocabulary.txt",
    "source_vocabulary.json",
    "source_vocabulary.txt",
    "target_vocabulary.json",
    "target_vocabulary.txt",
    "vocabulary_map.json",
    "sentencepiece.model",
    "source.model",
    "target.model",
)


def import_ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError:
        raise UserError(
            'ctranslate2 is not installed; install it with: pip install -e ".[ct2]" (or pip install "ctranslate2>=4")'
        ) from None
    return ctranslate2


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).contiguous().numpy().copy()


def _linear(spec: Any, w: dict[str, torch.Tensor], name: str) -> None:
    spec.weight = _np(w[f"{name}.weight"])
    if f"{name}.bias" in w:
        spec.bias = _np(w[f"{name}.bias"])


def _norm(spec: Any, w: dict[str, torch.Tensor], name: str) -> None:
    spec.gamma, spec.beta = _np(w[f"{name}.weight"]), _np(w[f"{name}.bias"])


def _encoder_layer(spec: Any, w: dict[str, torch.Tensor], p: str) -> None:
    _linear(spec.self_attention.linear[0], w, f"{p}self_attn.qkv_proj")
    _linear(spec.self_attention.linear[1], w, f"{p}self_attn.out_proj")
    _norm(spec.self_attention.layer_norm, w, f"{p}attn_sub.norm")
    _ffn(spec.ffn, w, p)


def _decoder_layer(spec: Any, w: dict[str, torch.Tensor], p: str) -> None:
    _linear(spec.self_attention.linear[0], w, f"{p}self_attn.qkv_proj")
    _linear(spec.self_attention.linear[1], w, f"{p}self_attn.out_proj")
    _norm(spec.self_attention.layer_norm, w, f"{p}self_sub.norm")
    _linear(spec.attention.linear[0], w, f"{p}cross_attn.q_proj")
    _linear(spec.attention.linear[1], w, f"{p}cross_attn.kv_proj")
    _linear(spec.attention.linear[2], w, f"{p}cross_attn.out_proj")
    _norm(spec.attention.layer_norm, w, f"{p}cross_sub.norm")
    _ffn(spec.ffn, w, p)


def _ffn(spec: Any, w: dict[str, torch.Tensor], p: str) -> None:
    _linear(spec.linear_0, w, f"{p}ffn.w1")
    _linear(spec.linear_1, w, f"{p}ffn.w2")
    _norm(spec.layer_norm, w, f"{p}ffn_sub.norm")


def build_spec(model: torch.nn.Module, cfg: Any, src_vocab: Vocab, tgt_vocab: Vocab) -> Any:
    """The ctranslate2 TransformerSpec of a tcli Transformer (`cfg` is its TransformerConfig)."""
    import_ctranslate2()  # a one-line error when it is missing
    from ctranslate2.specs import common_spec, transformer_spec

    activation = common_spec.Activation.GELU if cfg.activation == "gelu" else common_spec.Activation.RELU
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.enc_layers, cfg.dec_layers), cfg.heads, pre_norm=cfg.norm == "pre", activation=activation
    )
    w = model.state_dict()
    positions = _np(model.positions)  # (max_positions, d): the table itself
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = _np(w["src_embed.weight"])
    dec.embeddings.weight = _np(w["tgt_embed.weight"])
    enc.position_encodings.encodings, dec.position_encodings.encodings = positions, positions.copy()
    enc.scale_embeddings = dec.scale_embeddings = True  # x sqrt(d_model), as tcli's scaled_embedding
    for i, layer in enumerate(enc.layer):
        _encoder_layer(layer, w, f"encoder.{i}.")
    for i, layer in enumerate(dec.layer):
        _decoder_layer(layer, w, f"decoder.{i}.")
    if cfg.norm == "pre":
        _norm(enc.layer_norm, w, "enc_norm")
        _norm(dec.layer_norm, w, "dec_norm")
    dec.projection.weight = _np(w["out_proj.weight"])
    spec.register_source_vocabulary(_pieces(src_vocab))
    spec.register_target_vocabulary(_pieces(tgt_vocab))
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = "<unk>", "<s>", "</s>"
    spec.config.decoder_start_token = "<s>"
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    return spec


def _pieces(vocab: Vocab) -> list[str]:
    pieces = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
    expected = {0: "<pad>", 1: "<unk>", 2: "<s>", 3: "</s>"}
    wrong = [i for i, piece in expected.items() if pieces[i] != piece]
    if wrong:
        raise UserError(
            f"the vocabulary holds {pieces[wrong[0]]!r} at id {wrong[0]}, not {expected[wrong[0]]!r}; "
            "it is not a tcli translation vocabulary"
        )
    return pieces


def export_ct2(checkpoint: Path, out_dir: Path, quantization: str | None = None, force: bool = False) -> list[str]:
    """Write `checkpoint` (a translation model) as a CTranslate2 folder; returns the files written."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise UserError(f"--quantization {quantization!r}: expected one of {', '.join(QUANTIZATIONS)}")
    import_ctranslate2()
    ckpt = read_checkpoint(checkpoint, kind="translation")
    model = ckpt.build_model()  # names, shapes and finiteness validated
    src_vocab, tgt_vocab = ckpt.vocabs
    spec = build_spec(model, ckpt.cfg.model, src_vocab, tgt_vocab)
    spec.validate()
    spec.optimize(quantization=quantization)
    prepare_folder(out_dir, force, CT2_FILES, "CTranslate2")
    write_staged(out_dir, lambda staging: spec.save(str(staging)))
    if src_vocab is tgt_vocab:
        write_atomic(src_vocab.model_bytes, out_dir / "sentencepiece.model")
    else:
        write_atomic(src_vocab.model_bytes, out_dir / "source.model")
        write_atomic(tgt_vocab.model_bytes, out_dir / "target.model")
    return sorted(p.name for p in out_dir.iterdir() if p.name in CT2_FILES)
