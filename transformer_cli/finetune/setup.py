"""What the run lifecycle (train/lifecycle.py) needs to know about fine-tuning, and what a fine-tuning run reads before
anything is written: its labelled data (a GLUE folder, a table, CoNLL files), the label set, and the starting
encoder (`model.init`: a tcli BERT checkpoint, a Hugging Face BERT folder with its own tokenizer, or none).
Every problem is a one-line UserError, raised here.

`FinetuneSetup` is the lifecycle's TaskSetup: no token arrays (the labelled files are small and tokenised in
memory), and its "vocabulary" is the starting model's tokenizer, written to the run's vocab/ folder."""

from __future__ import annotations

import hashlib
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_cli.config import INIT_NONE_ARCHITECTURE, BertModelConfig, FinetuneRunConfig, FinetuneTrainConfig
from transformer_cli.core.console import say
from transformer_cli.core.errors import UserError, quote
from transformer_cli.core.files import check_file
from transformer_cli.data.labeled import (
    GLUE_TASKS,
    LabelledData,
    TaggedSentence,
    TextExample,
    check_labels,
    glue_key,
    label_set,
    read_conll,
    read_glue,
    read_table,
)
from transformer_cli.kinds.registry import KINDS
from transformer_cli.train.lifecycle import run_training
from transformer_cli.train.task_setup import SetupBase

if TYPE_CHECKING:
    from torch import Tensor

    from transformer_cli.checkpoint import Checkpoint
    from transformer_cli.finetune.task import FinetuneTask
    from transformer_cli.kinds.finetuned import FinetuneMeta
    from transformer_cli.runtime.device import Runtime
    from transformer_cli.vocab.bert_tokenizer import BertTokenizer
    from transformer_cli.vocab.spm import Vocab


def read_labelled(cfg: FinetuneRunConfig) -> LabelledData:
    """The run's examples, label set (from training; GLUE's own order for GLUE tasks) and metrics."""
    d, t = cfg.data, cfg.task
    kind = KINDS[t.kind]
    if kind.reads == "squad" and t.glue is None:
        return _read_squad_run(cfg)
    if t.glue is not None:
        g = GLUE_TASKS[glue_key(t.glue)]
        if t.kind != g.kind:
            raise UserError(f"task.glue {t.glue} is a {g.kind} task, but task.kind is {t.kind}; set task.kind={g.kind}")
        valid_split = g.dev_splits[0]
        train, valid = read_glue(Path(d.dir), g.name, "train"), read_glue(Path(d.dir), g.name, valid_split)
        more = {split: read_glue(Path(d.dir), g.name, split) for split in g.dev_splits[1:]}
        files = [Path(d.dir) / g.folder / "train.tsv"]
        labels, metrics = g.labels or (), g.metrics
        valid_path = Path(d.dir) / g.folder / f"{valid_split}.tsv"
    else:
        paths = [Path(d.dir) / d.train, Path(d.dir) / d.valid]
        for path in paths:
            check_file(path, f"data: {path} {{what}} (data.dir {d.dir!r} and data.train / data.valid)")
        suffix = paths[0].suffix.lower()  # (a .txt file is CoNLL for a tagger, a TSV table otherwise: CLUE's)
        conll_suffix = suffix == ".conll" or (suffix == ".txt" and kind.reads == "conll")
        conll = d.format == "conll" or (d.format == "auto" and conll_suffix)
        if (kind.reads == "conll") != conll:
            raise UserError(
                f"task.kind {t.kind} reads {'CoNLL files' if kind.reads == 'conll' else 'tables'}, but "
                f"{paths[0]} is read as {'CoNLL' if conll else 'a table'}; set data.format or task.kind"
            )
        if conll:
            train, valid = read_conll(paths[0]), read_conll(paths[1])
            for ex, path in ((train, paths[0]), (valid, paths[1])):
                unlabelled = next((s for s in ex if s.tags is None), None)
                if unlabelled is not None:
                    raise UserError(f"{path}:{unlabelled.line}: no tags; training and validation need a tag per word")
        else:
            train, valid = (_table(p, d, kind.label_form) for p in paths)
        files, valid_path, more = [paths[0]], paths[1], {}
        labels = label_set(train, paths[0]) if kind.has_label_set else ()
        metrics = kind.default_metrics
    if labels:
        check_labels(valid, labels, valid_path)
        for split, examples in more.items():
            check_labels(examples, labels, valid_path.with_name(f"{split}.tsv"))
    kind.check_label_set(labels, files[0])
    if "f1" in (t.metrics or metrics) and len(labels) != 2:
        raise UserError(
            f"task.metrics f1 is the F1 of the positive class (the second label, as GLUE scores MRPC and QQP) and "
            f"needs two labels, but {files[0]} has {len(labels)}; score it with accuracy or mcc"
        )
    kind.check_scorable(
        tuple(t.metrics or metrics),
        {valid_path: valid, **{valid_path.with_name(f"{k}.tsv"): v for k, v in more.items()}},
    )
    for warning in kind.label_warnings(labels, files[0]):
        print(warning, file=sys.stderr)
    return LabelledData(t.kind, train, valid, tuple(labels), tuple(t.metrics or metrics), files, valid_path, more)


