"""Checkpoints: one self-describing file, written atomically, read and validated in one place.

Every command that reads a checkpoint (translate, evaluate, export-hf, count-params, a resume, ...) goes
through `read_checkpoint`, so a damaged, foreign or hostile file is the same one-line error everywhere:
the file is loaded with `weights_only=True` (it cannot run code), then its metadata, config, vocabulary
and weights are checked before any model is built. Nothing here imports the training modules.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_cli.config import SCHEMAS, build_config
from transformer_cli.core.errors import UserError, finite_number, quote
from transformer_cli.metrics.bleu import OLD_DEFAULT
from transformer_cli.vocab.spm import Vocab, check_bert_vocab

# ----------------------------------------------------------------------------- writing


def serialize(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


# ----------------------------------------------------------------------------- reading


@dataclass
class Checkpoint:
    """A validated checkpoint: its kind, resolved run config, vocabularies and the raw state."""

    path: Path
    kind: str  # "translation" | "bert"
    cfg: Any  # TranslationRunConfig | BertRunConfig
    vocabs: tuple[Vocab, ...]  # translation: (source, target), the same object when joint; BERT: (vocab,)
    state: dict[str, Any]

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        return self.state["model"]

    @property
    def finetune(self) -> Any:
        """A fine-tuned checkpoint's task kind, labels, encoder sizes and tokenizer (finetuned.FinetuneMeta)."""
        from transformer_cli.kinds.finetuned import FinetuneMeta

        if "_finetune" not in self.__dict__:
            meta = FinetuneMeta.from_state(self.state.get("finetune"), str(self.path))
            if meta.kind != self.cfg.task.kind:  # a head of one kind read as another's: the shapes may agree
                raise UserError(
                    f"{self.path}: its fine-tuning metadata says {meta.kind} but its config's task.kind is "
                    f"{self.cfg.task.kind}; the file is damaged"
                )
            self.__dict__["_finetune"] = meta
        return self.__dict__["_finetune"]

    def build_model(self) -> nn.Module:
        """The model of this checkpoint with its weights, after `check` (names, shapes, finite values)."""
        self.check()
        model = self._build()
        model.load_state_dict(self.weights)
        return model

    def check(self) -> None:
        """Every tensor's name and shape against the config (on the meta device: no memory), and every weight
        finite: one-line errors naming the file."""
        try:
            with torch.device("meta"):
                expected = self._build().state_dict()
        except ValueError as e:
            raise UserError(f"{self.path}: its config does not describe a valid model: {e}") from None
        check_weights(self.weights, expected, str(self.path))

    def _build(self) -> nn.Module:
        from transformer_cli.models.builders import build_bert, build_transformer

        if self.kind == "finetune":
            from transformer_cli.kinds.finetuned import build_classifier

            return build_classifier(self.finetune)
        src, tgt = len(self.vocabs[0]), len(self.vocabs[-1])
        if self.kind == "bert":
            return build_bert(self.cfg.model, src)
        return build_transformer(self.cfg.model, src, tgt)


LOADABLE_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_weights(weights: dict[str, Any], expected: dict[str, torch.Tensor], source: str) -> None:
    """Names, shapes and finiteness of `weights` against a model's (meta) state dict; one-line errors."""
    missing = [k for k in expected if k not in weights]
    if missing:
        raise UserError(
            f"{source}: the weights lack {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; the file does not match its own config"
        )
    extra = [k for k in weights if k not in expected]
    if extra:
        raise UserError(
            f"{source}: unexpected tensor {extra[0]!r} in the weights; the file does not match its own config"
        )
    for name, ref in expected.items():
        t = weights[name]
        if not isinstance(t, torch.Tensor):
            raise UserError(f"{source}: {name} is a {type(t).__name__}, not a tensor")
        if t.layout != torch.strided or t.is_meta or t.is_quantized:  # values no model can load or check
            what = "meta" if t.is_meta else "quantized" if t.is_quantized else str(t.layout).removeprefix("torch.")
            raise UserError(f"{source}: {name} is a {what} tensor, not a dense one of values; the file is damaged")
        if tuple(t.shape) != tuple(ref.shape):
            raise UserError(f"{source}: {name} has shape {tuple(t.shape)} but the config needs {tuple(ref.shape)}")
        if t.is_floating_point() and t.dtype not in LOADABLE_FLOATS:  # float8: no arithmetic to convert or check
            raise UserError(f"{source}: {name} is {str(t.dtype).removeprefix('torch.')}, which tcli does not load")
        if t.dtype != ref.dtype and not (t.is_floating_point() and ref.is_floating_point()):
            # an integer weight would be loaded as its truncated values (0 for most): a damaged file
            kind = "floating-point" if ref.is_floating_point() else str(ref.dtype).removeprefix("torch.")
            raise UserError(
                f"{source}: {name} is {str(t.dtype).removeprefix('torch.')}, not {kind}; the file is damaged"
            )
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise UserError(
                f"{source}: {name} holds NaN or infinite values; the model diverged before this "
                "checkpoint was written (use an earlier one)"
            )


