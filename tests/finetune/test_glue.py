"""tcli glue: two tiny GLUE-layout tasks (MNLI with both dev splits, RTE) from init none, two seeds; the table,
the score's arithmetic, glue.json/glue.md, re-running resumes nothing that finished; bad arguments write nothing."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from transformer_cli.cli import app

WORDS = {
    "entailment": "cat sat mat".split(),
    "contradiction": "dog ran house".split(),
    "neutral": "bird flew tree".split(),
    "not_entailment": "dog ran house".split(),
}
TINY = [
    "model.d_model=16",
    "model.layers=1",
    "model.heads=2",
    "model.ffn_dim=32",
    "model.max_positions=32",
    "vocab.size=40",
    "data.max_seq_len=24",
    "train.batch_size=8",
    "train.max_epochs=2",
    "train.lr=0.001",
    "train.precision=fp32",
]


def _rows(labels: tuple[str, ...], n: int, seed: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(labels)
        a = " ".join(rng.choice(WORDS[label]) for _ in range(rng.randint(2, 5)))
        rows.append((a, "the " + a.split()[0], label))
    return rows


def _write(path: Path, header: str, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + "\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("glue_data")
    nli3 = ("contradiction", "entailment", "neutral")
    for split, n, seed in (("train", 40, 0), ("dev_matched", 12, 1), ("dev_mismatched", 12, 2)):
        rows = _rows(nli3, n, seed)
        _write(
            root / "MNLI" / f"{split}.tsv",
            "index\tsentence1\tsentence2\tgold_label",
            [f"{i}\t{a}\t{b}\t{y}" for i, (a, b, y) in enumerate(rows)],
        )
    for split, n, seed in (("train", 32, 3), ("dev", 12, 4)):
        rows = _rows(("entailment", "not_entailment"), n, seed)
        _write(
            root / "RTE" / f"{split}.tsv",
            "index\tsentence1\tsentence2\tlabel",
            [f"{i}\t{a}\t{b}\t{y}" for i, (a, b, y) in enumerate(rows)],
        )
    return root


def _glue(*args: str):
    return CliRunner().invoke(app, ["glue", *args, "--device", "cpu", "--quiet"])


def _sets(**replace: str) -> list[str]:
    """TINY as --set options, with `replace`'s keys (dots written as __) given other values."""
    pairs = dict(s.split("=", 1) for s in TINY)
    pairs.update({key.replace("__", "."): value for key, value in replace.items()})
    return [x for key, value in pairs.items() for x in ("--set", f"{key}={value}")]


@pytest.fixture(scope="module")
def glue_run(tmp_path_factory, glue_dir) -> tuple[Path, list[str], str]:
    out = tmp_path_factory.mktemp("glue") / "out"
    args = ["--checkpoint", "none", "--data-dir", str(glue_dir), "--seeds", "2", "--out", str(out), *_sets()]
    result = _glue(*args)
    assert result.exit_code == 0, result.output
    return out, args, result.stdout


def _evals(run: Path) -> list[dict]:
    return [e for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if e["event"] == "eval"]