def _read_squad_run(cfg: FinetuneRunConfig) -> LabelledData:
    """Extractive QA: SQuAD files (v1.1 or v2.0, as published or as JSON lines), read whole and checked (every
    answer where its answer_start says) before anything is written."""
    from transformer_cli.data.squad import read_squad
    from transformer_cli.kinds.span import check_span_sizes

    d, t = cfg.data, cfg.task
    check_span_sizes(d.max_seq_len, d.doc_stride, d.max_query_len)
    paths = [Path(d.dir) / d.train, Path(d.dir) / d.valid]
    for path in paths:
        check_file(path, f"data: {path} {{what}} (data.dir {d.dir!r} and data.train / data.valid)")
        if path.suffix.lower() not in (".json", ".jsonl"):
            raise UserError(
                f"{path}: task.kind span reads SQuAD files: .json as published, or .jsonl (a question a line); "
                "give one of those"
            )
    train, valid = read_squad(paths[0]), read_squad(paths[1])
    metrics = tuple(t.metrics or KINDS[t.kind].default_metrics)
    return LabelledData(t.kind, train, valid, (), metrics, [paths[0]], paths[1])


def _table(path: Path, d: Any, kind: str) -> list[TextExample]:
    suffix = path.suffix.lower()
    if d.format not in ("auto", suffix.lstrip(".")) and not (
        (d.format == "jsonl" and suffix == ".json") or suffix == ".txt"  # (.txt says nothing of the format)
    ):
        raise UserError(
            f"data.format is {d.format} but {path} has the suffix {path.suffix}; rename it or fix data.format"
        )
    fmt = None if d.format == "auto" else d.format
    return read_table(path, d.text, d.pair, d.label, kind, d.columns, fmt, d.label_separator)


# ----------------------------------------------------------------------------- the starting encoder


@dataclass
class InitSource:
    """The encoder to start from: its sizes, tokenizer and weights (BertClassifier names, `bert.*`; None for
    random weights)."""

    encoder: BertModelConfig
    vocab_size: int
    tokenizer: BertTokenizer
    weights: dict[str, Tensor] | None
    description: str


def _with_dropout(encoder: BertModelConfig, cfg: FinetuneRunConfig) -> BertModelConfig:
    m = cfg.model
    update = {k: getattr(m, k) for k in ("dropout", "attention_dropout") if getattr(m, k) is not None}
    return encoder.model_copy(update=update)


def resolve_init(cfg: FinetuneRunConfig, data: LabelledData) -> InitSource:
    """`model.init`: a tcli BERT checkpoint (a file), a Hugging Face folder, or none."""
    init = cfg.model.init
    if init.lower() == "none":
        return _random_init(cfg, data)
    path = Path(init)
    if path.is_dir():
        return _hf_init(path, cfg)
    if not path.exists():
        raise UserError(f"model.init: {path} not found (a tcli BERT checkpoint, a Hugging Face BERT folder, or none)")
    from transformer_cli.checkpoint import read_checkpoint
    from transformer_cli.models.bert import PRETRAINING_HEADS
    from transformer_cli.vocab.bert_tokenizer import BertTokenizer

    ckpt = read_checkpoint(path, kind="bert")
    ckpt.build_model()  # checks every tensor's name, shape and finiteness
    weights = {f"bert.{k}": v for k, v in ckpt.weights.items() if not k.startswith(PRETRAINING_HEADS)}
    vocab = ckpt.vocabs[0]
    tokenizer = BertTokenizer("sentencepiece", vocab.model_bytes, str(path))
    return InitSource(_with_dropout(ckpt.cfg.model, cfg), len(vocab), tokenizer, weights, f"tcli BERT {path}")


