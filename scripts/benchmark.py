"""Speed of tcli against the reference implementations, measured side by side in one run.

    python scripts/benchmark.py --nmt-checkpoint runs/m30k/checkpoints/best.pt --write docs/benchmarks

Runs, in one process tree on this machine: the matmul peak (fp32, bf16); translation training
(`tcli train` on Multi30k, steady-state `tgt_tokens_per_sec` from metrics.jsonl) against
`peer_hf_nmt.py`; BERT pretraining (`tcli pretrain-bert` on WikiText-2, `tokens_per_sec`) against
`peer_hf_bert.py`; beam search (`tcli translate --beam 5` on test_2016_flickr, decoded tokens/s) against
`peer_hf_nmt.py --mode decode --batch 64 --new-tokens 20` at the checkpoint's dimensions; model FLOPs
utilisation from FLOPs counted on a real step; resident memory over a long run; data-parallel
throughput with 1 and 2 processes under torchrun. Ours and the peers alternate (`--rounds`) so that the
shared machine's noise hits both; ratios use medians. Both sides run in the precision tcli's `auto` picks
on this machine (bf16 where the CPU multiplies bf16 natively, else fp32), and the run names the CPU and
its matrix instruction sets (from /proc/cpuinfo), so that every kind of machine gets its own row.

With `--write DIR` (the benchmarks pages, docs/benchmarks) this machine's row of the "by machine" table and its
own section are replaced, each in the page under DIR that holds its markers (the table in DIR/index.md, the
section between `<!-- benchmark:start KEY -->` and `<!-- benchmark:end KEY -->`, KEY naming the CPU, in
DIR/machines/<slug>.md); other machines' stay as they are. A CPU seen for the first time gets a new page,
DIR/machines/<slug>.md (its key as heading, and the markers), and an entry in the nav of DIR/../../mkdocs.yml, on
the line after its comment `# benchmark machine pages (scripts/benchmark.py adds new ones here)`. `--only data`
replaces the page that holds the `benchmark-data` markers. `--write FILE` does the same within one Markdown file,
a new machine's section going after the last machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from transformer_cli.core.metrics_log import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))  # as when run as a script: its peers import by name
from gpu_measure import mfu  # noqa: E402  (one MFU definition)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
PEERS = SHARED / "peers"
MACHINES_START, MACHINES_END = "<!-- benchmark-machines:start -->", "<!-- benchmark-machines:end -->"
# The per-machine section's markers: "<!-- benchmark:start KEY -->" ... "<!-- benchmark:end KEY -->".
START, END = "<!-- benchmark:start {} -->", "<!-- benchmark:end {} -->"
# The /proc/cpuinfo flags that decide how fast these models train: vector width, int8 dot products, bf16.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")

NMT_SIZE = [
    "model.d_model=256",
    "model.enc_layers=3",
    "model.dec_layers=3",
    "model.heads=4",
    "model.ffn_dim=1024",
    "vocab.size=8000",
    "train.max_tokens=2560",
]
BERT_SIZE = [
    "model.d_model=256",
    "model.layers=4",
    "model.heads=4",
    "model.ffn_dim=1024",
    "vocab.size=8000",
    "data.max_seq_len=128",
    "train.batch_size=32",
]


def run(cmd: list[str], env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})
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
    return read_metrics(run_dir, kind)


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
    """Model FLOPs of one fwd+bwd step per token at the benchmark's sizes (NMT_SIZE, BERT_SIZE): the formulas of
    transformer_cli.models.params, the one definition the GPU check uses too, on a batch of the benchmark's shape
    (translation: 16 source and 17 target tokens a sentence; BERT: 128 tokens, 19 masked, as with 15%)."""
    from transformer_cli.models.params import bert_train_flops, translation_train_flops
    from transformer_cli.tools.count_params import preset_config

    if kind == "nmt":
        src_len, tgt_len = 16, 17
        cfg = preset_config("transformer-base", NMT_SIZE)
        flops = translation_train_flops(cfg.model, cfg.vocab.size, src_len, tgt_len, src_len, tgt_len)
        return flops["total"] / tgt_len
    seq_len, masked = 128, 19
    cfg = preset_config("bert-base", BERT_SIZE)
    return bert_train_flops(cfg.model, cfg.vocab.size, seq_len, seq_len, masked, 1)["total"] / seq_len


def nmt_train_args(steps: int, log_every: int = 25, eval_every: int = 100000, size: list[str] = NMT_SIZE) -> list[str]:
    """`train` arguments of the translation benchmark: Multi30k at the benchmark size (or `size`), no test split."""
    return [
        "train",
        "--config",
        "configs/multi30k_en_de.yaml",
        "--quiet",
        "--set",
        f"data.dir={SHARED / 'data' / 'multi30k'}",
        "--set",
        f"train.max_steps={steps}",
        "--set",
        f"train.log_every={log_every}",
        "--set",
        f"train.eval_every={eval_every}",
        "--set",
        "data.test=null",
        *overrides(size),
    ]


def bench_nmt(work: Path, rounds: int, steps: int, dtype: str) -> dict:
    ours, theirs = [], []
    for r in range(rounds):
        out = work / f"nmt{r}"
        run(tcli(*nmt_train_args(steps), "--out", str(out)))
        ours.append(steady(out, "tgt_tokens_per_sec"))
        theirs.append(peer("peer_hf_nmt.py", "--dtype", dtype)["tgt_tokens_per_sec"])
    return {"ours": statistics.median(ours), "peer": statistics.median(theirs), "ours_all": ours, "peer_all": theirs}


def bench_bert(work: Path, rounds: int, steps: int, dtype: str) -> dict:
    data = SHARED / "data" / "wikitext-2"
    ours, theirs = [], []
    for r in range(rounds):
        out = work / f"bert{r}"
        run(
            tcli(
                "pretrain-bert",
                "--config",
                "configs/bert_wikitext2.yaml",
                "--out",
                str(out),
                "--quiet",
                "--set",
                f"data.dir={data}",
                "--set",
                f"train.max_steps={steps}",
                "--set",
                "train.log_every=25",
                "--set",
                "train.eval_every=100000",
                *overrides(BERT_SIZE),
            )
        )
        ours.append(steady(out, "tokens_per_sec"))
        theirs.append(peer("peer_hf_bert.py", "--dtype", dtype)["tokens_per_sec"])
    return {"ours": statistics.median(ours), "peer": statistics.median(theirs), "ours_all": ours, "peer_all": theirs}


def checkpoint_size(checkpoint: Path) -> dict:
    """The model dimensions of a translation checkpoint, as the peer's arguments name them."""
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    m, vocab = ckpt["config"]["model"], ckpt["model"]["out_proj.weight"].size(0)  # the pieces the model has
    if m["enc_layers"] != m["dec_layers"]:
        raise SystemExit(
            f"{checkpoint}: the peer has one layer count for encoder and decoder; this model has "
            f"{m['enc_layers']}+{m['dec_layers']}"
        )
    return {"d": m["d_model"], "layers": m["enc_layers"], "heads": m["heads"], "ffn": m["ffn_dim"], "vocab": vocab}


