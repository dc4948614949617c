"""`tcli evaluate`: a checkpoint scored on a split or a file with the functions training validates with."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_cli.core.errors import UserError, quote
from transformer_cli.core.files import check_file
from transformer_cli.metrics import task_metrics

if TYPE_CHECKING:
    from torch import nn

    from transformer_cli.checkpoint import Checkpoint
    from transformer_cli.runtime.device import Runtime


# ----------------------------------------------------------------------------- tcli evaluate


def run_evaluate(
    checkpoint: Path,
    split: str | None = None,
    input_path: Path | None = None,
    reference: Path | None = None,
    data_dir: Path | None = None,
    beam: int | None = None,
    lenpen: float | None = None,
    device: str = "auto",
    precision: str | None = None,
    as_json: bool = False,
    bleu_tokenize: str | None = None,
) -> dict[str, Any]:
    """`tcli evaluate`: score a checkpoint on a split of its data or on given files, with the functions
    training evaluates with (translation/validation.py, bert/validation.py), and print the result (text or one
    JSON line).

    The precision defaults to the checkpoint's train.precision and the weights stay fp32 under autocast,
    as during training, so the numbers equal the training-time evaluation of the same weights. BLEU uses
    `bleu_tokenize` (`auto` or a sacreBLEU tokenizer), by default the checkpoint's eval.bleu_tokenize.
    """
    import torch

    from transformer_cli.checkpoint import read_checkpoint
    from transformer_cli.runtime.device import Runtime

    if (split is None) == (input_path is None):
        raise UserError("give either --split NAME or --input FILE")
    if split is not None and reference is not None:  # it would be ignored: the split's own targets are scored
        raise UserError(
            f"--reference goes with --input; --split {split} is scored against its own target file (give --input "
            "and --reference to score other files)"
        )
    ckpt = read_checkpoint(checkpoint)
    translation_only = (reference, beam, lenpen, bleu_tokenize)
    if ckpt.kind != "translation" and any(option is not None for option in translation_only):
        what = "a BERT" if ckpt.kind == "bert" else "a fine-tuned"
        raise UserError(
            f"{checkpoint} is {what} checkpoint: --reference, --beam, --lenpen and --bleu-tokenize are for translation"
        )
    runtime = Runtime.create(device, precision or ckpt.cfg.train.precision)
    model = ckpt.build_model().to(runtime.device).eval()
    with torch.inference_mode():
        if ckpt.kind == "translation":
            result = _evaluate_translation(
                ckpt, model, runtime, split, input_path, reference, data_dir, beam, lenpen, bleu_tokenize
            )
        elif ckpt.kind == "finetune":
            result = _evaluate_finetuned(ckpt, model, runtime, split, input_path, data_dir)
        else:
            result = _evaluate_bert(ckpt, model, runtime, split, input_path, data_dir)
    result = {
        "checkpoint": str(checkpoint),
        "kind": ckpt.kind,
        "step": ckpt.state.get("train_state", {}).get("step"),
        **result,
        "device": str(runtime.device),
        "precision": runtime.precision,
    }
    print(json.dumps(result) if as_json else _describe(result))
    return result


def _evaluate_translation(
    ckpt: Checkpoint,
    model: nn.Module,
    runtime: Runtime,
    split: str | None,
    input_path: Path | None,
    reference: Path | None,
    data_dir: Path | None,
    beam: int | None,
    lenpen: float | None,
    bleu_tokenize: str | None,
) -> dict[str, Any]:
    from transformer_cli.data.translation import data_columns, data_paths, encode_parallel, read_parallel, read_tsv
    from transformer_cli.metrics.bleu import translation_scores, usable_tokenizer
    from transformer_cli.translation.validation import eval_decode_options, translate_texts, translation_nll

    cfg = ckpt.cfg
    if split is not None:
        src_path, ref_path = data_paths(cfg.data, split, data_dir)
        for path in dict.fromkeys((src_path, ref_path)):
            check_file(
                path,
                f"--split {split}: {path} {{what}} (the checkpoint's data.dir is {cfg.data.dir}; "
                "point elsewhere with --data-dir)",
            )
    elif reference is None:
        raise UserError("--input needs --reference (the translations to score against)")
    else:
        src_path, ref_path = input_path, reference
    where = "--bleu-tokenize" if bleu_tokenize is not None else f"{ckpt.path}'s eval.bleu_tokenize"
    tokenize = usable_tokenizer(bleu_tokenize or cfg.eval.bleu_tokenize, cfg.data.tgt_lang, where)
    columns = data_columns(cfg.data) if split is not None else None
    lines = read_tsv(src_path, columns) if columns is not None else read_parallel(src_path, ref_path)
    data = encode_parallel(
        *lines,
        *ckpt.vocabs,
        max_len=cfg.model.max_positions - 2,
        split=str(src_path) if columns is not None else f"{src_path} and {ref_path}",
        limit=f"the model's positions: model.max_positions {cfg.model.max_positions} - 2",
    )
    opts = dataclasses.replace(
        eval_decode_options(cfg.eval),
        **({"beam": beam} if beam is not None else {}),
        **({"lenpen": lenpen} if lenpen is not None else {}),
    )
    nll = translation_nll(model, data, cfg.train.max_tokens, runtime.device, runtime.context, cfg.train.pad_to_multiple)
    hyps = translate_texts(
        model, data.src, opts, ckpt.vocabs[1], runtime.device, runtime.context, runtime.kernel_per_shape
    )
    scores = translation_scores(hyps, data.tgt_text, tokenize)
    return {
        "data": split if split is not None else str(src_path),
        "sentences": len(data),
        "dropped_empty": data.dropped_empty,
        "dropped_long": data.dropped_long,
        "tokens": nll.tokens,
        "loss": nll.loss,
        "ppl": nll.ppl,
        "bleu": scores.bleu,
        "bleu_lc": scores.bleu_lc,
        "chrf": scores.chrf,
        "bleu_signature": scores.bleu_signature,
        "bleu_lc_signature": scores.bleu_lc_signature,
        "chrf_signature": scores.chrf_signature,
        "beam": opts.beam,
        "lenpen": opts.lenpen,
    }


def _evaluate_bert(
    ckpt: Checkpoint,
    model: nn.Module,
    runtime: Runtime,
    split: str | None,
    input_path: Path | None,
    data_dir: Path | None,
) -> dict[str, Any]:
    from transformer_cli.bert.validation import bert_special_ids, bert_validation, held_out_instances
    from transformer_cli.data.bert import check_corpus, encode_documents, read_documents

    cfg, d = ckpt.cfg, ckpt.cfg.data
    if split is not None:
        if split not in ("train", "valid"):
            raise UserError(f"--split {split!r}: a BERT run has the splits train and valid (data.train, data.valid)")
        path = Path(data_dir or d.dir) / getattr(d, split)
    else:
        path = input_path
    docs = read_documents(path, d.format, d.split_sentences)
    check_corpus(docs, str(path), d.format, d.split_sentences)
    encoded = encode_documents(ckpt.vocabs[0], docs)
    check_corpus(encoded, str(path), d.format, d.split_sentences)
    instances = held_out_instances(encoded, cfg.train.seed, d.max_seq_len, d.short_seq_prob)
    metrics = bert_validation(
        model,
        instances,
        bert_special_ids(len(ckpt.vocabs[0])),
        cfg.train.seed,
        cfg.train.batch_size,
        d.mask_prob,
        d.max_predictions,
        runtime.device,
        runtime.context,
    )
    return {
        "data": split if split is not None else str(path),
        "documents": len(encoded),
        "instances": len(instances),
        **metrics,
    }


def _evaluate_finetuned(
    ckpt: Checkpoint,
    model: nn.Module,
    runtime: Runtime,
    split: str | None,
    input_path: Path | None,
    data_dir: Path | None,
) -> dict[str, Any]:
    """The task's metrics and score on labelled examples, by the function training's dev evaluation uses.
    `--split valid` is the run's dev evaluation (for MNLI both dev splits, the second as "<split>/<metric>")."""
    from transformer_cli.kinds.finetuned import evaluate_examples

    meta, stored = ckpt.finetune, ckpt.state["finetune"].get("metrics")
    what = f"{ckpt.path}: the stored metrics {quote(stored, 60)}"
    if stored is not None and not isinstance(stored, list):
        raise UserError(f"{what} are damaged: not a list of metric names")
    try:  # as the run's config was checked (task.metrics), and f1 with two labels, as its data was
        task_metrics.check_names(meta.kind, stored or [], what)
    except ValueError as e:
        raise UserError(str(e)) from None
    if "f1" in (stored or []) and meta.task_kind.has_label_set and len(meta.labels) != 2:
        raise UserError(f"{what} are damaged: f1 scores two labels, and the model has {len(meta.labels)}")
    metrics = tuple(stored or ())
    sets = _labelled_examples(ckpt, split, input_path, data_dir)
    result: dict[str, Any] = {"data": split if split is not None else str(input_path)}
    for i, (name, examples) in enumerate(sets.items()):
        meta.task_kind.check_scorable(metrics, {input_path if split is None else f"--split {name}": examples})
        scores, _ = evaluate_examples(model, meta, metrics, examples, None, runtime, refuse_non_finite=str(ckpt.path))
        prefix = "" if i == 0 else f"{name}/"
        result.update({f"{prefix}examples": len(examples), **{f"{prefix}{k}": v for k, v in scores.items()}})
    return result