def test_glue_runs_every_task_and_seed_and_reports_medians(glue_run):
    out, _, stdout = glue_run
    summary = json.loads((out / "glue.json").read_text())
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["mnli-seed1", "mnli-seed2", "rte-seed1", "rte-seed2"]
    assert summary["seeds"] == [1, 2] and set(summary["tasks"]) == {"mnli-m", "mnli-mm", "rte"}
    # MNLI evaluates both dev splits; best.pt (and the row) is chosen on dev_matched
    for seed, rows in zip((1, 2), summary["per_seed"]["mnli"]):
        evals = _evals(out / f"mnli-seed{seed}")
        assert all("dev_mismatched/accuracy" in e for e in evals)
        best = max(evals, key=lambda e: e["accuracy"])
        assert rows == {
            "mnli-m": {"accuracy": best["accuracy"]},
            "mnli-mm": {"accuracy": best["dev_mismatched/accuracy"]},
        }
    # medians over the seeds, MNLI's two rows averaged into one task, then the mean over tasks
    tasks = summary["tasks"]
    for row, per_seed in (("mnli-m", summary["per_seed"]["mnli"]), ("rte", summary["per_seed"]["rte"])):
        assert tasks[row]["accuracy"] == pytest.approx(statistics.median(r[row]["accuracy"] for r in per_seed))
    mnli = (tasks["mnli-m"]["accuracy"] + tasks["mnli-mm"]["accuracy"]) / 2
    assert summary["score"] == pytest.approx((mnli + tasks["rte"]["accuracy"]) / 2)
    assert f"GLUE score {100 * summary['score']:.1f}" in stdout and "| mnli |" in stdout and "| rte |" in stdout
    assert (out / "glue.md").read_text().startswith("| task | metrics | score |")
    # the recipe: RTE trains 10 epochs by default; --set overrode it for every task
    config = (out / "rte-seed1" / "config.yaml").read_text()
    assert "max_epochs: 2" in config and "warmup_ratio: 0.1" in config and "glue: RTE" in config


def test_running_glue_again_skips_finished_runs(glue_run):
    out, args, stdout = glue_run
    before = {p: p.stat().st_mtime_ns for p in out.rglob("metrics.jsonl")}
    result = _glue(*args)
    assert result.exit_code == 0, result.output
    assert result.stdout == stdout
    assert before == {p: p.stat().st_mtime_ns for p in out.rglob("metrics.jsonl")}


def test_glue_arithmetic():
    from transformer_cli.finetune.glue import glue_score, glue_table, medians

    per_seed = [
        {"mrpc": {"f1": 0.9, "accuracy": 0.8}, "wnli": {"accuracy": 0.5}},
        {"mrpc": {"f1": 0.7, "accuracy": 0.9}, "wnli": {"accuracy": 0.4}},
        {"mrpc": {"f1": 0.8, "accuracy": 0.6}, "wnli": {"accuracy": 0.6}},
    ]
    per_task = medians(per_seed) | {"mnli-m": {"accuracy": 0.8}, "mnli-mm": {"accuracy": 0.7}}
    assert per_task["mrpc"] == {"f1": 0.8, "accuracy": 0.8} and per_task["wnli"] == {"accuracy": 0.5}
    # mnli (0.8 + 0.7) / 2, mrpc (0.8 + 0.8) / 2, wnli 0.5 (counted like any task)
    assert glue_score(per_task) == pytest.approx((0.75 + 0.8 + 0.5) / 3)
    table = glue_table(per_task)
    assert "| mnli | accuracy (m) 80.0 / accuracy (mm) 70.0 | 75.0 |" in table
    assert "| **GLUE score** (3 of 9 tasks) | | **68.3** |" in table


