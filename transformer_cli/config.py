"""Typed run configuration: YAML file -> validated, frozen config sections.

One YAML file describes a run; `--set a.b=c` overrides any key (values parsed as YAML scalars).
Unknown keys, wrong types and out-of-range values fail at load time with one line that names
the key path and the file. Each component receives only its own section (`cfg.model`, `cfg.train`).
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Hashable
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from transformer_cli.core.buckets import bucket
from transformer_cli.core.errors import UserError, quote
from transformer_cli.core.kinds import TASK_KINDS
from transformer_cli.metrics import task_metrics


class _Loader(yaml.SafeLoader):
    """YAML as a config needs it.

    - `1e-3` is the float every user means (YAML 1.1 reads it as a string).
    - Only true/false are booleans, as in YAML 1.2: `src_lang: no` (Norwegian) stays the string "no", and a
      bool key given yes/no/on/off/1/0 is an error (StrictBool), not a guess.
    - No timestamps: `test: 2016-12-01` names a split, it is not a date.
    - A key given twice in one mapping is an error naming both lines, not a silent last-one-wins.
    - Aliases may not expand the document beyond MAX_VALUES values ("billion laughs").
    """

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, Hashable) and key in seen:
                raise _DuplicateKey(
                    f"key {str(key)[:100]!r} appears twice (lines {seen[key]} and {line}); keep one",
                    key_node.start_mark,
                )
            if isinstance(key, Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep)

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, problem: str, mark):
        self.problem, self.problem_mark = problem, mark

    def __str__(self) -> str:
        return self.problem


MAX_VALUES = 100_000  # values a config may expand to through aliases (a real config has a few hundred)


def _check_expansion(root: yaml.Node) -> None:
    """Count the values the document expands to, an aliased node once per reference (memoised by node)."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once instead of looping
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        total = min(total, MAX_VALUES + 1)
        sizes[id(node)] = total
        return total

    if size(root) > MAX_VALUES:
        raise _DuplicateKey(
            f"the document expands to more than {MAX_VALUES:,} values through aliases "
            "(&anchor / *alias); a config needs no more",
            root.start_mark,
        )


_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")
        and tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
# Numbers as written in decimal: YAML 1.1's octal (010 is 8), hex (0x18), digit groups (2_4 is 24) and base 60
# (1:30 is 90) stay text, which a number key refuses and a split name keeps as written.
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)$"
        r"|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"
    ),
    list("-+0123456789."),
)


def yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


class Section(BaseModel):
    """Base of every config section: frozen, and an unknown key is an error."""

    # NaN and infinity are never a sensible setting (an infinite adam_eps or weight_decay trains an all-NaN
    # model); numbers given for a text key (a split named 2016) are read as text.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, coerce_numbers_to_str=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """true/false where a number goes (`train.max_steps: true`) is a mistake, not 1 or 0 (as pydantic's lax
        mode would read it); the bool keys themselves take only true/false (StrictBool)."""
        items = value if isinstance(value, (list, tuple)) else (value,)
        annotation = cls.model_fields[info.field_name].annotation
        if any(isinstance(item, bool) for item in items) and _takes_a_number(annotation):
            raise PydanticCustomError("bool_for_number", "write a number, not true or false")
        # "3" in quotes is text: pydantic's lax mode would read it as 3 where a number goes, unlike YAML itself
        if any(isinstance(item, str) and _numeric(item) for item in items) and _takes_a_number(annotation, but_not=str):
            raise PydanticCustomError(
                "text_for_number", "write a decimal number without quotes (010, 0x18, 2_4 and 1:30 are text)"
            )
        # `train.tsv/` names a folder, as the system reads it (`cat train.tsv/`: Not a directory); a path drops
        # the slash and would read the file. model.init may name a folder (Hugging Face's), not a file so.
        if isinstance(value, str) and value.endswith("/") and len(value) > 1:
            if info.field_name in cls.FILE_KEYS or (
                info.field_name in cls.FILE_OR_FOLDER_KEYS
                and os.path.lexists(value.rstrip("/"))
                and not os.path.isdir(value)
            ):
                raise PydanticCustomError("folder_for_file", "a file is named without the final '/'")
        return value

    FILE_KEYS: ClassVar[tuple[str, ...]] = ()  # keys that name a file (or a split's files)
    FILE_OR_FOLDER_KEYS: ClassVar[tuple[str, ...]] = ()  # keys that name a file or a folder

    def check(self) -> None:
        """Cross-field checks; raise ValueError naming the keys involved."""


def _numeric(text: str) -> bool:
    """Whether `text` reads as a number in Python or in YAML 1.1 (0x18, 0o17, 1:30)."""
    try:
        float(text)
    except ValueError:
        return bool(re.fullmatch(r"[-+]?(?:0[xob][0-9a-fA-F_]+|[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?)", text))
    return True


def _takes_a_number(annotation: Any, but_not: type = bool) -> bool:
    """Whether a field's type is, or holds, int or float and not `but_not` (`int | None`, `tuple[float, float]`)."""
    types: list[Any] = []
    pending = [annotation]
    while pending:
        t = pending.pop()
        types.append(t)
        pending.extend(typing.get_args(t))
    return bool({int, float} & set(types)) and but_not not in types and bool not in types