def bench_decode(work: Path, checkpoint: Path, rounds: int, dtype: str) -> dict:
    test = SHARED / "data" / "multi30k" / "test_2016_flickr.en"
    size = checkpoint_size(checkpoint)
    dims = [arg for key, value in size.items() for arg in (f"--{key}", str(value))]
    ours, theirs, scores = [], [], {}
    for r in range(rounds):
        stats = work / f"decode{r}.json"
        run(
            tcli(
                "translate",
                "--checkpoint",
                str(checkpoint),
                "--input",
                str(test),
                "--beam",
                "5",
                "--quiet",
                "--output",
                str(work / "hyp.de"),
                "--reference",
                str(test.with_suffix(".de")),
                "--stats-json",
                str(stats),
            )
        )
        s = json.loads(stats.read_text())
        ours.append(s["tokens_per_sec"])
        scores = {k: s[k] for k in ("bleu", "bleu_lc", "chrf", "sentences_per_sec", "tokens")}
        theirs.append(
            peer("peer_hf_nmt.py", "--mode", "decode", "--batch", "64", "--new-tokens", "20", "--dtype", dtype, *dims)[
                "tokens_per_sec"
            ]
        )
    return {
        "ours": statistics.median(ours),
        "peer": statistics.median(theirs),
        "ours_all": ours,
        "peer_all": theirs,
        "size": size,
        **scores,
    }


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
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "transformer_cli",
    ]
    setups = {
        "1 process, 1 thread": (tcli(*args), {"OMP_NUM_THREADS": "1"}),
        "2 processes (torchrun, gloo), 1 thread each": (torchrun + args, {"OMP_NUM_THREADS": "1"}),
        f"1 process, {torch.get_num_threads()} threads": (tcli(*args), {}),
    }
    result = {}
    for name, (cmd, env) in setups.items():
        out = work / f"ddp{len(result)}"
        run(cmd + ["--out", str(out)], env)
        result[name] = steady(out, "tgt_tokens_per_sec")
    one, two = list(result.values())[:2]
    return {"tokens_per_sec": result, "efficiency": two / (2 * one), "steps": steps}


def machine() -> dict:
    """The CPU's model name, its matrix instruction sets (ISA_FLAGS present in /proc/cpuinfo), and what tcli
    picks on it. `key` names the machine in the benchmarks pages: one row and one section per key."""
    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model is None:  # every core repeats it: the first is enough
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    cpu = model or platform.processor() or "CPU"
    from transformer_cli.runtime.device import resolve_precision

    isa = [flag for flag in ISA_FLAGS if flag in flags]
    return {
        "cpu": cpu,
        "isa": isa,
        "key": f"{cpu} [{' '.join(isa) or 'no listed ISA flags'}]",
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "precision": resolve_precision("auto", torch.device("cpu")),
    }


def describe(m: dict) -> str:
    """The machine as the tables' first line names it."""
    return (
        f"{m['cpu']}, {m['cores']} cores, ISA flags: {' '.join(m['isa']) or 'none of ' + ' '.join(ISA_FLAGS)}; "
        f"torch {m['torch']}, {m['threads']} threads"
    )


def utilisation(r: dict, kind: str) -> tuple[float, float]:
    """(achieved GFLOP/s, fraction of the matmul peak in the precision this machine trains in)."""
    flops_per_s = r[f"{kind}_flops_per_token"] * r[kind]["ours"]
    return flops_per_s / 1e9, mfu(flops_per_s, 1.0, r[f"peak_{r['machine']['precision']}"] / 1e3)


def kernel_shapes_line(r: dict) -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    from kernel_shapes import line

    return line(r)


def table(r: dict) -> str:
    m, dtype = r["machine"], r["machine"]["precision"]
    rows = [
        f"Machine: {describe(m)}; `precision: auto` = {dtype}, and the peers run in {dtype}. "
        f"Run: `{r['command']}` ({r['date']}).",
        "",
        f"Matmul peak (2048², median): fp32 {r['peak_fp32']:.0f} GFLOP/s, "
        + (f"bf16 {r['peak_bf16']:.0f} GFLOP/s." if r["peak_bf16"] else "bf16 not measured (no native bf16)."),
        "",
        "| what | ours | reference | ratio | target |",
        "|---|---|---|---|---|",
    ]
    if "nmt" in r:
        n = r["nmt"]
        rows.append(
            f"| translation training, tgt tokens/s (Multi30k, d 256, 3+3 layers, vocab 8000, ~2,200 "
            f"tokens/batch) | {n['ours']:,.0f} | {n['peer']:,.0f} (peer_hf_nmt {dtype}) | "
            f"{n['ours'] / n['peer']:.2f}× | ≥ 2.0× |"
        )
    if "bert" in r:
        b = r["bert"]
        rows.append(
            f"| BERT pretraining, tokens/s (WikiText-2, d 256, 4 layers, seq 128, batch 32) | "
            f"{b['ours']:,.0f} | {b['peer']:,.0f} (peer_hf_bert {dtype}) | "
            f"{b['ours'] / b['peer']:.2f}× | ≥ 2.0× |"
        )
    if "decode" in r:
        d, z = r["decode"], r["decode"]["size"]
        rows.append(
            f"| beam search (beam 5), decoded tokens/s (test_2016_flickr, 1,000 sentences; d {z['d']}, "
            f"{z['layers']}+{z['layers']} layers, vocab {z['vocab']}, BLEU {d['bleu']:.2f}) | "
            f"{d['ours']:,.0f} | {d['peer']:,.0f} (peer decode {dtype}, same size, batch 64, 20 tokens) | "
            f"{d['ours'] / d['peer']:.2f}× | ≥ 3.0× |"
        )
    for kind, label in (("nmt", "translation"), ("bert", "BERT-small")):
        if kind in r:
            achieved, share = utilisation(r, kind)
            rows.append(
                f"| model FLOPs utilisation, {label} training ({r[f'{kind}_flops_per_token'] / 1e6:.1f} "
                f"MFLOP/token counted) | {achieved:.0f} GFLOP/s = {100 * share:.0f}% of the {dtype} peak | "
                f"— | — |" + (" ≥ 40% bf16 |" if kind == "bert" else " report |")
            )
    if "memory" in r:
        m = r["memory"]
        last = m["samples"][-1][0]
        rows.append(
            f"| peak RSS of translation training, steps {last // 2:,}–{last:,} (evaluating every 250) | "
            f"{m['after_warmup_mb']:.0f} MB at step {last // 2:,}, {m['end_mb']:.0f} MB at the end "
            f"(max {m['max_mb']:.0f}) | — | — | no growth |"
        )
    if "shapes" in r:
        rows.append(
            f"| new GEMM shapes after warm-up (projection + attention; of the warm-up's; oneDNN kernels created, "
            f"and created twice over warm-up and window), "
            f"translation / BERT / beam search / fine-tuning, {r['shapes']['precision']} "
            f"(`python scripts/kernel_shapes.py`) | "
            f"{kernel_shapes_line(r['shapes'])} | — | — | 0 |"
        )
    if "ddp" in r:
        d = r["ddp"]
        rows += [
            "",
            f"Data-parallel translation training (Multi30k, same size and global batch, {d['steps']} steps "
            "each, steady-state tgt tokens/s):",
            "",
            "| setup | tgt tokens/s |",
            "|---|---|",
        ]
        rows += [f"| {name} | {tps:,.0f} |" for name, tps in d["tokens_per_sec"].items()]
        rows += ["", f"Scaling efficiency, 2 processes against 1 (1 thread each): {100 * d['efficiency']:.0f}%."]
    rows.append("")
    rows.append(
        "Raw medians of each round: "
        + "; ".join(
            f"{k}: ours {[round(x) for x in r[k]['ours_all']]}, peer {[round(x) for x in r[k]['peer_all']]}"
            for k in ("nmt", "bert", "decode")
            if k in r
        )
        + "."
    )
    return "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------- data at scale (--only data)

