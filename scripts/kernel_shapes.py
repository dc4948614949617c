"""New GEMM shapes (and oneDNN kernel creations) after warm-up: translation training, BERT training, beam search,
BERT fine-tuning.

    python scripts/kernel_shapes.py [--json]

Each workload runs tcli's own batching and model code on a synthetic corpus with a realistic length mix, in the
precision `auto` picks on this CPU: a warm-up (one epoch of training batches, for fine-tuning with its dev
evaluation; one set of sentences to translate), then a window of the same kind (the next epoch; a third as many
other sentences). Printed per workload: the distinct GEMM shapes of the warm-up, the shapes first seen in the
window (projections mm/addmm; attention bmm), oneDNN's kernel creations in the window (0 where torch does not
multiply through oneDNN, as for fp32 on most CPUs), and how many kernels oneDNN created a second time over the
whole run (warm-up and window: a kernel evicted from its cache and needed again). A shape-keyed kernel cache that
holds the warm-up's shapes creates nothing afterwards when the window brings no new shape.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformer_cli.runtime.device import Runtime  # noqa: E402
from transformer_cli.runtime.kernel_shapes import (
    GemmShapes,
    created_again,
    creation_ms,
    ending_sentences_at_random,
    onednn_creations,
    summary,
)

VOCAB, PAD, BOS, EOS = 1000, 0, 2, 3


def lengths(n: int, rng: np.random.Generator, mean: float = 14.0) -> np.ndarray:
    """Sentence lengths in pieces, log-normal around `mean` (a Multi30k-like mix), 1..100."""
    return np.clip(rng.lognormal(np.log(mean), 0.35, n).round(), 1, 100).astype(np.int64)


def train_step(model, loss_of, optimizer, runtime: Runtime) -> None:
    with runtime.context():
        loss = loss_of(model)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def translation(runtime: Runtime, pairs: int, max_tokens: int) -> dict:
    from transformer_cli.data.translation import ParallelData, collate, token_batches
    from transformer_cli.models.transformer import Transformer

    rng = np.random.default_rng(0)
    src = lengths(pairs, rng)
    tgt = np.clip(src + rng.integers(-3, 5, pairs), 1, 100)
    data = ParallelData([[7] * int(n) for n in src], [[8] * int(n) for n in tgt], [], [])
    torch.manual_seed(0)
    model = Transformer(VOCAB, VOCAB, 64, 4, 128, 2, 2, dropout=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def epoch(e: int) -> None:
        for spec in token_batches(src, tgt, max_tokens, seed=1, epoch=e, multiple=2):
            b = collate(data, spec, PAD, BOS, EOS, multiple=2, max_tokens=max_tokens)

            def loss(m, b=b):
                return m(b.src, b.tgt_in, labels=b.labels, label_smoothing=0.1).loss

            train_step(model, loss, optimizer, runtime)

    return window(lambda: epoch(0), lambda: epoch(1))


def bert(runtime: Runtime, docs: int, batch_size: int) -> dict:
    from transformer_cli.data.bert import SpecialIds, length_batches, make_batch, make_instances
    from transformer_cli.models.bert import Bert

    rng, nrng = random.Random(0), np.random.default_rng(0)
    corpus = [[[9] * int(n) for n in lengths(int(k), nrng, 18.0)] for k in nrng.integers(2, 12, docs)]
    instances = make_instances(corpus, 128, 0.1, rng)
    ids = SpecialIds(pad=PAD, cls=2, sep=3, mask=4, first_normal=5, vocab_size=VOCAB)
    torch.manual_seed(0)
    model = Bert(VOCAB, 64, 2, 4, 128, max_positions=128)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)

    def epoch(e: int) -> None:
        for idx in length_batches([len(x) for x in instances], batch_size, random.Random(e)):
            b = make_batch([instances[i] for i in idx], ids, 0.15, 20, generator, multiple=2)

            def loss(m, b=b):
                out = m(b.input_ids, b.segment_ids, b.mlm_labels, b.nsp_labels)
                return out.mlm_loss + out.nsp_loss

            train_step(model, loss, optimizer, runtime)

    return window(lambda: epoch(0), lambda: epoch(1))


def finetune(runtime: Runtime, examples: int) -> dict:
    """Sentence-pair classification with `tcli finetune`'s batches (length-bucketed, `finetuned.batch_width`) and
    its dev evaluation (`predict_logits`) after each epoch: MRPC's size and length mix (pairs of ~65 pieces, up
    to max_seq_len 128)."""
    from transformer_cli.data.bert import length_batches
    from transformer_cli.kinds.finetuned import EVAL_ROWS, Features, batch_width, collate, length_order, predict_logits
    from transformer_cli.models.bert import Bert
    from transformer_cli.models.heads import BertClassifier

    rng = np.random.default_rng(0)

    def features(n: int) -> Features:
        sizes = np.clip(rng.lognormal(np.log(60.0), 0.35, n).round(), 8, 128).astype(np.int64)
        ids = [[9] * int(k) for k in sizes]
        return Features(ids=ids, types=[[0] * len(x) for x in ids], labels=rng.integers(0, 2, n).tolist())

    train, dev = features(examples), features(examples // 9)
    torch.manual_seed(0)
    model = BertClassifier(Bert(VOCAB, 64, 2, 4, 128, max_positions=128, pretraining_heads=False), 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def epoch(e: int) -> None:
        model.train()
        for rows in length_batches([len(x) for x in train.ids], 32, random.Random(e)):
            width = batch_width(max(len(train.ids[r]) for r in rows), 1, 128, runtime.kernel_per_shape)
            b = collate(train, rows, PAD, "classification", width)
            train_step(model, lambda m, b=b: m(b.input_ids, b.segment_ids, b.labels).loss, optimizer, runtime)
        predict_logits(model, dev, length_order(dev, EVAL_ROWS), PAD, "classification", runtime, 128)

    return window(lambda: epoch(0), lambda: epoch(1))


def beam(runtime: Runtime, sentences: int) -> dict:
    from transformer_cli.models.transformer import Transformer
    from transformer_cli.translation.decode import DecodeOptions, decode_corpus

    torch.manual_seed(0)
    model = Transformer(VOCAB, VOCAB, 64, 4, 128, 2, 2, dropout=0.0).eval()
    ending_sentences_at_random(model, EOS)  # an untrained model seldom ends a sentence
    rng = np.random.default_rng(0)
    opts = DecodeOptions(beam=5, max_tokens=1500)

    def translate(n: int) -> None:
        sources = [rng.integers(5, VOCAB, int(k)).tolist() for k in lengths(n, rng)]
        decode_corpus(model, sources, opts, BOS, EOS, torch.device("cpu"), runtime.context, runtime.kernel_per_shape)

    return window(lambda: translate(3 * sentences), lambda: translate(sentences))


def window(warm_up, measured) -> dict:
    shapes = GemmShapes()
    with shapes:
        with onednn_creations() as warm_created:
            warm_up()
        warm = len(shapes.seen)
        shapes.mark()
        with onednn_creations() as created:
            start = time.perf_counter()
            measured()
            seconds = time.perf_counter() - start
    misses = warm_created["misses"] + created["misses"]
    return {
        "warm_up_shapes": warm,
        "warm_up": summary(shapes.seen - shapes.new),
        "new": summary(shapes.new),
        "new_shapes": sorted(shapes.new),
        "onednn_created": created["created"],
        "onednn_misses": created["misses"],
        "onednn_ms": creation_ms(created["misses"]),
        "window_s": seconds,
        "onednn_created_in_all": len(misses),
        "onednn_created_twice": created_again(misses),
    }


def measure(quick: bool = False) -> dict:
    """The three workloads' counts (smaller corpora with `quick`)."""
    runtime = Runtime.create("cpu", "auto")
    scale = 1 if quick else 3
    return {
        "precision": runtime.precision,
        "translation": translation(runtime, 1000 * scale, 2560),
        "bert": bert(runtime, 60 * scale, 32),
        "beam": beam(runtime, 100 * scale),
        "finetune": finetune(runtime, 1223 * scale),
    }


