"""The encoder of a Hugging Face BERT folder, for inference: its config.json sizes, its own tokenizer, and its
encoder weights under tcli's names (any HF BERT class: BertModel, BertForPreTraining, BertForMaskedLM, a
classifier; their heads are left out).

`tcli finetune` (finetune/setup.py `_hf_init`) and `tcli embed` both read a folder here: the keys that change the
function, integer sizes, every tensor's name and shape are checked before any weight is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import ValidationError
from torch import Tensor

from transformer_cli.config import BertModelConfig
from transformer_cli.core.errors import UserError, quote
from transformer_cli.export.hf import (
    DROPOUT_KEYS,
    SIZE_KEYS,
    _read_safetensors,
    check_function_keys,
    check_integers,
    from_hf_state_dict,
    read_json_object,
    to_hf_state_dict,
)
from transformer_cli.vocab.bert_tokenizer import BertTokenizer, tokenizer_of_hf_folder


@dataclass
class HfEncoder:
    encoder: BertModelConfig
    vocab_size: int  # rows of the token embedding (config.json vocab_size)
    tokenizer: BertTokenizer
    weights: dict[str, Tensor]  # Bert(pretraining_heads=False) names; the pooler's zero where the folder has none
    has_pooler: bool


def read_hf_encoder(folder: Path, where: str) -> HfEncoder:
    """The folder's encoder; every problem is one line that starts with `where` (the option naming the folder)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise UserError(f"{where}: no config.json; give a Hugging Face BERT folder (or a tcli checkpoint)")
    hf = read_json_object(config_path)
    if hf.get("model_type", "bert") != "bert":
        raise UserError(f"{config_path}: model_type {quote(hf.get('model_type'), 40)} is not bert")
    check_function_keys(hf, str(config_path))
    check_integers(hf, [*SIZE_KEYS, "vocab_size"], str(config_path))
    if isinstance(hf.get("hidden_size"), int) and isinstance(hf.get("num_attention_heads"), int):
        if hf["num_attention_heads"] < 1 or hf["hidden_size"] % hf["num_attention_heads"]:
            raise UserError(
                f"{config_path}: hidden_size {hf['hidden_size']} is not divisible by num_attention_heads "
                f"{hf['num_attention_heads']}; not a BERT config"
            )
    try:
        encoder = BertModelConfig(
            **{ours: hf[key] for key, ours in SIZE_KEYS.items()},
            **{ours: hf.get(key, 0.1) for key, ours in DROPOUT_KEYS.items()},
        )
        vocab_size = int(hf["vocab_size"])
    except ValidationError as e:  # a value out of tcli's bounds, named by its key in config.json
        error = e.errors()[0]
        ours = str(error["loc"][0]) if error.get("loc") else ""
        key = next((key for key, field in {**SIZE_KEYS, **DROPOUT_KEYS}.items() if field == ours), ours)
        raise UserError(
            f"{config_path}: {key} is {quote(hf.get(key), 40)}: {error['msg'].lower()}; not a BERT config tcli loads"
        ) from None
    except (KeyError, ValueError, TypeError) as e:
        raise UserError(f"{config_path}: not a BERT config ({str(e).splitlines()[0][:120]})") from None
    tokenizer = tokenizer_of_hf_folder(folder)
    if len(tokenizer) > vocab_size:
        raise UserError(
            f"{where}: the tokenizer's ids go up to {len(tokenizer) - 1} but config.json vocab_size is {vocab_size}"
        )
    weights, has_pooler = _encoder_weights(folder, encoder, vocab_size, where)
    return HfEncoder(encoder, vocab_size, tokenizer, weights, has_pooler)


def _encoder_weights(
    folder: Path, encoder: BertModelConfig, vocab_size: int, where: str
) -> tuple[dict[str, Tensor], bool]:
    from transformer_cli.checkpoint import check_weights
    from transformer_cli.models.bert import Bert

    hf: dict[str, Tensor] = {}
    for name, tensor in _read_weights(folder, where).items():  # BertModel saves without "bert."; old files gamma/beta
        name = name if name.startswith(("bert.", "cls.")) else f"bert.{name}"
        hf[name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")] = tensor
    has_pooler = any(name.startswith("bert.pooler.") for name in hf)
    if not has_pooler:  # BertForMaskedLM and tagger folders: zeros stand in through the mapping (no vector reads it)
        d = encoder.d_model
        hf = {**hf, "bert.pooler.dense.weight": torch.zeros(d, d), "bert.pooler.dense.bias": torch.zeros(d)}
    e = encoder
    with torch.device("meta"):
        ref = Bert(
            vocab_size, e.d_model, e.layers, e.heads, e.ffn_dim, e.max_positions, pretraining_heads=False
        ).state_dict()
        hf_ref = to_hf_state_dict(ref, e.layers, heads=False)
    if all(k in hf for k in hf_ref):  # (a missing one: from_hf_state_dict names it)
        check_weights({k: hf[k] for k in hf_ref}, hf_ref, f"{where}")
    try:
        ours = from_hf_state_dict(hf, e.layers, heads=False)
    except UserError as error:
        raise UserError(f"{where}: {error}") from None
    check_weights(ours, ref, where)
    return {k: v.float() for k, v in ours.items()}, has_pooler


def _read_weights(folder: Path, where: str) -> dict[str, Tensor]:
    path = folder / "model.safetensors"
    if path.is_file():
        return _read_safetensors(path)
    path = folder / "pytorch_model.bin"
    if not path.is_file():
        raise UserError(f"{where}: no model.safetensors or pytorch_model.bin")
    from transformer_cli.checkpoint import torch_load

    try:
        state = torch_load(path)
    except Exception as e:  # a damaged or foreign file
        raise UserError(f"{path} is not a readable weights file ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(state, dict):
        raise UserError(f"{path} holds no state dict")
    return state