# ----------------------------------------------------------------------------- shared sections

# Upper bounds that no real run reaches and that keep an absurd value (1e12) a config error instead of an
# allocation that fails or hangs; the memory a model needs is checked separately (train/lifecycle.py).
MAX_POSITIONS = 1 << 20
MAX_BATCH_TOKENS = 1 << 26
MAX_BEAM = 256
MAX_SEED = 2**32 - 1  # the largest train.seed


class VocabConfig(Section):
    """The sentencepiece vocabulary, trained from the training text on the first run."""

    FILE_KEYS = ("model",)

    size: int = Field(8000, ge=16, le=1_000_000, description="target vocabulary size (an upper bound)")
    type: Literal["unigram", "bpe", "char"] = Field(
        "unigram", description="sentencepiece model type (char: every character a piece)"
    )
    joint: StrictBool = Field(True, description="one vocabulary for source and target (needed to share embeddings)")
    character_coverage: float | Literal["auto"] = Field(
        "auto",
        description="share of characters covered (sentencepiece accepts 0.98 to 1); auto: 0.9995 when a language "
        "(data.src_lang/tgt_lang) is zh, ja or ko or the training text is mostly CJK, else 1.0",
    )
    split_cjk: StrictBool = Field(
        False,
        description="every CJK ideograph a token of its own, as in the Chinese BERTs (other scripts stay subwords); "
        "for vocabularies tcli trains",
    )
    max_sentences: int = Field(
        1_000_000,
        ge=1,
        le=1_000_000_000,
        description="at most this many lines (and 50M characters), drawn at random, train "
        "the vocabulary (sentencepiece needs about 17 bytes per character: under 1 GB)",
    )
    model: str | None = Field(None, description="an existing sentencepiece .model to use instead of training one")

    @field_validator("character_coverage")
    @classmethod
    def _coverage(cls, value: float | str) -> float | str:
        if value != "auto" and not 0.98 <= value <= 1.0:
            raise ValueError("sentencepiece accepts 0.98 to 1 (or auto)")
        return value


class TrainConfig(Section):
    """The shared trainer: optimisation, precision, evaluation and checkpoint cadence."""

    max_steps: int | None = Field(None, ge=1, le=10**12, description="stop after this many updates")
    max_epochs: int | None = Field(None, ge=1, le=10**9, description="stop after this many passes over the data")
    max_minutes: float | None = Field(None, gt=0, description="stop after this much wall time (evaluation included)")
    lr: float = Field(5e-4, gt=0.0, le=10.0, description="peak learning rate")
    warmup_steps: int = Field(4000, ge=0, description="linear warmup from 0 to lr")
    schedule: Literal["inverse_sqrt", "linear", "constant"] = Field(
        "inverse_sqrt", description="after warmup: lr*sqrt(warmup/step), linear decay to 0, or constant"
    )
    adam_betas: tuple[float, float] = Field((0.9, 0.98), description="AdamW betas")
    adam_eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay")
    clip_norm: float = Field(1.0, ge=0.0, description="gradient-norm clipping; 0 disables")
    accum_steps: int = Field(1, ge=1, le=65536, description="micro-batches accumulated per update")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 autocast where the hardware has bf16 matmul, else fp16/fp32"
    )
    seed: int = Field(1, ge=0, le=MAX_SEED, description="seeds data order, initialisation and dropout")
    eval_every: int = Field(1000, ge=1, description="evaluate every this many updates")
    save_every: int | None = Field(None, ge=1, description="write last.pt every this many updates (default eval_every)")
    log_every: int = Field(50, ge=1, description="log training metrics every this many updates")
    keep_last: int = Field(3, ge=0, description="step checkpoints kept besides best.pt and last.pt")
    patience: int | None = Field(None, ge=1, description="stop after this many evaluations without improvement")
    average_last: int | None = Field(
        None,
        ge=2,
        le=1000,
        description="at the end, average the last N step "
        "checkpoints into averaged.pt and score it beside best.pt (keep_last >= N)",
    )
    compile: StrictBool = Field(False, description="torch.compile the model")
    pad_to_multiple: int = Field(
        2,
        ge=1,
        le=512,
        description="batch lengths are padded to a set of 8 sizes per doubling, each a multiple of this: "
        "few repeating tensor shapes keep kernel caches warm, memory flat and speed steady",
    )


# ----------------------------------------------------------------------------- translation


