"""Check that the fast beam search translates a corpus exactly as the plain reference search does.

The fast path (`tcli translate`: batches sorted by length, key/value cache, cross-attention keys
projected once per sentence, finished sentences leaving the batch, one top-k over beam x vocabulary)
is compared, in fp32, with `reference_beam_search`: one sentence at a time, the decoder re-run over
each whole prefix, a Python list of hypotheses. Prints how many outputs are identical; exit code 1
if any differs.

    python scripts/verify_beam_search.py --checkpoint runs/m30k/checkpoints/best.pt \
        --input ../shared/data/multi30k/test_2016_flickr.en
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from transformer_cli.core.text import read_lines
from transformer_cli.translation.decode import DecodeOptions, decode_corpus, reference_beam_search
from transformer_cli.translation.translate import Translator
from transformer_cli.vocab.spm import BOS_ID, EOS_ID


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--input", type=Path, required=True)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=None, help="only the first N lines")
    a = p.parse_args()

    translator = Translator.from_checkpoint(a.checkpoint, device="cpu", precision="fp32")
    model = translator.model
    lines = [line for line in read_lines(a.input) if line.strip()][: a.limit]
    sources = translator.src_vocab.encode(lines)
    opts = DecodeOptions(beam=a.beam, lenpen=a.lenpen)

    start = time.perf_counter()
    with torch.inference_mode():
        fast = decode_corpus(model, sources, opts, BOS_ID, EOS_ID, torch.device("cpu"))
    fast_s = time.perf_counter() - start

    start = time.perf_counter()
    differ = []
    for i, ids in enumerate(sources):
        src = torch.tensor([ids[: model.positions.size(0) - 2] + [EOS_ID]])
        plain = reference_beam_search(
            model, src, BOS_ID, EOS_ID, opts.beam, opts.lenpen, opts.max_len_a, opts.max_len_b
        )
        if [h.tokens for h in plain] != [h.tokens for h in fast[i]]:
            differ.append(i)
    plain_s = time.perf_counter() - start

    print(
        f"{len(lines) - len(differ)}/{len(lines)} translations identical (fp32, beam {a.beam}); "
        f"fast path {fast_s:.1f}s, reference {plain_s:.1f}s"
    )
    for i in differ[:10]:
        print(f"line {i + 1} differs: {lines[i]}", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
