"""Translation on the shared trainer: vocabulary, parallel data, Transformer, validation BLEU."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_cli.config import TranslationRunConfig, dump_config
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
from transformer_cli.decode import DecodeOptions, decode_corpus
from transformer_cli.errors import UserError
from transformer_cli.evaluate import translation_scores
from transformer_cli.models.builders import build_transformer
from transformer_cli.scoring import eval_decode_options, translation_validation
from transformer_cli.train.checkpoint import load_checkpoint
from transformer_cli.train.loop import Trainer, prepare_run_dir, resume_requested, say
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
        e = self.cfg.eval
        opts = DecodeOptions(e.beam, e.lenpen, e.max_len_a, e.max_len_b, e.max_tokens)
        hyps = decode_corpus(model, data.src, opts, BOS_ID, EOS_ID, runtime.device, runtime.context)
        return self.vocabs[1].decode([h[0].tokens if h else [] for h in hyps])

    def final_report(self, ckpt_dir: Path, runtime: Runtime) -> dict[str, Any] | None:
        """Score the test split with best.pt: cased and lowercased BLEU, chrF."""
        best = ckpt_dir / "best.pt"
        if self.test is None or not best.exists():
            return None
        self.model.load_state_dict(load_checkpoint(best, kind=self.kind)["model"])
        self.model.eval()
        with torch.inference_mode():
            hyps = self.translate(self.model, runtime, self.test)
        scores = translation_scores(hyps, self.test.tgt_text)
        say(False, f"test ({self.cfg.data.test}, best.pt): " + " | ".join(scores.lines()))
        return {"split": self.cfg.data.test, "bleu": scores.bleu, "bleu_lc": scores.bleu_lc, "chrf": scores.chrf,
                "bleu_signature": scores.bleu_signature}

    def checkpoint_meta(self) -> dict[str, Any]:
        src, tgt = self.vocabs
        vocab = {"joint": src.model_bytes} if src is tgt else {"src": src.model_bytes, "tgt": tgt.model_bytes}
        return {"config": self.cfg.model_dump(mode="json"), "vocab": vocab, "data_fingerprint": self.data_fingerprint}

    def check_resume(self, state: dict[str, Any], path: Path) -> None:
        ours = self.checkpoint_meta()
        if state.get("vocab") != ours["vocab"]:
            raise UserError(f"{path} was trained with another vocabulary than the one in the run directory")
        if state.get("data_fingerprint") != self.data_fingerprint:
            raise UserError(f"the training data differ from those {path} was trained on; use a new --out to start over")
        for section in ("model", "vocab"):
            if state["config"].get(section) != ours["config"][section]:
                raise UserError(f"the {section}: section differs from the one {path} was trained with; "
                                f"resume with the same {section} settings or use a new --out")


def vocab_from_checkpoint(state: dict[str, Any]) -> tuple[Vocab, Vocab]:
    vocab = state["vocab"]
    if "joint" in vocab:
        joint = Vocab(vocab["joint"])
        return joint, joint
    return Vocab(vocab["src"]), Vocab(vocab["tgt"])


def _prepare_vocab(cfg: TranslationRunConfig, run_dir: Path, train_lines: tuple[list[str], list[str]],
                   quiet: bool) -> tuple[Vocab, Vocab]:
    """Load the run's vocabulary if it has one (resume), else train it from the training text and save it."""
    v, vocab_dir = cfg.vocab, run_dir / "vocab"
    names = ["joint"] if v.joint else ["src", "tgt"]
    paths = [vocab_dir / f"{name}.model" for name in names]
    if all(p.exists() for p in paths):
        loaded = [Vocab.load(p) for p in paths]
        return (loaded[0], loaded[0]) if v.joint else (loaded[0], loaded[1])
    src_lines, tgt_lines = train_lines
    corpora = [src_lines + tgt_lines] if v.joint else [src_lines, tgt_lines]
    vocabs = []
    for name, lines, path in zip(names, corpora, paths):
        say(quiet, f"training the {name} sentencepiece vocabulary ({v.type}, up to {v.size} pieces)")
        vocab = train_vocab(lines, v.size, v.type, v.character_coverage, v.max_sentences, cfg.train.seed)
        vocab.save(path)
        vocabs.append(vocab)
    return (vocabs[0], vocabs[0]) if v.joint else (vocabs[0], vocabs[1])


def read_splits(cfg: TranslationRunConfig) -> dict[str, tuple[list[str], list[str]]]:
    """Raw text of every split, read (and checked) before anything is written."""
    d = cfg.data
    names = [d.train, d.valid] + ([d.test] if d.test else [])
    return {name: read_parallel(*split_paths(d.dir, name, d.src_lang, d.tgt_lang)) for name in names}


def encode_split(name: str, lines: tuple[list[str], list[str]], vocabs: tuple[Vocab, Vocab], max_len: int | None,
                 quiet: bool) -> ParallelData:
    data = encode_parallel(*lines, vocabs[0], vocabs[1], max_len)
    say(quiet, f"{name}: {len(data)} of {len(lines[0])} pairs kept ({data.dropped_empty} with an empty side dropped"
               + (f", {data.dropped_long} over {max_len} pieces dropped)" if max_len else ")"))
    return data


def train_translation(cfg: TranslationRunConfig, run_dir: Path, device: str = "auto", resume: bool = False,
                      quiet: bool = False) -> dict[str, Any]:
    """`tcli train`: everything from raw text to best.pt; returns the end event."""
    runtime = Runtime.create(device, cfg.train.precision)
    quiet, resume = quiet or not runtime.is_main, resume_requested(resume)
    d = cfg.data
    splits = read_splits(cfg)
    if runtime.is_main:  # under torchrun, rank 0 prepares the run directory and the vocabulary
        prepare_run_dir(run_dir, resume)
        (run_dir / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
        say(quiet, f"run directory {run_dir}; {runtime.describe()}")
        vocabs = _prepare_vocab(cfg, run_dir, splits[d.train], quiet)
    runtime.barrier()
    if not runtime.is_main:
        vocabs = _prepare_vocab(cfg, run_dir, splits[d.train], quiet)
    train = encode_split(d.train, splits[d.train], vocabs, d.max_len, quiet)
    valid = encode_split(d.valid, splits[d.valid], vocabs, cfg.model.max_positions - 2, quiet)
    test = encode_split(d.test, splits[d.test], vocabs, None, quiet) if d.test else None
    train_files = list(split_paths(d.dir, d.train, d.src_lang, d.tgt_lang))

    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    model = build_transformer(cfg.model, len(vocabs[0]), len(vocabs[1]))
    n_params = sum(p.numel() for p in dict.fromkeys(model.parameters()))
    say(quiet, f"model: {n_params:,} parameters; vocabulary {len(vocabs[0])} / {len(vocabs[1])} pieces")
    task = TranslationTask(cfg, vocabs, train, valid, test, model, fingerprint(train_files))
    trainer = Trainer(task, cfg.train, run_dir, runtime, quiet)
    trainer.resume_or_start(resume)
    try:
        return trainer.run()
    finally:
        runtime.shutdown()