class TranslationDataConfig(Section):
    """Parallel text under `dir`: a split is two files `{split}.{src_lang}` and `{split}.{tgt_lang}`, one sentence
    per line (format: text), or one tab-separated file of pairs as Tatoeba/Anki exports and d2l's fra.txt are
    (format: tsv: `source<TAB>target<TAB>attribution`)."""

    FILE_KEYS = ("train", "valid", "test")

    dir: str = Field("data/toy", description="folder with the parallel text files")
    format: Literal["text", "tsv"] = Field(
        "text",
        description="text: a split is the files {split}.{src_lang} and {split}.{tgt_lang}; tsv: a split is one "
        "file of tab-separated columns (data.train/valid/test name the files, e.g. train.tsv)",
    )
    src_column: int = Field(0, ge=0, le=1000, description="format tsv: the column (0-based) of the source sentence")
    tgt_column: int = Field(1, ge=0, le=1000, description="format tsv: the column (0-based) of the target sentence")
    src_lang: str = Field("src", min_length=1, description="source language code and file suffix, e.g. en")
    tgt_lang: str = Field(
        "tgt", min_length=1, description="target language code and file suffix, e.g. de (BLEU's tokenizer follows it)"
    )
    train: str = Field("train", min_length=1, description="training split name (format tsv: its file)")
    valid: str = Field(
        "val",
        min_length=1,
        description="validation split name (format tsv: its file; not the training split, nor files holding its text)",
    )
    test: str | None = Field(
        "test",
        min_length=1,
        description="test split name (format tsv: its file), scored at the end of training (null: none)",
    )
    max_len: int = Field(
        128, ge=1, le=MAX_POSITIONS, description="training pairs with a side longer than this (in pieces) are dropped"
    )
    preprocessed: str | None = Field(
        None,
        description="a folder written by tcli preprocess (default: the run preprocesses into its own data/ folder)",
    )


class TransformerConfig(Section):
    """The encoder-decoder Transformer of "Attention Is All You Need"."""

    d_model: int = Field(512, ge=2, le=65536, description="model width")
    heads: int = Field(8, ge=1, le=1024, description="attention heads; must divide d_model")
    ffn_dim: int = Field(2048, ge=1, le=1_048_576, description="inner size of the position-wise feed-forward network")
    enc_layers: int = Field(6, ge=1, le=1000, description="encoder blocks")
    dec_layers: int = Field(6, ge=1, le=1000, description="decoder blocks")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout on embeddings and sub-layer outputs")
    attention_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on attention weights")
    activation: Literal["relu", "gelu"] = Field("relu", description="FFN non-linearity")
    norm: Literal["post", "pre"] = Field("post", description="post-norm (the paper) or pre-norm")
    share_embeddings: StrictBool = Field(True, description="one matrix for source and target embeddings (joint vocab)")
    tie_output: StrictBool = Field(True, description="output projection shares the target embedding matrix")
    max_positions: int = Field(1024, ge=2, le=MAX_POSITIONS, description="longest sequence the positional table covers")


class EvalConfig(Section):
    """Validation decoding during training."""

    beam: int = Field(5, ge=1, le=MAX_BEAM, description="beam size for validation BLEU")
    lenpen: float = Field(1.0, ge=0.0, le=10.0, description="length penalty: score / length**lenpen")
    max_len_a: float = Field(1.2, ge=0.0, le=1000.0, description="max output length = a * source length + b")
    max_len_b: int = Field(10, ge=1, le=MAX_POSITIONS, description="see max_len_a")
    max_tokens: int = Field(8000, ge=16, le=MAX_BATCH_TOKENS, description="source tokens per decoding batch")
    bleu: StrictBool = Field(True, description="decode the validation set and score BLEU at each evaluation")
    bleu_tokenize: str = Field(
        "auto",
        description="sacreBLEU's tokenizer for every BLEU of the run (validation, best.pt, test, translate, "
        "evaluate): auto picks it from data.tgt_lang as sacreBLEU does (zh, zh-TW, cmn, yue: zh; ja: ja-mecab; "
        "ko: ko-mecab; else 13a), or name one: 13a, intl, zh, char, ja-mecab, ko-mecab, none, flores101, "
        "flores200, ... (a checkpoint from before this key scores with 13a)",
    )

    @field_validator("bleu_tokenize")
    @classmethod
    def _known_tokenizer(cls, value: str) -> str:
        return check_bleu_tokenize(value)


def check_bleu_tokenize(value: str) -> str:
    """`value` if it is `auto` or a tokenizer the installed sacreBLEU offers (its own list), else a ValueError
    listing them (pydantic reports it under the key; the CLI options turn it into a UserError)."""
    from transformer_cli.metrics.bleu import AUTO, tokenizer_names

    names = tokenizer_names()
    if value != AUTO and value not in names:
        raise ValueError(
            f"unknown BLEU tokenizer {value[:40]!r}; expected auto or one of sacreBLEU's: {', '.join(names)}"
        )
    return value


class TranslationTrainConfig(TrainConfig):
    max_tokens: int = Field(4096, ge=16, le=MAX_BATCH_TOKENS, description="padded tokens per side in a batch")
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0, description="label smoothing epsilon of the loss")


