"""BERT pretraining on the shared trainer: vocabulary with reserved pieces, NSP pairs, dynamic masking."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_cli.checkpoint import Checkpoint, check_bert_vocab
from transformer_cli.config import BertRunConfig
from transformer_cli.datasets.bert import (
    BertBatch,
    Instance,
    SpecialIds,
    check_corpus,
    encode_documents,
    length_batches,
    make_batch,
    make_instances,
    read_documents,
)
from transformer_cli.datasets.text import fingerprint
from transformer_cli.errors import UserError
from transformer_cli.models.builders import build_bert
from transformer_cli.params import bert_formula
from transformer_cli.run import run_training, say
from transformer_cli.scoring import bert_special_ids, bert_validation, held_out_instances
from transformer_cli.train.runtime import Runtime
from transformer_cli.vocab import Vocab, train_vocab


def train_bert_vocab(sentences: list[str], cfg: BertRunConfig, source: str = "the training text") -> Vocab:
    v = cfg.vocab
    return train_vocab(sentences, v.size, v.type, v.character_coverage, v.max_sentences, cfg.train.seed,
                       pad_piece="[PAD]", unk_piece="[UNK]", control_symbols=("[CLS]", "[SEP]", "[MASK]"),
                       bos_eos=False, source=source)


def special_ids(vocab: Vocab) -> SpecialIds:
    check_bert_vocab(vocab, "the run's vocabulary")
    return bert_special_ids(len(vocab))


class BertTask:
    kind = "bert"
    throughput_key = "tokens_per_sec"
    best_metric, best_mode = "mlm_loss", "min"

    def __init__(self, cfg: BertRunConfig, vocab: Vocab, train_docs: list, valid_docs: list, model: nn.Module,
                 data_fingerprint: str):
        self.cfg, self.vocab, self.model = cfg, vocab, model
        self.ids = special_ids(vocab)
        self.train_docs, self.data_fingerprint = train_docs, data_fingerprint
        self._epoch: int | None = None
        self._instances: list[Instance] = []
        self.valid = held_out_instances(valid_docs, cfg.train.seed, cfg.data.max_seq_len, cfg.data.short_seq_prob)

    def _seed(self, *parts: int) -> int:
        return hash((self.cfg.train.seed, *parts)) & 0x7FFF_FFFF_FFFF

    def epoch_batches(self, epoch: int) -> list[tuple[int, list[int]]]:
        """(batch number, instance indices): pairs and batch order are drawn afresh each epoch."""
        if self._epoch != epoch:
            d = self.cfg.data
            rng = random.Random(self._seed(1, epoch))
            self._instances = make_instances(self.train_docs, d.max_seq_len, d.short_seq_prob, rng)
            self._epoch = epoch
            self._batches = length_batches([len(x) for x in self._instances], self.cfg.train.batch_size, rng)
        return list(enumerate(self._batches))

    def make_batch(self, spec: tuple[int, list[int]], epoch: int) -> BertBatch:
        number, indices = spec
        self.epoch_batches(epoch)
        generator = torch.Generator().manual_seed(self._seed(2, epoch, number))
        d = self.cfg.data
        return make_batch([self._instances[i] for i in indices], self.ids, d.mask_prob, d.max_predictions, generator,
                          multiple=self.cfg.train.pad_to_multiple)

    def step_loss(self, model: nn.Module, batch: BertBatch, norms: dict[str, int]) -> tuple[Tensor, dict]:
        out = model(batch.input_ids, batch.segment_ids, batch.mlm_labels, batch.nsp_labels)
        objective = out.mlm_loss / norms["mlm"] + out.nsp_loss / norms["nsp"]
        return objective, {"mlm_loss": (out.mlm_loss.detach(), batch.masked),
                           "nsp_loss": (out.nsp_loss.detach(), batch.rows)}

    def summarize(self, averages: dict[str, float]) -> dict[str, float]:
        return {"loss": averages["mlm_loss"] + averages["nsp_loss"], "mlm_loss": averages["mlm_loss"],
                "nsp_loss": averages["nsp_loss"]}

    def evaluate(self, model: nn.Module, runtime: Runtime) -> dict[str, float]:
        """MLM loss and accuracy at the masked positions, NSP accuracy, perplexity = exp(MLM loss)."""
        return bert_validation(model, self.valid, self.ids, self.cfg.train.seed, self.cfg.train.batch_size,
                               self.cfg.data.mask_prob, self.cfg.data.max_predictions, runtime.device,
                               runtime.context)

    def final_report(self, ckpt_dir: Path, runtime: Runtime) -> list[dict[str, Any]]:
        return []  # BERT has no test split: its held-out text is the validation file

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"config": self.cfg.model_dump(mode="json"), "vocab": {"bert": self.vocab.model_bytes},
                "data_fingerprint": self.data_fingerprint}


class BertSetup:
    """What the shared run lifecycle (run.py) needs to know about BERT pretraining."""

    kind = "bert"

    def __init__(self, cfg: BertRunConfig, init_from_hf: Path | None = None):
        self.cfg, self.init_from_hf = cfg, init_from_hf
        d = cfg.data
        self.paths = {name: Path(d.dir) / getattr(d, name) for name in ("train", "valid")}
        self.raw: dict[str, list[list[str]]] = {}
        self.hf_weights, self.hf_vocab = None, None
        self._fingerprint: str | None = None

    def read_data(self) -> None:
        d = self.cfg.data
        self.raw = {name: read_documents(path, d.format, d.split_sentences) for name, path in self.paths.items()}
        for name, docs in self.raw.items():
            check_corpus(docs, str(self.paths[name]), d.format)
        if self.init_from_hf is not None:
            from transformer_cli.hf import load_hf_bert

            self.hf_weights, self.hf_vocab = load_hf_bert(self.init_from_hf, self.cfg.model)

    def data_fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = fingerprint([self.paths["train"]])
        return self._fingerprint

    def count_parameters(self) -> tuple[int, int]:
        return bert_formula(self.cfg.model, self.cfg.vocab.size).total, 0

    def vocab_files(self) -> list[str]:
        return ["bert"]

    def vocab_settings(self) -> dict[str, Any]:
        hf = hashlib.sha256(self.hf_vocab.model_bytes).hexdigest() if self.hf_vocab is not None else None
        return {"kind": self.kind, "vocab": self.cfg.vocab.model_dump(mode="json"), "seed": self.cfg.train.seed,
                "data": self.data_fingerprint(), "from_hf": hf}

    def train_vocabs(self, quiet: bool) -> list[Vocab]:
        if self.hf_vocab is not None:
            return [self.hf_vocab]
        v = self.cfg.vocab
        say(quiet, f"training the sentencepiece vocabulary ({v.type}, up to {v.size} pieces)")
        sentences = [s for doc in self.raw["train"] for s in doc]
        return [train_bert_vocab(sentences, self.cfg, source=str(self.paths["train"]))]

    def vocabs_from_checkpoint(self, ckpt: Checkpoint) -> list[Vocab]:
        if self.hf_vocab is not None and self.hf_vocab != ckpt.vocabs[0]:
            raise UserError(f"the --init-from-hf folder has another vocabulary than {ckpt.path}")
        return [ckpt.vocabs[0]]

    def make_task(self, vocabs: list[Vocab], quiet: bool) -> BertTask:
        cfg, (vocab,) = self.cfg, vocabs
        docs = {name: encode_documents(vocab, raw_docs) for name, raw_docs in self.raw.items()}
        for name, encoded in docs.items():
            n_sent = sum(len(x) for x in encoded)
            n_tok = sum(len(s) for x in encoded for s in x)
            say(quiet, f"{name}: {len(encoded)} documents, {n_sent} sentences, {n_tok} tokens ({self.paths[name]})")
            check_corpus(encoded, str(self.paths[name]), cfg.data.format)
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        model = build_bert(cfg.model, len(vocab))
        if self.hf_weights is not None:
            model.load_state_dict(self.hf_weights)
            say(quiet, f"initialised from {self.init_from_hf}")
        n_params = sum(p.numel() for p in model.parameters())
        say(quiet, f"model: {n_params:,} parameters; vocabulary {len(vocab)} pieces")
        return BertTask(cfg, vocab, docs["train"], docs["valid"], model, self.data_fingerprint())


def pretrain_bert(cfg: BertRunConfig, run_dir: Path, device: str = "auto", resume: bool = False,
                  quiet: bool = False, init_from_hf: Path | None = None) -> dict[str, Any]:
    """`tcli pretrain-bert`: text -> vocabulary -> NSP/MLM instances -> trained BERT; returns the end event."""
    return run_training(BertSetup(cfg, init_from_hf), cfg, run_dir, device, resume, quiet)
