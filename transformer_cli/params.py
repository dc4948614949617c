"""`tcli count-params`: exact parameter counts by component, and the closed-form formula behind them.

The count comes from the real model built on the meta device (shapes only, no memory), so BERT-large
answers as fast as a toy model. Parameters are grouped by their names; one held under several names
(tied embeddings) is counted once and marked. Beside the count, the closed-form formula evaluated on
the config gives the same number for every configuration (a test checks presets and random configs),
and the quick estimate L·12H² + V·H shows how far off it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_cli.checkpoint import read_checkpoint
from transformer_cli.config import (
    SCHEMAS,
    BertModelConfig,
    BertRunConfig,
    TransformerConfig,
    TranslationRunConfig,
    _merge,
    build_config,
    file_config,
    parse_overrides,
)
from transformer_cli.errors import UserError
from transformer_cli.models.builders import build_bert, build_transformer

MB = 2**20  # bytes per MB in every size this module reports

# Presets only fix numbers; everything else keeps the config defaults.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "bert-base": (
        "bert",
        {
            "vocab": {"size": 30522},
            "model": {"d_model": 768, "layers": 12, "heads": 12, "ffn_dim": 3072, "max_positions": 512},
        },
    ),
    "bert-large": (
        "bert",
        {
            "vocab": {"size": 30522},
            "model": {"d_model": 1024, "layers": 24, "heads": 16, "ffn_dim": 4096, "max_positions": 512},
        },
    ),
    "transformer-base": (
        "translation",
        {
            "vocab": {"size": 37000, "joint": True},
            "model": {
                "d_model": 512,
                "heads": 8,
                "ffn_dim": 2048,
                "enc_layers": 6,
                "dec_layers": 6,
                "share_embeddings": True,
                "tie_output": True,
            },
        },
    ),
    "transformer-big": (
        "translation",
        {
            "vocab": {"size": 37000, "joint": True},
            "model": {
                "d_model": 1024,
                "heads": 16,
                "ffn_dim": 4096,
                "enc_layers": 6,
                "dec_layers": 6,
                "share_embeddings": True,
                "tie_output": True,
            },
        },
    ),
}

RunConfig = BertRunConfig | TranslationRunConfig

# ----------------------------------------------------------------------------- configs


def preset_config(name: str, overrides: list[str] | None = None) -> RunConfig:
    """The run config of preset `name` with `--set` overrides, validated like a YAML config."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    kind, numbers = PRESETS[name]
    raw = _merge({"train": {"max_steps": 1}}, numbers)  # a run config must be able to end
    source = f"preset {name}"
    if overrides:
        raw = _merge(raw, parse_overrides(overrides))
        source += " with --set " + " ".join(overrides)
    return build_config(SCHEMAS[kind], raw, source)


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