class TranslationRunConfig(Section):
    """`tcli train`: a translation run."""

    data: TranslationDataConfig = TranslationDataConfig()
    vocab: VocabConfig = VocabConfig()
    model: TransformerConfig = TransformerConfig()
    train: TranslationTrainConfig = TranslationTrainConfig()
    eval: EvalConfig = EvalConfig()

    def check(self) -> None:
        m, d = self.model, self.data
        for key in ("valid", "test"):
            if getattr(d, key) == d.train:
                raise ValueError(
                    f"data.train and data.{key} are both {d.train!r}: a run validates and tests on text it does "
                    f"not train on; name another split (or data.test: null for none)"
                )
        if d.format == "tsv" and d.src_column == d.tgt_column:
            raise ValueError(f"data.src_column and data.tgt_column are both {d.src_column}: name two columns")
        if d.format == "text" and (d.src_column, d.tgt_column) != (0, 1):
            raise ValueError("data.src_column and data.tgt_column choose columns of data.format: tsv; add it")
        if m.d_model % m.heads:
            raise ValueError(f"model.d_model ({m.d_model}) must be divisible by model.heads ({m.heads})")
        if m.d_model % 2:
            raise ValueError(f"model.d_model ({m.d_model}) must be even for the sinusoidal positions")
        if self.vocab.model is not None and not self.vocab.joint:
            raise ValueError("vocab.model gives one sentencepiece model for both languages: it needs vocab.joint: true")
        if m.share_embeddings and not self.vocab.joint:
            raise ValueError("model.share_embeddings needs vocab.joint: true (or set model.share_embeddings: false)")
        if self.data.max_len + 2 > m.max_positions:
            raise ValueError(f"data.max_len ({self.data.max_len}) + 2 exceeds model.max_positions ({m.max_positions})")
        padded = bucket(self.data.max_len + 1, self.train.pad_to_multiple)
        if padded > m.max_positions:
            raise ValueError(
                f"train.pad_to_multiple ({self.train.pad_to_multiple}) pads data.max_len + 1 "
                f"({self.data.max_len + 1}) to {padded} positions, more than model.max_positions "
                f"({m.max_positions}); use a smaller pad_to_multiple"
            )
        _check_train(self.train)


def _check_train(t: TrainConfig) -> None:
    if t.max_steps is None and t.max_epochs is None and t.max_minutes is None:
        raise ValueError("set train.max_steps, train.max_epochs or train.max_minutes so the run can end")
    if t.schedule == "linear" and t.max_steps is None and t.max_epochs is None:
        raise ValueError("train.schedule linear decays to 0 at the last step: set train.max_steps or train.max_epochs")
    if t.average_last and t.keep_last < t.average_last:
        raise ValueError(
            f"train.average_last ({t.average_last}) needs train.keep_last >= {t.average_last} "
            f"(it is {t.keep_last}): only the kept step checkpoints can be averaged"
        )
    if not all(0.0 <= b < 1.0 for b in t.adam_betas):
        raise ValueError(f"train.adam_betas {t.adam_betas} must lie in [0, 1)")


# ----------------------------------------------------------------------------- loading


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`["train.lr=1e-3", "model.norm=pre"]` -> nested dict; values are YAML scalars."""
    nested: dict[str, Any] = {}
    given: dict[str, str] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise UserError(f"--set {pair!r}: expected key.sub=value, e.g. --set train.lr=0.001")
        if key in given:
            raise UserError(f"--set {key} is given twice ({given[key]!r} and {pair!r}); give it once")
        given[key] = pair
        try:
            value = yaml_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"--set {pair!r}: {part} is set twice, once as a value and once as a section")
            node = child
        node[leaf] = value
    return nested


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


MAX_CONFIG_BYTES = 1 << 20


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, turning every failure into a one-line UserError."""
    path = Path(path)
    try:
        with open(path, "rb") as f:  # bounded: `--config /dev/zero` filled the memory
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise UserError(
                f"config file {path} holds over {MAX_CONFIG_BYTES // 2**20} MiB, more than a config's few lines of "
                "YAML; check the path"
            )
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config file {path}: {e}") from None
    try:
        raw = yaml_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{path}{where}: invalid YAML: {problem}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(
            f"{path}: expected a mapping of sections (data:, model:, train:, ...), got {type(raw).__name__}"
        )
    return raw


def build_config(schema: type[Section], raw: dict[str, Any], source: str) -> Any:
    """Validate a nested dict against `schema`; errors name the key path and `source`."""
    try:
        cfg = schema.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"unknown key; valid keys here: {_valid_keys(schema, err['loc'][:-1])}"
        elif err["type"] == "bool_type":
            msg = f"write true or false (got {quote(err['input'])})"
        elif "input" in err and not isinstance(err["input"], dict):
            msg = f"{msg} (got {quote(err['input'])})"
        more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise UserError(f"config error in {source}: {key}: {msg}{more}") from None
    try:
        cfg.check()
    except ValueError as e:
        raise UserError(f"config error in {source}: {e}") from None
    return cfg


def _valid_keys(schema: type[BaseModel], loc: tuple) -> str:
    model: Any = schema
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not isinstance(field.annotation, type):
            return "?"
        model = field.annotation
    return ", ".join(model.model_fields)


def load_config(
    schema: type[Section],
    path: str | Path | None,
    overrides: list[str] | None = None,
    source: str | None = None,
    raw: dict[str, Any] | None = None,
) -> Any:
    """Load `path` (or only defaults when None), apply `--set` overrides, validate. Errors name `source`
    (default: the file, or "defaults", and the overrides). `raw`: the file's mapping where it was read already
    (a pipe, `--config <(...)`, can be read once)."""
    if raw is None:
        raw = read_yaml(path) if path is not None else {}
    if source is None:
        source = str(path) if path is not None else "defaults"
        if overrides:
            source += " with --set " + " ".join(overrides)
    if overrides:
        raw = _merge(raw, parse_overrides(overrides))
    try:
        cfg = build_config(schema, raw, source)
    except UserError as e:
        other = _kind_that_fits(schema, raw) if _has_unknown_key(schema, raw) else None
        if other is None:
            raise
        this = next(kind for kind, s in SCHEMAS.items() if s is schema)
        hint = " (count-params counts a fine-tuned model from its checkpoint)" if other == "finetune" else ""
        raise UserError(
            f"config error in {source}: this is a {KIND_NAMES[other]} config, not a {KIND_NAMES[this]} config; "
            f"run it with `{COMMANDS[other]} --config`{hint}"
        ) from e
    _check_paths(cfg)
    return cfg


