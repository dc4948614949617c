"""BERT pretraining on the shared trainer: vocabulary with reserved pieces, NSP pairs, dynamic masking."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_cli.config import BertRunConfig, dump_config
from transformer_cli.datasets.bert import (
    BertBatch,
    Instance,
    SpecialIds,
    check_corpus,
    length_batches,
    make_batch,
    make_instances,
    read_documents,
)
from transformer_cli.datasets.text import fingerprint
from transformer_cli.errors import UserError
from transformer_cli.models.builders import build_bert
from transformer_cli.scoring import bert_validation
from transformer_cli.train.loop import Trainer, prepare_run_dir, resume_requested, say
from transformer_cli.train.runtime import Runtime
from transformer_cli.vocab import Vocab, train_vocab

SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4 in every tcli BERT vocabulary


def train_bert_vocab(sentences: list[str], cfg: BertRunConfig) -> Vocab:
    v = cfg.vocab
    return train_vocab(sentences, v.size, v.type, v.character_coverage, v.max_sentences, cfg.train.seed,
                       pad_piece="[PAD]", unk_piece="[UNK]", control_symbols=("[CLS]", "[SEP]", "[MASK]"),
                       bos_eos=False)


def special_ids(vocab: Vocab) -> SpecialIds:
    ids = [vocab.piece_to_id(p) for p in SPECIAL_PIECES]
    if ids != list(range(len(SPECIAL_PIECES))):
        raise UserError(f"the vocabulary does not hold {', '.join(SPECIAL_PIECES)} at ids 0-4; "
                        "it is not a BERT vocabulary")
    return SpecialIds(pad=0, cls=2, sep=3, mask=4, first_normal=len(SPECIAL_PIECES), vocab_size=len(vocab))


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
        # Held-out pairs and masks are drawn once, so every evaluation scores the same thing.
        valid_rng = random.Random(cfg.train.seed + 7919)
        self.valid = make_instances(valid_docs, cfg.data.max_seq_len, cfg.data.short_seq_prob, valid_rng)

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
        return make_batch([self._instances[i] for i in indices], self.ids, d.mask_prob, d.max_predictions, generator)

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

    def final_report(self, ckpt_dir: Path, runtime: Runtime) -> None:
        return None

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"config": self.cfg.model_dump(mode="json"), "vocab": {"bert": self.vocab.model_bytes},
                "data_fingerprint": self.data_fingerprint}

    def check_resume(self, state: dict[str, Any], path: Path) -> None:
        if state.get("vocab") != {"bert": self.vocab.model_bytes}:
            raise UserError(f"{path} was trained with another vocabulary than the one in the run directory")
        if state.get("data_fingerprint") != self.data_fingerprint:
            raise UserError(f"the training text differs from the text {path} was trained on; use a new --out")
        if state["config"].get("model") != self.cfg.model_dump(mode="json")["model"]:
            raise UserError(f"the model: section differs from the one {path} was trained with; "
                            "resume with the same model settings or use a new --out")


def _encode_docs(vocab: Vocab, docs: list[list[str]]) -> list[list[list[int]]]:
    flat = vocab.encode([s for d in docs for s in d])
    out, i = [], 0
    for d in docs:
        out.append([s for s in flat[i : i + len(d)] if s])
        i += len(d)
    return [d for d in out if d]


def _prepare_vocab(cfg: BertRunConfig, run_dir: Path, train_docs: list[list[str]], hf_vocab: Vocab | None,
                   quiet: bool) -> Vocab:
    """The run's vocabulary: the one saved in the run directory, else the HF folder's, else a new one."""
    path = run_dir / "vocab" / "bert.model"
    if path.exists():
        vocab = Vocab.load(path)
        if hf_vocab is not None and vocab != hf_vocab:
            raise UserError(f"the --init-from-hf folder has another vocabulary than the run directory {run_dir}")
        return vocab
    if hf_vocab is None:
        say(quiet, f"training the sentencepiece vocabulary ({cfg.vocab.type}, up to {cfg.vocab.size} pieces)")
    vocab = hf_vocab or train_bert_vocab([s for doc in train_docs for s in doc], cfg)
    vocab.save(path)
    return vocab


def pretrain_bert(cfg: BertRunConfig, run_dir: Path, device: str = "auto", resume: bool = False,
                  quiet: bool = False, init_from_hf: Path | None = None) -> dict[str, Any]:
    """`tcli pretrain-bert`: text -> vocabulary -> NSP/MLM instances -> trained BERT; returns the end event."""
    runtime = Runtime.create(device, cfg.train.precision)
    d = cfg.data
    paths = {name: Path(d.dir) / getattr(d, name) for name in ("train", "valid")}
    raw = {name: read_documents(path, d.format, d.split_sentences) for name, path in paths.items()}
    for name, docs in raw.items():
        check_corpus(docs, str(paths[name]))
    hf_model, hf_vocab = None, None
    if init_from_hf is not None:
        from transformer_cli.hf import load_hf_bert

        hf_model, hf_vocab = load_hf_bert(init_from_hf, cfg.model)
    quiet, resume = quiet or not runtime.is_main, resume_requested(resume)
    if runtime.is_main:  # under torchrun, rank 0 prepares the run directory and the vocabulary
        prepare_run_dir(run_dir, resume)
        (run_dir / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
        say(quiet, f"run directory {run_dir}; {runtime.describe()}")
        vocab = _prepare_vocab(cfg, run_dir, raw["train"], hf_vocab, quiet)
    runtime.barrier()
    if not runtime.is_main:
        vocab = Vocab.load(run_dir / "vocab" / "bert.model")
    docs = {name: _encode_docs(vocab, raw_docs) for name, raw_docs in raw.items()}
    for name, encoded in docs.items():
        n_sent = sum(len(x) for x in encoded)
        n_tok = sum(len(s) for x in encoded for s in x)
        say(quiet, f"{name}: {len(encoded)} documents, {n_sent} sentences, {n_tok} tokens ({paths[name]})")
        check_corpus(encoded, str(paths[name]))

    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    model = build_bert(cfg.model, len(vocab))
    if hf_model is not None:
        model.load_state_dict(hf_model)
        say(quiet, f"initialised from {init_from_hf}")
    n_params = sum(p.numel() for p in model.parameters())
    say(quiet, f"model: {n_params:,} parameters; vocabulary {len(vocab)} pieces")
    task = BertTask(cfg, vocab, docs["train"], docs["valid"], model, fingerprint([paths["train"]]))
    trainer = Trainer(task, cfg.train, run_dir, runtime, quiet)
    trainer.resume_or_start(resume)
    try:
        return trainer.run()
    finally:
        runtime.shutdown()
