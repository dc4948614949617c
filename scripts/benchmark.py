"""Speed of tcli against the reference implementations, measured side by side in one run.

    python scripts/benchmark.py --nmt-checkpoint runs/m30k/checkpoints/best.pt --write BENCHMARKS.md

Runs, in one process tree on this machine: the matmul peak (fp32, bf16); translation training
(`tcli train` on Multi30k, steady-state `tgt_tokens_per_sec` from metrics.jsonl) against
`peer_hf_nmt.py --dtype bf16`; BERT pretraining (`tcli pretrain-bert` on WikiText-2, `tokens_per_sec`)
against `peer_hf_bert.py --dtype bf16`; beam search (`tcli translate --beam 5` on test_2016_flickr,
decoded tokens/s) against `peer_hf_nmt.py --mode decode --batch 64 --new-tokens 20`; model FLOPs
utilisation from FLOPs counted on a real step; resident memory over a long run; data-parallel
throughput with 1 and 2 processes under torchrun. Ours and the peers
alternate (`--rounds`) so that the shared machine's noise hits both; ratios use medians.
With `--write FILE` the table replaces the part of FILE between its benchmark markers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
PEERS = SHARED / "peers"
START, END = "<!-- benchmark:start -->", "<!-- benchmark:end -->"

NMT_SIZE = ["model.d_model=256", "model.enc_layers=3", "model.dec_layers=3", "model.heads=4", "model.ffn_dim=1024",
            "vocab.size=8000", "train.max_tokens=2560"]
BERT_SIZE = ["model.d_model=256", "model.layers=4", "model.heads=4", "model.ffn_dim=1024", "vocab.size=8000",
             "data.max_seq_len=128", "train.batch_size=32"]


def run(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{result.stderr[-3000:]}")
    return result


def overrides(pairs: list[str]) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


def tcli(*args: str) -> list[str]:
    return [sys.executable, "-m", "transformer_cli", *args]


def peer(script: str, *args: str) -> dict:
    out = run([sys.executable, str(PEERS / script), *args]).stdout
    return json.loads(out.strip().splitlines()[-1])


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def steady(run_dir: Path, key: str) -> float:
    """Median of the logged interval throughputs, the first interval (warm-up) left out."""
    values = [e[key] for e in events(run_dir, "train")][1:]
    return statistics.median(values)


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e9


def train_flops_per_token(kind: str) -> float:
    """FLOPs of one fwd+bwd step counted by torch's FlopCounterMode on a benchmark-shaped batch, per token."""
    from torch.utils.flop_counter import FlopCounterMode

    from transformer_cli.models.bert import Bert
    from transformer_cli.models.transformer import Transformer

    if kind == "nmt":
        model = Transformer(8000, 8000, 256, 4, 1024, 3, 3)
        src, tgt = torch.randint(5, 8000, (128, 16)), torch.randint(5, 8000, (128, 17))
        with FlopCounterMode(display=False) as counter:
            model(src, tgt, labels=tgt, label_smoothing=0.1).loss.backward()
        return counter.get_total_flops() / tgt.numel()
    model = Bert(8000, 256, 4, 4, 1024)
    ids = torch.randint(5, 8000, (32, 128))
    labels = torch.full_like(ids, -100)
    labels[:, ::7] = ids[:, ::7]  # 19 of 128 positions, as with 15% masking
    with FlopCounterMode(display=False) as counter:
        model(ids, torch.zeros_like(ids), labels, torch.zeros(32, dtype=torch.long)).mlm_loss.backward()
    return counter.get_total_flops() / ids.numel()


def nmt_train_args(steps: int, log_every: int = 25, eval_every: int = 100000) -> list[str]:
    """`train` arguments of the translation benchmark: Multi30k at the benchmark size, no test split."""
    return ["train", "--config", "configs/multi30k_en_de.yaml", "--quiet",
            "--set", f"data.dir={SHARED / 'data' / 'multi30k'}", "--set", f"train.max_steps={steps}",
            "--set", f"train.log_every={log_every}", "--set", f"train.eval_every={eval_every}",
            "--set", "data.test=null", *overrides(NMT_SIZE)]


def bench_nmt(work: Path, rounds: int, steps: int) -> dict:
    ours, theirs = [], []
    for r in range(rounds):
        out = work / f"nmt{r}"
        run(tcli(*nmt_train_args(steps), "--out", str(out)))
        ours.append(steady(out, "tgt_tokens_per_sec"))
        theirs.append(peer("peer_hf_nmt.py", "--dtype", "bf16")["tgt_tokens_per_sec"])
    return {"ours": statistics.median(ours), "peer": statistics.median(theirs), "ours_all": ours, "peer_all": theirs}