def _random_init(cfg: FinetuneRunConfig, data: LabelledData) -> InitSource:
    """init none: the sizes of `model:` (BERT-base where null) and a sentencepiece vocabulary: vocab.model, or
    one trained on the training texts, as pretrain-bert would."""
    from transformer_cli.vocab.bert_tokenizer import BertTokenizer
    from transformer_cli.vocab.spm import load_model_file

    m = cfg.model
    sizes = {k: getattr(m, k) for k in INIT_NONE_ARCHITECTURE}
    encoder = _with_dropout(BertModelConfig(**{k: v for k, v in sizes.items() if v is not None}), cfg)
    vocab = load_model_file(cfg.vocab.model) if cfg.vocab.model is not None else scratch_vocab(cfg, data)
    tokenizer = BertTokenizer("sentencepiece", vocab.model_bytes, "vocab.model")
    return InitSource(encoder, len(vocab), tokenizer, None, "random weights (init: none)")


_SCRATCH_VOCABS: dict[tuple[str, str, int | bool], Vocab] = {}


def scratch_vocab(cfg: FinetuneRunConfig, data: LabelledData) -> Vocab:
    """The sentencepiece vocabulary `model.init: none` trains on the training texts, as pretrain-bert would.

    Kept for the process, by texts and settings: `tcli glue` trains every task's before the first task trains (a
    vocab.size too small for a later task's characters stops it there), and the task's runs then take it, each
    seed's too unless the seed samples the texts (more than vocab.max_sentences)."""
    from transformer_cli.bert.setup import train_bert_vocab
    from transformer_cli.data.squad import Question

    texts: list[str] = []
    contexts: dict[str, None] = {}  # (SQuAD asks several questions of each context: each is read once)
    for ex in data.train:
        if isinstance(ex, Question):
            texts.append(ex.question)
            contexts[ex.context] = None
        else:
            texts += (
                [" ".join(ex.words)] if isinstance(ex, TaggedSentence) else [ex.text, *([ex.pair] if ex.pair else [])]
            )
    texts += contexts
    sampled = len(texts) > cfg.vocab.max_sentences  # only then does the seed choose what it is trained on
    key = (
        hashlib.sha256("\n".join(texts).encode()).hexdigest(),
        cfg.vocab.model_dump_json(),
        sampled and cfg.train.seed,
    )
    if key not in _SCRATCH_VOCABS:
        _SCRATCH_VOCABS[key] = train_bert_vocab(texts, cfg, source=str(data.files[0]))
    return _SCRATCH_VOCABS[key]


def _hf_init(folder: Path, cfg: FinetuneRunConfig) -> InitSource:
    """A Hugging Face BERT folder: config.json, model.safetensors or pytorch_model.bin, and its tokenizer, read and
    checked by export/hf_folder.py (as `tcli embed` reads one), under BertClassifier names."""
    from transformer_cli.export.hf_folder import read_hf_encoder

    hf = read_hf_encoder(folder, f"model.init {folder}")
    # BertForMaskedLM and BertForTokenClassification folders have no pooler: as transformers does, the classifier
    # starts it from its own (seeded) initial weights, not from the zeros that stood in for it through the checks.
    weights = {f"bert.{k}": v for k, v in hf.weights.items() if hf.has_pooler or not f"bert.{k}".startswith(POOLER)}
    return InitSource(
        _with_dropout(hf.encoder, cfg), hf.vocab_size, hf.tokenizer, weights, f"Hugging Face BERT {folder}"
    )


POOLER = "bert.pooler."  # the classifier's pooler weights (a HF folder may lack them)


# ----------------------------------------------------------------------------- the run lifecycle