def line(r: dict) -> str:
    """One row for the benchmark table: new shapes after warm-up, translation / BERT / beam search / fine-tuning."""

    def cell(w: dict) -> str:
        new = f"{w['new']['projection']} + {w['new']['attention']}"
        cost = f" in {w['onednn_ms']:.0f} ms of the window's {w['window_s']:.1f} s" if w["onednn_created"] else ""
        return (
            f"{new} (of {w['warm_up_shapes']}; oneDNN {w['onednn_created']}{cost}, twice {w['onednn_created_twice']})"
        )

    return " / ".join(cell(r[k]) for k in ("translation", "bert", "beam", "finetune") if k in r)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--quick", action="store_true", help="smaller corpora")
    a = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    r = measure(a.quick)
    if a.json:
        print(json.dumps(r, default=list))
        return
    print(f"precision {r['precision']}; per workload: warm-up shapes (projection / attention), then new in the window")
    for k in ("translation", "bert", "beam", "finetune"):
        w = r[k]
        print(
            f"{k:12s} warm-up {w['warm_up']['projection']} / {w['warm_up']['attention']}; "
            f"new after warm-up {w['new']['projection']} / {w['new']['attention']}; "
            f"oneDNN kernels created in the window: {w['onednn_created']} "
            f"({w['onednn_ms']:.0f} ms of {w['window_s']:.1f} s) "
            f"(in all {w['onednn_created_in_all']}, of which again after eviction {w['onednn_created_twice']})"
        )
        for s in w["new_shapes"][:10]:
            print("   new:", s)


if __name__ == "__main__":
    main()
