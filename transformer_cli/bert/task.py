"""BERT pretraining on the shared trainer: vocabulary with reserved pieces, NSP pairs, dynamic masking."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_cli.bert.validation import bert_special_ids, bert_validation, held_out_instances
from transformer_cli.config import BertRunConfig
from transformer_cli.data.bert import (
    BertBatch,
    EpochPlan,
    PlanBatch,
    SpecialIds,
    batch_seed,
    make_plan_batch,
    plan_epoch,
    sample_map_cached,
)
from transformer_cli.data.shards import Manifest, document_starts
from transformer_cli.runtime.device import Runtime
from transformer_cli.vocab.spm import Vocab, check_bert_vocab


def special_ids(vocab: Vocab) -> SpecialIds:
    check_bert_vocab(vocab, "the run's vocabulary")
    return bert_special_ids(len(vocab))


class BertTask:
    kind = "bert"
    throughput_key = "tokens_per_sec"
    examples_key = None
    best_metric, best_mode = "mlm_loss", "min"
    evaluate_each_epoch = False

    def __init__(self, cfg: BertRunConfig, vocab: Vocab, data: Manifest, model: nn.Module, data_fingerprint: str):
        self.cfg, self.vocab, self.model = cfg, vocab, model
        self.ids = special_ids(vocab)
        self.data_fingerprint = data_fingerprint
        d = cfg.data
        self.train = data.array("train", "text")
        self.doc_starts = document_starts(data.folder, "train")
        # The chunks NSP samples are cut from: computed once, cached beside the arrays when that folder is writable.
        cache = data.folder if os.access(data.folder, os.W_OK) else None
        self.sample_map = sample_map_cached(
            cache, self.train.offsets, self.doc_starts, d.max_seq_len, d.short_seq_prob, cfg.train.seed
        )
        self._plan: tuple[int, EpochPlan] | None = None
        valid = data.array("valid", "text")
        starts = document_starts(data.folder, "valid").tolist()
        docs = [[valid.sentence(i) for i in range(a, b)] for a, b in zip(starts, starts[1:])]
        self.valid = held_out_instances(docs, cfg.train.seed, d.max_seq_len, d.short_seq_prob)

    def _seed(self, *parts: int) -> int:
        return batch_seed(self.cfg.train.seed, *parts)

    def epoch_batches(self, epoch: int) -> EpochPlan:
        """The epoch's NSP pairs and batch order, drawn for all samples at once; the same number every epoch."""
        if self._plan is None or self._plan[0] != epoch:
            d = self.cfg.data
            plan = plan_epoch(
                self.sample_map,
                self.train.offsets,
                self.doc_starts,
                d.max_seq_len,
                self.cfg.train.batch_size,
                self.cfg.train.seed,
                epoch,
            )
            self.train.release()  # planning read the whole index through its mapping
            self._plan = (epoch, plan)
        return self._plan[1]

    def make_batch(self, spec: PlanBatch, epoch: int) -> BertBatch:
        plan = self.epoch_batches(epoch)
        generator = torch.Generator().manual_seed(self._seed(2, epoch, spec.number))
        d = self.cfg.data
        batch = make_plan_batch(
            plan,
            spec,
            self.train.spans,
            self.train.offsets,
            self.ids,
            d.mask_prob,
            d.max_predictions,
            generator,
            multiple=self.cfg.train.pad_to_multiple,
        )
        self.train.release()  # the index pages this batch mapped (its tokens were read with pread)
        return batch

    def step_loss(self, model: nn.Module, batch: BertBatch, norms: dict[str, int]) -> tuple[Tensor, dict]:
        out = model(batch.input_ids, batch.segment_ids, batch.mlm_labels, batch.nsp_labels)
        objective = out.mlm_loss / norms["mlm"] + out.nsp_loss / norms["nsp"]
        return objective, {
            "mlm_loss": (out.mlm_loss.detach(), batch.masked),
            "nsp_loss": (out.nsp_loss.detach(), batch.rows),
        }

    def summarize(self, averages: dict[str, float]) -> dict[str, float]:
        return {
            "loss": averages["mlm_loss"] + averages["nsp_loss"],
            "mlm_loss": averages["mlm_loss"],
            "nsp_loss": averages["nsp_loss"],
        }

    def evaluate(self, model: nn.Module, runtime: Runtime) -> dict[str, float]:
        """MLM loss and accuracy at the masked positions, NSP accuracy, perplexity = exp(MLM loss)."""
        return bert_validation(
            model,
            self.valid,
            self.ids,
            self.cfg.train.seed,
            self.cfg.train.batch_size,
            self.cfg.data.mask_prob,
            self.cfg.data.max_predictions,
            runtime.device,
            runtime.context,
        )

    def final_report(self, ckpt_dir: Path, runtime: Runtime) -> list[dict[str, Any]]:
        return []  # BERT has no test split: its held-out text is the validation file

    def checkpoint_meta(self) -> dict[str, Any]:
        return {
            "config": self.cfg.model_dump(mode="json"),
            "vocab": {"bert": self.vocab.model_bytes},
            "data_fingerprint": self.data_fingerprint,
        }
