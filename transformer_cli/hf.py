"""Hugging Face interoperability for BERT: `tcli export-hf` writes a folder that
`transformers.BertForPreTraining.from_pretrained` loads, and `--init-from-hf` reads one back.

The folder holds config.json, model.safetensors (HF parameter names), and our sentencepiece model
(spiece.model, plus vocab.txt listing its pieces) so that a run can continue with the same vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from transformer_cli.checkpoint import read_checkpoint
from transformer_cli.config import BertModelConfig
from transformer_cli.errors import UserError
from transformer_cli.vocab import Vocab

_LAYER = "bert.encoder.layer.{i}."
# Our parameter name -> HF name, for everything but the fused Q/K/V projections.
_NAMES = {
    "embeddings.token.weight": "bert.embeddings.word_embeddings.weight",
    "embeddings.position.weight": "bert.embeddings.position_embeddings.weight",
    "embeddings.segment.weight": "bert.embeddings.token_type_embeddings.weight",
    "embeddings.norm.weight": "bert.embeddings.LayerNorm.weight",
    "embeddings.norm.bias": "bert.embeddings.LayerNorm.bias",
    "pooler.weight": "bert.pooler.dense.weight",
    "pooler.bias": "bert.pooler.dense.bias",
    "nsp_head.weight": "cls.seq_relationship.weight",
    "nsp_head.bias": "cls.seq_relationship.bias",
    "mlm_dense.weight": "cls.predictions.transform.dense.weight",
    "mlm_dense.bias": "cls.predictions.transform.dense.bias",
    "mlm_norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm_norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm_bias": "cls.predictions.bias",
}
_LAYER_NAMES = {
    "self_attn.out_proj": "attention.output.dense",
    "attn_sub.norm": "attention.output.LayerNorm",
    "ffn.w1": "intermediate.dense",
    "ffn.w2": "output.dense",
    "ffn_sub.norm": "output.LayerNorm",
}


def to_hf_state_dict(state: dict[str, Tensor], layers: int) -> dict[str, Tensor]:
    """Our BERT state dict -> HF BertForPreTraining names (Q, K, V split out of the fused projection)."""
    out = {hf: state[ours] for ours, hf in _NAMES.items()}
    for i in range(layers):
        prefix, hf = f"encoder.{i}.", _LAYER.format(i=i)
        for kind in ("weight", "bias"):
            q, k, v = state[f"{prefix}self_attn.qkv_proj.{kind}"].chunk(3, dim=0)
            out[f"{hf}attention.self.query.{kind}"] = q
            out[f"{hf}attention.self.key.{kind}"] = k
            out[f"{hf}attention.self.value.{kind}"] = v
            for ours, theirs in _LAYER_NAMES.items():
                out[f"{hf}{theirs}.{kind}"] = state[f"{prefix}{ours}.{kind}"]
    return {name: t.detach().contiguous().clone() for name, t in out.items()}


def from_hf_state_dict(hf: dict[str, Tensor], layers: int) -> dict[str, Tensor]:
    """The inverse of `to_hf_state_dict`."""
    missing = [name for name in _NAMES.values() if name not in hf]
    if missing:
        raise UserError(f"the HF weights lack {missing[0]} (and {len(missing) - 1} more); not a BertForPreTraining")
    out = {ours: hf[theirs] for ours, theirs in _NAMES.items()}
    for i in range(layers):
        prefix, theirs = f"encoder.{i}.", _LAYER.format(i=i)
        for kind in ("weight", "bias"):
            parts = [hf[f"{theirs}attention.self.{p}.{kind}"] for p in ("query", "key", "value")]
            out[f"{prefix}self_attn.qkv_proj.{kind}"] = torch.cat(parts, 0)
            for ours, hf_name in _LAYER_NAMES.items():
                out[f"{prefix}{ours}.{kind}"] = hf[f"{theirs}{hf_name}.{kind}"]
    return out


def hf_config(model: BertModelConfig, vocab_size: int) -> dict:
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": vocab_size,
        "hidden_size": model.d_model,
        "num_hidden_layers": model.layers,
        "num_attention_heads": model.heads,
        "intermediate_size": model.ffn_dim,
        "hidden_act": "gelu",
        "max_position_embeddings": model.max_positions,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "hidden_dropout_prob": model.dropout,
        "attention_probs_dropout_prob": model.attention_dropout,
        "initializer_range": 0.02,
        "pad_token_id": 0,
        "tie_word_embeddings": True,
    }


def export_hf(checkpoint: Path, out_dir: Path) -> Path:
    """Write config.json, model.safetensors, spiece.model and vocab.txt for a BERT checkpoint."""
    from safetensors.torch import save_file

    ckpt = read_checkpoint(checkpoint, kind="bert")
    cfg, (vocab,) = ckpt.cfg, ckpt.vocabs
    model = ckpt.build_model()  # validates every tensor's name, shape and finiteness
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = to_hf_state_dict(model.state_dict(), cfg.model.layers)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(hf_config(cfg.model, len(vocab)), indent=2) + "\n")
    vocab.save(out_dir / "spiece.model")
    pieces = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
    (out_dir / "vocab.txt").write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
    return out_dir


def load_hf_bert(folder: Path, model: BertModelConfig) -> tuple[dict[str, Tensor], Vocab]:
    """Weights (our names) and vocabulary of an exported folder; sizes must match the run's model section."""
    from safetensors.torch import load_file

    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    vocab_path = folder / "spiece.model"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise UserError(f"--init-from-hf {folder}: {path.name} not found (a folder written by tcli export-hf)")
    if not vocab_path.is_file():
        raise UserError(f"--init-from-hf {folder}: no spiece.model; its vocabulary cannot be matched to a "
                        "tcli vocabulary (export the model with tcli export-hf)")
    hf = json.loads(config_path.read_text())
    vocab = Vocab.load(vocab_path)
    expected = hf_config(model, len(vocab))
    for hf_key, ours in (("hidden_size", "d_model"), ("num_hidden_layers", "layers"), ("num_attention_heads", "heads"),
                         ("intermediate_size", "ffn_dim"), ("max_position_embeddings", "max_positions")):
        if hf.get(hf_key) != expected[hf_key]:
            raise UserError(f"--init-from-hf {folder}: {hf_key} is {hf.get(hf_key)} but model.{ours} is "
                            f"{expected[hf_key]}; set model.{ours}={hf.get(hf_key)}")
    if hf.get("vocab_size") != len(vocab):
        raise UserError(f"--init-from-hf {folder}: config.json vocab_size {hf.get('vocab_size')} does not match "
                        f"its spiece.model ({len(vocab)} pieces)")
    return from_hf_state_dict(load_file(str(weights_path)), model.layers), vocab
