"""Parameter counts of a model: exact by component (from the real model, built on the meta device) and the
closed-form formula behind them, which gives the same number for every configuration; and the model FLOPs of a
training step, from the same per-layer counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torch import nn

from transformer_cli.config import (
    BertModelConfig,
    TransformerConfig,
)

# ----------------------------------------------------------------------------- counting the model

_STACK = re.compile(r"^(encoder|decoder)\.(\d+)\.(.+)$")
_TOP = {  # module (or parameter) name -> (group, row label)
    "src_embed": ("embeddings", "source token embeddings"),
    "tgt_embed": ("embeddings", "target token embeddings"),
    "embeddings.token": ("embeddings", "token embeddings"),
    "embeddings.position": ("embeddings", "position embeddings"),
    "embeddings.segment": ("embeddings", "segment embeddings"),
    "embeddings.norm": ("embeddings", "LayerNorm (γ, β)"),
    "enc_norm": ("final norms", "encoder final LayerNorm (γ, β)"),
    "dec_norm": ("final norms", "decoder final LayerNorm (γ, β)"),
    "final_norm": ("final norms", "final LayerNorm (γ, β)"),  # pre-norm BERT
    "out_proj": ("output projection", "output projection (no bias)"),
    "pooler": ("pooler", "pooler dense (weight, bias)"),
    "nsp_head": ("pretraining heads", "NSP head (weight, bias)"),
    "mlm_dense": ("pretraining heads", "MLM transform dense (weight, bias)"),
    "mlm_norm": ("pretraining heads", "MLM transform LayerNorm (γ, β)"),
    "mlm_decoder": ("pretraining heads", "MLM decoder"),  # no parameter: F.linear with the token embeddings
    "mlm_bias": ("pretraining heads", "MLM decoder bias"),
}
_GROUPS = [
    "embeddings",
    "encoder",
    "decoder",
    "final norms",
    "output projection",
    "pooler",
    "pretraining heads",
    "task head",
]
_ORDER = {label: i for i, (_, label) in enumerate(_TOP.values())}  # row order within a group
_FUSED = {"qkv_proj": "QKV", "kv_proj": "KV", "q_proj": "Q", "out_proj": "O"}  # equal row blocks
_SUBLAYER = {"attn_sub": "self-attn", "self_sub": "self-attn", "cross_sub": "cross-attn", "ffn_sub": "FFN"}


def _top_label(name: str) -> tuple[str, str]:
    key = name if name in _TOP else name.rpartition(".")[0]
    return _TOP.get(key, ("other", name))


def _block_rows(name: str, numel: int) -> list[tuple[str, int]]:
    """'self_attn.qkv_proj.weight' -> [('self-attn Q weight', n/3), ('self-attn K weight', n/3), ...]."""
    module, _, leaf = name.rpartition(".")
    first, _, last = module.partition(".")
    if first in _SUBLAYER:
        return [(f"LayerNorm of {_SUBLAYER[first]} sub-layer (γ, β)", numel)]
    if first == "ffn":
        return [(f"FFN {last.upper()} {leaf}", numel)]
    if first in ("self_attn", "cross_attn") and last in _FUSED:
        parts = _FUSED[last]
        return [(f"{first.replace('_attn', '-attn')} {p} {leaf}", numel // len(parts)) for p in parts]
    return [(name, numel)]


def _finish_stack(comp: dict[str, Any]) -> None:
    layers = comp.pop("layers")
    each = {sum(rows.values()) for rows in layers.values()}
    first = layers[min(layers, key=int)]
    comp["count"] = len(layers)
    comp["name"] = f"{len(layers)} layers × {max(each):,}" + ("" if len(each) == 1 else " (layers differ)")
    rows = sorted(first.items(), key=_row_key)
    comp["per_layer"] = [{"name": label, "params": n, "tied": False} for label, n in rows]


def _row_key(row: tuple[str, int]) -> tuple[int, ...]:
    """Self-attn, cross-attn, FFN, LayerNorms; Q, K, V, O; weight before bias."""
    words = row[0].split()
    section = ["self-attn", "cross-attn", "FFN", "LayerNorm"]
    part = ["Q", "K", "V", "O", "W1", "W2"]
    return (
        section.index(words[0]) if words[0] in section else 9,
        part.index(words[1]) if words[1] in part else 9,
        words[-1] == "bias",
    )


def component(name: str, group: str, tied: bool = False, note: str = "", **extra: Any) -> dict[str, Any]:
    return {"name": name, "group": group, "params": 0, "tied": tied, "note": note, **extra}


def count_model(model: nn.Module, kind: str) -> dict[str, Any]:
    """Components (each parameter once, ties marked), totals, trainable and frozen counts."""
    comps: dict[str, dict[str, Any]] = {}
    owner: dict[int, str] = {}  # id(parameter) -> key of the component that counted it
    trainable = frozen = 0
    for name, p in model.named_parameters(remove_duplicate=False):
        group, label = _top_label(name)
        if id(p) in owner:
            first = comps[owner[id(p)]]
            first["tied"] = True
            first["note"] = (first["note"] + ", " if first["note"] else "tied: also ") + label
            comps[label] = component(label, group, tied=True, note=f"tied to {first['name']}, 0 new")
            continue
        n = p.numel()
        if p.requires_grad:
            trainable += n
        else:
            frozen += n
        stack = _STACK.match(name)
        if stack:
            label, group = stack[1], stack[1]
            comp = comps.setdefault(label, component(label, group, layers={}))
            rows = comp["layers"].setdefault(stack[2], {})
            for row, k in _block_rows(stack[3], n):
                rows[row] = rows.get(row, 0) + k
        comps.setdefault(label, component(label, group))["params"] += n
        owner[id(p)] = label
    if kind == "bert":  # the MLM decoder is F.linear with the token embeddings: an implicit tie
        comps["token embeddings"].update(tied=True, note="tied: also the MLM decoder")
        comps["MLM decoder"] = component(
            "MLM decoder", "pretraining heads", tied=True, note="tied to token embeddings, 0 new"
        )
    rows = sorted(
        comps.values(),
        key=lambda c: (_GROUPS.index(c["group"]) if c["group"] in _GROUPS else 99, _ORDER.get(c["name"], 0)),
    )
    for comp in rows:
        if "layers" in comp:
            _finish_stack(comp)
    out = {"components": rows, "total": trainable + frozen, "trainable": trainable, "frozen": frozen}
    if kind == "bert":
        out["bert_model"] = sum(c["params"] for c in comps.values() if c["group"] != "pretraining heads")
        out["pretraining"] = out["total"]
    return out


# ----------------------------------------------------------------------------- closed-form formulas


def encoder_layer_params(d: int, F: int) -> int:
    """One encoder layer (BERT's too): self-attention 4d²+4d, FFN 2dF+F+d, two LayerNorms 4d."""
    return (4 * d * d + 4 * d) + (2 * d * F + F + d) + 4 * d


def decoder_layer_params(d: int, F: int) -> int:
    """One decoder layer: self- and cross-attention 8d²+8d, FFN 2dF+F+d, three LayerNorms 6d."""
    return (8 * d * d + 8 * d) + (2 * d * F + F + d) + 6 * d


def cross_kv_params(d: int) -> int:
    """The key and value projections of one decoder layer's cross-attention (weights and biases)."""
    return 2 * d * d + 2 * d


def _pooler_params(H: int) -> int:
    return H * H + H


def _mlm_transform_params(H: int) -> int:
    """The MLM head before its (tied) decoder: dense H→H and a LayerNorm."""
    return (H * H + H) + 2 * H


def _nsp_params(H: int) -> int:
    return 2 * H + 2


@dataclass
class Term:
    """One line of the formula: its symbols, the same with the config's numbers, and the value."""

    name: str
    symbolic: str
    substituted: str
    value: int


@dataclass
class Formula:
    """The closed form evaluated on a config, and the quick estimate beside it."""

    terms: list[Term]
    total: int
    note: str  # the paper's short form where it applies
    approximation: int
    approximation_text: str
    approximation_note: str
    reference: str  # what the approximation estimates
    reference_value: int


def bert_formula(m: BertModelConfig, V: int) -> Formula:
    """BertForPreTraining = BertModel + heads, for any H, L, F, P (T = 2 segments)."""
    H, L, F, P, T = m.d_model, m.layers, m.ffn_dim, m.max_positions, 2
    emb = (V + P + T) * H + 2 * H
    layer = encoder_layer_params(H, F)
    final = 2 * H if m.norm == "pre" else 0
    pooler = _pooler_params(H)
    heads = _mlm_transform_params(H) + V + _nsp_params(H)
    base = emb + L * layer + final + pooler
    terms = [
        Term("embeddings", "(V+P+T)·H + 2H", f"({V}+{P}+{T})·{H} + 2·{H}", emb),
        Term("encoder layer", "4H²+4H + 2HF+F+H + 4H", f"4·{H}²+4·{H} + 2·{H}·{F}+{F}+{H} + 4·{H}", layer),
        Term("encoder", "L·layer", f"{L}·{layer:,}", L * layer),
        Term("final norm", "2H (pre-norm)" if final else "0 (post-norm)", f"2·{H}" if final else "0", final),
        Term("pooler", "H² + H", f"{H}² + {H}", pooler),
        Term(
            "BertModel",
            "embeddings + L·layer + norm + pooler",
            f"{emb:,} + {L * layer:,} + {final:,} + {pooler:,}",
            base,
        ),
        Term("pretraining heads", "(H²+H) + 2H + V + (2H+2)", f"({H}²+{H}) + 2·{H} + {V} + (2·{H}+2)", heads),
        Term("BertForPreTraining", "BertModel + heads", f"{base:,} + {heads:,}", base + heads),
    ]
    extra = " + 2H" if final else ""
    note = f"F = 4H: BertModel = (V+P+T+2)·H + L·(12H² + 13H){extra} + (H² + H)" if F == 4 * H else ""
    return Formula(
        terms,
        base + heads,
        note,
        L * 12 * H * H + V * H,
        f"L·12H² + V·H = {L}·12·{H}² + {V}·{H}",
        "omits biases, LayerNorms, positions, segments and the pooler",
        "BertModel",
        base,
    )


def transformer_formula(m: TransformerConfig, Vs: int, Vt: int) -> Formula:
    """Embeddings + N encoder layers + M decoder layers + final norms (pre-norm) + output projection."""
    d, F, N, M = m.d_model, m.ffn_dim, m.enc_layers, m.dec_layers
    if m.share_embeddings:
        emb = Term("embeddings (shared)", "V·d", f"{Vs}·{d}", Vs * d)
    else:
        emb = Term("embeddings", "Vs·d + Vt·d", f"{Vs}·{d} + {Vt}·{d}", (Vs + Vt) * d)
    if m.tie_output:
        out = Term("output projection", "0 (tied to target embeddings)", "0", 0)
    else:
        out = Term("output projection", "Vt·d (no bias)", f"{Vt}·{d}", Vt * d)
    enc = encoder_layer_params(d, F)
    dec = decoder_layer_params(d, F)
    final = 4 * d if m.norm == "pre" else 0
    parts = (emb.value, N * enc, M * dec, final, out.value)
    total = sum(parts)
    terms = [
        emb,
        Term("encoder layer", "4d²+4d + 2dF+F+d + 4d", f"4·{d}²+4·{d} + 2·{d}·{F}+{F}+{d} + 4·{d}", enc),
        Term("encoder", "N·layer", f"{N}·{enc:,}", N * enc),
        Term("decoder layer", "8d²+8d + 2dF+F+d + 6d", f"8·{d}²+8·{d} + 2·{d}·{F}+{F}+{d} + 6·{d}", dec),
        Term("decoder", "M·layer", f"{M}·{dec:,}", M * dec),
        Term("final norms", "4d (pre-norm)" if final else "0 (post-norm)", f"4·{d}" if final else "0", final),
        out,
        Term("total", "emb + N·enc + M·dec + norms + out", " + ".join(f"{v:,}" for v in parts), total),
    ]
    note = "F = 4d: encoder layer = 12d² + 13d, decoder layer = 16d² + 19d" if F == 4 * d else ""
    rows = (emb.value + out.value) // d  # rows of the distinct embedding/output matrices
    text = f"(N+M)·12d² + V·d = ({N}+{M})·12·{d}² + {rows}·{d}"
    why = (
        "the BERT rule on both stacks, V = rows of the distinct embedding/output matrices; "
        "omits cross-attention (4d² per decoder layer), biases and LayerNorms"
    )
    return Formula(terms, total, note, (N + M) * 12 * d * d + rows * d, text, why, "total", total)


# ----------------------------------------------------------------------------- model FLOPs of a training step
#
# Training FLOPs = 6 x (parameters a token passes through) x tokens + 12 x layers x d x attended length per token
# (PaLM appendix B, Megatron-LM): a multiply-add is 2 FLOPs, the backward pass costs twice the forward; the
# attention term is QK^T and AV, causal masks not halved. Embedding tables are lookups, not matmuls.


def attention_train_flops(d: int, layers: int, attended: int, tokens: int) -> int:
    """QK^T and AV, forward and backward, of `tokens` queries each attending to `attended` keys in `layers` layers."""
    return 12 * layers * d * attended * tokens


def translation_train_flops(
    m: TransformerConfig, tgt_vocab: int, src_tokens: int, tgt_tokens: int, src_len: int, tgt_len: int
) -> dict[str, int]:
    """Model FLOPs of one training step (forward + backward) of the encoder-decoder.

    Source tokens pass through the encoder layers and the decoder's cross-attention key/value projections (applied
    once to the encoder output); target tokens through the rest of the decoder layers and the output projection
    (Vt·d, applied to every target token whether or not it is tied to the embeddings). With equal source and target
    tokens, a shared vocabulary, tied weights and post-norm, `dense` is 6 x the parameter count x tokens.
    Returns {"dense", "attention", "total"}.
    """
    d, F, N, M = m.d_model, m.ffn_dim, m.enc_layers, m.dec_layers
    enc = N * encoder_layer_params(d, F)
    kv = M * cross_kv_params(d)
    dec = M * decoder_layer_params(d, F) - kv
    dense = 6 * ((enc + kv) * src_tokens + (dec + tgt_vocab * d) * tgt_tokens)
    attention = attention_train_flops(d, N, src_len, src_tokens) + attention_train_flops(
        d, M, tgt_len + src_len, tgt_tokens
    )
    return {"dense": dense, "attention": attention, "total": dense + attention}


def bert_train_flops(
    m: BertModelConfig, vocab: int, tokens: int, seq_len: int, masked: int, sequences: int
) -> dict[str, int]:
    """Model FLOPs of one BERT pretraining step (forward + backward): every token through the encoder layers, the
    MLM head (transform, tied decoder V·H and its bias) at the masked positions only, as tcli computes it, the
    pooler and NSP head once a sequence. Returns {"dense", "attention", "total"}."""
    H, F, L = m.d_model, m.ffn_dim, m.layers
    mlm_head = _mlm_transform_params(H) + vocab * H + vocab
    pooler_nsp = _pooler_params(H) + _nsp_params(H)
    dense = 6 * (L * encoder_layer_params(H, F) * tokens + mlm_head * masked + pooler_nsp * sequences)
    attention = attention_train_flops(H, L, seq_len, tokens)
    return {"dense": dense, "attention": attention, "total": dense + attention}


def shorthand_train_flops(params: int, tokens: int, layers: int, d: int, seq_len: int) -> int:
    """The common shorthand 6 N D + attention, N = all parameters: for BERT it charges the vocabulary projection
    at every position, so it overstates the work."""
    return 6 * params * tokens + attention_train_flops(d, layers, seq_len, tokens)
