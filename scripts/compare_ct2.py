"""A tcli translation checkpoint beside its CTranslate2 export, on a test set.

    python scripts/compare_ct2.py --checkpoint runs/m30k_avg/checkpoints/best.pt --ct2 ct2/fp32 --ct2-int8 ct2/int8 \
        --source ../shared/data/multi30k/test_2016_flickr.en --reference ../shared/data/multi30k/test_2016_flickr.de

Prints JSON: the largest difference between tcli's teacher-forced log-probabilities and CTranslate2's
`score_batch` (fp32, every reference token and EOS), the share of identical beam-5 outputs (the same
beam, length penalty and per-sentence length limit a * source + b as `tcli translate`), BLEU of each, and
decoding speed (target tokens/s, EOS included) of tcli fp32 and CTranslate2 fp32 / int8 on the same threads.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from transformer_cli.checkpoint import read_checkpoint
from transformer_cli.core.text import read_lines
from transformer_cli.metrics.bleu import bleu, resolve_tokenizer
from transformer_cli.translation.decode import DecodeOptions
from transformer_cli.translation.translate import Translator


def max_log_prob_diff(model, translator, src_vocab, tgt_vocab, sources, references) -> float:
    src_ids, tgt_ids = src_vocab.encode(sources), tgt_vocab.encode(references)
    scored = translator.score_batch(
        [[src_vocab.sp.id_to_piece(i) for i in s] for s in src_ids],
        [[tgt_vocab.sp.id_to_piece(i) for i in t] for t in tgt_ids],
        max_batch_size=64,
    )
    worst = 0.0
    with torch.inference_mode():
        for s, t, result in zip(src_ids, tgt_ids, scored):
            logits = model(torch.tensor([s + [3]]), torch.tensor([[2] + t]))[0]  # (T + 1, V)
            ours = logits.log_softmax(-1)[torch.arange(len(t) + 1), torch.tensor(t + [3])]
            worst = max(worst, float((ours - torch.tensor(result.log_probs)).abs().max()))
    return worst


def ct2_translate(translator, src_vocab, tgt_vocab, sources, opts: DecodeOptions, limit: int) -> tuple[list[str], int]:
    """Beam search with tcli's per-sentence budget: a * (pieces + EOS) + b tokens, EOS included, so at most
    one token fewer before EOS (CTranslate2's max_decoding_length counts tokens without EOS)."""
    ids = src_vocab.encode(sources)
    groups: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(ids):
        groups[min(int(opts.max_len_a * (len(s) + 1) + opts.max_len_b), limit)].append(i)
    out: list[list[str]] = [[] for _ in sources]
    for budget, rows in groups.items():
        results = translator.translate_batch(
            [[src_vocab.sp.id_to_piece(t) for t in ids[i]] for i in rows],
            beam_size=opts.beam,
            length_penalty=opts.lenpen,
            max_decoding_length=budget - 1,
            max_batch_size=64,
        )
        for i, r in zip(rows, results):
            out[i] = r.hypotheses[0]
    tokens = sum(len(h) + 1 for h in out)
    return tgt_vocab.decode([[tgt_vocab.sp.piece_to_id(p) for p in h] for h in out]), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--ct2", type=Path, required=True, help="an fp32 export (tcli export-ct2)")
    parser.add_argument("--ct2-int8", type=Path, help="an int8 export, timed as well")
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--reference", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import ctranslate2

    torch.set_num_threads(args.threads)
    sources, references = read_lines(args.source), read_lines(args.reference)
    ckpt = read_checkpoint(args.checkpoint, kind="translation")
    src_vocab, tgt_vocab = ckpt.vocabs
    tokenize = resolve_tokenizer(ckpt.cfg.eval.bleu_tokenize, ckpt.cfg.data.tgt_lang)
    model = ckpt.build_model().eval()
    opts = DecodeOptions(beam=5, lenpen=1.0, max_len_a=1.2, max_len_b=10, max_tokens=8000, nbest=1)
    limit = model.positions.size(0) - 1
    fp32 = ctranslate2.Translator(str(args.ct2), device="cpu", compute_type="float32", intra_threads=args.threads)
    report: dict = {"sentences": len(sources), "threads": args.threads}
    report["score_batch_max_abs_diff"] = max_log_prob_diff(model, fp32, src_vocab, tgt_vocab, sources, references)

    tcli = Translator.from_checkpoint(args.checkpoint, "cpu", "fp32")
    t0 = time.perf_counter()
    ours = [h[0][0] for h in tcli.translate(sources, opts)]
    report["tcli_fp32"] = {
        "seconds": time.perf_counter() - t0,
        "tokens": tcli.decoded_tokens,
        "bleu": bleu(ours, references, tokenize)[0],
    }
    runs = [("ct2_fp32", fp32)]
    if args.ct2_int8:
        runs.append(
            (
                "ct2_int8",
                ctranslate2.Translator(
                    str(args.ct2_int8), device="cpu", compute_type="int8", intra_threads=args.threads
                ),
            )
        )
    for name, translator in runs:
        t0 = time.perf_counter()
        theirs, tokens = ct2_translate(translator, src_vocab, tgt_vocab, sources, opts, limit)
        report[name] = {
            "seconds": time.perf_counter() - t0,
            "tokens": tokens,
            "bleu": bleu(theirs, references, tokenize)[0],
            "identical_to_tcli": sum(a == b for a, b in zip(ours, theirs)) / len(sources),
        }
    for key in ("tcli_fp32", "ct2_fp32", "ct2_int8"):
        if key in report:
            report[key]["tokens_per_sec"] = report[key]["tokens"] / report[key]["seconds"]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
