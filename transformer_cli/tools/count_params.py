"""`tcli count-params`: exact parameter counts by component, and the closed-form formula behind them.

The count comes from the real model built on the meta device (shapes only, no memory), so BERT-large
answers as fast as a toy model. Parameters are grouped by their names; one held under several names
(tied embeddings) is counted once and marked. Beside the count, the closed-form formula evaluated on
the config gives the same number for every configuration (a test checks presets and random configs),
and the quick estimate L·12H² + V·H shows how far off it is.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from transformer_cli.checkpoint import read_checkpoint
from transformer_cli.config import (
    SCHEMAS,
    BertRunConfig,
    TranslationRunConfig,
    _merge,
    build_config,
    file_config,
    parse_overrides,
)
from transformer_cli.core.errors import UserError
from transformer_cli.models.builders import build_bert, build_transformer
from transformer_cli.models.params import Term, bert_formula, component, count_model, transformer_formula

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


def count_finetuned(meta: Any, source: str) -> dict[str, Any]:
    """A fine-tuned model (finetuned.FinetuneMeta): the encoder and pooler as BERT's, plus the task head
    (H·C + C for C outputs; tcli keeps the pooler for tagging too, where HF's class drops it)."""
    from transformer_cli.kinds.finetuned import build_classifier

    with torch.device("meta"):
        model = build_classifier(meta)
    e, V, C = meta.encoder, meta.vocab_size, meta.outputs
    H = e.d_model
    report = count_model(model.bert, "encoder")
    head = H * C + C
    what = meta.task_kind.describe_outputs(meta.labels)
    report["components"].append(component(f"{meta.kind} classifier (weight, bias)", "task head", note=what))
    report["components"][-1]["params"] = head
    report["bert_model"] = report["total"]
    report["total"] += head
    report["trainable"] += head
    full = bert_formula(e, V)
    base = full.reference_value
    name = meta.task_kind.hf_class
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