def _labelled_examples(
    ckpt: Checkpoint, split: str | None, input_path: Path | None, data_dir: Path | None
) -> dict[str, list[Any]]:
    """{split name: labelled examples}: a split of the run's data (GLUE's own splits for a GLUE task), or --input
    read with the training columns (a .conll file for a tagger); labels outside the trained set are refused."""
    from transformer_cli.data.labeled import (
        GLUE_TASKS,
        TABLE_SUFFIXES,
        check_labels,
        glue_key,
        read_conll,
        read_glue,
        read_task_table,
    )

    cfg, meta = ckpt.cfg, ckpt.finetune
    d, folder = cfg.data, Path(data_dir or cfg.data.dir)
    glue = GLUE_TASKS[glue_key(cfg.task.glue)] if cfg.task.glue else None
    if split is not None and glue is not None:
        names = ("train", "valid", *glue.dev_splits)
        if split not in names:
            raise UserError(f"--split {split!r}: GLUE {glue.folder} has the splits {', '.join(names)}")
        chosen = glue.dev_splits if split == "valid" else (split,)
        return {name: read_glue(folder, glue.name, name) for name in chosen}
    if split is not None:
        if split not in ("train", "valid"):
            raise UserError(f"--split {split!r}: a fine-tuning run has the splits train and valid (data.train, .valid)")
        path = folder / getattr(d, split)
    else:
        path = input_path
    hint = f" (the checkpoint's data.dir is {d.dir}; see --data-dir)" if split else ""
    check_file(path, f"{'--split ' + split if split else '--input'} {path} {{what}}{hint}")
    suffix, conll = path.suffix.lower(), meta.task_kind.reads == "conll"
    if meta.task_kind.reads == "squad":  # questions with their answers (a SQuAD file, v1.1 or v2.0)
        from transformer_cli.data.squad import read_squad

        if suffix not in (".json", ".jsonl"):
            raise UserError(f"--input {path}: this span model scores SQuAD files (.json or .jsonl); give one")
        return {split or "input": read_squad(path)}
    if split is None and (suffix in TABLE_SUFFIXES if conll else suffix == ".conll"):
        reads = "CoNLL files (a word and its tag per line)" if conll else "tables (.tsv, .csv, .jsonl)"
        raise UserError(f"--input {path}: this {meta.kind} model reads {reads}, and {path.name} is not one")
    if conll:
        examples: list[Any] = read_conll(path)
        unlabelled = next((ex for ex in examples if ex.tags is None), None)
    else:
        text, pair, label = d.text, d.pair, d.label
        if glue is not None:  # a file with the GLUE task's own column names (CoLA's, unnamed: sentence, label)
            text, label = (c if isinstance(c, str) else n for c, n in ((glue.text, d.text), (glue.label, d.label)))
            pair = glue.pair if isinstance(glue.pair, str) else None
        form = meta.task_kind.label_form
        examples = read_task_table(path, glue, text, pair, label, form, d.columns, d.label_separator)
        unlabelled = next((ex for ex in examples if ex.label is None), None)
    if not examples:
        raise UserError(f"{path}: no examples to score")
    if unlabelled is not None:
        raise UserError(f"{path}:{unlabelled.line}: no label; tcli evaluate needs labels (tcli predict labels text)")
    if meta.labels:
        check_labels(examples, meta.labels, path)
    return {split or "input": examples}


