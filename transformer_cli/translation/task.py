"""Translation on the shared trainer: vocabulary, parallel data, Transformer, validation BLEU."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from transformer_cli.checkpoint import read_checkpoint
from transformer_cli.config import TranslationRunConfig
from transformer_cli.core.console import say
from transformer_cli.data.translation import Batch, BatchPlan, ParallelData, ShardedPairs, token_batches
from transformer_cli.metrics.bleu import resolve_tokenizer, translation_scores
from transformer_cli.runtime.device import Runtime
from transformer_cli.translation.validation import eval_decode_options, translate_texts, translation_validation
from transformer_cli.vocab.spm import Vocab


class TranslationTask:
    kind = "translation"
    throughput_key = "tgt_tokens_per_sec"
    examples_key = None
    evaluate_each_epoch = False

    def __init__(
        self,
        cfg: TranslationRunConfig,
        vocabs: tuple[Vocab, Vocab],
        train: ShardedPairs,
        valid: ParallelData,
        test: ParallelData | None,
        model: nn.Module,
        data_fingerprint: str,
    ):
        self.cfg, self.vocabs, self.model = cfg, vocabs, model
        self.train, self.valid, self.test = train, valid, test
        self.data_fingerprint = data_fingerprint
        self.best_metric, self.best_mode = ("bleu", "max") if cfg.eval.bleu else ("valid_loss", "min")
        self.bleu_tokenize = resolve_tokenizer(cfg.eval.bleu_tokenize, cfg.data.tgt_lang)

    def epoch_batches(self, epoch: int) -> BatchPlan:
        t = self.cfg.train
        return token_batches(
            self.train.src_lens, self.train.tgt_lens, t.max_tokens, t.seed, epoch, multiple=t.pad_to_multiple
        )

    def make_batch(self, spec: np.ndarray, epoch: int) -> Batch:
        t = self.cfg.train
        return self.train.batch(spec, multiple=t.pad_to_multiple, max_tokens=t.max_tokens)

    def step_loss(self, model: nn.Module, batch: Batch, norms: dict[str, int]) -> tuple[Tensor, dict]:
        out = model(batch.src, batch.tgt_in, labels=batch.labels, label_smoothing=self.cfg.train.label_smoothing)
        return out.loss / norms["tokens"], {"loss": (out.loss.detach(), batch.tokens)}

    def summarize(self, averages: dict[str, float]) -> dict[str, float]:
        return {"loss": averages["loss"]}

    def evaluate(self, model: nn.Module, runtime: Runtime) -> dict[str, float]:
        """Validation NLL per target token, its perplexity, and BLEU of beam-search output."""
        return translation_validation(
            model,
            self.valid,
            self.vocabs[1],
            self.cfg.train.max_tokens,
            self.cfg.train.pad_to_multiple,
            eval_decode_options(self.cfg.eval) if self.cfg.eval.bleu else None,
            self.bleu_tokenize,
            runtime.device,
            runtime.context,
            runtime.kernel_per_shape,
        )

    def translate(self, model: nn.Module, runtime: Runtime, data: ParallelData) -> list[str]:
        opts = eval_decode_options(self.cfg.eval)
        return translate_texts(
            model, data.src, opts, self.vocabs[1], runtime.device, runtime.context, runtime.kernel_per_shape
        )

    def final_report(self, ckpt_dir: Path, runtime: Runtime) -> list[dict[str, Any]]:
        """Score the test split with best.pt (and averaged.pt when train.average_last made one): cased and
        lowercased BLEU, chrF."""
        reports = []
        for name in ("best.pt", "averaged.pt"):
            path = ckpt_dir / name
            if self.test is None or not path.exists():
                if self.test is not None and name == "best.pt":  # removed by hand: said, not a log without test
                    print(f"warning: {path} is missing, so the test split is not scored", file=sys.stderr)
                continue
            self.model.load_state_dict(read_checkpoint(path, kind=self.kind).weights)
            self.model.eval()
            with torch.inference_mode():
                hyps = self.translate(self.model, runtime, self.test)
            scores = translation_scores(hyps, self.test.references(), self.bleu_tokenize)
            say(False, f"test ({self.cfg.data.test}, {name}): " + " | ".join(scores.lines()))
            reports.append(
                {
                    "split": self.cfg.data.test,
                    "checkpoint": name,
                    "bleu": scores.bleu,
                    "bleu_lc": scores.bleu_lc,
                    "chrf": scores.chrf,
                    "bleu_signature": scores.bleu_signature,
                }
            )
        return reports

    def checkpoint_meta(self) -> dict[str, Any]:
        src, tgt = self.vocabs
        vocab = {"joint": src.model_bytes} if src is tgt else {"src": src.model_bytes, "tgt": tgt.model_bytes}
        return {"config": self.cfg.model_dump(mode="json"), "vocab": vocab, "data_fingerprint": self.data_fingerprint}
