"""task.kind multilabel: a set of labels per text (a GoEmotions-like TSV with `2,0` fields, or JSON lists), one
sigmoid per label with binary cross-entropy, a threshold (fixed or tuned on dev, kept in the checkpoint), micro-
and macro-F1 and subset accuracy; predict, evaluate, export-hf (transformers' pipeline gives tcli's
probabilities) and count-params."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from tests.conftest import one_line_error
from transformer_cli.cli import app
from transformer_cli.config import FinetuneRunConfig, load_config
from transformer_cli.core.errors import UserError
from transformer_cli.data.labeled import label_set, read_table

# Label ids as GoEmotions writes them; each label has its own words, a text holds the words of its labels.
WORDS = {"0": "happy glad joy".split(), "1": "angry mad rage".split(), "2": "sad cry tears".split()}
FILLER = "the a of day it was".split()
TINY = "model: {init: none, d_model: 16, layers: 1, heads: 2, ffn_dim: 32, max_positions: 32}\nvocab: {size: 48}\n"
TEXTS = ["happy glad day", "mad rage and tears", "the day it was"]


def _rows(rng: random.Random, n: int) -> list[tuple[str, list[str]]]:
    rows = []
    for _ in range(n):
        labels = rng.sample(sorted(WORDS), rng.choice([1, 1, 2]))
        words = [rng.choice(WORDS[y]) for y in labels for _ in range(2)] + rng.sample(FILLER, 2)
        rng.shuffle(words)
        rows.append((" ".join(words), labels))
    return rows


def _write(folder: Path) -> None:
    rng = random.Random(0)
    rows = _rows(rng, 60)
    for split, part in (("train", rows[:44]), ("dev", rows[44:])):
        (folder / f"{split}.tsv").write_text(
            "text\tlabels\tid\n" + "".join(f"{t}\t{','.join(ys)}\tc{i}\n" for i, (t, ys) in enumerate(part))
        )
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": t, "labels": ys}) + "\n" for t, ys in part))


def _finetune(folder: Path, config: str) -> Path:
    (folder / "ft.yaml").write_text(config + TINY)
    out = folder / "run"
    result = CliRunner().invoke(
        app, ["finetune", "--config", str(folder / "ft.yaml"), "--out", str(out), "--device", "cpu", "-q"]
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny multilabel run from init none, the threshold tuned at each evaluation."""
    folder = tmp_path_factory.mktemp("ml")
    _write(folder)
    return _finetune(
        folder,
        f"task: {{kind: multilabel, threshold: tune}}\n"
        f"data: {{dir: {folder}, text: text, label: labels, max_seq_len: 24}}\n"
        "train: {batch_size: 8, max_steps: 24, eval_every: 8, lr: 0.003, precision: fp32}\n",
    )


def _events(run: Path, kind: str = "eval") -> list[dict]:
    return [e for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if e["event"] == kind]


def _probabilities(ckpt: Path, texts: list[str]) -> torch.Tensor:
    from transformer_cli.checkpoint import read_checkpoint

    c = read_checkpoint(ckpt)
    meta = c.finetune
    model = c.build_model().eval()
    out = []
    with torch.no_grad():
        for ids in meta.tokenizer.encode(texts):
            x = torch.tensor([[meta.tokenizer.cls_id, *ids, meta.tokenizer.sep_id]])
            out.append(model(x, torch.zeros_like(x))[0].sigmoid())
    return torch.stack(out)  # (N, L)


# ----------------------------------------------------------------------------- reading labels


def test_labels_are_read_from_a_separated_field_or_a_json_list(tmp_path):
    (tmp_path / "a.tsv").write_text("text\tlabels\nhappy day\t2,10\nsad\t 3 \n")
    (tmp_path / "a.jsonl").write_text('{"text": "happy day", "labels": ["2", 10]}\n{"text": "none", "labels": []}\n')
    (tmp_path / "b.csv").write_text('text,labels\nhappy day,"joy;love"\n')
    tsv = read_table(tmp_path / "a.tsv", "text", None, "labels", "multilabel")
    assert [ex.label for ex in tsv] == [("2", "10"), ("3",)]
    assert label_set(tsv, tmp_path / "a.tsv") == ("2", "3", "10")  # numbers in numeric order: the ids
    assert [ex.label for ex in read_table(tmp_path / "a.jsonl", "text", None, "labels", "multilabel")] == [
        ("2", "10"),
        (),
    ]
    got = read_table(tmp_path / "b.csv", "text", None, "labels", "multilabel", separator=";")
    assert got[0].label == ("joy", "love")