class FinetuneSetup(SetupBase):
    """What the shared run lifecycle (train/lifecycle.py) needs to know about a fine-tuning run.

    The data and the starting model are read lazily, once, by whichever lifecycle step asks first (a resume's
    data check, the memory check); a resume takes the label set, sizes and tokenizer from the checkpoint and
    never reads `model.init` again."""

    kind = "finetune"
    has_shards = False

    def __init__(self, cfg: FinetuneRunConfig):
        super().__init__()
        self.cfg = cfg
        self._data: LabelledData | None = None
        self._fingerprint: str | None = None
        self.meta: FinetuneMeta | None = None
        self.weights: dict[str, Tensor] | None = None  # the starting encoder's (None: random, or resumed)
        self.described = ""

    @property
    def data(self) -> LabelledData:
        if self._data is None:
            self._data = read_labelled(self.cfg)
        return self._data

    def resuming(self, ckpt: Checkpoint) -> None:
        self.meta, self.weights, self.described = ckpt.finetune, None, f"resumed {ckpt.path}"

    def model_meta(self) -> FinetuneMeta:
        """The model to train: the checkpoint's when resuming, else `model.init` (read here, once)."""
        if self.meta is None:
            from transformer_cli.kinds.finetuned import FinetuneMeta

            data, cfg = self.data, self.cfg
            source = resolve_init(cfg, data)
            self.meta = FinetuneMeta(
                data.kind,
                list(data.labels),
                source.encoder,
                source.vocab_size,
                source.tokenizer,
                cfg.data.max_seq_len,
                cfg.model.classifier_dropout,
                settings=KINDS[data.kind].settings_of(cfg, data),
                # (tune: set at each evaluation)
                threshold=cfg.task.threshold if isinstance(cfg.task.threshold, float) else 0.5,
            )
            self.weights, self.described = source.weights, source.description
        return self.meta

    def read_data(self) -> None:
        meta, t = self.model_meta(), self.cfg.train
        # A resumed checkpoint's head and packing against the run's data and config (a label list edited in the
        # file failed with a KeyError at the first batch, after the logs were opened)
        for what, ours, theirs in (
            ("labels", list(meta.labels), list(self.data.labels)),
            ("max_seq_len", meta.max_seq_len, self.cfg.data.max_seq_len),
            ("settings", *(_state(x) for x in (meta.settings, meta.task_kind.settings_of(self.cfg, self.data)))),
        ):
            if ours != theirs:
                raise UserError(
                    f"{self.described or 'the checkpoint'}: {what} {quote(ours, 80)} in the checkpoint, "
                    f"{quote(theirs, 80)} in the run; resume from an intact last.pt or choose another --out"
                )
        if meta.max_seq_len > meta.encoder.max_positions:
            raise UserError(
                f"data.max_seq_len ({meta.max_seq_len}) exceeds the model's {meta.encoder.max_positions} positions; "
                f"set data.max_seq_len={meta.encoder.max_positions}"
            )
        if t.warmup_ratio and not t.warmup_steps and not (t.max_steps or t.max_epochs):
            raise UserError("train.warmup_ratio needs train.max_steps or train.max_epochs (or set train.warmup_steps)")

    def valid_fingerprint(self) -> str:
        return self.data.valid_fingerprint()

    def valid_names(self) -> list[str]:
        return [p.name for p in self.data.valid_files()]

    def data_fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = self.data.fingerprint()
        return self._fingerprint

    def source_files(self) -> list[Path]:
        return list(self.data.files)

    def data_settings(self) -> dict[str, Any]:
        return {}

    def preprocessed(self) -> None:
        return None

    def split_names(self) -> list[str]:
        return []  # no preprocessed folder

    def count_parameters(self) -> tuple[int, int]:
        import torch

        from transformer_cli.kinds.finetuned import build_classifier

        meta = self.model_meta()  # (read outside the meta device: it may load the starting weights)
        with torch.device("meta"):  # sizes only: nothing is allocated
            model = build_classifier(meta)
        return sum(p.numel() for p in model.parameters()), 0

    def vocab_files(self) -> list[str]:
        return [Path(self.model_meta().tokenizer.file_name).stem]

    def vocab_paths(self, folder: Path) -> list[Path]:
        return [folder / self.model_meta().tokenizer.file_name]

    def load_vocabs(self, folder: Path) -> list[BertTokenizer]:
        from transformer_cli.vocab.bert_tokenizer import BertTokenizer

        (path,) = self.vocab_paths(folder)
        return [BertTokenizer(self.model_meta().tokenizer.kind, path.read_bytes(), str(path))]

    def vocab_settings(self) -> dict[str, Any]:
        tokenizer = self.model_meta().tokenizer
        return {
            "kind": self.kind,
            "init": self.cfg.model.init,
            "tokenizer": tokenizer.kind,
            "sha256": hashlib.sha256(tokenizer.data).hexdigest(),
        }

    def train_vocabs(self, quiet: bool) -> list[BertTokenizer]:
        return [self.model_meta().tokenizer]

    def vocabs_from_checkpoint(self, ckpt: Checkpoint) -> list[BertTokenizer]:
        return [ckpt.finetune.tokenizer]

    def write_shards(self, folder: Path, vocabs: list[Any], quiet: bool) -> dict[str, Any]:
        raise NotImplementedError("fine-tuning has no token arrays (has_shards is False)")

    def make_task(self, vocabs: list[Any], data: None, runtime: Runtime, quiet: bool) -> FinetuneTask:
        """The model (seeded; the starting weights loaded, the head new) and the task with its encoded data."""
        import torch

        from transformer_cli.finetune.task import FinetuneTask
        from transformer_cli.kinds.finetuned import build_classifier

        meta, cfg = self.model_meta(), self.cfg
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        model = build_classifier(meta)
        if self.weights is not None:
            missing, unexpected = model.load_state_dict(self.weights, strict=False)
            head = ("classifier.", "qa_outputs.", POOLER)  # the new head's
            assert not unexpected and all(k.startswith(head) for k in missing), (missing, unexpected)
            if any(k.startswith(POOLER) for k in missing):
                say(quiet, f"{self.cfg.model.init} has no pooler: it starts from random weights, as in transformers")
        task = FinetuneTask(cfg, meta, model, self.data, quiet, bucketed=runtime.kernel_per_shape)
        _describe(task, self.described, quiet)
        return task

    def train_config(self, task: FinetuneTask) -> FinetuneTrainConfig:
        return resolved_train(self.cfg.train, len(task.epoch_batches(0)))