# The commands that take a checkpoint of each kind, named when one is given to a command of another kind.
USED_BY = {
    "translation": "tcli translate, evaluate or export-ct2",
    "bert": "tcli fill-mask, evaluate or export-hf, or fine-tune it (tcli finetune, model.init)",
    "finetune": "tcli predict, evaluate or export-hf",
}


def read_checkpoint(path: str | Path, kind: str | None = None) -> Checkpoint:
    """Load and validate a tcli checkpoint; `kind` ("translation" or "bert") refuses the other kind.

    Every problem is a one-line UserError naming the file: not found, not a torch file, not a tcli
    checkpoint, an invalid config, a vocabulary sentencepiece cannot read, weights that are not tensors.
    """
    path = Path(path)
    state = _load(path)
    meta = state.get("tcli")
    if not isinstance(meta, dict) or not isinstance(state.get("model"), dict):
        raise UserError(f"{path} is not a tcli checkpoint (no tcli metadata); pass a file from <run>/checkpoints/")
    found = meta.get("kind")
    if found not in SCHEMAS:
        raise UserError(f"{path}: unknown model kind {str(found)[:40]!r}; valid kinds: {', '.join(SCHEMAS)}")
    if kind is not None and found != kind:
        raise UserError(f"{path} holds a {found} model, not a {kind} model; use it with {USED_BY[found]}")
    if not isinstance(state.get("config"), dict):
        raise UserError(f"{path} holds no run config; pass a file from <run>/checkpoints/")
    cfg = build_config(SCHEMAS[found], _as_trained(found, state["config"]), f"the config stored in {path}")
    # A fine-tuned model carries its tokenizer (sentencepiece or HF) in state["finetune"], read by .finetune.
    vocabs = _vocabs(state.get("vocab"), found, cfg, path) if found != "finetune" else ()
    if not all(isinstance(k, str) for k in state["model"]):
        raise UserError(f"{path}: the weights are not a state dict of named tensors")
    return Checkpoint(path, found, cfg, vocabs, state)


def _as_trained(kind: str, config: dict[str, Any]) -> dict[str, Any]:
    """The stored config with the settings that keys added since resolve to as the run had them: a translation
    checkpoint written before eval.bleu_tokenize scored BLEU with sacreBLEU's 13a, not with today's `auto`."""
    section = config.get("eval", {})
    if kind != "translation" or not isinstance(section, dict) or "bleu_tokenize" in section:
        return config
    return {**config, "eval": {**section, "bleu_tokenize": OLD_DEFAULT}}


# What a resume reads besides the weights (Trainer._restore): every key must be there, with a value of its type.
_TRAIN_STATE = {
    "step": int,
    "epoch": int,
    "batch_in_epoch": int,
    "bad_evals": int,
    "train_seconds": (int, float),
    "wall_seconds": (int, float),
}


def check_resumable(ckpt: Checkpoint) -> None:
    """A one-line refusal for a checkpoint that cannot continue a training run: an average (`tcli average`,
    `averaged.pt`), an export, or a file without optimizer, scheduler, RNG or a complete train state."""
    state, path = ckpt.state, ckpt.path
    if isinstance(state["tcli"].get("averaged"), dict):
        raise UserError(
            f"{path} is an average of checkpoints (tcli average): it holds no optimizer state and cannot be "
            "resumed; put the run's own last.pt back, or use the average with translate / evaluate"
        )
    missing = [
        k for k in ("optimizer", "scheduler", "scaler", "rng", "train_state") if not isinstance(state.get(k), dict)
    ]
    train_state = state.get("train_state") if isinstance(state.get("train_state"), dict) else {}
    missing += [
        f"train_state.{k}"
        for k, kind in _TRAIN_STATE.items()
        if "train_state" not in missing
        and (not isinstance(train_state.get(k), kind) or isinstance(train_state.get(k), bool))
    ]
    if "rng" not in missing and not {"torch", "python"} <= set(state["rng"]):
        missing.append("rng.torch / rng.python")
    if not isinstance(state.get("valid_fingerprint", ""), str):  # (absent: saved before it was kept)
        missing.append("valid_fingerprint (a hash)")
    best = train_state.get("best")
    if "train_state" not in missing and not (best is None or finite_number(best)):
        missing.append("train_state.best (a number or null)")
    # (types checked first) a step of -3 trained over the step files of the run; NaN seconds
    negative = (
        [] if missing else [k for k in _TRAIN_STATE if not (finite_number(train_state[k]) and train_state[k] >= 0)]
    )
    if negative:
        raise UserError(
            f"{path} cannot be resumed: its train_state.{negative[0]} is {train_state[negative[0]]!r}, where a count "
            "or a time of 0 or more belongs; resume from an intact last.pt or choose another --out"
        )
    damage = None if missing else _interval_damage(train_state.get("interval"), train_state["step"])
    if damage:
        raise UserError(
            f"{path} cannot be resumed: its train_state.interval (the updates since the last train event) {damage}; "
            "resume from an intact last.pt or choose another --out"
        )
    if missing:
        raise UserError(
            f"{path} cannot be resumed: it lacks {missing[0]}"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''} that a training checkpoint "
            "holds; resume from a last.pt written by tcli train / pretrain-bert, or choose another --out"
        )


