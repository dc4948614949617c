"""tcli finetune: from a tiny pretrained tcli BERT and from init none, on TSV/JSONL tables and a GLUE folder;
metrics, best.pt, exact resume after SIGKILL, a finished run untouched, bad rows refused before writing."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from transformer_cli.cli import app

from ..conftest import ROOT, run_killed, run_tcli, run_tcli_process

POSITIVE = "the cat sat on a mat with friend".split()
NEGATIVE = "dog ran to house in garden and".split()


def _sentences(n: int, seed: int) -> list[tuple[str, int]]:
    """Label 1: words of one group, label 0: of the other (a signal a 1-layer model learns in a few steps)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        y = rng.randint(0, 1)
        out.append((" ".join(rng.choice(POSITIVE if y else NEGATIVE) for _ in range(rng.randint(2, 8))), y))
    return out


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A tiny BERT pretrained for a few steps on the bundled toy stories (once per module)."""
    from transformer_cli.bert.setup import pretrain_bert
    from transformer_cli.config import BertRunConfig, load_config

    out = tmp_path_factory.mktemp("bert")
    sets = [
        "model.d_model=32",
        "model.layers=1",
        "model.heads=2",
        "model.ffn_dim=64",
        "model.max_positions=64",
        "vocab.size=200",
        "train.max_steps=8",
        "train.eval_every=8",
        "train.batch_size=8",
        "train.precision=fp32",
    ]
    cfg = load_config(BertRunConfig, ROOT / "configs" / "bert_quickstart.yaml", sets)
    pretrain_bert(cfg, out / "run", device="cpu", quiet=True)
    return out / "run" / "checkpoints" / "last.pt"


@pytest.fixture(scope="module")
def sst(tmp_path_factory) -> Path:
    """A sentiment table: the label is whether 'good' or 'bad' appears (TSV and JSONL, train and dev)."""
    folder = tmp_path_factory.mktemp("sst")
    for split, n, seed in (("train", 48, 0), ("dev", 16, 1)):
        rows = _sentences(n, seed)
        lines = ["sentence\tlabel", *(f"{s}\t{'pos' if y else 'neg'}" for s, y in rows)]
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")
        jsonl = [json.dumps({"a": s, "b": s.split()[0], "score": 4.0 * y + 0.5}) for s, y in rows]
        (folder / f"{split}.jsonl").write_text("\n".join(jsonl) + "\n")
    glue = folder / "glue" / "SST-2"
    glue.mkdir(parents=True)
    for split in ("train", "dev"):
        text = (folder / f"{split}.tsv").read_text().replace("\tpos", "\t1").replace("\tneg", "\t0")
        (glue / f"{split}.tsv").write_text(text)
    return folder


def write_config(path: Path, data: Path, init: str, *extra: str) -> Path:
    path.write_text(
        "\n".join(
            [
                "task: {kind: classification}",
                f"data: {{dir: {data}, train: train.tsv, valid: dev.tsv, text: sentence, label: label, "
                "max_seq_len: 24}",
                f"model: {{init: {init}, classifier_dropout: 0.0}}",
                "train: {batch_size: 8, max_epochs: 2, lr: 0.01, eval_every: 4, log_every: 2, precision: fp32,"
                " keep_last: 1}",
                *extra,
            ]
        )
        + "\n"
    )
    return path


def invoke(*args: str):
    return CliRunner().invoke(app, [*args, "--device", "cpu", "--quiet"])


def events(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_bert, sst) -> Path:
    """The run of a classifier fine-tuned from the tiny BERT for 4 epochs (once per module)."""
    folder = tmp_path_factory.mktemp("ft")
    cfg = write_config(folder / "ft.yaml", sst, str(tiny_bert), "")
    result = invoke("finetune", "--config", str(cfg), "--out", str(folder / "run"), "--set", "train.max_epochs=4")
    assert result.exit_code == 0, result.output
    return folder / "run"


def test_finetune_from_tcli_checkpoint_learns_and_keeps_best(finetuned, sst):
    run = finetuned
    cfg = run.parent / "ft.yaml"
    evals = events(run, "eval")
    assert {"accuracy", "score"} <= set(evals[-1])
    # evaluated every 4 steps and at each epoch end (48 examples / 8 = 6 steps an epoch)
    assert [e["step"] for e in evals] == [4, 6, 8, 12, 16, 18, 20, 24]
    assert max(e["accuracy"] for e in evals) >= 0.9
    # speed in examples/s as well as tokens/s: their ratio is the interval's real tokens per example, which lies
    # between [CLS] word [SEP] and the longest example
    longest = max(len(line.split()) for line in (sst / "train.tsv").read_text().splitlines()[1:])
    for e in events(run, "train"):
        assert e["examples_per_sec"] > 0 and 3 <= e["tokens_per_sec"] / e["examples_per_sec"] <= 3 * longest
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    assert best["train_state"]["best"] == max(e["score"] for e in evals)
    assert best["finetune"]["labels"] == ["neg", "pos"]
    assert "classifier.weight" in best["model"] and "bert.nsp_head.weight" not in best["model"]
    assert (run / "vocab" / "bert.model").is_file()
    # the shared lifecycle's run directory: run.json, the tokenizer and what it came from in vocab/, no data/
    marker = json.loads((run / "run.json").read_text())
    assert marker["kind"] == "finetune" and marker["status"] == "finished" and marker["finished_step"] == 24
    assert json.loads((run / "vocab" / "vocab.json").read_text())["tokenizer"] == "sentencepiece"
    assert not (run / "data").exists()
    # a finished run: exit 0, nothing touched; a resume that changes the model is refused
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    again = invoke(
        "finetune", "--config", str(cfg), "--out", str(run), "--set", "train.max_epochs=4", "--resume", "auto"
    )
    assert again.exit_code == 0
    changed = invoke("finetune", "--config", str(cfg), "--out", str(run), "--set", "model.classifier_dropout=0.3")
    assert changed.exit_code == 2 and "already holds a run" in changed.output
    changed = invoke(
        "finetune", "--config", str(cfg), "--out", str(run), "--resume", "auto", "--set", "model.classifier_dropout=0.3"
    )
    assert changed.exit_code == 2 and "model.classifier_dropout changed" in changed.output
    assert before == {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != ".lock"}


def test_finetune_init_none_regression_on_jsonl(tmp_path, sst):
    cfg = tmp_path / "reg.yaml"
    cfg.write_text(
        "task: {kind: regression}\n"
        f"data: {{dir: {sst}, train: train.jsonl, valid: dev.jsonl, text: a, pair: b, label: score, max_seq_len: 16}}\n"
        "model: {init: none, d_model: 16, layers: 1, heads: 2, ffn_dim: 32, max_positions: 32}\n"
        "vocab: {size: 60}\n"
        "train: {batch_size: 8, max_steps: 6, eval_every: 3, lr: 0.001, precision: fp32}\n"
    )
    result = invoke("finetune", "--config", str(cfg), "--out", str(tmp_path / "run"), "--pad-to-max")
    assert result.exit_code == 0, result.output
    last = events(tmp_path / "run", "eval")[-1]
    assert {"pearson", "spearman", "score"} <= set(last)
    # 16 positions (max_seq_len) in every batch: the tokens counted are the real ones, the shapes padded
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert state["finetune"]["kind"] == "regression" and state["finetune"]["labels"] == []
    assert state["config"]["train"]["pad_to_max"] is True


def test_a_diverged_run_says_so_in_one_line_without_torchs_warning(tmp_path):
    """A weight decay that multiplies the weights by -2e7 an update overflows them within a few steps: the skipped
    updates still step the schedule, and torch's warning that the optimizer did not step reached stderr beside the
    one line. (Targets of 1e30, which overflowed the squared error, are refused when the file is read.)"""
    rows = "".join(f"{text}\t{score}\n" for text, score in [("the cat sat", 1.0), ("dog ran home", 2.0)] * 120)
    for split in ("train", "dev"):
        (tmp_path / f"{split}.tsv").write_text("sentence\tscore\n" + rows)
    cfg = tmp_path / "reg.yaml"
    cfg.write_text(
        "task: {kind: regression}\n"
        f"data: {{dir: {tmp_path}, label: score, max_seq_len: 16}}\n"
        "model: {init: none, d_model: 16, layers: 1, heads: 2, ffn_dim: 32, max_positions: 32}\n"
        "vocab: {size: 40}\n"
        "train: {batch_size: 8, max_steps: 30, eval_every: 30, precision: fp32, lr: 0.00002, weight_decay: 1e12}\n"
    )
    # a process of its own: torch warns once per process, and this one's tests may have met that warning before
    result = run_tcli_process("finetune", "--config", cfg, "--out", tmp_path / "run", "--device", "cpu", "-q")
    assert result.returncode == 2 and result.stderr.startswith("error: training diverged"), result.stderr
    assert result.stderr.count("\n") == 1 and "in a row" in result.stderr and "weight_decay" in result.stderr


def test_f1_of_a_task_with_three_labels_is_refused_before_any_write(tmp_path):
    """`f1` is the positive class's F1 (MRPC, QQP): on labels a/b/c it scored class b alone, and chose best.pt by it."""
    rows = "".join(f"{text}\t{label}\n" for text, label in [("the cat", "a"), ("dog ran", "b"), ("a mat", "c")] * 8)
    for split in ("train", "dev"):
        (tmp_path / f"{split}.tsv").write_text("sentence\tlabel\n" + rows)
    cfg = tmp_path / "three.yaml"
    cfg.write_text(
        f"data: {{dir: {tmp_path}, max_seq_len: 16}}\n"
        "model: {init: none, d_model: 16, layers: 1, heads: 2, ffn_dim: 32, max_positions: 32}\n"
        "vocab: {size: 40}\n"
        "train: {batch_size: 8, max_steps: 2, eval_every: 2, precision: fp32}\n"
    )
    for metrics in ("[f1]", "[accuracy, f1]"):
        result = invoke(
            "finetune", "--config", str(cfg), "--out", str(tmp_path / "run"), "--set", f"task.metrics={metrics}"
        )
        assert result.exit_code == 2 and "needs two labels" in result.output and "has 3" in result.output, result.output
        assert not (tmp_path / "run").exists()
    result = invoke("finetune", "--config", str(cfg), "--out", str(tmp_path / "run"), "--set", "task.metrics=[mcc]")
    assert result.exit_code == 0, result.output