def _has_unknown_key(schema: type[Section], raw: dict[str, Any]) -> bool:
    """Whether `raw` names a section, or a key of a section, that `schema` does not have."""
    for name, value in raw.items():
        field = schema.model_fields.get(name)
        if field is None:
            return True
        section = field.annotation
        if isinstance(value, dict) and isinstance(section, type) and issubclass(section, BaseModel):
            if any(key not in section.model_fields for key in value):
                return True
    return False


def _kind_that_fits(schema: type[Section], raw: dict[str, Any]) -> str | None:
    """The other kind of config (of SCHEMAS) that `raw` is valid as, if any: a config with keys the command
    does not know, given to the wrong command, then says which command runs it."""
    for kind, other in SCHEMAS.items():
        if other is schema:
            continue
        try:
            build_config(other, raw, "")
        except UserError:
            continue
        return kind
    return None


def _check_paths(cfg: Any) -> None:
    """The config's file and folder names (data.*, vocab.model, fine-tuning's model.init) go through the check of
    every user path."""
    from transformer_cli.core.files import check_user_path

    paths = {("vocab", "model"), ("model", "init")}
    for section in ("data", "vocab", "model"):
        values = getattr(cfg, section).model_dump(mode="json") if hasattr(cfg, section) else {}
        for key, value in values.items():
            if isinstance(value, str) and (section == "data" or (section, key) in paths):
                check_user_path(value, f"{section}.{key}")