def _component(name: str, group: str, tied: bool = False, note: str = "", **extra: Any) -> dict[str, Any]:
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
            comps[label] = _component(label, group, tied=True, note=f"tied to {first['name']}, 0 new")
            continue
        n = p.numel()
        if p.requires_grad:
            trainable += n
        else:
            frozen += n
        stack = _STACK.match(name)
        if stack:
            label, group = stack[1], stack[1]
            comp = comps.setdefault(label, _component(label, group, layers={}))
            rows = comp["layers"].setdefault(stack[2], {})
            for row, k in _block_rows(stack[3], n):
                rows[row] = rows.get(row, 0) + k
        comps.setdefault(label, _component(label, group))["params"] += n
        owner[id(p)] = label
    if kind == "bert":  # the MLM decoder is F.linear with the token embeddings: an implicit tie
        comps["token embeddings"].update(tied=True, note="tied: also the MLM decoder")
        comps["MLM decoder"] = _component(
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
    layer = (4 * H * H + 4 * H) + (2 * H * F + F + H) + 4 * H
    final = 2 * H if m.norm == "pre" else 0
    pooler = H * H + H
    heads = (H * H + H) + 2 * H + V + (2 * H + 2)
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
    enc = (4 * d * d + 4 * d) + (2 * d * F + F + d) + 4 * d
    dec = (8 * d * d + 8 * d) + (2 * d * F + F + d) + 6 * d
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


# ----------------------------------------------------------------------------- report


def count_config(
    cfg: RunConfig, src_vocab: int | None = None, tgt_vocab: int | None = None, source: str = "config"
) -> dict[str, Any]:
    """Build the model of `cfg` on the meta device; count it and evaluate the formula on the config.

    Vocabulary sizes default to `cfg.vocab.size` (both sides for translation).
    """
    Vs = src_vocab or cfg.vocab.size
    Vt = tgt_vocab or Vs
    kind = "bert" if isinstance(cfg, BertRunConfig) else "translation"
    m = cfg.model
    try:
        with torch.device("meta"):
            model = build_bert(m, Vs) if kind == "bert" else build_transformer(m, Vs, Vt)
    except ValueError as e:
        raise UserError(f"{source}: cannot build the model: {e}") from None
    if kind == "bert":
        sizes = {"V": Vs, "H": m.d_model, "L": m.layers, "A": m.heads, "F": m.ffn_dim, "P": m.max_positions, "T": 2}
        sizes["norm"] = m.norm
        formula = bert_formula(m, Vs)
    else:
        sizes = {
            "Vs": Vs,
            "Vt": Vt,
            "d": m.d_model,
            "h": m.heads,
            "F": m.ffn_dim,
            "N": m.enc_layers,
            "M": m.dec_layers,
            "norm": m.norm,
            "share_embeddings": m.share_embeddings,
            "tie_output": m.tie_output,
        }
        formula = transformer_formula(m, Vs, Vt)
    report = {"kind": kind, "source": source, "sizes": sizes, **count_model(model, kind)}
    report.update(
        bytes_fp32=4 * report["total"],
        bytes_bf16=2 * report["total"],
        mb_fp32=round(4 * report["total"] / MB, 2),
        mb_bf16=round(2 * report["total"] / MB, 2),
        formula=[asdict(t) for t in formula.terms],
        formula_note=formula.note,
        formula_total=formula.total,
        formula_matches=formula.total == report["total"],
        approximation=formula.approximation,
        approximation_text=formula.approximation_text,
        approximation_note=formula.approximation_note,
        approximation_of=formula.reference,
        approximation_rel_error=(formula.approximation - formula.reference_value) / formula.reference_value,
    )
    return report


def stored_count(weights: dict[str, Any]) -> int:
    """Elements of the tensors a state dict stores, a tensor held under several names (a tie) once."""
    seen: set[tuple] = set()
    total = 0
    for t in weights.values():
        if isinstance(t, torch.Tensor):
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
            if key not in seen:
                seen.add(key)
                total += t.numel()
    return total


def count_checkpoint(path: Path) -> dict[str, Any]:
    """The stored element count of a checkpoint, beside the count of the model its config builds."""
    ckpt = read_checkpoint(path)  # its vocabularies too: every command checks a checkpoint whole
    if ckpt.kind == "finetune":
        ckpt.check()
        report = count_finetuned(ckpt.finetune, f"checkpoint {path}")
        report["stored_total"] = stored_count(ckpt.weights)
        report["stored_matches"] = report["stored_total"] == report["total"]
        return report
    ckpt.check()
    report = count_config(ckpt.cfg, len(ckpt.vocabs[0]), len(ckpt.vocabs[-1]), f"checkpoint {path}")
    report["stored_total"] = stored_count(ckpt.weights)
    report["stored_matches"] = report["stored_total"] == report["total"]
    return report


HF_CLASSES = {
    "classification": "BertForSequenceClassification",
    "regression": "BertForSequenceClassification",
    "tagging": "BertForTokenClassification",
}


def count_finetuned(meta: Any, source: str) -> dict[str, Any]:
    """A fine-tuned model (finetuned.FinetuneMeta): the encoder and pooler as BERT's, plus the task head
    (H·C + C for C outputs; tcli keeps the pooler for tagging too, where HF's class drops it)."""
    from transformer_cli.finetuned import build_classifier

    with torch.device("meta"):
        model = build_classifier(meta)
    e, V, C = meta.encoder, meta.vocab_size, meta.outputs
    H = e.d_model
    report = count_model(model.bert, "encoder")
    head = H * C + C
    what = f"{len(meta.labels)} labels" if meta.kind != "regression" else "1 output"
    report["components"].append(_component(f"{meta.kind} classifier (weight, bias)", "task head", note=what))
    report["components"][-1]["params"] = head
    report["bert_model"] = report["total"]
    report["total"] += head
    report["trainable"] += head
    full = bert_formula(e, V)
    base = full.reference_value
    name = HF_CLASSES[meta.kind]
    up_to_bert_model = [t.name for t in full.terms].index("BertModel") + 1
    terms = [
        *full.terms[:up_to_bert_model],
        Term("task head", "H·C + C", f"{H}·{C} + {C}", head),
        Term(name, "BertModel + head", f"{base:,} + {head:,}", base + head),
    ]
    sizes = {"V": V, "H": H, "L": e.layers, "A": e.heads, "F": e.ffn_dim, "P": e.max_positions, "T": 2, "C": C}
    sizes["norm"] = e.norm
    total = report["total"]
    report.update(
        kind="finetune",
        task=meta.kind,
        hf_class=name,
        source=source,
        sizes=sizes,
        bytes_fp32=4 * total,
        bytes_bf16=2 * total,
        mb_fp32=round(4 * total / MB, 2),
        mb_bf16=round(2 * total / MB, 2),
        formula=[asdict(t) for t in terms],
        formula_note=full.note,
        formula_total=base + head,
        formula_matches=base + head == total,
        approximation=full.approximation,
        approximation_text=full.approximation_text,
        approximation_note=full.approximation_note + "; and the head",
        approximation_of=name,
        approximation_rel_error=(full.approximation - total) / total,
    )
    return report


def _line(label: str, value: int, note: str = "") -> str:
    return f"{label:<56}{value:>14,}" + (f"  {note}" if note else "")


def format_table(r: dict[str, Any]) -> str:
    """The report as a plain-text table: components, totals, sizes, formula, approximation."""
    bert, finetuned = r["kind"] == "bert", r["kind"] == "finetune"
    title = "BERT" if bert else "Transformer (translation)"
    if finetuned:
        title = f"fine-tuned BERT ({r['task']}, as {r['hf_class']})"
    out = [
        f"{title} from {r['source']}",
        "  ".join(f"{k}={v}" for k, v in r["sizes"].items()),
        "",
        f"{'component':<56}{'parameters':>14}",
    ]
    group = None
    for c in r["components"]:
        if (bert or finetuned) and c["group"] in ("pretraining heads", "task head") and group != c["group"]:
            out.append(_line("= BertModel (encoder + pooler)", r["bert_model"]))
        if c["group"] != group:
            group = c["group"]
            out.append(group)
        out.append(_line("  " + c["name"], c["params"], c["note"]))
        out.extend(_line("    per layer: " + p["name"], p["params"]) for p in c.get("per_layer", []))
    total_of = " (BertForPreTraining)" if bert else f" ({r['hf_class']})" if finetuned else ""
    out.append(_line("= total" + total_of, r["total"]))
    out.append(f"trainable {r['trainable']:,}, frozen {r['frozen']:,}")
    out.append(f"size {r['mb_fp32']:,.2f} MB at fp32, {r['mb_bf16']:,.2f} MB at bf16 (MB = 2^20 bytes)")
    if "stored_total" in r:
        same = "equal to the model count" if r["stored_matches"] else "DIFFERS from the model count"
        out.append(f"stored in the checkpoint: {r['stored_total']:,} elements (tied tensors once), {same}")
    out += ["", "formula (exact, closed form; F = FFN inner size):"]
    width = max(20, *(len(t["name"]) + 2 for t in r["formula"]))  # BertForSequenceClassification: 29
    for t in r["formula"]:
        numbers = "" if t["substituted"] == str(t["value"]) else f" = {t['substituted']}"
        out.append(f"  {t['name']:<{width}}{t['symbolic']:<34}{numbers} = {t['value']:,}")
    if r["formula_note"]:
        out.append(f"  with {r['formula_note']}")
    check = "equals the built model" if r["formula_matches"] else f"DIFFERS from the built model ({r['total']:,})"
    out.append(f"  formula total {r['formula_total']:,}: {check}")
    out.append(
        f"approximation {r['approximation_text']} = {r['approximation']:,} "
        f"({r['approximation_rel_error']:+.2%} vs {r['approximation_of']}): {r['approximation_note']}"
    )
    return "\n".join(out)


def run_count_params(
    config: Path | None, checkpoint: Path | None, preset: str | None, overrides: list[str] | None, as_json: bool
) -> dict[str, Any]:
    """`tcli count-params`: print the table (or JSON) for exactly one source and return the report."""
    if sum(s is not None for s in (config, checkpoint, preset)) != 1:
        raise UserError("give one of --config, --checkpoint or --preset")
    if checkpoint is not None:
        if overrides:
            raise UserError("--set applies to --config and --preset; a checkpoint is counted as stored")
        report = count_checkpoint(Path(checkpoint))
    elif preset is not None:
        report = count_config(preset_config(preset, overrides), source=f"preset {preset}")
    else:
        report = count_config(file_config(Path(config), overrides), source=str(config))
    print(json.dumps(report, indent=2) if as_json else format_table(report))
    return report
