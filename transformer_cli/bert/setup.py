"""What the run lifecycle needs to know about BERT pretraining: its text files (documents), vocabulary and
preprocessing, and how to build its task. Torch is imported only to build the task: `tcli preprocess` never
loads it."""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_cli.config import BertRunConfig, FinetuneRunConfig
from transformer_cli.core.console import say
from transformer_cli.core.errors import UserError
from transformer_cli.core.sentences import heading_level, split_sentences
from transformer_cli.core.text import (
    LineIndex,
    check_document_counts,
    fingerprint,
    index_lines,
    stream_lines,
)
from transformer_cli.data.shards import BLOCK_LINES, Manifest, lines_of, preprocess_documents, reservoir
from transformer_cli.train.lifecycle import run_training
from transformer_cli.train.task_setup import SetupBase, vocab_settings
from transformer_cli.vocab.spm import (
    Vocab,
    check_bert_vocab,
    head_lines,
    load_model_file,
    resolve_coverage,
    train_vocab,
)

if TYPE_CHECKING:
    from transformer_cli.bert.task import BertTask
    from transformer_cli.checkpoint import Checkpoint
    from transformer_cli.runtime.device import Runtime


def train_bert_vocab(
    sentences: list[str],
    cfg: BertRunConfig | FinetuneRunConfig,
    source: str = "the training text",
    coverage: float | None = None,
) -> Vocab:
    """A BERT vocabulary ([PAD] [UNK] [CLS] [SEP] [MASK], no BOS/EOS) of `cfg.vocab` from `sentences`: pretraining's,
    and fine-tuning's from scratch (`model.init: none`). `coverage`: vocab.character_coverage resolved (by default
    auto is resolved from the first sentences)."""
    v = cfg.vocab
    if coverage is None:
        coverage = resolve_coverage(v.character_coverage, [], sentences[:10_000])
    return train_vocab(
        sentences,
        v.size,
        v.type,
        coverage,
        v.max_sentences,
        cfg.train.seed,
        pad_piece="[PAD]",
        unk_piece="[UNK]",
        control_symbols=("[CLS]", "[SEP]", "[MASK]"),
        bos_eos=False,
        source=source,
        split_cjk=v.split_cjk,
    )