def dump_config(cfg: Section) -> str:
    """The fully resolved config as YAML (every key, defaults included)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, default_flow_style=None)


# ----------------------------------------------------------------------------- BERT


class BertDataConfig(Section):
    """Pretraining text: documents separated by blank lines (or WikiText headings)."""

    FILE_KEYS = ("train", "valid")

    dir: str = Field("data/bert_toy", description="folder with the text files")
    train: str = Field("train.txt", min_length=1, description="training text file under dir")
    valid: str = Field(
        "valid.txt", min_length=1, description="held-out text file under dir (not data.train, nor a copy of it)"
    )
    format: Literal["text", "wikitext"] = Field(
        "text", description="text: blank lines separate documents; wikitext: '= Title =' lines start documents"
    )
    split_sentences: StrictBool = Field(False, description="split lines into sentences with a rule-based splitter")
    preprocessed: str | None = Field(
        None,
        description="a folder written by tcli preprocess (default: the run preprocesses into its own data/ folder)",
    )
    max_seq_len: int = Field(128, ge=8, le=MAX_POSITIONS, description="tokens per sequence, [CLS] and [SEP]s included")
    short_seq_prob: float = Field(0.1, ge=0.0, le=1.0, description="share of sequences with a shorter random target")
    mask_prob: float = Field(0.15, gt=0.0, lt=1.0, description="share of non-special positions chosen for MLM")
    max_predictions: int = Field(
        20, ge=1, le=MAX_POSITIONS, description="at most this many masked positions per sequence"
    )


class BertModelConfig(Section):
    """BERT encoder sizes (defaults: BERT-base)."""

    d_model: int = Field(768, ge=2, le=65536, description="hidden size H")
    layers: int = Field(12, ge=1, le=1000, description="encoder blocks L")
    heads: int = Field(12, ge=1, le=1024, description="attention heads A; must divide d_model")
    ffn_dim: int = Field(3072, ge=1, le=1_048_576, description="FFN inner size (4H in the paper)")
    max_positions: int = Field(512, ge=8, le=MAX_POSITIONS, description="learned position embeddings P")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout on embeddings and sub-layer outputs")
    attention_dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout on attention weights")
    norm: Literal["post", "pre"] = Field(
        "post",
        description="post-norm (the paper's, and Hugging Face BertModel's) or pre-norm (a LayerNorm before each "
        "sub-layer and one after the last block; not exportable to Hugging Face)",
    )


class BertTrainConfig(TrainConfig):
    batch_size: int = Field(32, ge=1, le=1_048_576, description="sequences per micro-batch")
    lr: float = Field(1e-4, gt=0.0, le=10.0, description="peak learning rate")
    warmup_steps: int = Field(1000, ge=0, description="linear warmup from 0 to lr")
    schedule: Literal["inverse_sqrt", "linear", "constant"] = Field("linear", description="decay after warmup")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    adam_eps: float = Field(1e-6, gt=0.0, description="AdamW epsilon")
    weight_decay: float = Field(0.01, ge=0.0, description="AdamW decoupled weight decay (not on biases/norms)")


class BertRunConfig(Section):
    """`tcli pretrain-bert`: a BERT pretraining run."""

    data: BertDataConfig = BertDataConfig()
    vocab: VocabConfig = VocabConfig()
    model: BertModelConfig = BertModelConfig()
    train: BertTrainConfig = BertTrainConfig()

    def check(self) -> None:
        m, d = self.model, self.data
        if not self.vocab.joint:
            raise ValueError("vocab.joint is for translation (one vocabulary for both languages); remove it here")
        if d.valid == d.train:
            raise ValueError(
                f"data.train and data.valid are both {d.train!r}: a run validates on text it does not train on; "
                "name held-out text as data.valid"
            )
        if m.d_model % m.heads:
            raise ValueError(f"model.d_model ({m.d_model}) must be divisible by model.heads ({m.heads})")
        if d.max_seq_len > m.max_positions:
            raise ValueError(f"data.max_seq_len ({d.max_seq_len}) exceeds model.max_positions ({m.max_positions})")
        padded = bucket(d.max_seq_len, self.train.pad_to_multiple)
        if padded > m.max_positions:
            raise ValueError(
                f"train.pad_to_multiple ({self.train.pad_to_multiple}) pads data.max_seq_len "
                f"({d.max_seq_len}) to {padded} positions, more than model.max_positions "
                f"({m.max_positions}); use a smaller pad_to_multiple"
            )
        _check_train(self.train)


# ----------------------------------------------------------------------------- fine-tuning


class FinetuneTaskConfig(Section):
    """What is learnt: the head and the metrics."""

    kind: Literal[tuple(TASK_KINDS)] = Field(  # type: ignore[valid-type]  (one module per kind: kinds/)
        "classification",
        description="a label per text (or pair), one number per text, a tag per word, a set of labels per text "
        "(multilabel), or an answer span in a context (span: extractive QA, SQuAD)",
    )
    glue: str | None = Field(
        None,
        description="a GLUE task name (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI): its files, "
        "columns, kind and metrics",
    )
    metrics: list[str] | None = Field(
        None,
        description="metrics of each evaluation, whose mean selects best.pt (null: the task's): accuracy, f1, "
        "mcc (classification); pearson, spearman (regression); entity_f1, entity_precision, entity_recall (tagging); "
        "macro_f1, micro_f1, subset_accuracy (multilabel); exact_match, f1 (span: SQuAD's, in percent)",
    )
    max_answer_len: int = Field(30, ge=1, le=MAX_POSITIONS, description="span: the longest answer, in pieces")
    n_best: int = Field(20, ge=1, le=1000, description="span: candidate answers kept per question")
    null_threshold: float = Field(
        0.0,
        ge=-1e6,
        le=1e6,
        description="span, SQuAD v2: answer nothing when the no-answer score ([CLS]'s start + end logit) beats the "
        "best span's by more than this",
    )
    threshold: float | Literal["tune"] = Field(
        0.5,
        description="multilabel: a label is predicted when its sigmoid probability is above this (0 to 1), or tune: "
        "at each evaluation the threshold (0.05 to 0.95) that scores best on the dev set, kept in the checkpoint",
    )

    @field_validator("threshold", mode="before")
    @classmethod
    def _threshold_inside(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, str) and _numeric(value)):
            return value  # (refused by Section's own check, as for every number key)
        number = isinstance(value, (int, float))
        if value != "tune" and not (number and 0.0 < value < 1.0):
            raise PydanticCustomError("threshold", "a probability threshold between 0 and 1 (exclusive), or tune")
        return value


class FinetuneDataConfig(Section):
    """Labelled examples: a GLUE folder, a TSV/CSV/JSONL file with named columns, or CoNLL files."""

    FILE_KEYS = ("train", "valid")

    dir: str = Field("data", description="folder with the training and validation files")
    format: Literal["auto", "tsv", "csv", "jsonl", "conll"] = Field(
        "auto",
        description="file format (auto: from the file suffix; .conll is CoNLL, .txt is CoNLL for tagging and "
        "TSV for the other kinds)",
    )
    train: str = Field("train.tsv", min_length=1, description="training file under dir")
    valid: str = Field("dev.tsv", min_length=1, description="validation file under dir")
    columns: list[str] | None = Field(
        None,
        description="names of the columns of TSV/CSV files without a header line, in order, for text, pair and "
        "label to name (CLUE's AFQMC: [sentence1, sentence2, label]); null: the first line is the header",
    )
    text: str = Field("sentence", min_length=1, description="column of the text (the first of a pair)")
    pair: str | None = Field(None, description="column of the second text of a pair (null: single texts)")
    label: str = Field("label", min_length=1, description="column of the label (or the regression target)")
    label_separator: str = Field(
        ",", min_length=1, description='multilabel: what separates the labels of a TSV/CSV field ("4,27")'
    )
    max_seq_len: int = Field(
        128, ge=8, le=MAX_POSITIONS, description="pieces per example, [CLS] and [SEP]s included; longer are cut"
    )
    doc_stride: int = Field(
        128, ge=1, le=MAX_POSITIONS, description="span: pieces that consecutive windows of a long context share"
    )
    max_query_len: int = Field(64, ge=1, le=MAX_POSITIONS, description="span: a question's pieces; longer are cut")


# The keys of FinetuneModelConfig that give the encoder's architecture, for `init: none` only.
INIT_NONE_ARCHITECTURE = ("d_model", "layers", "heads", "ffn_dim", "max_positions", "norm")


class FinetuneModelConfig(Section):
    """The starting encoder, and sizes only for `init: none`."""

    FILE_OR_FOLDER_KEYS = ("init",)

    init: str = Field(
        "none", description="a tcli BERT checkpoint, a Hugging Face BERT folder, or none (random weights)"
    )
    classifier_dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout before the head's linear layer")
    dropout: float | None = Field(None, ge=0.0, lt=1.0, description="encoder dropout (null: the init model's)")
    attention_dropout: float | None = Field(
        None, ge=0.0, lt=1.0, description="attention dropout (null: the init model's)"
    )
    d_model: int | None = Field(None, ge=2, le=65536, description="init none: hidden size (null: 768)")
    layers: int | None = Field(None, ge=1, le=1000, description="init none: encoder blocks (null: 12)")
    heads: int | None = Field(None, ge=1, le=1024, description="init none: attention heads (null: 12)")
    ffn_dim: int | None = Field(None, ge=1, le=1_048_576, description="init none: FFN inner size (null: 3072)")
    max_positions: int | None = Field(None, ge=8, le=MAX_POSITIONS, description="init none: positions (null: 512)")
    norm: Literal["post", "pre"] | None = Field(None, description="init none: post- or pre-norm (null: post)")


class FinetuneTrainConfig(TrainConfig):
    batch_size: int = Field(32, ge=1, le=1_048_576, description="examples per micro-batch")
    max_epochs: int | None = Field(3, ge=1, le=10**9, description="stop after this many passes over the data")
    lr: float = Field(2e-5, gt=0.0, le=10.0, description="peak learning rate")
    warmup_steps: int = Field(
        0, ge=0, description="linear warmup from 0 to lr over this many updates (above 0, it replaces warmup_ratio)"
    )
    warmup_ratio: float = Field(
        0.1, ge=0.0, lt=1.0, description="warmup as a share of all updates (when warmup_steps is 0)"
    )
    schedule: Literal["inverse_sqrt", "linear", "constant"] = Field("linear", description="decay after warmup")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    adam_eps: float = Field(1e-6, gt=0.0, description="AdamW epsilon")
    weight_decay: float = Field(0.01, ge=0.0, description="AdamW decoupled weight decay (not on biases/norms)")
    eval_every: int = Field(500, ge=1, description="evaluate every this many updates (and at each epoch end)")
    keep_last: int = Field(1, ge=0, description="step checkpoints kept besides best.pt and last.pt")
    pad_to_multiple: int = Field(
        1,
        ge=1,
        le=512,
        description="a batch is padded to its longest member rounded up to a multiple of this (at most "
        "data.max_seq_len); in bf16 on a CPU, up to a set of 8 sizes per doubling, each a multiple of this: "
        "few repeating tensor shapes keep oneDNN's kernel cache warm",
    )
    pad_to_max: StrictBool = Field(False, description="pad every batch to data.max_seq_len (for benchmarks)")


class FinetuneRunConfig(Section):
    """`tcli finetune`: a fine-tuning run."""

    task: FinetuneTaskConfig = FinetuneTaskConfig()
    data: FinetuneDataConfig = FinetuneDataConfig()
    model: FinetuneModelConfig = FinetuneModelConfig()
    vocab: VocabConfig = VocabConfig()
    train: FinetuneTrainConfig = FinetuneTrainConfig()

    def check(self) -> None:
        m = self.model
        sizes = [k for k in INIT_NONE_ARCHITECTURE if getattr(m, k) is not None]
        if sizes and m.init.lower() != "none":
            raise ValueError(f"model.{sizes[0]} is set but model.init gives the sizes; set it only with init: none")
        if m.init.lower() == "none":
            # Sizes left out are BERT-base's (BertModelConfig's defaults), so one given alone must fit those.
            base = BertModelConfig()
            d_model, heads = m.d_model or base.d_model, m.heads or base.heads
            if d_model % heads:
                raise ValueError(
                    f"model.d_model ({d_model}{'' if m.d_model else ', the default'}) must be divisible by "
                    f"model.heads ({heads}{'' if m.heads else ', the default'}); set both"
                )
        elif self.vocab != VocabConfig():
            key = _first_changed(self.vocab, VocabConfig())
            raise ValueError(
                f"vocab.{key} is set but model.init brings its own tokenizer; set vocab keys only with init: none"
            )
        if not self.vocab.joint:
            raise ValueError("vocab.joint is for translation (one vocabulary for both languages); remove it here")
        d, defaults = self.data, FinetuneDataConfig()
        if self.task.glue is not None:
            fixed = ("format", "train", "valid", "columns", "text", "pair", "label")
            key = next((k for k in fixed if getattr(d, k) != getattr(defaults, k)), None)
            if key is not None:
                raise ValueError(
                    f"data.{key} is set but task.glue ({self.task.glue}) gives the task's files and columns; "
                    "remove it (data.dir names the GLUE folder)"
                )
        elif TASK_KINDS[self.task.kind].reads == "squad":
            _check_span(self)
        elif TASK_KINDS[self.task.kind].reads == "conll":
            names = ("columns", "text", "pair", "label")
            key = next((k for k in names if getattr(d, k) != getattr(defaults, k)), None)
            if key is not None:
                raise ValueError(
                    f"data.{key} names a table column, but {self.task.kind} reads CoNLL files (a word and its tag "
                    "per line); remove it"
                )
        else:  # one column in two roles: the label read as input (the model learns to copy it), or a text twice
            columns = [("text", d.text), ("pair", d.pair), ("label", d.label)]
            for i, (key, column) in enumerate(columns):
                other = next((k for k, c in columns[i + 1 :] if c is not None and c == column), None)
                if column is not None and other is not None:
                    raise ValueError(
                        f"data.{key} and data.{other} both name the column {column!r}; each role needs its own column"
                    )
            if d.columns is not None:
                _check_columns(d.columns, columns)
        if self.task.threshold != 0.5 and not TASK_KINDS[self.task.kind].thresholded:
            raise ValueError(f"task.threshold is for multilabel tasks, and task.kind is {self.task.kind}; remove it")
        if self.task.kind != "span":
            task_defaults = FinetuneTaskConfig()
            changed = [f"task.{k}" for k in _SPAN_TASK_KEYS if getattr(self.task, k) != getattr(task_defaults, k)]
            changed += [f"data.{k}" for k in _SPAN_DATA_KEYS if getattr(d, k) != getattr(defaults, k)]
            if changed:
                raise ValueError(f"{changed[0]} is for task.kind span (extractive QA); remove it")
        _check_metrics(self.task)
        _check_train(self.train)


_SPAN_TASK_KEYS, _SPAN_DATA_KEYS = ("max_answer_len", "n_best", "null_threshold"), ("doc_stride", "max_query_len")


def _check_span(cfg: FinetuneRunConfig) -> None:
    """Extractive QA reads SQuAD files, not table columns. (That its windows move forward, doc_stride below what
    max_seq_len leaves after the question, is checked as its data is read: kinds/span.check_span_sizes, so that
    `task.kind: span` alone loads, with max_seq_len's default of 128 for every kind.)"""
    d, defaults = cfg.data, FinetuneDataConfig()
    tables = ("format", "columns", "text", "pair", "label")
    key = next((k for k in tables if getattr(d, k) != getattr(defaults, k)), None)
    if key is not None:
        raise ValueError(
            f"data.{key} is for tables, but span reads SQuAD files (.json as published, or .jsonl lines of "
            '{"id", "question", "context", "answers"}); remove it'
        )


def _check_columns(names: list[str], roles: list[tuple[str, str | None]]) -> None:
    """data.columns: distinct names, among them those that data.text, data.pair and data.label name."""
    if not names or any(not n.strip() or n != n.strip() for n in names):
        raise ValueError(f"data.columns {names!r}: give each column of the files a name (no blanks, no spaces around)")
    repeated = next((n for n in names if names.count(n) > 1), None)
    if repeated is not None:
        raise ValueError(f"data.columns names the column {repeated!r} twice; rename one")
    for key, column in roles:
        if column is not None and column not in names:
            raise ValueError(
                f"data.{key} is {column!r}, which is not one of data.columns ({', '.join(names)}); name one of them"
            )


def _first_changed(section: Section, defaults: Section) -> str:
    """The first key of `section` whose value differs from `defaults`'."""
    return next(k for k in type(section).model_fields if getattr(section, k) != getattr(defaults, k))


def _check_metrics(task: FinetuneTaskConfig) -> None:
    """task.metrics: known names that score the task's kind, each once (else the first evaluation would fail)."""
    if task.metrics is None:
        return
    if not task.metrics:
        fits = task_metrics.BY_KIND[task.kind]
        raise ValueError(f"task.metrics is empty; name one or more of {', '.join(fits)}, or leave it out")
    task_metrics.check_names(task.kind, task.metrics, "task.metrics")


# ----------------------------------------------------------------------------- config files of either kind

SCHEMAS: dict[str, type[TranslationRunConfig] | type[BertRunConfig] | type[FinetuneRunConfig]] = {
    "translation": TranslationRunConfig,
    "bert": BertRunConfig,
    "finetune": FinetuneRunConfig,
}
COMMANDS = {"translation": "tcli train", "bert": "tcli pretrain-bert", "finetune": "tcli finetune"}
KIND_NAMES = {"translation": "translation", "bert": "BERT pretraining", "finetune": "fine-tuning"}


def config_kind(raw: dict[str, Any]) -> str:
    """'bert' when a section holds a key only BERT configs have, else 'translation'."""

    def keys(section: str) -> set[str]:
        value = raw.get(section)
        return set(value) if isinstance(value, dict) else set()

    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    # data.format is a key of both; translation's takes `tsv` (or comes with its language keys), BERT's wikitext
    translation_format = data.get("format") == "tsv" or {"src_lang", "tgt_lang", "src_column", "tgt_column"} & set(data)
    bert_data = "max_seq_len" in data or ("format" in data and not translation_format)
    bert = "layers" in keys("model") or bert_data or "batch_size" in keys("train")
    return "bert" if bert else "translation"


def file_config(path: Path, overrides: list[str] | None = None) -> TranslationRunConfig | BertRunConfig:
    """A translation or BERT YAML config (kind detected from its keys) with `--set` overrides."""
    raw = read_yaml(path)
    return load_config(SCHEMAS[config_kind(raw)], path, overrides, raw=raw)
