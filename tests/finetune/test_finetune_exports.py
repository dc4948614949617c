"""Fine-tuned checkpoints everywhere a checkpoint is read: tcli evaluate (the run's own dev numbers), count-params
(the head counted, formula exact), export-hf (transformers' pipelines give tcli's labels; logits within 1e-4)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from transformer_cli.cli import app

transformers = pytest.importorskip("transformers")
GROUPS = {"pos": "the cat sat on a mat".split(), "neg": "dog ran to house in garden".split()}
TINY = "model: {init: none, d_model: 16, layers: 1, heads: 2, ffn_dim: 32, max_positions: 32}\nvocab: {size: 40}\n"


def _finetune(folder: Path, config: str) -> Path:
    (folder / "ft.yaml").write_text(config + TINY)
    result = CliRunner().invoke(
        app, ["finetune", "--config", str(folder / "ft.yaml"), "--out", str(folder / "run"), "--device", "cpu", "-q"]
    )
    assert result.exit_code == 0, result.output
    return folder / "run"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Three tiny runs from init none: a classifier, a regressor (pairs) and a tagger."""
    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("ft")
    rows = []
    for _ in range(40):
        y = rng.choice(["pos", "neg"])
        rows.append((" ".join(rng.choice(GROUPS[y]) for _ in range(rng.randint(2, 6))), y))
    for split, part in (("train", rows[:28]), ("dev", rows[28:])):
        (folder / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in part))
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps({"a": s, "b": s.split()[0], "score": 3.0 * (y == "pos")}) + "\n" for s, y in part)
        )
        (folder / f"{split}.conll").write_text(
            "\n".join("".join(f"{w} {'B-ANI' if w in ('cat', 'dog') else 'O'}\n" for w in s.split()) for s, _ in part)
        )
    train = "train: {batch_size: 8, max_steps: 6, eval_every: 3, lr: 0.003, precision: fp32}\n"
    out = {}
    for kind, extra in (
        ("classification", "data: {dir: %s, max_seq_len: 24}\n"),
        (
            "regression",
            "data: {dir: %s, train: train.jsonl, valid: dev.jsonl, text: a, pair: b, label: score, max_seq_len: 24}\n",
        ),
        ("tagging", "data: {dir: %s, train: train.conll, valid: dev.conll, max_seq_len: 24}\n"),
    ):
        sub = folder / kind
        sub.mkdir()
        out[kind] = _finetune(sub, f"task: {{kind: {kind}}}\n" + extra % folder + train)
    return out


def _events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kind", ["classification", "regression", "tagging"])
def test_evaluate_gives_the_runs_dev_numbers(runs, kind):
    run = runs[kind]
    last_eval = [e for e in _events(run) if e["event"] == "eval"][-1]
    result = CliRunner().invoke(
        app, ["evaluate", "--checkpoint", str(run / "checkpoints" / "last.pt"), "--split", "valid", "--json"]
    )
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["kind"] == "finetune" and got["step"] == last_eval["step"]
    for key in ("score", *(k for k in ("accuracy", "pearson", "spearman", "entity_f1") if k in last_eval)):
        assert got[key] == pytest.approx(last_eval[key], abs=1e-6), key


