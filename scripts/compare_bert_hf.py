"""BERT quality against wall time: tcli pretrain-bert beside transformers' BertForPreTraining.

Same sizes, same data (the instances and dynamic masks of tcli's pipeline, the same sentencepiece
vocabulary), same optimiser (AdamW, warmup then inverse square root decay, clipping), same bf16
autocast, same evaluation cadence and held-out batches, same wall-time budget (evaluation included).

    python scripts/compare_bert_hf.py --data-dir ../shared/data/wikitext-2 --minutes 20 --out bench/bert_hf

Writes <out>/ours/ (a tcli run directory), <out>/hf.jsonl (the HF run's eval events) and prints a
markdown table of MLM accuracy, NSP accuracy and perplexity against wall time for both.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from transformer_cli.core.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["train.schedule=inverse_sqrt", "train.max_steps=1000000", "train.eval_every=500", "train.log_every=100"]


def run_ours(config: Path, data_dir: Path, minutes: float, out: Path) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "transformer_cli",
        "pretrain-bert",
        "--config",
        str(config),
        "--out",
        str(out),
        "--quiet",
        "--set",
        f"data.dir={data_dir}",
        "--set",
        f"train.max_minutes={minutes}",
    ]
    for pair in COMMON:
        cmd += ["--set", pair]
    subprocess.run(cmd, cwd=ROOT, check=True)
    events = read_metrics(out)
    return [e for e in events if e["event"] == "eval"]


def run_hf(config: Path, data_dir: Path, minutes: float, out: Path, vocab_path: Path) -> list[dict]:
    """The same loop as tcli's trainer around transformers.BertForPreTraining."""
    import transformers

    from transformer_cli.bert.task import BertTask
    from transformer_cli.config import BertRunConfig, load_config
    from transformer_cli.data.shards import read_manifest
    from transformer_cli.export.hf import hf_config
    from transformer_cli.train.optim import lr_factor
    from transformer_cli.vocab.spm import Vocab

    cfg = load_config(BertRunConfig, config, [f"data.dir={data_dir}", *COMMON])
    vocab = Vocab.load(vocab_path)  # the very vocabulary of our run
    data = read_manifest(vocab_path.parents[1] / "data", "bert")  # and the token arrays it tokenised
    t = cfg.train
    torch.manual_seed(t.seed)
    random.seed(t.seed)
    hf_cfg = transformers.BertConfig(**hf_config(cfg.model, len(vocab)), attn_implementation="sdpa")
    model = transformers.BertForPreTraining(hf_cfg).train()
    task = BertTask(cfg, vocab, data, model, data_fingerprint="")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=t.lr, betas=t.adam_betas, eps=t.adam_eps, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s + 1, t.schedule, t.warmup_steps, None))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    start, step, epoch, evals = time.perf_counter(), 0, 0, []
    while True:
        for spec in task.epoch_batches(epoch):
            b = task.make_batch(spec, epoch)
            with autocast:
                loss = model(
                    input_ids=b.input_ids,
                    token_type_ids=b.segment_ids,
                    attention_mask=b.input_ids.ne(0).long(),
                    labels=b.mlm_labels,
                    next_sentence_label=b.nsp_labels,
                ).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            step += 1
            out_of_time = time.perf_counter() - start >= 60 * minutes
            if step % t.eval_every == 0 or out_of_time:
                evals.append(
                    {
                        "event": "eval",
                        "step": step,
                        **evaluate_hf(model, task, autocast),
                        "wall_s": round(time.perf_counter() - start, 1),
                    }
                )
                print(json.dumps(evals[-1]), flush=True)
            if out_of_time:
                (out / "hf.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
                return evals
        epoch += 1


@torch.inference_mode()
def evaluate_hf(model, task, autocast) -> dict:
    """BertTask.evaluate's numbers (same held-out batches and masks) from the HF model's logits."""
    from transformer_cli.bert.validation import held_out_batches
    from transformer_cli.data.bert import IGNORE

    model.eval()
    cfg = task.cfg
    sums = {"loss": 0.0, "mlm_ok": 0, "mlm": 0, "nsp_ok": 0, "nsp": 0}
    d = cfg.data
    for b in held_out_batches(
        task.valid, task.ids, cfg.train.seed, cfg.train.batch_size, d.mask_prob, d.max_predictions
    ):
        with autocast:
            out = model(input_ids=b.input_ids, token_type_ids=b.segment_ids, attention_mask=b.input_ids.ne(0).long())
        keep = b.mlm_labels.ne(IGNORE)
        logits = out.prediction_logits[keep].float()
        sums["loss"] += float(torch.nn.functional.cross_entropy(logits, b.mlm_labels[keep], reduction="sum"))
        sums["mlm_ok"] += int((logits.argmax(-1) == b.mlm_labels[keep]).sum())
        sums["mlm"] += int(keep.sum())
        sums["nsp_ok"] += int((out.seq_relationship_logits.argmax(-1) == b.nsp_labels).sum())
        sums["nsp"] += b.nsp_labels.numel()
    model.train()
    mlm_loss = sums["loss"] / sums["mlm"]
    return {
        "mlm_loss": mlm_loss,
        "mlm_acc": sums["mlm_ok"] / sums["mlm"],
        "nsp_acc": sums["nsp_ok"] / sums["nsp"],
        "ppl": math.exp(mlm_loss),
    }


def table(ours: list[dict], hf: list[dict]) -> str:
    rows = ["| system | step | wall time | MLM acc | NSP acc | perplexity |", "|---|---|---|---|---|---|"]
    for name, evals in (("tcli", ours), ("HF BertForPreTraining", hf)):
        for e in evals:
            rows.append(
                f"| {name} | {e['step']:,} | {e['wall_s'] / 60:.1f} min | {e['mlm_acc']:.3f} | "
                f"{e['nsp_acc']:.3f} | {e['ppl']:.1f} |"
            )
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "bert_wikitext2.yaml")
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "wikitext-2")
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bert_hf_compare")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    ours = run_ours(a.config, a.data_dir.resolve(), a.minutes, a.out / "ours")
    hf = run_hf(a.config, a.data_dir.resolve(), a.minutes, a.out, a.out / "ours" / "vocab" / "bert.model")
    text = table(ours, hf)
    (a.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