DATA_START, DATA_END = "<!-- benchmark-data:start -->", "<!-- benchmark-data:end -->"
MULTI30K, WIKITEXT2 = SHARED / "data" / "multi30k", SHARED / "data" / "wikitext-2"
# A first update needs no evaluation, test split or BLEU: they would dominate the short runs below.
NMT_DATA = ["data.test=null", "train.eval_every=100000", "eval.bleu=false", "train.save_every=100000"]
BERT_DATA = ["train.eval_every=100000", "train.save_every=100000"]
# The data section's runs measure the data path: a small model keeps the steps short on a slow CPU and the data
# path a larger share of time and memory than at the benchmark size (a stricter test); same vocabulary (8,000).
DATA_NMT_SIZE = [
    "model.d_model=64",
    "model.enc_layers=1",
    "model.dec_layers=1",
    "model.heads=2",
    "model.ffn_dim=128",
    "vocab.size=8000",
    "train.max_tokens=1024",
]
DATA_BERT_SIZE = [
    "model.d_model=64",
    "model.layers=1",
    "model.heads=2",
    "model.ffn_dim=128",
    "vocab.size=8000",
    "data.max_seq_len=128",
    "train.batch_size=8",
]
BARE_SPM = """import os, sys, sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
n = 0
for path in sys.argv[2:]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i in range(0, len(lines), 100_000):  # blocks keep the id lists' memory bounded; the speed is the same
        n += len(sp.encode(lines[i : i + 100_000], num_threads=len(os.sched_getaffinity(0))))  # as tcli's
print(n)
"""


def replicate(sources: list[Path], dest: Path, times: int) -> None:
    """`dest` = the concatenation of `sources`, `times` over (kept when it already has the right size)."""
    data = b"".join(s.read_bytes().rstrip(b"\n") + b"\n" for s in sources)
    if dest.is_file() and dest.stat().st_size == len(data) * times:
        return
    with open(dest, "wb") as f:
        for _ in range(times):
            f.write(data)


def build_corpora(root: Path, scales: list[int], wiki_scale: int) -> dict[str, Path]:
    """Multi30k's train split replicated `scale` times (val and test as they are) and WikiText-2's
    test + valid replicated `wiki_scale` times as train.txt (valid.txt held out), under `root`."""
    out = {}
    for scale in scales:
        folder = out[f"m30k_x{scale}"] = root / f"m30k_x{scale}"
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("train.en", "train.de", "val.en", "val.de", "test_2016_flickr.en", "test_2016_flickr.de"):
            replicate([MULTI30K / name], folder / name, scale if name.startswith("train") else 1)
    folder = out[f"wiki_x{wiki_scale}"] = root / f"wiki_x{wiki_scale}"
    folder.mkdir(parents=True, exist_ok=True)
    replicate([WIKITEXT2 / "test.txt", WIKITEXT2 / "valid.txt"], folder / "train.txt", wiki_scale)
    replicate([WIKITEXT2 / "valid.txt"], folder / "valid.txt", 1)
    return out


