"""tcli finetune against the Hugging Face peer (../shared/peers/peer_hf_finetune.py), from the same BERT.

Both start from one Hugging Face folder: `--checkpoint` (a tcli BERT checkpoint, exported here with
`tcli export-hf`) or `--hf` (a folder already exported). Both use its tokenizer, batch 32, AdamW with weight
decay 0.01 and ε 1e-8, 10% linear warmup then linear decay, max length 128, gradient clipping at 1.0, and the same
precision (`--precision`, default fp32).

  speed   (default) examples/s over `--steps` updates of each `--tasks` task, alternating ours and the
          peer `--rounds` times: ours pads each length-bucketed batch to its longest member (rounded up to
          8 widths per doubling); the peer pads its random batches to their longest member, and again with
          `--pad-to-max` (run_glue.py's default).
          Ours: the median of the train events' examples_per_sec after the first (warm-up) interval, data
          loading included; the peer's: 32 / its median step time, tokenisation excluded.
  parity  `--epochs` over each task with `--seeds` seeds, both tools; the median over the seeds of each dev
          metric after the last update, and the difference in points. The peer's script ranks for Spearman
          with ties broken by file order (not GLUE's average ranks; STS-B's dev scores tie often), so for a
          regression task ours is also scored that way (`spearman_peer_ranks`, from `tcli predict` on dev)
          and compared with the peer's like for like.

  python scripts/finetune_benchmark.py --checkpoint runs/bert-gb/checkpoints/last.pt --data ../shared/data/glue
  python scripts/finetune_benchmark.py --hf runs/hf --mode parity --tasks sst2,mrpc,stsb,rte,cola --seeds 3

Prints one JSON object (and a Markdown table to stderr); `--out` keeps the runs (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from transformer_cli.data.labeled import GLUE_TASKS, read_glue

sys.path.insert(0, str(Path(__file__).resolve().parent))  # as when run as a script: its sibling imports by name
from benchmark import PEERS, SHARED, events, machine, overrides, peer, run, steady, tcli  # noqa: E402

PEER = "peer_hf_finetune.py"
TASKS = ("cola", "sst2", "mrpc", "stsb", "rte", "wnli")  # the GLUE tasks the peer reads


def ours(hf: Path, task: str, a: argparse.Namespace, out: Path, seed: int, steps: int | None) -> dict:
    """One `tcli finetune` run from the HF folder: examples/s (median after the first interval; `steps` runs
    only) and the dev metrics of its last evaluation (after the last update)."""
    length = ["train.max_steps=" + str(steps), "train.max_epochs=null"] if steps else [f"train.max_epochs={a.epochs}"]
    log_every = max(1, steps // 5) if steps else 50
    sets = [
        f"task.glue={GLUE_TASKS[task].folder}",
        f"data.dir={a.data}",
        "data.max_seq_len=128",
        f"model.init={hf}",
        "train.batch_size=32",
        f"train.lr={a.lr}",
        "train.warmup_ratio=0.1",
        "train.weight_decay=0.01",
        "train.adam_eps=1e-8",  # the peer's AdamW is torch's default (tcli's fine-tuning default is BERT's 1e-6)
        f"train.precision={a.precision}",
        f"train.seed={seed}",
        f"train.log_every={log_every}",
        "train.eval_every=1000000",  # dev evaluation at the epoch ends (and the run's end) only
        *length,
    ]
    out.mkdir(parents=True, exist_ok=True)
    config = out.parent / f"{out.name}.yaml"  # every setting comes as --set; the file holds the task's kind
    config.write_text(f"task: {{kind: {GLUE_TASKS[task].kind}}}\n")
    run(tcli("finetune", "--config", str(config), "--out", str(out), "--quiet", *overrides(sets)))
    last = events(out, "eval")[-1]
    speed = steady(out, "examples_per_sec") if steps else None  # parity runs may log no interval to read
    dev = {k: last[k] for k in GLUE_TASKS[task].metrics}
    if GLUE_TASKS[task].kind == "regression" and not steps:
        dev["spearman_peer_ranks"] = spearman_peer_ranks(out, task, a)
    return {"examples_per_sec": speed, "dev": dev}


def spearman_peer_ranks(out: Path, task: str, a: argparse.Namespace) -> float:
    """Spearman's rho of the run's dev predictions as the peer's script computes it: Pearson's r of ordinal
    ranks, ties (in gold and in predictions) broken by file order, where GLUE's definition averages them."""
    dev_tsv = a.data / GLUE_TASKS[task].folder / "dev.tsv"
    checkpoint = out / "checkpoints" / "last.pt"
    args = ["predict", "--checkpoint", str(checkpoint), "--input", str(dev_tsv), "--precision", a.precision]
    pred = [float(line) for line in run(tcli(*args)).stdout.split()]
    return peer_spearman(pred, [float(e.label) for e in read_glue(a.data, task, "dev")])


def peer_spearman(pred: list[float], gold: list[float]) -> float:
    """peer_hf_finetune.py's Spearman: Pearson's r of ordinal ranks (a stable argsort: ties by file order)."""

    def rank(v: list[float]) -> np.ndarray:
        return np.argsort(np.argsort(np.asarray(v, dtype=float), kind="stable"), kind="stable").astype(float)

    return float(np.corrcoef(rank(pred), rank(gold))[0, 1])


def theirs(hf: Path, task: str, a: argparse.Namespace, seed: int, steps: int | None, pad_to_max: bool = False) -> dict:
    args = ["--model", str(hf), "--task", task, "--data", str(a.data), "--lr", str(a.lr), "--dtype", a.precision]
    args += ["--seed", str(seed), "--batch", "32", "--max-len", "128"]
    args += ["--steps", str(steps)] if steps else ["--epochs", str(a.epochs)]
    args += ["--pad-to-max"] if pad_to_max else []
    result = peer(PEER, *args)
    return {
        "examples_per_sec": result["examples_per_sec"],
        "dev": {k: result["dev"][k] for k in GLUE_TASKS[task].metrics},
    }