def test_bad_arguments_are_one_line_and_write_nothing(tmp_path, glue_dir):
    out = tmp_path / "out"
    for args, message in (
        (["--checkpoint", "none", "--data-dir", str(glue_dir), "--tasks", "rte,foo"], "unknown GLUE task 'foo'"),
        (["--checkpoint", "none", "--data-dir", str(glue_dir), "--tasks", "sst2"], "SST-2/train.tsv not found"),
        (["--checkpoint", str(tmp_path / "nope.pt"), "--data-dir", str(glue_dir)], "nope.pt not found"),
        (["--checkpoint", "none", "--data-dir", str(tmp_path)], "no GLUE task folder"),
        (["--checkpoint", "none", "--data-dir", str(glue_dir), "--set", "train.lrr=1"], "train.lrr"),
        # the message names the user's --set, not the recipe's own overrides
        (
            ["--checkpoint", "none", "--data-dir", str(glue_dir), "--set", "train.lr=-1"],
            "recipe with --set train.lr=-1: train.lr",
        ),
        # keys the recipe sets for each task are refused, with the option that sets them
        (["--checkpoint", "none", "--data-dir", str(glue_dir), "--set", "task.metrics=[f1]"], "task.metrics"),
        (["--checkpoint", "none", "--data-dir", str(glue_dir), "--set", "task.glue=RTE"], "--tasks"),
        (["--checkpoint", "none", "--data-dir", str(glue_dir), "--set", "data.dir=x"], "--data-dir"),
        (["--checkpoint", "none", "--data-dir", str(glue_dir), "--set", "model.init=none"], "--checkpoint"),
        (["--checkpoint", "none", "--data-dir", str(glue_dir), "--set", "data.text=x"], "own files and columns"),
        # a whole section would replace the keys glue sets (it trained CoLA in the WNLI folder, or ignored
        # --checkpoint)
        (["--checkpoint", "none", "--data-dir", str(glue_dir), "--set", "task={glue: CoLA}"], "set single keys"),
        (["--checkpoint", "none", "--data-dir", str(glue_dir), "--set", "model={init: none}"], "model.init"),
        # the seeds past the first must not overflow train.seed's bound
        (
            ["--checkpoint", "none", "--data-dir", str(glue_dir), "--seeds", "2", "--set", "train.seed=4294967295"],
            "--seeds 2 from train.seed 4294967295 would go past 4294967295",
        ),
    ):
        result = _glue(*args, "--out", str(out))
        assert result.exit_code == 2 and message in result.output, result.output
        assert result.output.count("\n") == 1 and not out.exists()
    # a run refused inside finetune (a model too small for max_seq_len) leaves no --out behind either
    result = _glue(
        "--checkpoint",
        "none",
        "--data-dir",
        str(glue_dir),
        "--out",
        str(out),
        *_sets(model__max_positions="16"),
    )
    assert result.exit_code == 2 and "max_seq_len" in result.output and not out.exists()


def test_a_starting_model_that_cannot_be_read_is_the_only_line(tmp_path, glue_dir):
    """Checked before the first run starts: the progress lines of that run came before the error."""
    notes = tmp_path / "notes.pt"
    notes.write_text("not a checkpoint\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["glue", "--checkpoint", str(notes), "--data-dir", str(glue_dir), "--out", str(out), "--device", "cpu"]
    )
    assert result.exit_code == 2 and "not a readable tcli checkpoint" in result.output, result.output
    assert result.output.count("\n") == 1 and not out.exists()


@pytest.mark.parametrize(
    "name, line, fragments",
    [
        # RTE comes after MNLI in GLUE's order: its bad row is found before MNLI trains
        ("dev.tsv", "99\tone\ttwo\tmaybe\n", ("dev.tsv:", "'maybe'")),
        # from scratch each task trains its own vocabulary: RTE's holds characters MNLI's does not, and vocab.size
        # 40 is enough for MNLI's only
        ("train.tsv", "99\tQXZJKVY 0123456789 PWGUE\tthe end\tentailment\n", ("vocab.size 40 is too small for", "RTE")),
    ],
)
def test_a_problem_of_a_later_task_stops_before_any_training(tmp_path, glue_dir, name, line, fragments):
    import shutil

    data = tmp_path / "glue_data"
    shutil.copytree(glue_dir, data)
    path = data / "RTE" / name
    path.write_text(path.read_text() + line)
    out = tmp_path / "out"
    result = _glue("--checkpoint", "none", "--data-dir", str(data), "--out", str(out), *_sets())
    assert result.exit_code == 2 and all(f in result.output for f in fragments), result.output
    assert not out.exists()


