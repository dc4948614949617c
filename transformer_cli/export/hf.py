"""Hugging Face interoperability for BERT: `tcli export-hf` writes a folder that
`transformers.BertForPreTraining.from_pretrained` loads (a fine-tuned checkpoint: BertForSequenceClassification
or BertForTokenClassification, with its labels), and `--init-from-hf` reads one back.

The folder holds config.json, model.safetensors (HF parameter names), our sentencepiece model
(spiece.model, so that a run can continue with the same vocabulary), and a fast tokenizer that encodes
like it (tokenizer.json, tokenizer_config.json, special_tokens_map.json; see export/hf_tokenizer.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_cli.checkpoint import USED_BY, Checkpoint, check_weights, read_checkpoint
from transformer_cli.config import BertModelConfig
from transformer_cli.core.errors import UserError, quote
from transformer_cli.core.files import write_atomic
from transformer_cli.models.bert import PRETRAINING_HEADS
from transformer_cli.models.builders import build_bert
from transformer_cli.vocab.spm import Vocab, check_bert_vocab

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


def to_hf_state_dict(state: dict[str, Tensor], layers: int, heads: bool = True) -> dict[str, Tensor]:
    """Our BERT state dict -> HF BertForPreTraining names (Q, K, V split out of the fused projection);
    `heads=False`: the encoder and pooler alone (BertModel's tensors, under the "bert." prefix)."""
    out = {hf: state[ours] for ours, hf in _NAMES.items() if heads or not ours.startswith(PRETRAINING_HEADS)}
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


_LAYER_INDEX = re.compile(r"bert\.encoder\.layer\.(\d+)\.")


def from_hf_state_dict(hf: dict[str, Tensor], layers: int, heads: bool = True) -> dict[str, Tensor]:
    """The inverse of `to_hf_state_dict`; `heads=False` takes the encoder and pooler alone (the tensors of
    whatever heads the HF class that saved them had are ignored)."""
    names = {ours: theirs for ours, theirs in _NAMES.items() if heads or not ours.startswith(PRETRAINING_HEADS)}
    per_layer = [f"attention.self.{p}" for p in ("query", "key", "value")] + list(_LAYER_NAMES.values())
    needed = [*names.values()]
    for i in range(layers):
        needed += [f"{_LAYER.format(i=i)}{name}.{kind}" for name in per_layer for kind in ("weight", "bias")]
    missing = [name for name in needed if name not in hf]
    if missing:
        kind = "BertForPreTraining" if heads else "BERT model"
        raise UserError(f"the HF weights lack {missing[0]} (and {len(missing) - 1} more); not a {kind}")
    beyond = sorted({int(m.group(1)) for m in map(_LAYER_INDEX.match, hf) if m and int(m.group(1)) >= layers})
    if beyond:  # a deeper model than config.json says: its last layers would be dropped in silence
        raise UserError(
            f"the HF weights hold layer {beyond[-1]}, but config.json's num_hidden_layers is {layers}; "
            "the weights are not of the model config.json describes"
        )
    out = {ours: hf[theirs] for ours, theirs in names.items()}
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


# Files a transformers loader reads from a model folder (weights, configs, tokenizers): an export replaces
# them all, so that nothing of an earlier model in the folder is picked up with ours.
HF_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "tf_model.h5.index.json",
    "flax_model.msgpack",
    "flax_model.msgpack.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)
HF_SHARDS = ("model-*-of-*.safetensors", "pytorch_model-*-of-*.bin", "tf_model-*-of-*.h5")


def _write_json(data: dict, path: Path) -> None:
    write_atomic((json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"), path)


def _tokenizer_json(vocab: Vocab, where: Path) -> dict:
    """tokenizer.json of a tcli sentencepiece vocabulary."""
    from transformer_cli.export.hf_tokenizer import tokenizer_json

    try:
        return tokenizer_json(vocab)
    except ValueError as e:
        raise UserError(f"{where}: its vocabulary cannot be written as a HF tokenizer: {e}") from None


def _write_hf_folder(
    out_dir: Path, weights: dict[str, Tensor], config: dict, tokenizer: dict, max_len: int, spiece: bytes | None
) -> None:
    """An HF model folder, its files written whole or not at all (export/folders.write_staged): model.safetensors,
    config.json, the tokenizer files, and spiece.model where the tokenizer is tcli's sentencepiece vocabulary."""
    from safetensors.torch import save as save_safetensors

    from transformer_cli.export.folders import write_staged
    from transformer_cli.export.hf_tokenizer import special_tokens_map, tokenizer_config

    def write(folder: Path) -> None:
        write_atomic(save_safetensors(weights, metadata={"format": "pt"}), folder / "model.safetensors")
        _write_json(config, folder / "config.json")
        if spiece is not None:
            write_atomic(spiece, folder / "spiece.model")
        _write_json(tokenizer, folder / "tokenizer.json")
        _write_json(tokenizer_config(max_len), folder / "tokenizer_config.json")
        _write_json(special_tokens_map(), folder / "special_tokens_map.json")

    write_staged(out_dir, write)


def export_hf(checkpoint: Path, out_dir: Path, force: bool = False) -> Path:
    """Write config.json, model.safetensors, spiece.model and the fast-tokenizer files for a BERT checkpoint.

    A non-empty `out_dir` is refused unless `force`, which first removes every HF model/tokenizer file there.
    """
    from transformer_cli.export.folders import prepare_folder

    ckpt = read_checkpoint(checkpoint)
    if ckpt.kind == "finetune":  # BertForSequenceClassification / BertForTokenClassification
        return export_finetuned(ckpt, out_dir, force)
    if ckpt.kind != "bert":
        raise UserError(f"{checkpoint} holds a {ckpt.kind} model, not a bert model; use it with {USED_BY[ckpt.kind]}")
    cfg, (vocab,) = ckpt.cfg, ckpt.vocabs
    check_post_norm(cfg.model, str(checkpoint))
    model = ckpt.build_model()  # validates every tensor's name, shape and finiteness
    tokenizer = _tokenizer_json(vocab, checkpoint)
    prepare_folder(out_dir, force, HF_FILES + HF_SHARDS, "HF model and tokenizer")
    weights = to_hf_state_dict(model.state_dict(), cfg.model.layers)
    config = hf_config(cfg.model, len(vocab))
    _write_hf_folder(out_dir, weights, config, tokenizer, cfg.model.max_positions, vocab.model_bytes)
    return out_dir


def export_finetuned(ckpt: Checkpoint, out_dir: Path, force: bool = False) -> Path:
    """A fine-tuned checkpoint as BertForSequenceClassification (classification; regression with num_labels 1 and
    problem_type "regression"), BertForTokenClassification (tagging) or BertForQuestionAnswering (span, its head
    `qa_outputs`): config.json with id2label and label2id, model.safetensors, and the run's tokenizer (its
    tokenizer.json from an HF starting model, or the one derived from the tcli sentencepiece vocabulary, with
    spiece.model), so that transformers' pipelines answer with tcli's labels and logits."""
    from transformer_cli.export.folders import prepare_folder

    meta = ckpt.finetune
    check_post_norm(meta.encoder, str(ckpt.path))
    model = ckpt.build_model()  # validates every tensor's name, shape and finiteness
    tok = meta.tokenizer
    spiece = tok.data if tok.kind == "sentencepiece" else None
    tokenizer = _tokenizer_json(tok.vocab, ckpt.path) if spiece is not None else json.loads(tok.data.decode("utf-8"))
    prepare_folder(out_dir, force, HF_FILES + HF_SHARDS, "HF model and tokenizer")
    state = model.state_dict()
    encoder = {k.removeprefix("bert."): v for k, v in state.items() if k.startswith("bert.")}
    weights = to_hf_state_dict(encoder, meta.encoder.layers, heads=False)
    if meta.task_kind.per_token:  # BertForTokenClassification and BertForQuestionAnswering have no pooler
        weights = {k: v for k, v in weights.items() if not k.startswith("bert.pooler.")}
    for name in (k for k in state if not k.startswith("bert.")):  # the head: classifier.* (qa_outputs.* for QA)
        weights[name] = state[name].detach().contiguous().clone()
    _write_hf_folder(out_dir, weights, classifier_config(meta), tokenizer, meta.max_seq_len, spiece)
    return out_dir


def check_post_norm(model: BertModelConfig, where: str) -> None:
    """Hugging Face's BertModel is post-norm only: a pre-norm BERT has no equivalent there."""
    if model.norm != "post":
        raise UserError(
            f"{where}: a pre-norm BERT (model.norm: {model.norm}) has no Hugging Face BertModel equivalent; "
            "export-hf and --init-from-hf take post-norm models only"
        )


def classifier_config(meta: Any) -> dict:
    """config.json of the HF class of a fine-tuned model (finetuned.FinetuneMeta), its labels named."""
    kind = meta.task_kind
    config = hf_config(meta.encoder, meta.vocab_size)
    labels = kind.hf_labels(meta.labels)
    config.update(
        architectures=[kind.hf_class],
        pad_token_id=meta.tokenizer.pad_id,
        classifier_dropout=meta.classifier_dropout,
        id2label={str(i): label for i, label in enumerate(labels)},
        label2id={label: i for i, label in enumerate(labels)},
    )
    if kind.problem_type is not None:
        config["problem_type"] = kind.problem_type
    return config


def load_hf_bert(folder: Path, model: BertModelConfig) -> tuple[dict[str, Tensor], Vocab]:
    """Weights (our names) and vocabulary of an exported folder; sizes must match the run's model section.

    Every problem with the folder (a missing, unreadable or malformed file, a missing or mis-shaped tensor)
    is a one-line UserError naming the file.
    """
    where = f"--init-from-hf {folder}"
    check_post_norm(model, where)
    if not folder.is_dir():
        raise UserError(f"{where}: not a folder (pass a folder written by tcli export-hf)")
    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    vocab_path = folder / "spiece.model"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise UserError(f"{where}: {path.name} not found (a folder written by tcli export-hf)")
    hf = read_json_object(config_path)
    check_hf_config(hf, hf_config(model, 0), f"{where}: {config_path.name}")
    if not vocab_path.is_file():
        raise UserError(
            f"{where}: no spiece.model; its vocabulary cannot be matched to a "
            "tcli vocabulary (export the model with tcli export-hf)"
        )
    vocab = Vocab.load(vocab_path)
    check_bert_vocab(vocab, str(vocab_path))
    vocab_size = hf.get("vocab_size")
    check_integers(hf, ["vocab_size"], f"{where}: config.json")  # 400.0 equals 400, but is not a size
    if vocab_size != len(vocab):
        raise UserError(
            f"{where}: config.json vocab_size {quote(vocab_size, 60)} does not match its spiece.model "
            f"({len(vocab)} pieces)"
        )
    weights = _read_safetensors(weights_path)
    with torch.device("meta"):
        reference = to_hf_state_dict(build_bert(model, len(vocab)).state_dict(), model.layers)
    # Tensors we do not use (a head saved by another HF class) are ignored; ours must all be there.
    check_weights({k: weights[k] for k in reference if k in weights}, reference, str(weights_path))
    decoder = weights.get("cls.predictions.decoder.weight")
    if decoder is not None and not torch.equal(decoder, weights["bert.embeddings.word_embeddings.weight"]):
        raise UserError(
            f"{where}: cls.predictions.decoder.weight differs from the word embeddings (tie_word_embeddings "
            "false); tcli's BERT ties them, so it would compute another model: use a folder with tied embeddings"
        )
    try:
        return from_hf_state_dict(weights, model.layers), vocab
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


# config.json keys that change what the model computes, with the value tcli's BERT computes with; a key left
# out of config.json takes transformers' default, which is tcli's value for each of these.
FUNCTION_KEYS = {
    "model_type": "bert",
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "is_decoder": False,
    "add_cross_attention": False,
    "tie_word_embeddings": True,
}
# Sizes that must equal the run's model section: config.json key -> model key.
SIZE_KEYS = {
    "hidden_size": "d_model",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "intermediate_size": "ffn_dim",
    "max_position_embeddings": "max_positions",
}
DROPOUT_KEYS = {"hidden_dropout_prob": "dropout", "attention_probs_dropout_prob": "attention_dropout"}  # 0.1 if absent


def check_hf_config(hf: dict, expected: dict, where: str) -> None:
    """A config.json that describes exactly the model tcli builds from the run's model section, or a one-line
    error naming the key: another architecture, a key that changes the function (activation, LayerNorm
    epsilon, position embeddings, segment vocabulary, ...), a size of the wrong type or another value."""
    model_type = hf.get("model_type", "bert")
    if model_type != "bert":
        raise UserError(
            f"{where} describes a {str(model_type)[:40]!r} model (model_type), not BERT; --init-from-hf reads "
            "BERT folders (written by tcli export-hf or transformers' BertForPreTraining)"
        )
    check_function_keys(hf, where)
    for key, ours in SIZE_KEYS.items():
        value = hf.get(key)
        if key not in hf:
            raise UserError(f"{where} has no {key}; a BERT config.json gives it (tcli export-hf writes it)")
        check_integers(hf, [key], where)
        if value != expected[key]:
            raise UserError(
                f"{where}: {key} is {value} but the run's model.{ours} is {expected[key]}; set model.{ours}={value}"
            )


def check_function_keys(hf: dict, where: str) -> None:
    """One line naming the first config.json key that would make another function than tcli's BERT computes
    (FUNCTION_KEYS: activation, LayerNorm epsilon, position embeddings, a decoder, ...)."""
    for key, ours in FUNCTION_KEYS.items():
        value = hf.get(key, ours)
        same = type(value) is type(ours) or (isinstance(ours, float) and _is_number(value))
        if not same or value != ours:
            raise UserError(
                f"{where} sets {key} to {quote(value, 60)}, but tcli's BERT computes with {key} {ours!r}: it "
                "would start from another model than the folder holds; use a folder with that value"
            )


def check_integers(hf: dict, keys: list[str], where: str) -> None:
    """Each of `keys` that config.json gives is an integer: a size written "32", 32.0 or true is one line."""
    for key in keys:
        value = hf.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            raise UserError(f"{where}: {key} is {quote(value, 60)} ({type(value).__name__}); it must be an integer")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_json_object(path: Path) -> dict:
    """A JSON file holding an object (a Hugging Face config.json); anything else is a one-line UserError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except (ValueError, RecursionError) as e:  # an integer of over 4,300 digits, nesting past the stack
        raise UserError(
            f"{path} is not valid JSON ({'nested too deeply' if isinstance(e, RecursionError) else e})"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a JSON {type(data).__name__}, not an object of config keys")
    return data


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error type, or OSError, for a damaged file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} is not a readable safetensors file ({first[:160]}); export the model again") from None