def _interval_damage(interval: Any, step: int) -> str | None:
    """What is wrong with a checkpoint's train_state.interval (Trainer's _Interval.state_dict), or None; a checkpoint
    written before intervals were saved has none, which is fine."""
    if interval is None:
        return None
    if not isinstance(interval, dict):
        return f"is a {type(interval).__name__}, not a dict"
    counts = ("tokens", "rows", "steps")
    for key in (*counts, "seconds", "data_wait"):
        value = interval.get(key)
        if not finite_number(value) or value < 0 or (key in counts and not isinstance(value, int)):
            kind = "a count" if key in counts else "a time in seconds"
            return f"holds {key} = {quote(value)}, where {kind} of 0 or more belongs"
    if interval["steps"] > step:
        return f"counts {interval['steps']} updates, more than the run's {step}"
    grad_norm = interval.get("grad_norm")
    if not (grad_norm is None or (finite_number(grad_norm) and grad_norm >= 0)):
        return f"holds grad_norm = {quote(grad_norm)}, where a sum of gradient norms (0 or more) or null belongs"
    sums = interval.get("sums")
    if not isinstance(sums, dict):
        return f"holds sums = {quote(sums)}, where a dict of loss sums belongs"
    for key, entry in sums.items():
        if not (
            isinstance(key, str)
            and isinstance(entry, list | tuple)
            and len(entry) == 2
            and finite_number(entry[0])
            and isinstance(entry[1], int)
            and not isinstance(entry[1], bool)
            and entry[1] >= 0
        ):
            return f"holds sums[{quote(key)}] = {quote(entry)}, where [a finite loss sum, a count of 0 or more] belongs"
    return None


def _load(path: Path) -> dict[str, Any]:
    if not path.exists():
        if path.is_symlink():
            raise UserError(f"checkpoint {path} is a symbolic link to nothing (missing, or a loop of links)")
        raise UserError(f"checkpoint not found: {path}")
    if not path.is_file():
        raise UserError(f"{path} is not a file; pass a .pt file from <run>/checkpoints/")
    try:
        state = torch_load(path)
    except Exception as e:  # torch raises many types for a damaged, truncated or foreign file
        raise UserError(
            f"{path} is not a readable tcli checkpoint: the file is truncated, damaged or not a torch file "
            f"(torch.load: {_first_sentence(e)}); use another checkpoint, e.g. an earlier one of the run"
        ) from None
    if not isinstance(state, dict):
        raise UserError(f"{path} is not a tcli checkpoint (it holds a {type(state).__name__}, not a dict)")
    return state


def torch_load(path: Path) -> Any:
    """torch.load of a user's file: tensors and containers only (a file cannot run code), onto the CPU, without
    torch's warnings about what the file holds (an old pickle protocol, a sparse layout), which are not the user's
    to act on: the caller checks what it got."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, map_location="cpu", weights_only=True)


def _first_sentence(e: Exception, most: int = 100) -> str:
    """The first sentence of an error's message, whole words, at most about `most` characters."""
    text = str(e).strip().splitlines()[0].strip() if str(e).strip() else ""
    text = text.split(". ")[0].rstrip(".")
    if len(text) > most:
        text = text[:most].rsplit(" ", 1)[0] + " ..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _vocabs(vocab: Any, kind: str, cfg: Any, path: Path) -> tuple[Vocab, ...]:
    names = ("bert",) if kind == "bert" else (("joint",) if cfg.vocab.joint else ("src", "tgt"))
    if not isinstance(vocab, dict) or set(vocab) != set(names):
        raise UserError(f"{path}: the stored vocabulary should hold {', '.join(names)}; the file is damaged")
    loaded = []
    for name in names:
        data = vocab[name]
        if not isinstance(data, bytes | bytearray) or not data:
            raise UserError(f"{path}: the {name} vocabulary is not sentencepiece model bytes")
        try:
            loaded.append(Vocab(data))
        except Exception:  # sentencepiece raises RuntimeError, or worse, for bytes it cannot parse
            raise UserError(f"{path}: the {name} vocabulary is not a valid sentencepiece model") from None
    if kind == "bert":
        check_bert_vocab(loaded[0], str(path))
        return (loaded[0],)
    return (loaded[0], loaded[0]) if cfg.vocab.joint else (loaded[0], loaded[1])