def children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, out, todo = children_of(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += tree.get(p, [])
    return out


def rollup(pid: int) -> dict[str, float]:
    """/proc/PID/smaps_rollup in MB (Rss, Pss, Shared_Clean, Private_Dirty, ...); {} once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    fields = (line.split() for line in text.splitlines()[1:])
    return {f[0].rstrip(":"): int(f[1]) / 1024 for f in fields if len(f) == 3 and f[2] == "kB"}


class TreeMemory(threading.Thread):
    """Peak of the summed Rss and Pss of a process and all its descendants (tokenising workers included),
    sampled every `every` seconds: /usr/bin/time's %M is the largest single process, not the tree."""

    def __init__(self, pid: int, every: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.every, self.rss, self.pss, self.done = pid, every, 0.0, 0.0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            stats = [rollup(p) for p in descendants(self.pid)]
            self.rss = max(self.rss, sum(s.get("Rss", 0) for s in stats))
            self.pss = max(self.pss, sum(s.get("Pss", 0) for s in stats))

    def stop(self) -> None:
        self.done.set()
        self.join()


def timed(cmd: list[str], cwd: Path = ROOT, env: dict | None = None) -> dict:
    """Run `cmd` under /usr/bin/time -f "%e %M": wall seconds, peak RSS of the largest process (MB), the
    process tree's peak summed Rss/Pss (MB) and the 1-minute load average when it started."""
    with tempfile.NamedTemporaryFile("r") as report:
        load = os.getloadavg()[0]
        proc = subprocess.Popen(
            ["/usr/bin/time", "-f", "%e %M", "-o", report.name, *cmd],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        tree = TreeMemory(proc.pid)
        tree.start()
        _, err = proc.communicate()
        tree.stop()
        if proc.returncode != 0:
            raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-3000:]}")
        wall, peak_kb = report.read().split()[-2:]
    return {
        "wall_s": float(wall),
        "peak_mb": int(peak_kb) / 1024,
        "tree_rss_mb": tree.rss,
        "tree_pss_mb": tree.pss,
        "load": load,
    }


def nmt_preprocess(corpus: Path, out: Path, vocab: Path | None = None) -> list[str]:
    return tcli(
        "preprocess",
        "--config",
        "configs/multi30k_en_de.yaml",
        "--out",
        str(out),
        "--quiet",
        "--set",
        f"data.dir={corpus}",
        *overrides(DATA_NMT_SIZE + ["data.test=null"]),
        *overrides([f"vocab.model={vocab}"] if vocab else []),
    )


def nmt_train(folder: Path, out: Path, steps: int, vocab: Path | None = None, log_every: int = 25) -> list[str]:
    return tcli(
        "train",
        "--config",
        "configs/multi30k_en_de.yaml",
        "--out",
        str(out),
        "--quiet",
        *overrides(
            [
                f"data.preprocessed={folder}",
                f"train.max_steps={steps}",
                f"train.log_every={log_every}",
                *DATA_NMT_SIZE,
                *NMT_DATA,
                *([f"vocab.model={vocab}"] if vocab else []),
            ]
        ),
    )


def bert_preprocess(corpus: Path, train: str, out: Path, vocab: Path | None = None) -> list[str]:
    return tcli(
        "preprocess",
        "--config",
        "configs/bert_wikitext2.yaml",
        "--out",
        str(out),
        "--quiet",
        *overrides(
            [f"data.dir={corpus}", f"data.train={train}", *DATA_BERT_SIZE, *([f"vocab.model={vocab}"] if vocab else [])]
        ),
    )


def bert_train(
    folder: Path, train: str, out: Path, steps: int, vocab: Path | None = None, log_every: int = 25
) -> list[str]:
    return tcli(
        "pretrain-bert",
        "--config",
        "configs/bert_wikitext2.yaml",
        "--out",
        str(out),
        "--quiet",
        *overrides(
            [
                f"data.preprocessed={folder}",
                f"data.train={train}",
                f"train.max_steps={steps}",
                f"train.log_every={log_every}",
                *DATA_BERT_SIZE,
                *BERT_DATA,
                *([f"vocab.model={vocab}"] if vocab else []),
            ]
        ),
    )


def first_update(cmd: list[str], run_dir: Path, limit_s: float = 600) -> dict:
    """Seconds from starting `cmd` (a training run logging every step) to its first "train" event in
    metrics.jsonl, i.e. to the end of its first update; the run is then stopped with SIGTERM."""
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics, seconds = run_dir / "metrics.jsonl", None
    while seconds is None and proc.poll() is None and time.perf_counter() - start < limit_s:
        if metrics.is_file() and '"event": "train"' in metrics.read_text():
            seconds = time.perf_counter() - start
        else:
            time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate()
    if seconds is None:
        raise SystemExit(f"no update within {limit_s} s: {' '.join(cmd)}\n{err[-3000:]}")
    return {"seconds": seconds, "load": load}


def mappings(pid: int, suffix: str) -> dict[str, float]:
    """Summed smaps fields (MB) of the process's mappings of files whose name ends with `suffix`."""
    total: dict[str, float] = {}
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return total
    inside = False
    for line in text.splitlines():
        f = line.split()
        if f and "-" in f[0] and len(f) >= 5:  # a mapping's header line: address perms offset dev inode [path]
            inside = len(f) >= 6 and f[-1].endswith(suffix)
        elif inside and len(f) == 3 and f[2] == "kB":
            total[f[0].rstrip(":")] = total.get(f[0].rstrip(":"), 0.0) + int(f[1]) / 1024
    return total


def ranks_memory(launcher: subprocess.Popen, run_dir: Path, limit_s: float = 900) -> list[list[dict]]:
    """While a torchrun job trains (after its first "train" event, until it ends), every second: each rank's
    smaps_rollup and its mappings of the corpus' .bin files. The ranks are the launcher's descendants
    running transformer_cli."""
    samples, start, metrics = [], time.perf_counter(), run_dir / "metrics.jsonl"
    while launcher.poll() is None and time.perf_counter() - start < limit_s:
        time.sleep(1.0)
        if not (metrics.is_file() and '"event": "train"' in metrics.read_text()):
            continue
        ranks = [p for p in descendants(launcher.pid)[1:] if b"transformer_cli" in _cmdline(p)]
        sample = [{"pid": p, **rollup(p), "bin": mappings(p, ".bin")} for p in sorted(ranks)]
        if len(sample) == 2 and all("Rss" in s for s in sample):
            samples.append(sample)
    return samples


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def bench_ranks(out: Path, folder: Path, steps: int, vocab: Path | None) -> dict:
    """Two ranks under torchrun (OMP_NUM_THREADS=1) on a preprocessed corpus: memory per rank while training,
    at the sample where the ranks' private memory summed is largest."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        *nmt_train(folder, out, steps, vocab, log_every=10)[1:],
    ]

    load = os.getloadavg()[0]
    launcher = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    samples = ranks_memory(launcher, out)
    _, err = launcher.communicate()
    if launcher.returncode != 0 or not samples:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-3000:]}")
    private = lambda s: s.get("Private_Clean", 0) + s.get("Private_Dirty", 0)  # noqa: E731
    worst = max(samples, key=lambda sample: sum(map(private, sample)))
    bins = {p.name: p.stat().st_size / 2**20 for p in sorted(folder.glob("train.*.bin"))}
    return {"ranks": worst, "samples": len(samples), "bin_mb": bins, "steps": steps, "load": load, "command": cmd}


def train_peak(cmd: list[str], run_dir: Path) -> dict:
    """A training run under /usr/bin/time, with the largest rss_mb its metrics logged."""
    result = timed(cmd)
    logged = [e["rss_mb"] for e in events(run_dir, "train")]
    return {**result, "command": cmd, "rss_logged": max(logged, default=None)}


def preprocess_rounds(work: Path, corpus: Path, vocab: Path, rounds: int) -> dict:
    """`tcli preprocess` with the vocabulary given against bare sentencepiece on the same lines (train and
    val, both sides), alternating ABBA; the last round's folder is kept in work/p_small."""
    (work / "bare_spm.py").write_text(BARE_SPM)
    bare = [
        sys.executable,
        str(work / "bare_spm.py"),
        str(vocab),
        *[str(corpus / f"{s}.{lang}") for s in ("train", "val") for lang in ("en", "de")],
    ]
    ours, theirs = [], []
    for r in range(rounds):
        folder = work / ("p_small" if r == rounds - 1 else f"p_small{r}")
        for side in ("ours", "bare") if r % 2 == 0 else ("bare", "ours"):
            if side == "ours":
                ours.append(timed(nmt_preprocess(corpus, folder, vocab)))
            else:
                theirs.append(timed(bare))
        if folder.name != "p_small":
            shutil.rmtree(folder)
    med = lambda xs: statistics.median(x["wall_s"] for x in xs)  # noqa: E731
    return {
        "ours": ours,
        "bare": theirs,
        "ours_s": med(ours),
        "bare_s": med(theirs),
        "ratio": med(ours) / med(theirs),
        "command": nmt_preprocess(corpus, work / "p_small", vocab),
        "bare_command": bare,
    }


def bench_data_nmt(work: Path, corpora: dict[str, Path], small: str, large: str, a: argparse.Namespace) -> dict:
    r: dict = {}
    for name in (small, large):  # vocabulary trained from the corpus: the whole of tcli preprocess
        r[f"vocab_{name}"] = {
            **timed(nmt_preprocess(corpora[name], work / f"pv_{name}")),
            "command": nmt_preprocess(corpora[name], work / f"pv_{name}"),
        }
    vocab = work / f"pv_{small}" / "vocab" / "joint.model"
    r["rounds"] = preprocess_rounds(work, corpora[small], vocab, a.data_rounds)
    r["plain"] = {
        **timed(nmt_preprocess(MULTI30K, work / "p_plain", vocab)),
        "command": nmt_preprocess(MULTI30K, work / "p_plain", vocab),
    }
    cmd = nmt_train(work / "p_small", work / "first_nmt", a.data_steps, vocab, log_every=1)
    r["first"] = {**first_update(cmd, work / "first_nmt"), "command": cmd}
    runs = {"plain": (work / "p_plain", vocab), small: (work / "p_small", vocab), large: (work / f"pv_{large}", None)}
    for name, (folder, v) in runs.items():
        out = work / f"steps_{name}"
        r[f"steps_{name}"] = train_peak(nmt_train(folder, out, a.data_steps, v), out)
    r["ddp"] = {
        name: bench_ranks(work / f"ddp_{name}", folder, a.data_ddp_steps, v)
        for name, (folder, v) in (("plain", runs["plain"]), (large, runs[large]))
    }
    r["bin_mb"] = {
        name: sum(p.stat().st_size for p in (work / folder).glob("train.*.bin")) / 2**20
        for name, folder in (("plain", "p_plain"), (small, "p_small"), (large, f"pv_{large}"))
    }
    return r


def bench_data_bert(work: Path, corpus: Path, a: argparse.Namespace) -> dict:
    r: dict = {
        "vocab": {
            **timed(bert_preprocess(corpus, "train.txt", work / "pb_large")),
            "command": bert_preprocess(corpus, "train.txt", work / "pb_large"),
        }
    }
    vocab = work / "pb_large" / "vocab" / "bert.model"
    r["plain"] = {
        **timed(bert_preprocess(WIKITEXT2, "test.txt", work / "pb_plain", vocab)),
        "command": bert_preprocess(WIKITEXT2, "test.txt", work / "pb_plain", vocab),
    }
    cmd = bert_train(work / "pb_large", "train.txt", work / "first_bert", a.data_steps, log_every=1)
    r["first"] = {**first_update(cmd, work / "first_bert"), "command": cmd}
    for name, (folder, train, v) in {
        "plain": (work / "pb_plain", "test.txt", vocab),
        "large": (work / "pb_large", "train.txt", None),
    }.items():
        out = work / f"bsteps_{name}"
        r[f"steps_{name}"] = train_peak(bert_train(folder, train, out, a.data_steps, v), out)
    r["words"] = len((corpus / "train.txt").read_bytes().split())
    r["bin_mb"] = {
        name: (work / folder / "train.text.bin").stat().st_size / 2**20
        for name, folder in (("plain", "pb_plain"), ("large", "pb_large"))
    }
    return r


QUICKSTART = tcli("train", "--config", "configs/quickstart.yaml", "--quiet")


def bench_regression(work: Path, commit: str, rounds: int, steps: int) -> dict:
    """Translation training tgt tokens/s (nmt_train_args at the data section's size, Multi30k text as a user
    runs it) at `commit`,
    checked out in a temporary worktree, against this tree; alternating, medians."""
    old = work / "old_tree"
    run(["git", "worktree", "add", "--detach", str(old), commit])
    try:
        where = run(
            [sys.executable, "-c", "import transformer_cli; print(transformer_cli.__file__)"],
            env={"PYTHONPATH": str(old)},
            cwd=old,
        ).stdout.strip()
        if not where.startswith(str(old)):
            raise SystemExit(f"the old tree's transformer_cli did not load (got {where})")
        tps: dict[str, list[float]] = {"old": [], "new": []}
        quick: dict[str, list[float]] = {"old": [], "new": []}  # `tcli train --config configs/quickstart.yaml`
        for r in range(rounds):
            for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                out = work / f"reg_{side}{r}"
                tree, env = (old, {"PYTHONPATH": str(old)}) if side == "old" else (ROOT, None)
                run(
                    tcli(*nmt_train_args(steps, log_every=10, size=DATA_NMT_SIZE), "--out", str(out)),
                    env=env,
                    cwd=tree,
                )
                tps[side].append(steady(out, "tgt_tokens_per_sec"))
                quick[side].append(
                    timed(QUICKSTART + ["--out", str(work / f"quick_{side}{r}")], cwd=tree, env=env)["wall_s"]
                )
    finally:
        run(["git", "worktree", "remove", "--force", str(old)])
    return {
        "commit": commit,
        "old": tps["old"],
        "new": tps["new"],
        "steps": steps,
        "ratio": statistics.median(tps["new"]) / statistics.median(tps["old"]),
        "command": tcli(*nmt_train_args(steps, log_every=10, size=DATA_NMT_SIZE), "--out", "RUN"),
        "quick_old": quick["old"],
        "quick_new": quick["new"],
        "quick_ratio": statistics.median(quick["new"]) / statistics.median(quick["old"]),
        "quick_command": QUICKSTART + ["--out", "RUN"],
    }


def bench_data(work: Path, a: argparse.Namespace) -> dict:
    small, large = (f"m30k_x{s}" for s in a.data_scales)
    root = a.data_root or work / "corpora"
    corpora = build_corpora(root, list(a.data_scales), a.wiki_scale)
    r = {
        "work": str(work),
        "data_steps": a.data_steps,
        "root": str(root),
        "scales": list(a.data_scales),
        "small": small,
        "large": large,
        "wiki_scale": a.wiki_scale,
        "uptime_start": uptime(),
    }
    r["pairs"] = {name: sum(1 for _ in open(corpora[name] / "train.en", "rb")) for name in (small, large)}
    r["nmt"] = bench_data_nmt(work, corpora, small, large, a)
    r["bert"] = bench_data_bert(work, corpora[f"wiki_x{a.wiki_scale}"], a)
    r["regression"] = bench_regression(work, a.regression_commit, a.data_rounds, a.regression_steps)
    r["uptime_end"] = uptime()
    return r


def uptime() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def shown(cmd: list[str], work: Path, root: Path) -> str:
    """A command as the table prints it: python for this interpreter, $TMP for the benchmark's folder, $DATA for
    the replicated corpora's."""
    import shlex

    text = shlex.join(["python" if c == sys.executable else c for c in cmd])
    return (
        text.replace(str(root), "$DATA")
        .replace(str(work), "$TMP")
        .replace(str(SHARED), "../shared")
        .replace(str(ROOT) + "/", "")
    )


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def data_rows(r: dict, cite: Callable[[dict | list], str]) -> list[str]:
    n, b, small, large = r["nmt"], r["bert"], r["small"], r["large"]
    pairs = {k: f"{v / 1e6:.2f}M pairs" for k, v in r["pairs"].items()}
    rounds, gb = n["rounds"], lambda mb: f"{mb / 1024:.2f} GB"  # noqa: E731
    peak = lambda x: max(x["peak_mb"], x["tree_pss_mb"])  # noqa: E731  (the workers count too)
    vs, vl, pl = n[f"vocab_{small}"], n[f"vocab_{large}"], n["plain"]
    rows = [
        f"| preprocess {pairs[small]} (×{r['scales'][0]}), vocabulary given: tcli wall time against bare "
        f"sentencepiece on the same lines, medians of {len(rounds['ours'])} alternating rounds | "
        f"{rounds['ours_s']:.1f} s against {rounds['bare_s']:.1f} s = **{rounds['ratio']:.2f}×** (tcli "
        f"{[round(x['wall_s'], 1) for x in rounds['ours']]}, bare {[round(x['wall_s'], 1) for x in rounds['bare']]}; "
        f"load {rounds['ours'][0]['load']:.1f}) | {cite(rounds['command'])} vs {cite(rounds['bare_command'])} | "
        f"≤ 1.3× | {verdict(rounds['ratio'] <= 1.3)} |"
    ]
    for name, x in ((small, vs), (large, vl)):
        ok = verdict(peak(x) <= 2048)
        if name != small:
            ok += f"; not growing: {verdict(peak(x) <= 1.1 * peak(vs))}"
        rows.append(
            f"| preprocess {pairs[name]}, vocabulary trained (all of tcli preprocess): wall time, peak RSS "
            f"(`time` %M; the whole process tree, summed Rss) | {x['wall_s']:.0f} s, **{gb(x['peak_mb'])}** "
            f"(tree: Rss {gb(x['tree_rss_mb'])}, Pss {gb(x['tree_pss_mb'])}; load {x['load']:.1f}) | "
            f"{cite(x['command'])} | ≤ 2 GB" + (", not growing with the corpus" if name == large else "") + f" | {ok} |"
        )
    given = max(rounds["ours"], key=lambda x: x["peak_mb"])
    rows.append(
        f"| preprocess {pairs[small]}, vocabulary given: peak RSS (largest of the rounds) | "
        f"{gb(given['peak_mb'])} (tree {gb(given['tree_rss_mb'])}) | {cite(rounds['command'])} | — | — |"
    )
    rows.append(
        f"| preprocess Multi30k (29,000 pairs), vocabulary given | {pl['wall_s']:.1f} s, {gb(pl['peak_mb'])} | "
        f"{cite(pl['command'])} | — | — |"
    )
    f = n["first"]
    rows.append(
        f"| from the preprocessed {pairs[small]}: command start to the end of the first update | "
        f"**{f['seconds']:.1f} s** (load {f['load']:.1f}) | {cite(f['command'])} | ≤ 10 s | "
        f"{verdict(f['seconds'] <= 10)} |"
    )
    base = n["steps_plain"]
    for name in (small, large):
        x = n[f"steps_{name}"]
        ratio = x["peak_mb"] / base["peak_mb"]
        rows.append(
            f"| {r['data_steps']} training steps from the preprocessed {pairs[name]} against plain Multi30k: "
            f"peak RSS | {x['peak_mb']:,.0f} MB against {base['peak_mb']:,.0f} MB = **{ratio:.2f}×** "
            f"({x['wall_s']:.0f} s and {base['wall_s']:.0f} s) | {cite(x['command'])} vs "
            f"{cite(base['command'])} | within 15% | {verdict(ratio <= 1.15)} |"
        )
    bv, bp, bf = b["vocab"], b["plain"], b["first"]
    words = f"{b['words'] / 1e6:.1f}M words"
    rows.append(
        f"| preprocess WikiText-2 ×{r['wiki_scale']} ({words}) for BERT, vocabulary trained: wall time, "
        f"peak RSS | {bv['wall_s']:.0f} s, **{gb(bv['peak_mb'])}** (tree: Rss {gb(bv['tree_rss_mb'])}, Pss "
        f"{gb(bv['tree_pss_mb'])}; load {bv['load']:.1f}) | {cite(bv['command'])} | ≤ 2 GB | "
        f"{verdict(peak(bv) <= 2048)} |"
    )
    rows.append(
        f"| preprocess WikiText-2 (test.txt) for BERT, vocabulary given | {bp['wall_s']:.1f} s, "
        f"{gb(bp['peak_mb'])} | {cite(bp['command'])} | — | — |"
    )
    rows.append(
        f"| BERT from the preprocessed {words}: command start to the end of the first update | "
        f"**{bf['seconds']:.1f} s** (load {bf['load']:.1f}) | {cite(bf['command'])} | ≤ 15 s | "
        f"{verdict(bf['seconds'] <= 15)} |"
    )
    x, base = b["steps_large"], b["steps_plain"]
    ratio = x["peak_mb"] / base["peak_mb"]
    rows.append(
        f"| {r['data_steps']} BERT steps from the preprocessed {words} against WikiText-2: peak RSS | "
        f"{x['peak_mb']:,.0f} MB against {base['peak_mb']:,.0f} MB = **{ratio:.2f}×** | {cite(x['command'])} "
        f"vs {cite(base['command'])} | within 15% | {verdict(ratio <= 1.15)} |"
    )
    g = r["regression"]
    spread = max(max(g[k]) / min(g[k]) for k in ("old", "new"))  # the same code's rounds: the machine's noise
    noisy = f"not resolved: rounds of the same code differ by {spread:.1f}×" if spread > 1.2 else None
    regression = noisy or verdict(g["ratio"] >= 0.95)
    rows.append(
        f"| no regression: translation training tgt tokens/s, {g['steps']} steps on Multi30k text, commit "
        f"{g['commit']} against this tree, alternating | {statistics.median(g['old']):,.0f} → "
        f"{statistics.median(g['new']):,.0f} = **{g['ratio']:.2f}×** (old {[round(v) for v in g['old']]}, new "
        f"{[round(v) for v in g['new']]}) | {cite(g['command'])} | ≥ 0.95× | {regression} |"
    )
    spread = max(max(g[k]) / min(g[k]) for k in ("quick_old", "quick_new"))
    noisy = f"not resolved: rounds of the same code differ by {spread:.1f}×" if spread > 1.2 else None
    rows.append(
        f"| no regression: `tcli train --config configs/quickstart.yaml` wall time, commit {g['commit']} "
        f"against this tree, alternating | {statistics.median(g['quick_old']):.0f} s → "
        f"{statistics.median(g['quick_new']):.0f} s = **{g['quick_ratio']:.2f}×** (old "
        f"{[round(v) for v in g['quick_old']]}, new {[round(v) for v in g['quick_new']]}) | "
        f"{cite(g['quick_command'])} | ≤ 1.05× | {noisy or verdict(g['quick_ratio'] <= 1.05)} |"
    )
    return rows


def ranks_rows(runs: dict[str, dict], cite: Callable[[dict | list], str]) -> list[str]:
    """Per-rank memory on the small corpus (the control) and the large one: a copy of the corpus in each rank
    would show as private memory growing by the corpus' size per rank."""
    (_, control), (name, large) = runs.items()
    corpus = sum(large["bin_mb"].values())
    private = lambda s: s["Private_Clean"] + s["Private_Dirty"]  # noqa: E731
    rows = [
        f"Two ranks under torchrun, {large['steps']} steps each, `OMP_NUM_THREADS=1`, on plain Multi30k "
        f"({cite(control['command'])}) and on the {name} corpus ({cite(large['command'])}): each rank's "
        "/proc/PID/smaps_rollup while training, at the sample (taken once a second) where the ranks' private "
        'memory summed is largest; "corpus mapping" is the rank\'s mappings of the train.*.bin files '
        "(/proc/PID/smaps).",
        "",
        "| corpus (train.*.bin) | rank | Rss | Pss | Private_Clean + Private_Dirty | Shared_Clean + Shared_Dirty | "
        "Anonymous | corpus mapping: Rss (of it private) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, d in runs.items():
        for i, s in enumerate(d["ranks"]):
            m, shared, anon = s["bin"], s["Shared_Clean"] + s["Shared_Dirty"], s.get("Anonymous", 0)
            rows.append(
                f"| {label} ({sum(d['bin_mb'].values()):,.1f} MB) | {i} | {s['Rss']:,.0f} MB | "
                f"{s['Pss']:,.0f} MB | {private(s):,.0f} MB | {shared:,.0f} MB | {anon:,.0f} MB"
                f" | {m.get('Rss', 0):,.1f} MB ({m.get('Private_Clean', 0) + m.get('Private_Dirty', 0):,.1f} "
                "MB) |"
            )
    grown = sum(map(private, large["ranks"])) - sum(map(private, control["ranks"]))
    rows += [
        "",
        f"The two ranks' private memory summed: {sum(map(private, large['ranks'])):,.0f} MB on the {name} "
        f"corpus against {sum(map(private, control['ranks'])):,.0f} MB on Multi30k, {grown:+,.0f} MB for a "
        f"corpus of {corpus:,.0f} MB (two copies: {2 * corpus:,.0f} MB): {verdict(grown < corpus)} (target: "
        "the private memory does not hold two copies of the corpus).",
    ]
    return rows


def data_table(r: dict, head: dict) -> str:
    """The "Data at scale" section's table, each figure with the command that produced it (listed below it)."""
    work, commands = Path(r["work"]), []

    def cite(cmd: dict | list) -> str:
        text = shown(cmd, work, Path(r["root"]))
        if text not in commands:
            commands.append(text)
        return f"[{commands.index(text) + 1}]"

    rows = [
        f"Machine: {describe(head['machine'])}. Run: `{head['command']}` ({head['date']}; "
        f"{r['uptime_start']} at the start, {r['uptime_end']} at the end: the machine is shared). "
        f"$TMP is the benchmark's temporary folder, "
        f"$DATA the replicated corpora's ({', '.join(f'{k}: {v:,} pairs' for k, v in r['pairs'].items())}). "
        f"Training runs use a small model, to keep the steps short on this CPU and the data path a large share "
        f"of time and memory: translation `{' '.join(DATA_NMT_SIZE)}`, BERT `{' '.join(DATA_BERT_SIZE)}`; "
        f"no evaluation during the runs and no test split (`{' '.join(NMT_DATA)}`; BERT "
        f"`{' '.join(BERT_DATA)}`), one validation at the end.",
        "",
        "| what | measured | command | target | |",
        "|---|---|---|---|---|",
        *data_rows(r, cite),
        "",
        *ranks_rows(r["nmt"]["ddp"], cite),
        "",
        "Commands:",
        "",
    ]
    rows += [f"{i}. `{text}`" for i, text in enumerate(commands, 1)]
    rows += ["", "$TMP/bare_spm.py:", "", "```python", BARE_SPM.rstrip(), "```"]
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="nmt,bert,decode,memory,shapes,ddp", help="comma-separated subset")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of ours and the peer")
    p.add_argument("--nmt-steps", type=int, default=200)
    p.add_argument("--bert-steps", type=int, default=150)
    p.add_argument("--memory-steps", type=int, default=2000)
    p.add_argument("--ddp-steps", type=int, default=150)
    p.add_argument("--nmt-checkpoint", type=Path, help="a trained Multi30k model for the decoding benchmark")
    p.add_argument(
        "--write",
        type=Path,
        help="replace the sections that ran between their markers in the pages of this folder (docs/benchmarks) "
        "or in this one file",
    )
    p.add_argument(
        "--data-scales",
        type=lambda t: tuple(map(int, t.split(","))),
        default=(35, 155),
        help="data: Multi30k's train split replicated this many times, the smaller and the larger corpus",
    )
    p.add_argument("--wiki-scale", type=int, default=100, help="data: WikiText-2 test+valid replicated this many times")
    p.add_argument("--data-root", type=Path, help="data: build (and keep) the replicated corpora here")
    p.add_argument("--data-rounds", type=int, default=2, help="data: alternating rounds of the side-by-side timings")
    p.add_argument("--data-steps", type=int, default=100, help="data: updates of the memory runs")
    p.add_argument("--data-ddp-steps", type=int, default=100)
    p.add_argument("--regression-commit", default="c15717c", help="data: the code before preprocessed data")
    p.add_argument("--regression-steps", type=int, default=200)
    a = p.parse_args()
    only = set(a.only.split(","))
    result = {
        "machine": machine(),
        "command": "python scripts/benchmark.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
    }
    dtype = result["machine"]["precision"]
    print(f"machine: {result['machine']['key']}; precision auto = {dtype} (the peers run in {dtype})", file=sys.stderr)
    speed = only & {"nmt", "bert", "decode", "memory", "shapes", "ddp"}
    if speed:  # the speed table's reference; bf16 only where the CPU multiplies it natively (elsewhere one
        # emulated 2048² bf16 matmul takes minutes)
        result |= {
            "peak_fp32": matmul_peak(torch.float32),
            "peak_bf16": matmul_peak(torch.bfloat16) if dtype == "bf16" else None,
        }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "data" in only:  # first, while nothing else of ours has warmed the machine or filled the page cache
            result["data"] = bench_data(work, a)
            print(json.dumps(result["data"], indent=1, default=str), file=sys.stderr)
        if "nmt" in only:
            result["nmt"] = bench_nmt(work, a.rounds, a.nmt_steps, dtype)
            result["nmt_flops_per_token"] = train_flops_per_token("nmt")
        if "bert" in only:
            result["bert"] = bench_bert(work, a.rounds, a.bert_steps, dtype)
            result["bert_flops_per_token"] = train_flops_per_token("bert")
        if "decode" in only:
            if a.nmt_checkpoint is None:
                raise SystemExit("--nmt-checkpoint is needed for the decoding benchmark (or drop decode from --only)")
            result["decode"] = bench_decode(work, a.nmt_checkpoint, a.rounds, dtype)
        if "memory" in only:
            result["memory"] = bench_memory(work, a.memory_steps)
        if "shapes" in only:
            result["shapes"] = json.loads(run([sys.executable, "scripts/kernel_shapes.py", "--json"]).stdout)
        if "ddp" in only:
            result["ddp"] = bench_ddp(work, a.ddp_steps)
    sections = {}
    if speed:
        key = result["machine"]["key"]
        sections[START.format(key), END.format(key)] = table(result)
    if "data" in only:
        sections[DATA_START, DATA_END] = data_table(result["data"], result)
    for text in sections.values():
        print(text)
    print(json.dumps({k: v for k, v in result.items() if k != "data"}, indent=1, default=str), file=sys.stderr)
    if a.write:
        for path in write_results(a.write, result if speed else None, sections):
            print(f"wrote {path}", file=sys.stderr)


def write_results(target: Path, r: dict | None, sections: dict[tuple[str, str], str]) -> list[Path]:
    """Write this run's machine row (when `r`, the speed result, is given) and `sections` into the pages of the
    folder `target`, or into the one file `target`; the files written."""
    if not target.is_dir():
        doc = target.read_text(encoding="utf-8")
        if r is not None:
            doc = update_machine_row(add_machine_section(doc, r["machine"]), r)
        target.write_text(write_sections(doc, sections), encoding="utf-8")
        return [target]
    docs: dict[Path, str] = {}  # the pages read so far, with the changes made to them

    def holder(marker: str) -> Path | None:
        for path in dict.fromkeys([target / "index.md", *sorted(target.rglob("*.md"))]):
            if path not in docs and path.is_file():
                docs[path] = path.read_text(encoding="utf-8")
            if marker in docs.get(path, ""):
                return path
        return None

    def needed(marker: str) -> Path:
        path = holder(marker)
        if path is None:
            raise SystemExit(f"no page under {target} holds the {marker} marker")
        return path

    written: set[Path] = set()
    if r is not None:
        if holder(START.format(r["machine"]["key"])) is None:
            page = add_machine_page(target, r["machine"]["key"])
            docs[page] = page.read_text(encoding="utf-8")
        table = needed(MACHINES_START)
        docs[table] = update_machine_row(docs[table], r)
        written.add(table)
    for markers, text in sections.items():
        path = needed(markers[0])
        docs[path] = write_sections(docs[path], {markers: text})
        written.add(path)
    for path in sorted(written):
        path.write_text(docs[path], encoding="utf-8")
    return sorted(written)


# The line of mkdocs.yml's nav after which a new machine's page is listed.
NAV_COMMENT = "# benchmark machine pages (scripts/benchmark.py adds new ones here)"


def machine_slug(key: str) -> str:
    """A page name for a CPU key: the model's words and the widest matrix instructions it has, e.g.
    "Intel(R) Xeon(R) Processor [avx2 ... amx_bf16 amx_int8]" -> intel-xeon-amx."""
    cpu, _, flags = key.partition(" [")
    isa = set(flags.rstrip("]").split())
    words = re.findall(r"[a-z0-9]+", re.sub(r"\((r|tm)\)|\b(processor|cpu)\b|@.*$", " ", cpu.lower()))
    if any(flag.startswith("amx") for flag in isa):
        words.append("amx")
    elif "avx512_bf16" in isa:
        words += ["avx512", "bf16"]
    elif "avx512f" in isa:
        words.append("avx512")
    elif "avx2" in isa:
        words.append("avx2")
    return "-".join(words) or "cpu"


def add_machine_page(folder: Path, key: str) -> Path:
    """A new page, folder/machines/<slug>.md, with the key as heading and empty markers, listed in the nav of the
    mkdocs.yml two folders up (or a line saying why it could not be)."""
    base = machine_slug(key)
    page, n = folder / "machines" / f"{base}.md", 2
    while page.exists():  # another kind's page took the name: two keys may share a model and its widest flags
        page, n = folder / "machines" / f"{base}-{n}.md", n + 1
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"# {key}\n\n{START.format(key)}\n{END.format(key)}\n", encoding="utf-8")
    mkdocs = folder.resolve().parents[1] / "mkdocs.yml"
    entry = f"{folder.name}/machines/{page.name}"
    lines = mkdocs.read_text(encoding="utf-8").splitlines(keepends=True) if mkdocs.is_file() else []
    at = next((i for i, line in enumerate(lines) if line.strip() == NAV_COMMENT), None)
    if at is None:
        why = "is missing" if not lines else f"has no line {NAV_COMMENT!r}"
        print(f'{mkdocs} {why}: add - "{key}": {entry} to its nav by hand', file=sys.stderr)
        return page
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    quoted = key.replace("\\", "\\\\").replace('"', '\\"')
    lines.insert(at + 1, f'{indent}- "{quoted}": {entry}\n')
    mkdocs.write_text("".join(lines), encoding="utf-8")
    return page