@pytest.mark.parametrize(
    "row, message",
    [
        ("x\t2,2\n", "names '2' twice"),
        ("x\t2,\n", "holds ''"),
        ("x\t\n", "missing label"),
    ],
)
def test_a_bad_label_set_is_one_line_naming_the_row(tmp_path, row, message):
    (tmp_path / "a.tsv").write_text("text\tlabels\nfine\t1\n" + row)
    with pytest.raises(UserError) as e:
        read_table(tmp_path / "a.tsv", "text", None, "labels", "multilabel")
    one_line_error(e, "a.tsv:3", message)


def test_the_config_keys_of_multilabel():
    cfg = load_config(FinetuneRunConfig, None, ["task.kind=multilabel", "task.threshold=0.3"])
    assert cfg.task.threshold == 0.3 and cfg.data.label_separator == ","
    for overrides, message in (
        (["task.threshold=0.3"], "task.threshold is for multilabel tasks"),
        (["task.kind=multilabel", "task.threshold=1"], "between 0 and 1"),
        (["task.kind=multilabel", "task.metrics=[accuracy]"], "accuracy does not score a multilabel task"),
    ):
        with pytest.raises(UserError, match=message):
            load_config(FinetuneRunConfig, None, overrides)


# ----------------------------------------------------------------------------- head, loss, decisions


def test_the_loss_is_hf_bce_with_logits_mean_once_divided_by_the_batch():
    from transformer_cli.models.bert import Bert
    from transformer_cli.models.heads import BertClassifier

    torch.manual_seed(0)
    model = BertClassifier(Bert(30, 16, 1, 2, 32, 16, pretraining_heads=False), 5, loss="bce").eval()
    ids = torch.randint(5, 30, (4, 7))
    labels = (torch.rand(4, 5) > 0.5).float()
    out = model(ids, torch.zeros_like(ids), labels)
    want = F.binary_cross_entropy_with_logits(out.logits, labels)  # transformers' multi_label_classification loss
    torch.testing.assert_close(out.loss / 4, want)


def test_the_tuned_threshold_scores_at_least_as_well_as_every_other_on_its_grid():
    from transformer_cli.kinds.finetuned import score
    from transformer_cli.kinds.multilabel import TUNING_GRID
    from transformer_cli.kinds.registry import KINDS

    class Meta:
        labels, threshold, task_kind = ["a", "b", "c"], 0.5, KINDS["multilabel"]

    from transformer_cli.data.labeled import TextExample

    gen = torch.Generator().manual_seed(1)
    gold = [tuple(n for n in "abc" if torch.rand(1, generator=gen) > 0.5) for _ in range(40)]
    examples = [TextExample("x", None, g, i) for i, g in enumerate(gold)]
    logits = [torch.randn(3, generator=gen) + 2.0 * torch.tensor([n in g for n in "abc"]) for g in gold]
    kind, meta = KINDS["multilabel"], Meta()
    best = kind.tuned_threshold(meta, ["macro_f1"], examples, logits)
    scores = {}
    for t in TUNING_GRID:
        meta.threshold = t
        scores[t] = score(meta, ["macro_f1"], examples, kind.decide(meta, logits)[0])["score"]
    assert best in TUNING_GRID and scores[best] == max(scores.values())


# ----------------------------------------------------------------------------- a run, and its checkpoint everywhere