def test_evaluate_an_input_file_with_labels_and_refusals(runs, tmp_path):
    run = runs["classification"]
    ckpt = str(run / "checkpoints" / "last.pt")
    data = run.parent.parent
    by_split = CliRunner().invoke(app, ["evaluate", "--checkpoint", ckpt, "--split", "valid", "--json"])
    by_file = CliRunner().invoke(app, ["evaluate", "--checkpoint", ckpt, "--input", str(data / "dev.tsv"), "--json"])
    assert by_file.exit_code == 0, by_file.output
    assert json.loads(by_file.stdout)["accuracy"] == json.loads(by_split.stdout)["accuracy"]
    text = CliRunner().invoke(app, ["evaluate", "--checkpoint", ckpt, "--split", "valid"])
    assert "accuracy" in text.stdout and "examples 12" in text.stdout
    (tmp_path / "bad.tsv").write_text("sentence\tlabel\na cat\tmaybe\n")
    (tmp_path / "none.tsv").write_text("sentence\tlabel\na cat\t\n")
    for args, message in (
        (["--input", str(tmp_path / "bad.tsv")], "bad.tsv:2"),
        (["--input", str(tmp_path / "none.tsv")], "none.tsv:2"),
        (["--split", "test"], "the splits train and valid"),
        (["--split", "valid", "--beam", "2"], "fine-tuned checkpoint"),
    ):
        result = CliRunner().invoke(app, ["evaluate", "--checkpoint", ckpt, *args])
        assert result.exit_code == 2 and message in result.output, result.output
        assert result.output.count("\n") == 1
    # the metrics a checkpoint stores for evaluate: an unknown one, another kind's, or f1 beside 3 labels
    state = torch.load(ckpt, weights_only=True)
    for metrics in (["bogus"], ["pearson"], "accuracy", ["accuracy", "accuracy"], [1]):
        state["finetune"]["metrics"] = metrics
        torch.save(state, tmp_path / "damaged.pt")
        result = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(tmp_path / "damaged.pt"), "--split", "valid"])
        assert result.exit_code == 2 and "the stored metrics" in result.output, result.output
        assert result.output.count("\n") == 1


