"""Translation on the shared trainer: vocabulary, parallel data, Transformer, validation BLEU."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_cli.checkpoint import Checkpoint, read_checkpoint
from transformer_cli.config import TranslationRunConfig
from transformer_cli.datasets.text import fingerprint
from transformer_cli.datasets.translation import (
    Batch,
    ParallelData,
    collate,
    encode_parallel,
    read_parallel,
    split_paths,
    token_batches,
)
from transformer_cli.evaluate import translation_scores
from transformer_cli.models.builders import build_transformer
from transformer_cli.params import transformer_formula
from transformer_cli.run import run_training, say
from transformer_cli.scoring import eval_decode_options, translate_texts, translation_validation
from transformer_cli.train.runtime import Runtime
from transformer_cli.vocab import BOS_ID, EOS_ID, PAD_ID, Vocab, train_vocab


class TranslationTask:
    kind = "translation"
    throughput_key = "tgt_tokens_per_sec"

    def __init__(self, cfg: TranslationRunConfig, vocabs: tuple[Vocab, Vocab], train: ParallelData,
                 valid: ParallelData, test: ParallelData | None, model: nn.Module, data_fingerprint: str):
        self.cfg, self.vocabs, self.model = cfg, vocabs, model
        self.train, self.valid, self.test = train, valid, test
        self.data_fingerprint = data_fingerprint
        self.best_metric, self.best_mode = ("bleu", "max") if cfg.eval.bleu else ("valid_loss", "min")
        self._src_lens = [len(s) for s in train.src]
        self._tgt_lens = [len(t) for t in train.tgt]

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        t = self.cfg.train
        return token_batches(self._src_lens, self._tgt_lens, t.max_tokens, t.seed, epoch, multiple=t.pad_to_multiple)

    def make_batch(self, spec: list[int], epoch: int) -> Batch:
        return collate(self.train, spec, PAD_ID, BOS_ID, EOS_ID, multiple=self.cfg.train.pad_to_multiple)

    def step_loss(self, model: nn.Module, batch: Batch, norms: dict[str, int]) -> tuple[Tensor, dict]:
        out = model(batch.src, batch.tgt_in, labels=batch.labels, label_smoothing=self.cfg.train.label_smoothing)
        return out.loss / norms["tokens"], {"loss": (out.loss.detach(), batch.tokens)}

    def summarize(self, averages: dict[str, float]) -> dict[str, float]:
        return {"loss": averages["loss"]}

    def evaluate(self, model: nn.Module, runtime: Runtime) -> dict[str, float]:
        """Validation NLL per target token, its perplexity, and BLEU of beam-search output."""
        return translation_validation(model, self.valid, self.vocabs[1], self.cfg.train.max_tokens,
                                      eval_decode_options(self.cfg.eval) if self.cfg.eval.bleu else None,
                                      runtime.device, runtime.context)

    def translate(self, model: nn.Module, runtime: Runtime, data: ParallelData) -> list[str]:
        opts = eval_decode_options(self.cfg.eval)
        return translate_texts(model, data.src, opts, self.vocabs[1], runtime.device, runtime.context)

    def final_report(self, ckpt_dir: Path, runtime: Runtime) -> list[dict[str, Any]]:
        """Score the test split with best.pt (and averaged.pt when train.average_last made one): cased and
        lowercased BLEU, chrF."""
        reports = []
        for name in ("best.pt", "averaged.pt"):
            path = ckpt_dir / name
            if self.test is None or not path.exists():
                continue
            self.model.load_state_dict(read_checkpoint(path, kind=self.kind).weights)
            self.model.eval()
            with torch.inference_mode():
                hyps = self.translate(self.model, runtime, self.test)
            scores = translation_scores(hyps, self.test.tgt_text)
            say(False, f"test ({self.cfg.data.test}, {name}): " + " | ".join(scores.lines()))
            reports.append({"split": self.cfg.data.test, "checkpoint": name, "bleu": scores.bleu,
                            "bleu_lc": scores.bleu_lc, "chrf": scores.chrf, "bleu_signature": scores.bleu_signature})
        return reports

    def checkpoint_meta(self) -> dict[str, Any]:
        src, tgt = self.vocabs
        vocab = {"joint": src.model_bytes} if src is tgt else {"src": src.model_bytes, "tgt": tgt.model_bytes}
        return {"config": self.cfg.model_dump(mode="json"), "vocab": vocab, "data_fingerprint": self.data_fingerprint}


def read_splits(cfg: TranslationRunConfig) -> dict[str, tuple[list[str], list[str]]]:
    """Raw text of every split, read (and checked) before anything is written."""
    d = cfg.data
    names = [d.train, d.valid] + ([d.test] if d.test else [])
    return {name: read_parallel(*split_paths(d.dir, name, d.src_lang, d.tgt_lang)) for name in names}


def encode_split(name: str, lines: tuple[list[str], list[str]], vocabs: tuple[Vocab, Vocab], max_len: int | None,
                 quiet: bool) -> ParallelData:
    data = encode_parallel(*lines, vocabs[0], vocabs[1], max_len, split=name)
    say(quiet, f"{name}: {len(data)} of {len(lines[0])} pairs kept ({data.dropped_empty} with an empty side dropped"
               + (f", {data.dropped_long} over {max_len} pieces dropped)" if max_len else ")"))
    return data


class TranslationSetup:
    """What the shared run lifecycle (run.py) needs to know about translation."""

    kind = "translation"

    def __init__(self, cfg: TranslationRunConfig):
        self.cfg = cfg
        self.splits: dict[str, tuple[list[str], list[str]]] = {}
        self._fingerprint: str | None = None

    def read_data(self) -> None:
        self.splits = read_splits(self.cfg)

    def data_fingerprint(self) -> str:
        if self._fingerprint is None:
            d = self.cfg.data
            self._fingerprint = fingerprint(list(split_paths(d.dir, d.train, d.src_lang, d.tgt_lang)))
        return self._fingerprint

    def count_parameters(self) -> tuple[int, int]:
        m, V = self.cfg.model, self.cfg.vocab.size  # vocab.size bounds the trained vocabulary
        return transformer_formula(m, V, V).total, m.max_positions * m.d_model

    def vocab_files(self) -> list[str]:
        return ["joint"] if self.cfg.vocab.joint else ["src", "tgt"]

    def vocab_settings(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab": self.cfg.vocab.model_dump(mode="json"), "seed": self.cfg.train.seed,
                "data": self.data_fingerprint()}

    def train_vocabs(self, quiet: bool) -> list[Vocab]:
        v, train = self.cfg.vocab, self.cfg.data.train
        src_lines, tgt_lines = self.splits[train]
        corpora = [src_lines + tgt_lines] if v.joint else [src_lines, tgt_lines]
        vocabs = []
        for name, lines in zip(self.vocab_files(), corpora):
            say(quiet, f"training the {name} sentencepiece vocabulary ({v.type}, up to {v.size} pieces)")
            vocabs.append(train_vocab(lines, v.size, v.type, v.character_coverage, v.max_sentences,
                                      self.cfg.train.seed, source=f"the {train} split"))
        return vocabs

    def vocabs_from_checkpoint(self, ckpt: Checkpoint) -> list[Vocab]:
        return [ckpt.vocabs[0]] if self.cfg.vocab.joint else list(ckpt.vocabs)

    def make_task(self, vocabs: list[Vocab], quiet: bool) -> TranslationTask:
        cfg, d = self.cfg, self.cfg.data
        pair = (vocabs[0], vocabs[0]) if cfg.vocab.joint else (vocabs[0], vocabs[1])
        train = encode_split(d.train, self.splits[d.train], pair, d.max_len, quiet)
        valid = encode_split(d.valid, self.splits[d.valid], pair, cfg.model.max_positions - 2, quiet)
        test = encode_split(d.test, self.splits[d.test], pair, None, quiet) if d.test else None
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        model = build_transformer(cfg.model, len(pair[0]), len(pair[1]))
        n_params = sum(p.numel() for p in dict.fromkeys(model.parameters()))
        say(quiet, f"model: {n_params:,} parameters; vocabulary {len(pair[0])} / {len(pair[1])} pieces")
        return TranslationTask(cfg, pair, train, valid, test, model, self.data_fingerprint())


def train_translation(cfg: TranslationRunConfig, run_dir: Path, device: str = "auto", resume: bool = False,
                      quiet: bool = False) -> dict[str, Any]:
    """`tcli train`: everything from raw text to best.pt; returns the end event."""
    return run_training(TranslationSetup(cfg), cfg, run_dir, device, resume, quiet)