def write_sections(doc: str, sections: dict[tuple[str, str], str]) -> str:
    """`doc` with what lies between each pair of markers replaced by its section's text."""
    for (start, end), text in sections.items():
        if start not in doc or end not in doc:
            raise SystemExit(f"the file has no {start} ... {end} markers")
        head, rest = doc.split(start, 1)
        _, tail = rest.split(end, 1)
        doc = f"{head}{start}\n{text}{end}{tail}"
    return doc


def add_machine_section(doc: str, m: dict) -> str:
    """A heading and empty markers for a machine the file has no section for, after the last machine's
    section (or after the "by machine" table when there is none yet)."""
    start, end = START.format(m["key"]), END.format(m["key"])
    if start in doc:
        return doc
    anchor = doc.rfind("<!-- benchmark:end ")
    anchor = doc.index("-->", anchor) + 3 if anchor >= 0 else doc.index(MACHINES_END) + len(MACHINES_END)
    block = f"\n\n### {m['key']}\n\n{start}\n{end}"
    return doc[:anchor] + block + doc[anchor:]


MACHINE_COLUMNS = (
    "machine (CPU [ISA flags])",
    "precision",
    "translation training",
    "BERT training",
    "beam search",
    "MFU translation / BERT",
    "measured",
)


def update_machine_row(doc: str, r: dict) -> str:
    """This machine's row of the "by machine" table: the ratios this run measured replace the old ones,
    those it did not measure are kept."""
    if MACHINES_START not in doc or MACHINES_END not in doc:
        raise SystemExit(f"the file has no {MACHINES_START} ... {MACHINES_END} markers")
    head, rest = doc.split(MACHINES_START, 1)
    body, tail = rest.split(MACHINES_END, 1)
    rows = [line for line in body.strip().splitlines() if line.startswith("| ")][1:]  # without the header
    m = r["machine"]
    cells = {MACHINE_COLUMNS[0]: m["key"], "precision": m["precision"], "measured": r["date"]}
    old = next((row for row in rows if row.split(" | ")[0] == f"| {m['key']}"), None)
    if old is not None:
        cells = dict(zip(MACHINE_COLUMNS, (c.strip() for c in old.strip("| ").split(" | ")))) | cells
    for kind, column in (("nmt", "translation training"), ("bert", "BERT training"), ("decode", "beam search")):
        if kind in r:
            cells[column] = f"{r[kind]['ours'] / r[kind]['peer']:.2f}×"
    if "nmt" in r or "bert" in r:
        shares = [f"{100 * utilisation(r, k)[1]:.0f}%" if k in r else "—" for k in ("nmt", "bert")]
        cells["MFU translation / BERT"] = " / ".join(shares)
    row = "| " + " | ".join(cells.get(c, "—") for c in MACHINE_COLUMNS) + " |"
    rows = [row if existing is old else existing for existing in rows] if old is not None else rows + [row]
    table = ["| " + " | ".join(MACHINE_COLUMNS) + " |", "|" + "---|" * len(MACHINE_COLUMNS), *rows]
    return f"{head}{MACHINES_START}\n" + "\n".join(table) + f"\n{MACHINES_END}{tail}"


if __name__ == "__main__":
    main()