def bench_bert(work: Path, rounds: int, steps: int) -> dict:
    data = SHARED / "data" / "wikitext-2"
    ours, theirs = [], []
    for r in range(rounds):
        out = work / f"bert{r}"
        run(tcli("pretrain-bert", "--config", "configs/bert_wikitext2.yaml", "--out", str(out), "--quiet",
                 "--set", f"data.dir={data}", "--set", f"train.max_steps={steps}", "--set", "train.log_every=25",
                 "--set", "train.eval_every=100000", *overrides(BERT_SIZE)))
        ours.append(steady(out, "tokens_per_sec"))
        theirs.append(peer("peer_hf_bert.py", "--dtype", "bf16")["tokens_per_sec"])
    return {"ours": statistics.median(ours), "peer": statistics.median(theirs), "ours_all": ours, "peer_all": theirs}


def bench_decode(work: Path, checkpoint: Path, rounds: int) -> dict:
    test = SHARED / "data" / "multi30k" / "test_2016_flickr.en"
    ours, theirs, scores = [], [], {}
    for r in range(rounds):
        stats = work / f"decode{r}.json"
        run(tcli("translate", "--checkpoint", str(checkpoint), "--input", str(test), "--beam", "5", "--quiet",
                 "--output", str(work / "hyp.de"), "--reference", str(test.with_suffix(".de")),
                 "--stats-json", str(stats)))
        s = json.loads(stats.read_text())
        ours.append(s["tokens_per_sec"])
        scores = {k: s[k] for k in ("bleu", "bleu_lc", "chrf", "sentences_per_sec", "tokens")}
        theirs.append(peer("peer_hf_nmt.py", "--mode", "decode", "--batch", "64", "--new-tokens", "20",
                           "--dtype", "bf16")["tokens_per_sec"])
    return {"ours": statistics.median(ours), "peer": statistics.median(theirs), "ours_all": ours,
            "peer_all": theirs, **scores}


def bench_memory(work: Path, steps: int) -> dict:
    """Resident memory of a translation run as a user runs it (evaluation and checkpoints every 250
    updates), logged with each train event."""
    out = work / "memory"
    run(tcli(*nmt_train_args(steps, log_every=50, eval_every=250), "--out", str(out)))
    rss = [(e["step"], e["rss_mb"]) for e in events(out, "train")]
    warm = [m for s, m in rss if s >= steps // 2]  # the first half is warm-up: shapes and allocator settle
    return {"after_warmup_mb": warm[0], "end_mb": warm[-1], "max_mb": max(warm), "samples": rss}


def bench_ddp(work: Path, steps: int) -> dict:
    """Translation training under torchrun: 2 processes of 1 thread each against 1 process of 1 thread
    (scaling efficiency = 2-process throughput / twice the 1-process one) and 1 process of all threads.
    The global batch (train.max_tokens) is the same in all three."""
    args = nmt_train_args(steps)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "transformer_cli"]
    setups = {"1 process, 1 thread": (tcli(*args), {"OMP_NUM_THREADS": "1"}),
              "2 processes (torchrun, gloo), 1 thread each": (torchrun + args, {"OMP_NUM_THREADS": "1"}),
              f"1 process, {torch.get_num_threads()} threads": (tcli(*args), {})}
    result = {}
    for name, (cmd, env) in setups.items():
        out = work / f"ddp{len(result)}"
        run(cmd + ["--out", str(out)], env)
        result[name] = steady(out, "tgt_tokens_per_sec")
    one, two = list(result.values())[:2]
    return {"tokens_per_sec": result, "efficiency": two / (2 * one), "steps": steps}


def machine() -> str:
    cpu = platform.processor() or "CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from transformer_cli.train.runtime import cpu_has_bf16_matmul

    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"bf16 matrix instructions: {'yes' if cpu_has_bf16_matmul() else 'no'}")


