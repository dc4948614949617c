"""What the run lifecycle needs to know about translation: its text files, vocabulary and preprocessing, and
how to build its task. Torch is imported only to build the task: `tcli preprocess` never loads it."""

from __future__ import annotations

import hashlib
import itertools
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_cli.config import TranslationRunConfig
from transformer_cli.core.console import say
from transformer_cli.core.errors import UserError
from transformer_cli.core.text import LineIndex, fingerprint
from transformer_cli.data.shards import Manifest, reservoir
from transformer_cli.data.translation import (
    ShardedPairs,
    SplitFiles,
    data_columns,
    data_paths,
    index_pair,
    preprocess_parallel,
)
from transformer_cli.metrics.bleu import usable_tokenizer
from transformer_cli.train.lifecycle import run_training
from transformer_cli.train.task_setup import SetupBase, vocab_settings
from transformer_cli.vocab.spm import (
    Vocab,
    check_translation_vocab,
    head_lines,
    load_model_file,
    resolve_coverage,
    train_vocab,
)

if TYPE_CHECKING:
    from transformer_cli.checkpoint import Checkpoint
    from transformer_cli.runtime.device import Runtime
    from transformer_cli.translation.task import TranslationTask


class TranslationSetup(SetupBase):
    """What the shared run lifecycle (train/lifecycle.py) needs to know about translation."""

    kind = "translation"

    def __init__(self, cfg: TranslationRunConfig):
        super().__init__()
        self.cfg = cfg
        self._fingerprint: str | None = None
        self.given_vocab: Vocab | None = None  # vocab.model, read by read_data
        self._indexes: dict[str, tuple[LineIndex, LineIndex]] = {}  # the text files' blocks, found by read_data
        self._coverage: float | None = None

    def split_names(self) -> list[str]:
        return [split.name for split in self.split_files()]

    def split_files(self) -> list[SplitFiles]:
        """The splits to tokenise: training pairs over data.max_len are dropped; validation and test keep every
        non-empty pair (and their references)."""
        d = self.cfg.data
        names = [d.train, d.valid] + ([d.test] if d.test else [])
        return [
            SplitFiles(
                name, *data_paths(d, name), d.max_len if name == d.train else None, name != d.train, data_columns(d)
            )
            for name in dict.fromkeys(names)
        ]

    def read_data(self) -> None:
        """Every file is read through once before anything is written: a missing file, invalid UTF-8 or
        misaligned line counts stop the run here (in bounded memory, whatever the corpus size)."""
        if self.cfg.vocab.model is not None:
            self.given_vocab = load_model_file(self.cfg.vocab.model)
            check_translation_vocab(self.given_vocab, f"vocab.model {self.cfg.vocab.model}")
        if self.preprocessed() is not None:
            return
        train = hashlib.sha256()  # the data fingerprint (text.fingerprint of the training files), in the same read
        self._indexes = {
            split.name: index_pair(
                split.src, split.tgt, also=train if split.name == self.cfg.data.train else None, columns=split.columns
            )
            for split in self.split_files()
        }
        self._fingerprint = train.hexdigest()
        d = self.cfg.data
        hashes = {name: tuple(index.sha256 for index in pair) for name, pair in self._indexes.items()}
        for key, name in (("valid", d.valid), ("test", d.test)):  # held-out text under another name (a copy, a link)
            if name is not None and hashes[name] == hashes[d.train]:
                raise UserError(
                    f"data.{key} {name!r} holds the same text as data.train {d.train!r} (the files under {d.dir}): "
                    "a run validates and tests on text it does not train on; name another split"
                )
        self._read = {i.path: {"size": i.size, "sha256": i.sha256} for pair in self._indexes.values() for i in pair}

    def data_settings(self) -> dict[str, Any]:
        d = self.cfg.data
        settings = {
            "src_lang": d.src_lang,
            "tgt_lang": d.tgt_lang,
            "train": d.train,
            "valid": d.valid,
            "test": d.test,
            "max_len": d.max_len,
        }
        if d.format == "tsv":  # (only then: a folder preprocessed from text files before these keys still matches)
            settings.update(format=d.format, src_column=d.src_column, tgt_column=d.tgt_column)
        return settings

    def source_files(self) -> list[Path]:
        return list(dict.fromkeys(p for s in self.split_files() for p in (s.src, s.tgt)))

    def valid_names(self) -> list[str]:
        return [p.name for p in dict.fromkeys(data_paths(self.cfg.data, self.cfg.data.valid))]

    def data_fingerprint(self) -> str:
        if self._fingerprint is None:
            manifest = self.preprocessed()
            if manifest is not None:
                self._fingerprint = manifest.data["data_fingerprint"]
            else:
                self._fingerprint = fingerprint(list(dict.fromkeys(data_paths(self.cfg.data, self.cfg.data.train))))
        return self._fingerprint

    def count_parameters(self) -> tuple[int, int]:
        from transformer_cli.models.params import transformer_formula

        m, V = self.cfg.model, self.cfg.vocab.size  # vocab.size bounds the trained vocabulary
        return transformer_formula(m, V, V).total, m.max_positions * m.d_model

    def vocab_files(self) -> list[str]:
        return ["joint"] if self.cfg.vocab.joint else ["src", "tgt"]

    def vocab_settings(self) -> dict[str, Any]:
        return vocab_settings(self.kind, self.cfg.vocab, self.cfg.train.seed, self.data_fingerprint(), self.coverage())

    def coverage(self) -> float:
        """vocab.character_coverage, auto resolved from the languages or the training text (a preprocessed
        folder's: the value it was made with)."""
        if self._coverage is None:
            v, d, manifest = self.cfg.vocab, self.cfg.data, self.preprocessed()
            if v.character_coverage == "auto" and manifest is not None:
                self._coverage = manifest.data["vocab_settings"]["vocab"].get("character_coverage", 1.0)
            else:
                train = self.split_files()[0]
                text = head_lines([train.src, train.tgt])
                self._coverage = resolve_coverage(v.character_coverage, [d.src_lang, d.tgt_lang], text)
        return self._coverage

    def train_vocabs(self, quiet: bool) -> list[Vocab]:
        manifest, v = self.preprocessed(), self.cfg.vocab
        if manifest is not None:
            return [Vocab.load(p) for p in manifest.vocab_paths()]
        if v.model is not None:
            return [self.given_vocab]
        train = self.split_files()[0]
        corpora = [["src", "tgt"]] if v.joint else [["src"], ["tgt"]]
        vocabs = []
        for name, sides in zip(self.vocab_files(), corpora):
            say(
                quiet,
                f"training the {name} sentencepiece vocabulary ({v.type}, up to {v.size} pieces, on at most "
                f"{v.max_sentences:,} lines)",
            )
            lines = itertools.chain.from_iterable(train.side_lines(side) for side in sides)
            sample = reservoir(lines, v.max_sentences, self.cfg.train.seed)
            vocabs.append(
                train_vocab(
                    sample,
                    v.size,
                    v.type,
                    self.coverage(),
                    v.max_sentences,
                    self.cfg.train.seed,
                    source=f"the {train.name} split",
                    split_cjk=v.split_cjk,
                )
            )
        return vocabs

    def vocabs_from_checkpoint(self, ckpt: Checkpoint) -> list[Vocab]:
        return [ckpt.vocabs[0]] if self.cfg.vocab.joint else list(ckpt.vocabs)

    def write_shards(self, folder: Path, vocabs: list[Vocab], quiet: bool) -> dict[str, Any]:
        pair = (vocabs[0], vocabs[0]) if self.cfg.vocab.joint else (vocabs[0], vocabs[1])
        return preprocess_parallel(folder, self.split_files(), pair, quiet, indexes=self._indexes)

    def make_task(self, vocabs: list[Vocab], data: Manifest, runtime: Runtime, quiet: bool) -> TranslationTask:
        import torch

        from transformer_cli.models.builders import build_transformer
        from transformer_cli.translation.task import TranslationTask

        cfg, d = self.cfg, self.cfg.data
        pair = (vocabs[0], vocabs[0]) if cfg.vocab.joint else (vocabs[0], vocabs[1])
        train = ShardedPairs(data, d.train)
        valid = ShardedPairs(data, d.valid).load(max_len=cfg.model.max_positions - 2)
        test = ShardedPairs(data, d.test).load() if d.test else None
        say(
            quiet,
            f"{d.train}: {len(train):,} pairs, {d.valid}: {len(valid):,}"
            + (f", {d.test}: {len(test):,}" if test else "")
            + f" ({data.folder})",
        )
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        model = build_transformer(cfg.model, len(pair[0]), len(pair[1]))
        n_params = sum(p.numel() for p in dict.fromkeys(model.parameters()))
        say(quiet, f"model: {n_params:,} parameters; vocabulary {len(pair[0])} / {len(pair[1])} pieces")
        return TranslationTask(cfg, pair, train, valid, test, model, self.data_fingerprint())


def train_translation(
    cfg: TranslationRunConfig, run_dir: Path, device: str = "auto", resume: bool = False, quiet: bool = False
) -> dict[str, Any]:
    """`tcli train`: everything from raw text to best.pt; returns the end event."""
    if cfg.eval.bleu or cfg.data.test:  # a tokenizer that cannot run is said now, not at the first validation
        usable_tokenizer(cfg.eval.bleu_tokenize, cfg.data.tgt_lang, "eval.bleu_tokenize")
    return run_training(TranslationSetup(cfg), cfg, run_dir, device, resume, quiet)