def test_glue_trains_each_vocabulary_once(tmp_path, glue_dir, monkeypatch):
    """The vocabulary glue trains to check it is the one the task's run uses: one training per task."""
    from transformer_cli.bert import setup as bert_setup
    from transformer_cli.finetune import setup as finetune_setup

    calls = []
    train = bert_setup.train_bert_vocab
    monkeypatch.setattr(finetune_setup, "_SCRATCH_VOCABS", {})
    monkeypatch.setattr(bert_setup, "train_bert_vocab", lambda *a, **k: calls.append(1) or train(*a, **k))
    out = tmp_path / "out"
    args = ("--checkpoint", "none", "--data-dir", str(glue_dir), "--tasks", "rte", "--seeds", "2", "--out", str(out))
    result = _glue(*args, *_sets(train__max_epochs="1"))
    assert result.exit_code == 0, result.output
    assert len(calls) == 1  # the seeds train on every sentence: the same vocabulary
    seeds = [(out / f"rte-seed{s}" / "vocab" / "bert.model").read_bytes() for s in (1, 2)]
    assert seeds[0] == seeds[1]


def test_out_holding_anything_but_a_glue_run_is_refused_and_left_as_it_was(tmp_path, glue_dir, glue_run):
    """glue.md and glue.json would overwrite the user's files: a folder with other entries, or with a glue.json
    that tcli did not write, is refused before any run; an earlier tcli glue folder is taken (resumed)."""
    args = ["--checkpoint", "none", "--data-dir", str(glue_dir), "--tasks", "rte", *_sets()]
    for name, text in (("notes.txt", "mine"), ("glue.md", "my table"), ("glue.json", '{"mine": 1}')):
        out = tmp_path / name
        out.mkdir()
        (out / name).write_text(text)
        result = _glue(*args, "--out", str(out))
        assert result.exit_code == 2 and "is not a tcli glue folder" in result.output, result.output
        assert result.output.count("\n") == 1
        assert [p.name for p in out.iterdir()] == [name] and (out / name).read_text() == text
    out, _, _ = glue_run  # glue.json, glue.md and <task>-seed<N> runs: accepted, nothing run again
    result = _glue("--checkpoint", "none", "--data-dir", str(glue_dir), "--seeds", "2", "--out", str(out), *_sets())
    assert result.exit_code == 0, result.output


def test_the_guides_recipe_table_is_the_code():
    from transformer_cli.data.labeled import GLUE_TASKS
    from transformer_cli.finetune.glue import EPOCHS

    readme = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "finetuning.md").read_text()
    header = next(line for line in readme.splitlines() if line.strip().startswith("| task | CoLA |"))
    epochs = next(line for line in readme.splitlines() if line.strip().startswith("| epochs |"))
    folders = [c.strip() for c in header.split("|")[2:-1]]
    assert folders == [t.folder for t in GLUE_TASKS.values()]
    assert [int(c) for c in epochs.split("|")[2:-1]] == list(EPOCHS.values())


def test_the_users_set_replaces_the_recipes_keys_and_seeds_count_from_train_seed(tmp_path, glue_dir):
    """Each run's config: the recipe, the user's --set on top (a key of both given once, the user's value), and
    --seeds N numbered from the user's train.seed."""
    from transformer_cli.finetune.glue import plan

    sets = [s for s in TINY if not s.startswith("train.lr=")] + [
        "train.seed=7",
        "train.lr=3e-5",
        "train.warmup_steps=4",
    ]
    runs = plan("none", glue_dir, ["rte"], 2, tmp_path / "out", sets)
    assert [(r.task, r.seed, r.cfg.train.seed) for r in runs] == [("rte", 7, 7), ("rte", 8, 8)]
    assert {(r.cfg.train.lr, r.cfg.train.warmup_steps, r.cfg.data.max_seq_len) for r in runs} == {(3e-5, 4, 24)}


def test_paths_that_look_like_yaml_stay_paths(tmp_path, glue_dir):
    """--data-dir and --checkpoint reach the config as YAML strings: `-` was read as a list ([None]), `null` as
    nothing, `[x]` as a list."""
    import shutil

    from transformer_cli.finetune.glue import plan

    odd = tmp_path / "[x] null"
    shutil.copytree(glue_dir, odd)
    (run,) = plan("none", odd, ["rte"], 1, tmp_path / "out", TINY)
    assert run.cfg.data.dir == str(odd) and run.cfg.model.init == "none"