def test_finetune_glue_folder_by_task_name(tmp_path, tiny_bert, sst):
    cfg = tmp_path / "glue.yaml"
    cfg.write_text(
        f"task: {{glue: SST-2}}\ndata: {{dir: {sst / 'glue'}, max_seq_len: 24}}\nmodel: {{init: {tiny_bert}}}\n"
        "train: {batch_size: 16, max_steps: 2, eval_every: 2, precision: fp32}\n"
    )
    result = invoke("finetune", "--config", str(cfg), "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert "accuracy" in events(tmp_path / "run", "eval")[-1]
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert state["finetune"]["labels"] == ["0", "1"]


def test_bad_row_is_one_line_and_writes_nothing(tmp_path, tiny_bert, sst):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\na cat\tpos\nthe dog\t\n")
    (data / "dev.tsv").write_text((sst / "dev.tsv").read_text())
    cfg = write_config(tmp_path / "bad.yaml", data, str(tiny_bert))
    result = run_tcli("finetune", "--config", str(cfg), "--out", str(tmp_path / "run"), "--device", "cpu")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "train.tsv:3" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()
    # a dev label training never saw
    (data / "train.tsv").write_text((sst / "train.tsv").read_text())
    (data / "dev.tsv").write_text("sentence\tlabel\na cat\tmaybe\n")
    result = invoke("finetune", "--config", str(cfg), "--out", str(tmp_path / "run"))
    assert result.exit_code == 2 and "dev.tsv:2" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_resume_after_sigkill_is_exact(tmp_path, tiny_bert, sst):
    """Killed after step 5 (mid-epoch, between evaluations) and resumed = uninterrupted, bitwise (CPU, fp32)."""
    cfg = write_config(tmp_path / "ft.yaml", sst, str(tiny_bert))
    common = ("finetune", "--config", str(cfg), "--device", "cpu", "--quiet", "--set", "model.classifier_dropout=0.1")
    full = run_tcli(*common, "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    killed = run_killed(5, "step", *common, "--out", str(tmp_path / "cut"))
    assert killed.returncode != 0
    resumed = run_tcli(*common, "--out", str(tmp_path / "cut"), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    steps = [e["step"] for e in events(tmp_path / "cut", "train")]
    assert steps == sorted(set(steps))


def test_a_resume_refuses_a_changed_dev_file(tmp_path, tiny_bert, sst):
    """best.pt and early stopping compare dev scores across a resume: a dev file changed (a row appended) between
    the two would compare scores on two sets; refused as changed training data is, and the same file resumes."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(sst, data)
    cfg = write_config(tmp_path / "ft.yaml", data, str(tiny_bert))
    run = tmp_path / "run"
    assert invoke("finetune", "--config", str(cfg), "--out", str(run), "--set", "train.max_steps=2").exit_code == 0
    original = (data / "dev.tsv").read_bytes()
    (data / "dev.tsv").write_bytes(original + b"a good extra row\tpos\n")
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    result = invoke(
        "finetune", "--config", str(cfg), "--out", str(run), "--resume", "auto", "--set", "train.max_steps=4"
    )
    assert result.exit_code == 2 and "differ from those" in result.output, result.output
    assert "the validation data (dev.tsv) differ" in result.output and "compared by sha256" in result.output
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before
    (data / "dev.tsv").write_bytes(original)
    again = invoke(
        "finetune", "--config", str(cfg), "--out", str(run), "--resume", "auto", "--set", "train.max_steps=4"
    )
    assert again.exit_code == 0, again.output


def test_shipped_finetune_configs_load():
    from transformer_cli.config import FinetuneRunConfig, load_config

    assert load_config(FinetuneRunConfig, ROOT / "configs" / "finetune_sst2.yaml").task.glue == "SST-2"
    assert load_config(FinetuneRunConfig, ROOT / "configs" / "finetune_conll2003.yaml").task.kind == "tagging"


def test_predict_table_stdin_and_output_agree_with_the_dev_evaluation(tmp_path, finetuned, sst):
    best = finetuned / "checkpoints" / "best.pt"
    result = CliRunner().invoke(
        app, ["predict", "--checkpoint", str(best), "-i", str(sst / "dev.tsv"), "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    gold = [line.split("\t")[1] for line in (sst / "dev.tsv").read_text().splitlines()[1:]]
    assert len(rows) == len(gold) and all(0.5 <= float(p) <= 1.0 for _, p in rows)
    accuracy = sum(label == g for (label, _), g in zip(rows, gold)) / len(gold)
    best_eval = max(events(finetuned, "eval"), key=lambda e: e["score"])
    assert accuracy == pytest.approx(best_eval["accuracy"])
    # plain lines from stdin, and --output
    out = tmp_path / "pred.txt"
    texts = [line.split("\t")[0] for line in (sst / "dev.tsv").read_text().splitlines()[1:4]]
    args = ["predict", "--checkpoint", str(best), "--output", str(out), "--device", "cpu"]
    result = CliRunner().invoke(app, args, input="\n".join(texts) + "\n")
    assert result.exit_code == 0, result.output
    assert out.read_text().splitlines() == result_lines(rows[:3])
    assert "predicted 3 examples" in result.stderr
    # an empty input: nothing written, exit 0 as for any filter, and a warning instead of silence
    result = CliRunner().invoke(app, ["predict", "--checkpoint", str(best), "--device", "cpu"], input="")
    assert result.exit_code == 0 and result.stdout == "" and "standard input holds no examples" in result.stderr


def result_lines(rows: list[list[str]]) -> list[str]:
    return ["\t".join(r) for r in rows]


def test_predict_refuses_a_pretraining_checkpoint_and_an_empty_line(tmp_path, tiny_bert, finetuned):
    result = CliRunner().invoke(app, ["predict", "--checkpoint", str(tiny_bert), "--device", "cpu"], input="a cat\n")
    assert result.exit_code == 2 and "not a finetune model" in result.output
    best = finetuned / "checkpoints" / "best.pt"
    result = CliRunner().invoke(app, ["predict", "--checkpoint", str(best), "--device", "cpu"], input="a cat\n\n")
    assert result.exit_code == 2 and "<stdin>:2: empty line" in result.output
    # a table's rows as plain lines: the header and each label were predicted as text, in silence
    for lines in ("sentence\tlabel\nthe cat\t1\n", "a cat\ta\tb\n"):
        result = CliRunner().invoke(app, ["predict", "--checkpoint", str(best), "--device", "cpu"], input=lines)
        assert result.exit_code == 2 and "<stdin>:1: a tab in a line" in result.output, result.output


@pytest.mark.parametrize(
    "key,value",
    [
        ("max_seq_len", 0),  # crashed the packing (pop from an empty list)
        ("max_seq_len", -5),
        ("max_seq_len", 10**9),  # beyond the encoder's positions: crashed its embedding
        ("max_seq_len", "128"),
        ("vocab_size", "abc"),
        ("vocab_size", 3),
        ("classifier_dropout", 2.0),
        ("classifier_dropout", None),
    ],
)
def test_damaged_fine_tuning_numbers_are_one_line(tmp_path, finetuned, key, value):
    state = torch.load(finetuned / "checkpoints" / "best.pt", weights_only=True)
    state["finetune"][key] = value
    damaged = tmp_path / "damaged.pt"
    torch.save(state, damaged)
    for command in (["predict", "--checkpoint", str(damaged)], ["count-params", "--checkpoint", str(damaged)]):
        result = CliRunner().invoke(app, command, input="a cat sat " * 50 + "\n")
        assert result.exit_code == 2 and f"the stored {key}" in result.output, result.output


@pytest.mark.parametrize("labels", [[], ["0"], ["0", "0"], ["0", 1], "01", ["0", "1\x00"]])
def test_a_damaged_label_set_is_one_line(tmp_path, finetuned, labels):
    """A classifier's labels: two or more distinct strings (none printed torch's warning about a zero-size head)."""
    state = torch.load(finetuned / "checkpoints" / "best.pt", weights_only=True)
    state["finetune"]["labels"] = labels
    damaged = tmp_path / "damaged.pt"
    torch.save(state, damaged)
    for command in (["predict", "--checkpoint", str(damaged)], ["count-params", "--checkpoint", str(damaged)]):
        result = CliRunner().invoke(app, command, input="a cat sat\n")
        assert result.exit_code == 2 and result.output.startswith("error: "), result.output
        assert "stored label set of its classification head is damaged" in result.output, result.output
        assert result.output.count("\n") == 1, result.output


def test_a_checkpoint_whose_head_disagrees_with_its_run_is_refused(tmp_path, finetuned):
    """A fine-tuned checkpoint read as another kind than its config's (a classifier's 2 outputs tagged words), or
    resumed with a label list or max_seq_len other than its run's (a KeyError at the first batch, after the logs
    were opened): one line, the run folder as it was."""
    import hashlib
    import shutil

    state = torch.load(finetuned / "checkpoints" / "last.pt", weights_only=True)
    state["finetune"]["kind"] = "tagging"
    torch.save(state, tmp_path / "kind.pt")
    for command in ("predict", "count-params", "evaluate"):
        args = ["--split", "valid"] if command == "evaluate" else []
        result = CliRunner().invoke(app, [command, "--checkpoint", str(tmp_path / "kind.pt"), *args], input="a b\n")
        assert result.exit_code == 2 and "metadata says tagging but its config's task.kind is classification" in (
            result.output
        ), result.output
    for key, value in (("labels", ["neg", "other"]), ("max_seq_len", 20)):
        run = tmp_path / key
        shutil.copytree(finetuned, run)
        state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
        state["finetune"][key] = value
        torch.save(state, run / "checkpoints" / "last.pt")
        before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}
        cfg = finetuned.parent / "ft.yaml"
        result = invoke(
            "finetune", "--config", str(cfg), "--out", str(run), "--resume", "auto", "--set", "train.max_epochs=5"
        )
        assert result.exit_code == 2 and f"{key} " in result.output and "in the checkpoint" in result.output, (
            result.output
        )
        assert before == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}


def test_predict_never_writes_over_what_it_reads_nor_an_output_it_cannot_replace(tmp_path, finetuned, sst):
    """--output naming the checkpoint or the input (a link to it too) is refused before any work; a predict that
    fails before its first line leaves an existing --output as it was; an empty input gives an empty file; a
    device that refuses the write is one line."""
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes((finetuned / "checkpoints" / "best.pt").read_bytes())
    lines = tmp_path / "in.txt"
    lines.write_text("the cat sat\n")
    (tmp_path / "link.txt").symlink_to(lines)
    before = {p: p.read_bytes() for p in (ckpt, lines)}

    def predict(*args: str, input: str | None = None):
        return CliRunner().invoke(app, ["predict", "--checkpoint", str(ckpt), *args, "--device", "cpu"], input=input)

    for args, named in (
        (["-i", str(lines), "-o", str(ckpt)], "--checkpoint"),
        (["-i", str(lines), "-o", str(lines)], "--input"),
        (["-i", str(lines), "-o", str(tmp_path / "link.txt")], "--input"),
        (["-o", str(ckpt)], "--checkpoint"),
    ):
        result = predict(*args, input="a cat\n")
        assert result.exit_code == 2 and f"is the same file as {named}" in result.output, result.output
        assert result.output.count("\n") == 1
    assert {p: p.read_bytes() for p in before} == before
    kept = tmp_path / "kept.txt"
    bad_table = tmp_path / "bad.tsv"
    bad_table.write_text("words\tlabel\nthe cat\tpos\n")
    for args, input, message in (
        (["-i", str(bad_table)], None, "sentence"),  # the model's text column is missing
        ([], "\nthe cat\n", "<stdin>:1: empty line"),
        (["-i", str(tmp_path / "missing.txt")], None, "missing.txt"),
    ):
        kept.write_text("earlier predictions\n")
        result = predict(*args, "-o", str(kept), input=input)
        assert result.exit_code == 2 and message in result.output, result.output
        assert kept.read_text() == "earlier predictions\n"
    result = predict("-o", str(kept), input="")
    assert result.exit_code == 0 and kept.read_text() == ""
    if Path("/dev/full").exists():  # every write fails there: No space left on device
        result = predict("-o", "/dev/full", input="the cat\n")
        assert result.exit_code == 2 and "--output /dev/full: cannot write" in result.output, result.output
        assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_a_folder_where_a_file_goes_is_named_as_one(tmp_path, finetuned):
    (tmp_path / "train.tsv").mkdir()
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\na cat\tpos\n")
    cfg = write_config(tmp_path / "ft.yaml", tmp_path, "none", "")
    result = invoke("finetune", "--config", str(cfg), "--out", str(tmp_path / "run"))
    assert result.exit_code == 2 and "train.tsv is a folder, not a file" in result.output, result.output
    best = str(finetuned / "checkpoints" / "best.pt")
    result = CliRunner().invoke(app, ["evaluate", "--checkpoint", best, "-i", str(tmp_path), "--device", "cpu"])
    assert result.exit_code == 2 and f"--input {tmp_path} is a folder, not a file" in result.output, result.output


def test_tagging_on_conll_first_pieces_and_word_tag_output(tmp_path):
    """CoNLL files, a tag per word at its first piece; entity scores; predict writes `word tag` lines."""
    rng = random.Random(3)
    sentences = []
    for _ in range(24):
        words = [rng.choice(POSITIVE + NEGATIVE) for _ in range(rng.randint(2, 6))]
        sentences.append("\n".join(f"{w} {'B-ANI' if w in ('cat', 'dog') else 'O'}" for w in words))
    for split in ("train", "dev"):
        (tmp_path / f"{split}.conll").write_text("-DOCSTART- O\n\n" + "\n\n".join(sentences) + "\n")
    cfg = tmp_path / "tag.yaml"
    cfg.write_text(
        "task: {kind: tagging}\n"
        f"data: {{dir: {tmp_path}, train: train.conll, valid: dev.conll, max_seq_len: 16}}\n"
        "model: {init: none, d_model: 16, layers: 1, heads: 2, ffn_dim: 32, max_positions: 16}\n"
        "vocab: {size: 40}\n"
        "train: {batch_size: 8, max_steps: 4, eval_every: 4, lr: 0.001, precision: fp32}\n"
    )
    result = invoke("finetune", "--config", str(cfg), "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    last = events(tmp_path / "run", "eval")[-1]
    assert {"entity_f1", "entity_precision", "entity_recall", "score"} <= set(last)
    assert last["score"] == last["entity_f1"]  # best.pt by entity F1; precision and recall are reported beside it
    best = tmp_path / "run" / "checkpoints" / "last.pt"
    result = CliRunner().invoke(app, ["predict", "--checkpoint", str(best), "--device", "cpu"], input="the cat sat\n")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["the", "cat", "sat"] and lines[3] == ""
    assert all(line.split()[1] in ("B-ANI", "O") for line in lines[:3])
    # more words than max_seq_len holds: every word still gets a line, and stderr says which were not read
    result = CliRunner().invoke(
        app, ["predict", "--checkpoint", str(best), "--device", "cpu"], input="cat\n" + "cat " * 40
    )
    assert result.exit_code == 0, result.output
    assert len([line for line in result.stdout.splitlines() if line]) == 41
    assert "warning: line 2: " in result.stderr and "of its 40 words fit" in result.stderr
    assert "line 1" not in result.stderr
    # a CoNLL file's rows given as plain lines (a .txt, as CoNLL-2003 ships) were tagged column by column
    rows = tmp_path / "rows.txt"
    for text in ("cat NN B-ANI\nsat VB O\n", "cat B-ANI\nsat O\n\ndog B-ANI\n", "-DOCSTART- O\n\ncat B-ANI\n"):
        rows.write_text(text)
        result = CliRunner().invoke(app, ["predict", "--checkpoint", str(best), "-i", str(rows), "--device", "cpu"])
        assert result.exit_code == 2 and "are a CoNLL file's rows" in result.output and not result.stdout, result.output
    rows.write_text("cat sat O\nthe dog ran\n")  # sentences, one ending in a tag's name
    assert CliRunner().invoke(app, ["predict", "--checkpoint", str(best), "-i", str(rows)]).exit_code == 0


def test_first_piece_labels():
    from transformer_cli.kinds.finetuned import encode_tagged
    from transformer_cli.models.losses import IGNORE
    from transformer_cli.vocab.bert_tokenizer import BertTokenizer
    from transformer_cli.vocab.spm import train_vocab

    vocab = train_vocab(
        ["the cat sat on a mat"] * 5,
        30,
        pad_piece="[PAD]",
        unk_piece="[UNK]",
        control_symbols=("[CLS]", "[SEP]", "[MASK]"),
        bos_eos=False,
    )
    tok = BertTokenizer("sentencepiece", vocab.model_bytes)
    words = ["the", "catsat", "mat"]
    feats = encode_tagged(tok, [words], [[1, 2, 3]], 64)
    pieces = tok.encode_words(words)
    ids, labels, firsts = feats.ids[0], feats.labels[0], feats.first_pieces[0]
    assert ids == [tok.cls_id, *sum(pieces, []), tok.sep_id]
    assert firsts == [1, 1 + len(pieces[0]), 1 + len(pieces[0]) + len(pieces[1])]
    assert [labels[i] for i in firsts] == [1, 2, 3]
    assert sum(x != IGNORE for x in labels) == 3
    cut = encode_tagged(tok, [words], [[1, 2, 3]], 4)  # room for 2 pieces: later words are lost, counted
    assert len(cut.ids[0]) <= 4 and cut.truncated == 1 and cut.words_lost >= 1


def test_pre_norm_bert_fine_tunes_from_its_checkpoint_and_export_hf_refuses_it(tmp_path, sst):
    """A pre-norm pretrained BERT starts fine-tuning with every weight it has (its final LayerNorm included),
    the fine-tuned model keeps its norm, `init: none` builds the same shape, and export-hf refuses both
    checkpoints in one line (HF BertModel is post-norm)."""
    from transformer_cli.bert.setup import pretrain_bert
    from transformer_cli.checkpoint import read_checkpoint
    from transformer_cli.config import BertRunConfig, FinetuneRunConfig, load_config
    from transformer_cli.finetune.setup import read_labelled, resolve_init

    sets = ["model.d_model=16", "model.layers=1", "model.heads=2", "model.ffn_dim=32", "model.max_positions=32"]
    sets += ["model.norm=pre", "vocab.size=200", "train.max_steps=2", "train.eval_every=2", "train.batch_size=4"]
    sets += ["train.precision=fp32", "data.max_seq_len=32"]
    bert_cfg = load_config(BertRunConfig, ROOT / "configs" / "bert_quickstart.yaml", sets)
    pretrain_bert(bert_cfg, tmp_path / "pre", "cpu", quiet=True)
    pre = tmp_path / "pre" / "checkpoints" / "last.pt"
    config = write_config(tmp_path / "ft.yaml", sst, str(pre))
    cfg = load_config(FinetuneRunConfig, config, [])
    source = resolve_init(cfg, read_labelled(cfg))
    pretrained = read_checkpoint(pre, kind="bert").weights
    assert source.encoder.norm == "pre"
    torch.testing.assert_close(source.weights["bert.final_norm.weight"], pretrained["final_norm.weight"])
    result = invoke("finetune", "--config", str(config), "--out", str(tmp_path / "ft"), "--set", "train.max_steps=2")
    assert result.exit_code == 0, result.output
    state = torch.load(tmp_path / "ft" / "checkpoints" / "last.pt", weights_only=True)
    assert state["finetune"]["encoder"]["norm"] == "pre" and "bert.final_norm.weight" in state["model"]
    for ckpt in (pre, tmp_path / "ft" / "checkpoints" / "last.pt"):
        done = run_tcli("export-hf", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf"))
        assert done.returncode == 2 and "pre-norm BERT (model.norm: pre)" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "hf").exists()
        counted = run_tcli("count-params", "--checkpoint", str(ckpt), "--json")
        assert counted.returncode == 0, counted.stderr
        report = json.loads(counted.stdout)
        assert report["formula_matches"] and report["sizes"]["norm"] == "pre"
    done = run_tcli("fill-mask", "--checkpoint", str(pre), "the cat [MASK] on the mat")
    assert done.returncode == 0 and "[MASK] 1" in done.stdout, done.stderr
    scratch = write_config(tmp_path / "none.yaml", sst, "none", "vocab: {size: 60}")
    result = invoke(
        "finetune", "--config", str(scratch), "--out", str(tmp_path / "none"), "--set", "train.max_steps=1",
        "--set", "model.norm=pre", "--set", "model.d_model=16", "--set", "model.layers=1", "--set", "model.heads=2",
        "--set", "model.ffn_dim=32", "--set", "model.max_positions=32",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "bert.final_norm.weight" in torch.load(tmp_path / "none" / "checkpoints" / "last.pt")["model"]


def _features(lengths: list[int]) -> Any:
    from transformer_cli.kinds.finetuned import Features

    return Features(ids=[[5] * n for n in lengths], types=[[0] * n for n in lengths], labels=[0] * len(lengths))


def test_batch_widths_come_from_a_small_set_where_kernels_compile_per_shape():
    """Where matmuls compile a kernel per shape (bf16 on a CPU), training and evaluation batches are padded to one
    of 8 widths per doubling of their longest member (at most 12.5% padding), capped at max_seq_len: each exact
    width would bring its own kernels, more than oneDNN's cache holds (MRPC compiled them again every epoch).
    Elsewhere (fp32: MKL compiles nothing) to their longest member, or the next multiple of pad_to_multiple."""
    from types import SimpleNamespace

    from transformer_cli.core.buckets import bucket
    from transformer_cli.finetune.task import FinetuneTask
    from transformer_cli.kinds.finetuned import predict_logits
    from transformer_cli.runtime.device import Runtime

    max_seq_len = 100
    lengths = list(range(1, max_seq_len + 1))
    task = object.__new__(FinetuneTask)
    task.train = _features(lengths)
    task.meta = SimpleNamespace(max_seq_len=max_seq_len, tokenizer=SimpleNamespace(pad_id=0), kind="classification")

    def widths(bucketed: bool, **train) -> list[int]:
        task.bucketed = bucketed
        task.cfg = SimpleNamespace(train=SimpleNamespace(**{"pad_to_max": False, "pad_to_multiple": 1, **train}))
        return [task.make_batch([n - 1, 0], epoch=0).input_ids.size(1) for n in lengths]

    for multiple in (1, 8):
        got = widths(True, pad_to_multiple=multiple)
        for n, w in zip(lengths, got):
            assert n <= w <= max(n, max_seq_len) and (w == max_seq_len or w == bucket(n, multiple)), (n, w)
            assert w - n <= max(multiple - 1, n // 8), (n, w)  # at most 12.5% (or the multiple's rounding)
        assert len(set(got)) <= 40  # of 100 lengths: 8 per doubling
        exact = widths(False, pad_to_multiple=multiple)
        assert exact == [min(-(-n // multiple) * multiple, max_seq_len) for n in lengths]
    assert set(widths(True, pad_to_max=True)) == set(widths(False, pad_to_max=True)) == {max_seq_len}

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.widths: list[int] = []

        def forward(self, ids, types):
            self.widths.append(ids.size(1))
            return torch.zeros(ids.size(0), 2)

    for precision, bucketed in (("bf16", True), ("fp32", False)):
        runtime = Runtime(torch.device("cpu"), precision)
        assert runtime.kernel_per_shape is bucketed
        model = Recorder()
        predict_logits(model, task.train, [[n - 1] for n in lengths], 0, "classification", runtime, max_seq_len)
        assert model.widths == widths(bucketed)  # evaluation and `tcli predict` take training's widths


def test_a_dev_set_every_model_scores_alike_is_refused_and_look_alike_labels_are_warned(tmp_path, capsys):
    """One gold score makes Pearson and Spearman undefined (reported as 0, best.pt chosen on it); one dev class makes
    MCC 0 for every model. Labels '1' and '1.0' train as two classes: a warning names them."""
    from transformer_cli.config import FinetuneRunConfig, load_config
    from transformer_cli.core.errors import UserError
    from transformer_cli.finetune.setup import read_labelled

    (tmp_path / "train.tsv").write_text("sentence\tlabel\na b\t1\nc d\t2.5\ne f\t1.0\n")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\na b\t3\nc d\t3.0\n")
    config = write_config(tmp_path / "ft.yaml", tmp_path, "none")
    for kind, metric, message in (
        ("regression", "pearson", "every example has the score 3, on which Pearson and Spearman are undefined"),
        ("classification", "mcc", "every example has the label '3', on which MCC is 0 for any model"),
    ):
        if kind == "classification":
            (tmp_path / "dev.tsv").write_text("sentence\tlabel\na b\t1\nc d\t1\n")
            message = message.replace("'3'", "'1'")
        cfg = load_config(FinetuneRunConfig, config, [f"task.kind={kind}", f"task.metrics=[{metric}]"])
        with pytest.raises(UserError, match=message):
            read_labelled(cfg)
    cfg = load_config(FinetuneRunConfig, config, ["task.metrics=[accuracy]"])  # one dev class scores fine there
    assert read_labelled(cfg).labels == ("1", "1.0", "2.5")
    assert "the labels '1' and '1.0' differ only in case or in how a number is written" in capsys.readouterr().err