def table(r: dict) -> str:
    rows = [f"Machine: {r['machine']}. Run: `{r['command']}` ({r['date']}).", "",
            f"Matmul peak (2048², median): fp32 {r['peak_fp32']:.0f} GFLOP/s, "
            f"bf16 {r['peak_bf16']:.0f} GFLOP/s.", "",
            "| what | ours | reference | ratio | target |", "|---|---|---|---|---|"]
    if "nmt" in r:
        n = r["nmt"]
        rows.append(f"| translation training, tgt tokens/s (Multi30k, d 256, 3+3 layers, vocab 8000, ~2,200 "
                    f"tokens/batch) | {n['ours']:,.0f} | {n['peer']:,.0f} (peer_hf_nmt bf16) | "
                    f"{n['ours'] / n['peer']:.2f}× | ≥ 2.0× |")
    if "bert" in r:
        b = r["bert"]
        rows.append(f"| BERT pretraining, tokens/s (WikiText-2, d 256, 4 layers, seq 128, batch 32) | "
                    f"{b['ours']:,.0f} | {b['peer']:,.0f} (peer_hf_bert bf16) | "
                    f"{b['ours'] / b['peer']:.2f}× | ≥ 2.0× |")
    if "decode" in r:
        d = r["decode"]
        rows.append(f"| beam search (beam 5), decoded tokens/s (test_2016_flickr, 1,000 sentences) | "
                    f"{d['ours']:,.0f} | {d['peer']:,.0f} (peer decode, batch 64, 20 tokens) | "
                    f"{d['ours'] / d['peer']:.2f}× | ≥ 3.0× |")
    for kind, label in (("nmt", "translation"), ("bert", "BERT-small")):
        if kind in r:
            f = r[f"{kind}_flops_per_token"]
            achieved = f * r[kind]["ours"] / 1e9
            rows.append(f"| model FLOPs utilisation, {label} training ({f / 1e6:.1f} MFLOP/token counted) | "
                        f"{achieved:.0f} GFLOP/s = {100 * achieved / r['peak_bf16']:.0f}% of bf16 peak, "
                        f"{100 * achieved / r['peak_fp32']:.0f}% of fp32 peak | — | — |"
                        + (" ≥ 40% bf16 |" if kind == "bert" else " report |"))
    if "memory" in r:
        m = r["memory"]
        last = m["samples"][-1][0]
        rows.append(f"| peak RSS of translation training, steps {last // 2:,}–{last:,} (evaluating every 250) | "
                    f"{m['after_warmup_mb']:.0f} MB at step {last // 2:,}, {m['end_mb']:.0f} MB at the end "
                    f"(max {m['max_mb']:.0f}) | — | — | no growth |")
    if "ddp" in r:
        d = r["ddp"]
        rows += ["", f"Data-parallel translation training (Multi30k, same size and global batch, {d['steps']} steps "
                 "each, steady-state tgt tokens/s):", "", "| setup | tgt tokens/s |", "|---|---|"]
        rows += [f"| {name} | {tps:,.0f} |" for name, tps in d["tokens_per_sec"].items()]
        rows += ["", f"Scaling efficiency, 2 processes against 1 (1 thread each): {100 * d['efficiency']:.0f}%."]
    rows.append("")
    rows.append("Raw medians of each round: " + "; ".join(
        f"{k}: ours {[round(x) for x in r[k]['ours_all']]}, peer {[round(x) for x in r[k]['peer_all']]}"
        for k in ("nmt", "bert", "decode") if k in r) + ".")
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="nmt,bert,decode,memory,ddp", help="comma-separated subset")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of ours and the peer")
    p.add_argument("--nmt-steps", type=int, default=200)
    p.add_argument("--bert-steps", type=int, default=150)
    p.add_argument("--memory-steps", type=int, default=2000)
    p.add_argument("--ddp-steps", type=int, default=150)
    p.add_argument("--nmt-checkpoint", type=Path, help="a trained Multi30k model for the decoding benchmark")
    p.add_argument("--write", type=Path, help="replace the benchmark section of this markdown file")
    a = p.parse_args()
    only = set(a.only.split(","))
    result = {"machine": machine(), "command": "python scripts/benchmark.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "peak_fp32": matmul_peak(torch.float32),
              "peak_bf16": matmul_peak(torch.bfloat16)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "nmt" in only:
            result["nmt"] = bench_nmt(work, a.rounds, a.nmt_steps)
            result["nmt_flops_per_token"] = train_flops_per_token("nmt")
        if "bert" in only:
            result["bert"] = bench_bert(work, a.rounds, a.bert_steps)
            result["bert_flops_per_token"] = train_flops_per_token("bert")
        if "decode" in only:
            if a.nmt_checkpoint is None:
                raise SystemExit("--nmt-checkpoint is needed for the decoding benchmark (or drop decode from --only)")
            result["decode"] = bench_decode(work, a.nmt_checkpoint, a.rounds)
        if "memory" in only:
            result["memory"] = bench_memory(work, a.memory_steps)
        if "ddp" in only:
            result["ddp"] = bench_ddp(work, a.ddp_steps)
    text = table(result)
    print(text)
    print(json.dumps(result, indent=1, default=str), file=sys.stderr)
    if a.write:
        doc = a.write.read_text(encoding="utf-8")
        head, rest = doc.split(START, 1)
        _, tail = rest.split(END, 1)
        a.write.write_text(f"{head}{START}\n{text}{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    main()