@pytest.mark.parametrize("kind", ["classification", "tagging"])
def test_count_params_counts_the_head_exactly(runs, kind):
    ckpt = runs[kind] / "checkpoints" / "last.pt"
    result = CliRunner().invoke(app, ["count-params", "--checkpoint", str(ckpt), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    state = torch.load(ckpt, weights_only=True)
    assert report["total"] == sum(t.numel() for t in state["model"].values()) == report["stored_total"]
    C = 2 if kind == "classification" else len(state["finetune"]["labels"])
    assert report["formula_matches"] and report["total"] - report["bert_model"] == 16 * C + C
    table = CliRunner().invoke(app, ["count-params", "--checkpoint", str(ckpt)]).stdout
    assert "task head" in table and "H·C + C" in table and "equals the built model" in table
    # every formula name stands apart from its formula (BertForSequenceClassification is 29 characters)
    assert any(line.split()[:2] == [report["hf_class"], "BertModel"] for line in table.splitlines())


def _predict(ckpt: Path, lines: list[str]) -> list[str]:
    result = CliRunner().invoke(app, ["predict", "--checkpoint", str(ckpt), "--device", "cpu"], input="\n".join(lines))
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


TEXTS = ["the cat sat on a mat", "dog ran to house", "a garden in the house"]


def test_predict_refuses_an_input_of_the_other_kind_of_model(runs, tmp_path):
    """A .conll file to a classifier, a table to a tagger: one line saying what the model reads, nothing written
    (not CoNLL lines classified as texts, not a table's header tagged as words)."""
    conll = tmp_path / "in.conll"
    conll.write_text("John B-PER\nlives O\n")
    table = tmp_path / "in.tsv"
    table.write_text("sentence\tlabel\nthe cat\tpos\n")
    out = tmp_path / "out.txt"
    for kind, given, message in (
        ("classification", conll, "a .conll file is for a tagger"),
        ("tagging", table, "tags words"),
    ):
        ckpt = runs[kind] / "checkpoints" / "last.pt"
        args = ["predict", "--checkpoint", str(ckpt), "-i", str(given), "-o", str(out), "--device", "cpu"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, result.output
        assert not out.exists()
        # evaluate, likewise: a table is not read as CoNLL (its header line was reported as an unknown tag)
        args = ["evaluate", "--checkpoint", str(ckpt), "-i", str(given), "--device", "cpu"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and f"this {kind} model reads" in result.output, result.output


def test_average_refuses_fine_tuned_checkpoints_of_different_tasks(runs, tmp_path):
    """A classifier's and a regressor's heads differ in shape (it broadcast them, exit 0, or crashed the other
    way round): one line naming both files, in either order, and nothing written."""
    out = tmp_path / "avg.pt"
    for a, b in (("classification", "regression"), ("regression", "classification"), ("classification", "tagging")):
        paths = [str(runs[k] / "checkpoints" / "last.pt") for k in (a, b)]
        result = CliRunner().invoke(app, ["average", "--checkpoints", *paths, "--out", str(out)])
        assert result.exit_code == 2 and f"one is a {a} model, the other a {b} model" in result.output, result.output
        assert result.output.count("\n") == 1 and not out.exists()


def test_pair_model_reads_exactly_two_fields_a_line(runs):
    ckpt = runs["regression"] / "checkpoints" / "last.pt"
    assert len(_predict(ckpt, ["the cat\tsat", "a dog\tran\r"])) == 2
    for line, found in (
        ("the cat\tsat\tmore", "has 3 tab-separated fields"),
        ("no tab here", "has 1 tab-separated field)"),
        ("the cat\t ", "its second text is empty"),
        ("\tsat", "its first text is empty"),
    ):
        result = CliRunner().invoke(app, ["predict", "--checkpoint", str(ckpt), "--device", "cpu"], input=line + "\n")
        assert result.exit_code == 2, result.output
        assert "<stdin>:1: this model reads pairs" in result.output and found in result.output, result.output


def _export(run: Path, tmp_path: Path) -> tuple[Path, Path]:
    ckpt, folder = run / "checkpoints" / "last.pt", tmp_path / "hf"
    result = CliRunner().invoke(app, ["export-hf", "--checkpoint", str(ckpt), "--out", str(folder)])
    assert result.exit_code == 0, result.output
    return ckpt, folder


def _tcli_logits(ckpt: Path, ids: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
    from transformer_cli.checkpoint import read_checkpoint

    model = read_checkpoint(ckpt).build_model().eval()
    with torch.no_grad():
        return model(ids, types)


def test_export_hf_classifier_pipeline_gives_tcli_labels_and_logits(runs, tmp_path):
    ckpt, folder = _export(runs["classification"], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["id2label"] == {
        "0": "neg",
        "1": "pos",
    }
    pipe = transformers.pipeline("text-classification", model=str(folder), device="cpu")
    got = pipe(TEXTS)
    want = [line.split("\t") for line in _predict(ckpt, TEXTS)]
    assert [g["label"] for g in got] == [w[0] for w in want]
    assert [g["score"] for g in got] == pytest.approx([float(w[1]) for w in want], abs=1e-4)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    batch = tok(TEXTS[:1], return_tensors="pt")
    with torch.no_grad():
        theirs = model(**batch).logits
    ours = _tcli_logits(ckpt, batch["input_ids"], batch["token_type_ids"])
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


def test_export_hf_regression_gives_the_score(runs, tmp_path):
    ckpt, folder = _export(runs["regression"], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["problem_type"] == "regression" and list(config["id2label"]) == ["0"]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder))
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    pipe = transformers.pipeline("text-classification", model=str(folder), device="cpu")
    pairs = [{"text": t, "text_pair": t.split()[0]} for t in TEXTS]
    got = [pipe(p)["score"] for p in pairs]
    want = [float(line) for line in _predict(ckpt, [f"{t}\t{t.split()[0]}" for t in TEXTS])]
    assert got == pytest.approx(want, abs=1e-4)


def test_export_hf_tagger_pipeline_gives_tcli_tags(runs, tmp_path):
    ckpt, folder = _export(runs["tagging"], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"]
    pipe = transformers.pipeline("token-classification", model=str(folder), device="cpu", ignore_labels=[])
    from transformer_cli.checkpoint import read_checkpoint

    tokenizer = read_checkpoint(ckpt).finetune.tokenizer
    for text in TEXTS:
        words = text.split()
        pieces = tokenizer.encode_words(words)
        assert sum(pieces, []) == tokenizer.encode([text])[0]  # whole-text pieces = word-wise pieces here
        firsts = [1 + sum(len(p) for p in pieces[:i]) for i in range(len(words))]
        by_index = {e["index"]: e["entity"] for e in pipe(text)}
        tcli = [line.split()[1] for line in _predict(ckpt, [text]) if line]
        assert [by_index[i] for i in firsts] == tcli
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForTokenClassification.from_pretrained(str(folder)).eval()
    batch = tok(TEXTS[:1], return_tensors="pt")
    with torch.no_grad():
        theirs = model(**batch).logits
    torch.testing.assert_close(
        theirs, _tcli_logits(ckpt, batch["input_ids"], batch["token_type_ids"]), atol=1e-4, rtol=0
    )


@pytest.mark.parametrize("kind", ["classification", "regression", "tagging"])
def test_a_checkpoint_whose_outputs_are_not_finite_is_refused_not_scored_as_class_0(runs, kind, monkeypatch):
    """A run diverging through weight decay saved finite weights of 1e16 whose outputs were NaN: predict printed
    `0 nan` and evaluate `accuracy 0.5` (NaN argmax is class 0), exit 0. Here the outputs are made NaN where the
    model's logits come out (weights that overflow depend on the input); the training's evaluation of such
    outputs is NaN, which never becomes best.pt."""
    from transformer_cli.checkpoint import read_checkpoint
    from transformer_cli.data.labeled import read_conll, read_table
    from transformer_cli.finetune import predict
    from transformer_cli.kinds import finetuned
    from transformer_cli.runtime.device import Runtime

    real = finetuned.predict_logits

    def overflowing(*args, **kwargs):
        logits = real(*args, **kwargs)
        return [t.clone().fill_(math.inf) - math.inf if i % 2 == 0 else t for i, t in enumerate(logits)]  # NaN

    monkeypatch.setattr(finetuned, "predict_logits", overflowing)
    monkeypatch.setattr(predict, "predict_logits", overflowing)
    run = runs[kind]
    ckpt_path = run / "checkpoints" / "last.pt"
    line = {"classification": "a cat\n", "regression": "a cat\ta\n", "tagging": "a cat\n"}[kind]
    for args, kwargs in (
        (["evaluate", "--checkpoint", str(ckpt_path), "--split", "valid"], {}),
        (["predict", "--checkpoint", str(ckpt_path)], {"input": line}),
    ):
        result = CliRunner().invoke(app, args, **kwargs)
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
        assert f"{ckpt_path}: the model's outputs are not finite (NaN or inf)" in result.output, result.output
    data = run.parent.parent
    if kind == "tagging":
        examples = read_conll(data / "dev.conll")
    elif kind == "regression":
        examples = read_table(data / "dev.jsonl", "a", "b", "score", "regression")
    else:
        examples = read_table(data / "dev.tsv", "sentence", None, "label", "classification")
    ckpt = read_checkpoint(ckpt_path)
    scores, _ = finetuned.evaluate_examples(
        ckpt.build_model(), ckpt.finetune, ["x"], examples, None, Runtime.create("cpu", "fp32")
    )
    assert set(scores) == {"x", "score"} and all(math.isnan(v) for v in scores.values())


def test_evaluate_refuses_a_file_on_which_its_metrics_are_undefined(runs, tmp_path):
    """One gold score: Pearson and Spearman are undefined; evaluate printed them as 0.0000, exit 0, where
    fine-tuning refuses the same file as its dev set."""
    ckpt = str(runs["regression"] / "checkpoints" / "last.pt")
    same = tmp_path / "same.jsonl"
    same.write_text("".join(json.dumps({"a": t, "b": "x", "score": 3.0}) + "\n" for t in ("a cat", "a dog")))
    result = CliRunner().invoke(app, ["evaluate", "--checkpoint", ckpt, "--input", str(same)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"{same}: every example has the score 3, on which Pearson and Spearman are undefined" in result.output
    same.write_text("".join(json.dumps({"a": t, "b": "x", "score": s}) + "\n" for t, s in (("a", 1.0), ("b", 2.0))))
    assert CliRunner().invoke(app, ["evaluate", "--checkpoint", ckpt, "--input", str(same)]).exit_code == 0