def speed(hf: Path, a: argparse.Namespace, work: Path) -> dict:
    out = {}
    for task in a.tasks:
        rows: dict[str, list[float]] = {"ours": [], "peer": [], "peer_pad_to_max": []}
        for r in range(a.rounds):
            rows["ours"].append(ours(hf, task, a, work / f"speed-{task}-{r}", 1, a.steps)["examples_per_sec"])
            rows["peer"].append(theirs(hf, task, a, 1, a.steps)["examples_per_sec"])
            rows["peer_pad_to_max"].append(theirs(hf, task, a, 1, a.steps, pad_to_max=True)["examples_per_sec"])
            print(f"{task} round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items()), file=sys.stderr)
        med = {k: statistics.median(v) for k, v in rows.items()}
        out[task] = {
            **{f"{k}_median": v for k, v in med.items()},
            "vs_peer": med["ours"] / med["peer"],
            "vs_peer_pad_to_max": med["ours"] / med["peer_pad_to_max"],
            "rounds": rows,
        }
    return out


def parity(hf: Path, a: argparse.Namespace, work: Path) -> dict:
    out = {}
    for task in a.tasks:
        runs: dict[str, list[dict]] = {"ours": [], "peer": []}
        for s in range(a.seeds):
            runs["ours"].append(ours(hf, task, a, work / f"parity-{task}-{s}", s + 1, None)["dev"])
            runs["peer"].append(theirs(hf, task, a, s + 1, None)["dev"])
            print(f"{task} seed {s + 1}: ours {runs['ours'][-1]}, peer {runs['peer'][-1]}", file=sys.stderr)
        med = {
            tool: {k: statistics.median(r[k] for r in results) for k in GLUE_TASKS[task].metrics}
            for tool, results in runs.items()
        }
        diff = {k: 100 * (med["ours"][k] - med["peer"][k]) for k in GLUE_TASKS[task].metrics}
        if GLUE_TASKS[task].kind == "regression":  # like for like: both ranked as the peer's script ranks
            med["ours"]["spearman_peer_ranks"] = statistics.median(r["spearman_peer_ranks"] for r in runs["ours"])
            med["peer"]["spearman_peer_ranks"] = med["peer"]["spearman"]
            diff["spearman_peer_ranks"] = 100 * (med["ours"]["spearman_peer_ranks"] - med["peer"]["spearman"])
        out[task] = {"median": med, "difference_points": diff, "runs": runs}
    return out


def table(r: dict) -> str:
    lines = []
    if r["mode"] == "speed":
        lines += ["| task | ours ex/s | peer ex/s (longest) | ratio | peer ex/s (pad to 128) | ratio |"]
        lines += ["|---|---|---|---|---|---|"]
        for task, t in r["results"].items():
            lines.append(
                f"| {task} | {t['ours_median']:.1f} | {t['peer_median']:.1f} | {t['vs_peer']:.2f}× | "
                f"{t['peer_pad_to_max_median']:.1f} | {t['vs_peer_pad_to_max']:.2f}× |"
            )
    else:
        lines += ["| task | metric | ours (median) | peer (median) | difference (points) |", "|---|---|---|---|---|"]
        for task, t in r["results"].items():
            for k, d in t["difference_points"].items():
                lines.append(
                    f"| {task} | {k} | {100 * t['median']['ours'][k]:.2f} | "
                    f"{100 * t['median']['peer'][k]:.2f} | {d:+.2f} |"
                )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    start = p.add_mutually_exclusive_group(required=True)
    start.add_argument("--checkpoint", type=Path, help="a tcli BERT checkpoint (exported here with tcli export-hf)")
    start.add_argument("--hf", type=Path, help="a Hugging Face BERT folder with its tokenizer")
    p.add_argument("--data", type=Path, default=SHARED / "data" / "glue", help="GLUE folders")
    p.add_argument("--mode", choices=("speed", "parity"), default="speed")
    p.add_argument("--tasks", default="sst2,mrpc", help="comma-separated: " + ",".join(TASKS))
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--steps", type=int, default=60, help="speed: updates per run")
    p.add_argument("--rounds", type=int, default=2, help="speed: alternating rounds")
    p.add_argument("--epochs", type=int, default=3, help="parity: epochs per run")
    p.add_argument("--seeds", type=int, default=3, help="parity: seeds per task and tool")
    p.add_argument("--out", type=Path, help="keep the runs here")
    a = p.parse_args()
    a.tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    unknown = [t for t in a.tasks if t not in TASKS]
    if unknown:
        p.error(f"unknown task {unknown[0]!r}; choose from {', '.join(TASKS)}")
    if not (PEERS / PEER).is_file():
        p.error(f"no peer at {PEERS / PEER}")
    with tempfile.TemporaryDirectory() as tmp:
        work = a.out or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        hf = a.hf
        if hf is None:
            hf = work / "hf"
            run(tcli("export-hf", "--checkpoint", str(a.checkpoint), "--out", str(hf), "--force"))
        results = (speed if a.mode == "speed" else parity)(hf.resolve(), a, work)
    report = {"mode": a.mode, "cpu": machine()["key"], "precision": a.precision, "lr": a.lr, "results": results}
    report |= {"steps": a.steps, "rounds": a.rounds} if a.mode == "speed" else {"epochs": a.epochs, "seeds": a.seeds}
    print(f"{report['cpu']}, {a.precision}\n{table(report)}", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