class BertSetup(SetupBase):
    """What the shared run lifecycle (train/lifecycle.py) needs to know about BERT pretraining."""

    kind = "bert"

    def __init__(self, cfg: BertRunConfig, init_from_hf: Path | None = None):
        super().__init__()
        self.cfg, self.init_from_hf = cfg, init_from_hf
        d = cfg.data
        self.paths = {name: Path(d.dir) / getattr(d, name) for name in ("train", "valid")}
        self.hf_weights, self.hf_vocab = None, None
        self._fingerprint: str | None = None
        self.given_vocab: Vocab | None = None  # vocab.model, read by read_data
        self._indexes: dict[str, LineIndex] = {}  # the text files' blocks, found by read_data
        self._coverage: float | None = None

    def split_names(self) -> list[str]:
        return list(self.paths)  # train, valid

    def read_data(self) -> None:
        """The text files are read through once before anything is written: a missing file, invalid UTF-8 or
        a corpus without two documents stops the run here (in bounded memory)."""
        if self.cfg.vocab.model is not None:
            self.given_vocab = load_model_file(self.cfg.vocab.model)
            check_bert_vocab(self.given_vocab, f"vocab.model {self.cfg.vocab.model}")
        if self.preprocessed() is None:
            self._indexes = {name: index_lines(path, BLOCK_LINES) for name, path in self.paths.items()}
            train, valid = self._indexes["train"], self._indexes["valid"]
            if train.sha256 == valid.sha256:  # under another name too (a copy, a link)
                raise UserError(
                    f"data.valid {valid.path} holds the same text as data.train {train.path}: the validation "
                    "scores would be of text the model trains on; give held-out text as data.valid"
                )
            for path in self.paths.values():
                documents, longest = document_counts(path, self.cfg.data)
                check_document_counts(documents, longest, str(path), self.cfg.data.format)
            self._fingerprint = self._indexes["train"].sha256  # text.fingerprint of the training file
            self._read = {i.path: {"size": i.size, "sha256": i.sha256} for i in self._indexes.values()}
        if self.init_from_hf is not None:
            from transformer_cli.export.hf import load_hf_bert

            self.hf_weights, self.hf_vocab = load_hf_bert(self.init_from_hf, self.cfg.model)

    def data_settings(self) -> dict[str, Any]:
        d = self.cfg.data
        return {"train": d.train, "valid": d.valid, "format": d.format, "split_sentences": d.split_sentences}

    def source_files(self) -> list[Path]:
        return list(self.paths.values())

    def valid_names(self) -> list[str]:
        return [self.paths["valid"].name]

    def data_fingerprint(self) -> str:
        if self._fingerprint is None:
            manifest = self.preprocessed()
            self._fingerprint = (
                manifest.data["data_fingerprint"] if manifest is not None else fingerprint([self.paths["train"]])
            )
        return self._fingerprint

    def count_parameters(self) -> tuple[int, int]:
        from transformer_cli.models.params import bert_formula

        return bert_formula(self.cfg.model, self.cfg.vocab.size).total, 0

    def vocab_files(self) -> list[str]:
        return ["bert"]

    def vocab_settings(self) -> dict[str, Any]:
        v, seed = self.cfg.vocab, self.cfg.train.seed
        settings = vocab_settings(self.kind, v, seed, self.data_fingerprint(), self.coverage())
        settings["from_hf"] = hashlib.sha256(self.hf_vocab.model_bytes).hexdigest() if self.hf_vocab else None
        return settings

    def coverage(self) -> float:
        """vocab.character_coverage, auto resolved from the training text (a preprocessed folder's: the value it was
        made with)."""
        if self._coverage is None:
            v, manifest = self.cfg.vocab, self.preprocessed()
            if v.character_coverage == "auto" and manifest is not None:
                self._coverage = manifest.data["vocab_settings"]["vocab"].get("character_coverage", 1.0)
            else:
                self._coverage = resolve_coverage(v.character_coverage, [], head_lines([self.paths["train"]]))
        return self._coverage

    def train_vocabs(self, quiet: bool) -> list[Vocab]:
        manifest, v = self.preprocessed(), self.cfg.vocab
        if manifest is not None:
            vocab = Vocab.load(manifest.vocab_paths()[0])
        elif self.hf_vocab is not None:
            vocab = self.hf_vocab
        elif self.given_vocab is not None:
            vocab = self.given_vocab
        else:
            say(
                quiet,
                f"training the sentencepiece vocabulary ({v.type}, up to {v.size} pieces, on at most "
                f"{v.max_sentences:,} sentences)",
            )
            sample = reservoir(
                document_sentences(self.paths["train"], self.cfg.data), v.max_sentences, self.cfg.train.seed
            )
            return [train_bert_vocab(sample, self.cfg, source=str(self.paths["train"]), coverage=self.coverage())]
        if manifest is not None:
            source = f"the preprocessed folder {manifest.folder} (data.preprocessed)"
        elif self.hf_vocab is not None:
            source = f"--init-from-hf {self.init_from_hf}"
        else:
            source = f"vocab.model {v.model}"
        check_bert_vocab(vocab, source)
        if self.hf_vocab is not None and vocab != self.hf_vocab:
            raise UserError(
                f"--init-from-hf {self.init_from_hf} has another vocabulary (spiece.model) than {source}; "
                "preprocess the data with the folder's vocabulary (vocab.model: its spiece.model) or start without it"
            )
        return [vocab]

    def vocabs_from_checkpoint(self, ckpt: Checkpoint) -> list[Vocab]:
        if self.hf_vocab is not None and self.hf_vocab != ckpt.vocabs[0]:
            raise UserError(
                f"--init-from-hf {self.init_from_hf} has another vocabulary (spiece.model) than the run it "
                f"would continue ({ckpt.path}); resume without --init-from-hf, or start a new --out"
            )
        return [ckpt.vocabs[0]]

    def write_shards(self, folder: Path, vocabs: list[Vocab], quiet: bool) -> dict[str, Any]:
        d = self.cfg.data
        splits = {name: self._indexes.get(name) or index_lines(path, BLOCK_LINES) for name, path in self.paths.items()}
        return preprocess_documents(folder, splits, vocabs[0], d.format, d.split_sentences, quiet)

    def make_task(self, vocabs: list[Vocab], data: Manifest, runtime: Runtime, quiet: bool) -> BertTask:
        import torch

        from transformer_cli.bert.task import BertTask
        from transformer_cli.models.builders import build_bert

        cfg, (vocab,) = self.cfg, vocabs
        for name in ("train", "valid"):
            split = data.split(name)
            counts = ", ".join(f"{n:,} {what}" for what, n in split["counts"].items() if what != "lines")
            say(quiet, f"{name}: {counts}, {split['tokens']['text']:,} tokens ({data.folder})")
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        model = build_bert(cfg.model, len(vocab))
        if self.hf_weights is not None:
            model.load_state_dict(self.hf_weights)
            say(quiet, f"initialised from {self.init_from_hf}")
        n_params = sum(p.numel() for p in model.parameters())
        say(quiet, f"model: {n_params:,} parameters; vocabulary {len(vocab)} pieces")
        return BertTask(cfg, vocab, data, model, self.data_fingerprint())


def document_sentences(path: Path, d: Any, boundary: str | None = None) -> Iterator[str | None]:
    """The sentences of a BERT text file as a stream (headings and blank lines left out); with `boundary`, that
    value is yielded where a document ends (a blank line, or a WikiText title)."""
    for line in lines_of(stream_lines(path)):
        text = line.strip()
        level = heading_level(text) if d.format == "wikitext" else 0
        if level or not text:
            if boundary is not None and (level == 1 or (not text and d.format == "text")):
                yield boundary
            continue
        yield from split_sentences(text) if d.split_sentences else [text]


def document_counts(path: Path, d: Any) -> tuple[int, int]:
    """(documents, sentences of the longest) of a BERT text file, counted as a stream."""
    documents, longest, current = 0, 0, 0
    for sentence in itertools.chain(document_sentences(path, d, boundary=""), [""]):
        if sentence:
            current += 1
        elif current:
            documents, longest, current = documents + 1, max(longest, current), 0
    return documents, longest


def pretrain_bert(
    cfg: BertRunConfig,
    run_dir: Path,
    device: str = "auto",
    resume: bool = False,
    quiet: bool = False,
    init_from_hf: Path | None = None,
) -> dict[str, Any]:
    """`tcli pretrain-bert`: text -> vocabulary -> NSP/MLM instances -> trained BERT; returns the end event."""
    return run_training(BertSetup(cfg, init_from_hf), cfg, run_dir, device, resume, quiet)