def _describe(r: dict[str, Any]) -> str:
    head = f"{r['checkpoint']} ({r['kind']}, step {r['step']}) on {r['data']}"
    if r["kind"] == "finetune":
        shown = "  ".join(
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
            for k, v in r.items()
            if k not in ("checkpoint", "kind", "step", "data", "device", "precision")
        )
        return f"{head}\n{shown}"
    if r["kind"] == "bert":
        return "\n".join(
            [
                f"{head}: {r['documents']} documents, {r['instances']} NSP pairs",
                f"MLM loss {r['mlm_loss']:.4f}  perplexity {r['ppl']:.2f}  MLM accuracy {r['mlm_acc']:.4f}",
                f"NSP accuracy {r['nsp_acc']:.4f}",
            ]
        )
    dropped = r["dropped_empty"] + r["dropped_long"]
    note = f" ({dropped} dropped: empty side or too long)" if dropped else ""
    return "\n".join(
        [
            f"{head}: {r['sentences']} sentence pairs{note}, {r['tokens']} target tokens; beam {r['beam']}, "
            f"lenpen {r['lenpen']}",
            f"loss {r['loss']:.4f} (per-token NLL)  perplexity {r['ppl']:.2f}",
            f"BLEU {r['bleu']:.2f}  ({r['bleu_signature']})",
            f"BLEU lowercased {r['bleu_lc']:.2f}  ({r['bleu_lc_signature']})",
            f"chrF {r['chrf']:.2f}  ({r['chrf_signature']})",
        ]
    )
