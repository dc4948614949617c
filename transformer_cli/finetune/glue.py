"""`tcli glue`: fine-tune one starting model on every GLUE task of a `glue_data/` folder, one resumable run
directory per task and seed, then the table and the GLUE score.

Orchestration only: each run is `tcli finetune` with the task's recipe (`RECIPES`, the README's table), the
user's `--set` overrides on top. A task's numbers are the dev metrics of its best.pt (MNLI: selected on
dev_matched, both splits reported); with `--seeds N`, each metric is the median over the N runs. Running the
same command again resumes unfinished runs and skips finished ones.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from transformer_cli.config import MAX_SEED, FinetuneRunConfig, load_config
from transformer_cli.core.console import say
from transformer_cli.core.errors import UserError
from transformer_cli.core.files import is_temporary, write_atomic
from transformer_cli.data.labeled import GLUE_TASKS, glue_tasks_in
from transformer_cli.metrics.task_metrics import main_value

# What every GLUE run starts from (the FinetuneTrainConfig defaults: batch 32, lr 2e-5, warmup 10% then linear
# decay, weight decay 0.01, max length 128), and the epochs per task: one pass over the large tasks (SST-2's 67k
# examples already give 2,100 updates), four over the small ones, whose dev scores swing with the few updates an
# epoch gives. The six tasks then fit 30 minutes on 2 CPU cores for a 4-layer, d_model 256 BERT (measured:
# docs/benchmarks/finetuning.md).
EPOCHS = {"cola": 4, "sst2": 1, "mrpc": 4, "stsb": 4, "qqp": 1, "mnli": 1, "qnli": 1, "rte": 4, "wnli": 4}
COMMON = ("train.batch_size=32", "train.lr=2e-5", "train.warmup_ratio=0.1", "train.weight_decay=0.01")
COMMON += ("data.max_seq_len=128",)


# Keys each task's recipe (or an option) sets, which --set may not change.
OWN_KEYS = {
    "task.glue": "choose the tasks with --tasks",
    "task.kind": "each GLUE task has its kind",
    "task.metrics": "the table reports GLUE's metrics of each task (tcli finetune takes task.metrics)",
    "data.dir": "give the folder with --data-dir",
    **{
        f"data.{key}": "each GLUE task has its own files and columns"
        for key in ("format", "train", "valid", "text", "pair", "label")
    },
    "model.init": "give the starting model with --checkpoint",
}


def _key(override: str) -> str:
    return override.partition("=")[0].strip()


def recipe(task: str) -> list[str]:
    """The `--set` overrides of one GLUE task's run (before the user's own)."""
    g = GLUE_TASKS[task]
    return [f"task.glue={g.folder}", f"task.kind={g.kind}", *COMMON, f"train.max_epochs={EPOCHS[task]}"]


@dataclass
class GlueRun:
    task: str
    seed: int
    cfg: FinetuneRunConfig
    out: Path


def parse_tasks(tasks: str | None, data_dir: Path) -> list[str]:
    """`--tasks cola,SST-2,...` (GLUE's names or keys) in GLUE order, or every task found in `data_dir`."""
    found = glue_tasks_in(data_dir)
    if tasks is None:
        if not found:
            folders = ", ".join(t.folder for t in GLUE_TASKS.values())
            raise UserError(f"--data-dir {data_dir}: no GLUE task folder with a train.tsv ({folders}); check the path")
        return found
    wanted = []
    for name in (n.strip() for n in tasks.split(",") if n.strip()):
        key = name.lower().replace("-", "").replace("_", "")
        if key not in GLUE_TASKS:
            raise UserError(f"--tasks: unknown GLUE task {name!r}; the tasks are {', '.join(GLUE_TASKS)}")
        if key not in found:
            raise UserError(f"--tasks {name}: {data_dir / GLUE_TASKS[key].folder / 'train.tsv'} not found")
        wanted.append(key)
    if not wanted:
        raise UserError("--tasks is empty; name GLUE tasks, e.g. --tasks rte,mrpc (or leave it out for every task)")
    return [t for t in GLUE_TASKS if t in wanted]


def plan(
    checkpoint: str, data_dir: Path, tasks: list[str], seeds: int, out: Path, overrides: list[str]
) -> list[GlueRun]:
    """Every run's config, checked before any runs (a bad --set or checkpoint stops here)."""
    if checkpoint.lower() != "none" and not Path(checkpoint).exists():
        raise UserError(
            f"--checkpoint {checkpoint} not found (a tcli BERT checkpoint, a Hugging Face BERT folder, or none)"
        )
    for override in overrides:
        key = _key(override)
        if key in OWN_KEYS:
            raise UserError(f"--set {override}: tcli glue sets {key} for each task; {OWN_KEYS[key]}")
        owned = [own for own in OWN_KEYS if own.startswith(key + ".")]
        if owned:  # a whole section (--set 'task={kind: regression}') would replace those keys too
            raise UserError(
                f"--set {override}: tcli glue sets {', '.join(owned)} for each task; set single keys of {key} "
                f"instead (--set {key}.KEY=VALUE)"
            )
    shown = f" with --set {' '.join(overrides)}" if overrides else ""
    runs = []
    mine = {_key(override) for override in overrides}
    for task in tasks:
        recipe_sets = [s for s in recipe(task) if _key(s) not in mine]  # the user's --set replaces the recipe's
        # the paths as YAML strings (json.dumps quotes them): a name like `-`, `[x]` or `null` is a path, not YAML
        paths = [f"data.dir={json.dumps(str(data_dir))}", f"model.init={json.dumps(checkpoint)}"]
        sets = [*recipe_sets, *paths, *overrides]
        source = f"tcli glue's {GLUE_TASKS[task].folder} recipe{shown}"
        first = load_config(FinetuneRunConfig, None, sets, source).train.seed
        if first + seeds - 1 > MAX_SEED:
            raise UserError(
                f"--seeds {seeds} from train.seed {first} would go past {MAX_SEED}, the largest seed; "
                f"set train.seed to at most {MAX_SEED - seeds + 1}"
            )
        unseeded = [s for s in sets if _key(s) != "train.seed"]
        for i in range(seeds):
            cfg = load_config(FinetuneRunConfig, None, [*unseeded, f"train.seed={first + i}"], source)
            runs.append(GlueRun(task, first + i, cfg, out / f"{task}-seed{first + i}"))
    return runs


def check_out(out: Path) -> None:
    """--out is new, empty or an earlier `tcli glue` folder: its glue.json and glue.md, and a `<task>-seed<N>`
    run directory per run (each guarded as a finetune run). Anything else is the user's, which glue.md and
    glue.json would overwrite: refused."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory")
    entries = sorted(out.iterdir())
    ours = _is_summary(out / "glue.json")
    foreign = [
        e.name
        for e in entries
        if not (
            (e.is_dir() and _RUN_FOLDER.fullmatch(e.name))
            or (ours and e.name in ("glue.json", "glue.md") and e.is_file())
            or is_temporary(e.name, "glue.json")
            or is_temporary(e.name, "glue.md")
        )
    ]
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise UserError(
            f"--out {out} is not empty and is not a tcli glue folder (it holds {shown}); "
            "choose a new or empty directory"
        )


_RUN_FOLDER = re.compile(rf"(?:{'|'.join(GLUE_TASKS)})-seed\d+")


def _is_summary(path: Path) -> bool:
    """Whether `path` is a glue.json that tcli glue wrote."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and {"score", "tasks", "runs"} <= set(data)


def best_eval(run_dir: Path) -> dict[str, Any]:
    """The eval event of a finished run's best.pt: the first with the best score (as the trainer chose it)."""
    events = []
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except (ValueError, RecursionError):
            continue
    evals = [e for e in events if e.get("event") == "eval"]
    if not evals:
        raise UserError(f"{run_dir}/metrics.jsonl holds no evaluation; remove {run_dir} and run tcli glue again")
    top = max(e["score"] for e in evals)
    return next(e for e in evals if e["score"] == top)


def rows_of(task: str, event: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{glue_row: {metric: value}} of one run's best evaluation: the first dev split from the plain keys, the
    others from "<split>/<metric>" keys."""
    g = GLUE_TASKS[task]
    out = {}
    for i, split in enumerate(g.dev_splits):
        prefix = "" if i == 0 else f"{split}/"
        out[glue_row(task, split)] = {m: float(event[prefix + m]) for m in g.metrics}
    return out


def medians(per_seed: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each row's each metric: the median over the seeds' runs."""
    return {
        row: {m: float(statistics.median(run[row][m] for run in per_seed)) for m in per_seed[0][row]}
        for row in per_seed[0]
    }


def run_glue(
    checkpoint: str,
    data_dir: Path,
    tasks: str | None = None,
    seeds: int = 1,
    out: Path = Path("runs/glue"),
    overrides: list[str] | None = None,
    device: str = "auto",
    quiet: bool = False,
) -> dict[str, Any]:
    """Fine-tune on each task (and seed), then write glue.json and glue.md into `out`; returns glue.json's data."""
    from transformer_cli.finetune.setup import finetune, read_labelled, resolve_init

    if seeds < 1:
        raise UserError(f"--seeds {seeds}: give 1 or more runs per task")
    check_out(Path(out))
    runs = plan(checkpoint, Path(data_dir), parse_tasks(tasks, Path(data_dir)), seeds, Path(out), overrides or [])
    # Every task's files are read and checked before any training: a bad row in the last task stops here, not after
    # the first tasks have trained; so does a starting model that cannot be read, and, from scratch, a vocab.size too
    # small for a task's characters (each new run's vocabulary is trained here, and the run takes it).
    init_checked = False
    for run in {r.task: r for r in runs}.values():
        data = read_labelled(run.cfg)
        if (run.out / "checkpoints" / "last.pt").exists():
            continue  # resumed from its own checkpoint
        if run.cfg.model.init.lower() == "none" or not init_checked:
            resolve_init(run.cfg, data)
            init_checked = True
    created = not out.exists()
    results: dict[str, list[dict[str, dict[str, float]]]] = {}
    try:
        for i, run in enumerate(runs, 1):
            say(quiet, f"glue: {run.task} seed {run.seed} ({i}/{len(runs)}) -> {run.out}")
            finetune(run.cfg, run.out, device=device, resume=True, quiet=quiet)
            results.setdefault(run.task, []).append(rows_of(run.task, best_eval(run.out)))
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # the first run was refused: leave nothing behind
        raise
    per_task: dict[str, dict[str, float]] = {}
    for per_seed in results.values():
        per_task.update(medians(per_seed))
    table = glue_table(per_task)
    score = glue_score(per_task)
    summary = {
        "checkpoint": checkpoint,
        "data_dir": str(data_dir),
        "seeds": sorted({r.seed for r in runs}),
        "overrides": overrides or [],
        "score": score,
        "tasks": per_task,
        "per_seed": {task: per_seed for task, per_seed in results.items()},
        "runs": [str(r.out) for r in runs],
    }
    write_atomic((json.dumps(summary, indent=1) + "\n").encode(), out / "glue.json")
    what = f"median of {seeds} runs per task" if seeds > 1 else "one run per task"
    write_atomic(f"{table}\nDev sets; best.pt of each run; {what}.\n".encode(), out / "glue.md")
    return summary | {"table": table}


# --- GLUE ----------------------------------------------------------------------------------------------------

_SPLIT_SUFFIX = {"dev": "", "dev_matched": "-m", "dev_mismatched": "-mm"}


def glue_row(task: str, split: str) -> str:
    """The key of one evaluated split in `glue_score`'s input: "sst2" for dev, "mnli-m" and "mnli-mm" for MNLI."""
    return task + _SPLIT_SUFFIX.get(split, f"-{split}")


def _task_of(row: str) -> str:

    task = row.split("-", 1)[0]
    if task not in GLUE_TASKS or (row != task and row[len(task) :] not in _SPLIT_SUFFIX.values()):
        raise ValueError(f"unknown GLUE row {row!r}: expected a task ({', '.join(GLUE_TASKS)}) or mnli-m / mnli-mm")
    return task


def _task_scores(per_task: dict[str, dict[str, float]]) -> dict[str, tuple[float, list[str]]]:
    """{task: (score, its rows)} in GLUE order; a task's score is the mean over its rows of each row's mean."""

    rows: dict[str, list[str]] = {}
    for row in per_task:
        rows.setdefault(_task_of(row), []).append(row)
    out = {}
    for task in (t for t in GLUE_TASKS if t in rows):
        names = GLUE_TASKS[task].metrics
        out[task] = (float(np.mean([main_value(per_task[r], names) for r in rows[task]])), sorted(rows[task]))
    return out


def glue_score(per_task: dict[str, dict[str, float]]) -> float:
    """The GLUE score: the mean over tasks of each task's score (the mean of its GLUE metrics).

    Args:
        per_task: {row: {metric: value}}, a row per evaluated split, keyed as `glue_row` names them: the task
            name ("sst2"), or for MNLI "mnli-m" and "mnli-mm", averaged into one MNLI task. Each row must hold
            its task's `GlueTask.metrics`; other keys (a loss, per-type scores) are ignored. WNLI counts like
            any task. Only the tasks present are averaged.

    Returns:
        The score in 0..1.
    """
    scores = _task_scores(per_task)
    if not scores:
        raise ValueError("no GLUE tasks to average")
    return float(np.mean([score for score, _ in scores.values()]))


def glue_table(per_task: dict[str, dict[str, float]]) -> str:
    """A Markdown table of `glue_score`'s input: a row per task (metrics and task score, x100 with one decimal)
    and a last "GLUE score" row naming how many of the nine tasks it averages."""

    scores = _task_scores(per_task)
    lines = ["| task | metrics | score |", "|---|---|---:|"]
    for task, (score, rows) in scores.items():
        parts = []
        for row in rows:
            where = "" if row == task else f" ({row[len(task) + 1 :]})"
            parts += [f"{name}{where} {100 * per_task[row][name]:.1f}" for name in GLUE_TASKS[task].metrics]
        lines.append(f"| {task} | {' / '.join(parts)} | {100 * score:.1f} |")
    overall = np.mean([score for score, _ in scores.values()]) if scores else float("nan")
    lines.append(f"| **GLUE score** ({len(scores)} of {len(GLUE_TASKS)} tasks) | | **{100 * overall:.1f}** |")
    return "\n".join(lines) + "\n"