def _state(settings: Any) -> Any:
    return settings.state() if settings is not None else None


def resolved_train(train: FinetuneTrainConfig, batches_per_epoch: int) -> FinetuneTrainConfig:
    """train.warmup_ratio as a number of warmup steps (of all the run's updates), unless train.warmup_steps gives
    them (as in Hugging Face's Trainer, warmup_steps above 0 wins)."""
    if not train.warmup_ratio or train.warmup_steps:
        return train
    limits = [train.max_steps] if train.max_steps else []
    if train.max_epochs:
        limits.append(math.ceil(batches_per_epoch / train.accum_steps) * train.max_epochs)
    if not limits:
        raise UserError("train.warmup_ratio needs train.max_steps or train.max_epochs (or set train.warmup_steps)")
    return train.model_copy(update={"warmup_steps": max(1, round(train.warmup_ratio * min(limits)))})


def _describe(task: FinetuneTask, source: str, quiet: bool) -> None:
    meta = task.meta
    n_params = sum(p.numel() for p in task.model.parameters())
    labels = meta.task_kind.describe_outputs(meta.labels)
    say(quiet, f"model: {source}; {n_params:,} parameters; {meta.kind} ({labels}); tokenizer {meta.tokenizer.kind}")
    for name, feats, examples in (("train", task.train, task.data.train), ("valid", task.valid, task.data.valid)):
        say(quiet, meta.task_kind.describe_features(meta, name, examples, feats))
    if isinstance(task.data.train[0], TaggedSentence) and task.train.truncated:
        say(quiet, "tagging: words beyond max_seq_len are not trained on; raise data.max_seq_len to keep them")


def finetune(
    cfg: FinetuneRunConfig, run_dir: Path, device: str = "auto", resume: bool = False, quiet: bool = False
) -> dict[str, Any]:
    """`tcli finetune`: labelled data + a starting encoder -> a fine-tuned classifier; returns the end event."""
    return run_training(FinetuneSetup(cfg), cfg, run_dir, device, resume, quiet)