def test_a_run_logs_every_multilabel_metric_and_keeps_its_tuned_threshold(run):
    evals = _events(run)
    assert evals
    for e in evals:
        assert {"macro_f1", "micro_f1", "subset_accuracy", "threshold"} <= set(e)
        assert {f"f1_{y}" for y in WORDS} <= set(e)  # per-label F1 in metrics.jsonl
        assert e["score"] == pytest.approx(e["macro_f1"])  # best.pt by macro-F1 unless task.metrics says otherwise
        assert e["macro_f1"] == pytest.approx(sum(e[f"f1_{y}"] for y in WORDS) / len(WORDS))
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    top = max(evals, key=lambda e: e["score"])
    assert best["finetune"]["threshold"] == top["threshold"] and best["finetune"]["labels"] == sorted(WORDS)


def test_evaluate_gives_the_runs_dev_numbers_at_the_stored_threshold(run):
    last = _events(run)[-1]
    result = CliRunner().invoke(
        app, ["evaluate", "--checkpoint", str(run / "checkpoints" / "last.pt"), "--split", "valid", "--json"]
    )
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    for key in ("macro_f1", "micro_f1", "subset_accuracy", "score", "f1_0"):
        assert got[key] == pytest.approx(last[key], abs=1e-6), key
    data = run.parent
    ckpt = str(run / "checkpoints" / "last.pt")
    by_json = CliRunner().invoke(app, ["evaluate", "--checkpoint", ckpt, "--input", str(data / "dev.jsonl"), "--json"])
    assert by_json.exit_code == 0, by_json.output  # the same rows as JSON lists
    assert json.loads(by_json.stdout)["macro_f1"] == pytest.approx(last["macro_f1"], abs=1e-6)


def test_predict_prints_every_label_above_the_threshold_with_its_probability(run):
    ckpt = run / "checkpoints" / "best.pt"
    threshold = torch.load(ckpt, weights_only=True)["finetune"]["threshold"]
    result = CliRunner().invoke(app, ["predict", "--checkpoint", str(ckpt), "--device", "cpu"], input="\n".join(TEXTS))
    assert result.exit_code == 0, result.output
    lines = result.stdout.split("\n")[: len(TEXTS)]
    probs = _probabilities(ckpt, TEXTS)
    for line, row in zip(lines, probs):
        fields = line.split("\t") if line else []
        got = dict(zip(fields[::2], map(float, fields[1::2])))
        want = {y: float(p) for y, p in zip(sorted(WORDS), row) if p > threshold}
        assert set(got) == set(want) and all(abs(got[y] - want[y]) < 1e-4 for y in got)
        assert list(got.values()) == sorted(got.values(), reverse=True)  # most probable first


def test_export_hf_pipeline_gives_tcli_probabilities(run, tmp_path):
    transformers = pytest.importorskip("transformers")
    ckpt, folder = run / "checkpoints" / "best.pt", tmp_path / "hf"
    result = CliRunner().invoke(app, ["export-hf", "--checkpoint", str(ckpt), "--out", str(folder)])
    assert result.exit_code == 0, result.output
    config = json.loads((folder / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification"
    assert config["id2label"] == {str(i): y for i, y in enumerate(sorted(WORDS))}
    pipe = transformers.pipeline("text-classification", model=str(folder), device="cpu")
    theirs = pipe(TEXTS, top_k=None, function_to_apply="sigmoid")
    ours = _probabilities(ckpt, TEXTS)
    for row, want in zip(theirs, ours):
        got = {d["label"]: d["score"] for d in row}
        assert [got[y] for y in sorted(WORDS)] == pytest.approx(want.tolist(), abs=1e-4)


def test_count_params_counts_one_output_per_label(run, capsys):
    from transformer_cli.tools.count_params import run_count_params

    r = run_count_params(None, run / "checkpoints" / "last.pt", None, None, True)
    assert r["task"] == "multilabel" and r["hf_class"] == "BertForSequenceClassification"
    assert r["sizes"]["C"] == len(WORDS) and r["stored_total"] == r["total"] == r["formula_total"]


def test_a_damaged_stored_threshold_is_one_line(run, tmp_path):
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    state["finetune"]["threshold"] = 1.5
    torch.save(state, tmp_path / "bad.pt")
    result = CliRunner().invoke(app, ["predict", "--checkpoint", str(tmp_path / "bad.pt")], input="a day\n")
    assert result.exit_code == 2 and "the stored threshold (1.5) is damaged" in result.output, result.output
    assert result.output.count("\n") == 1
