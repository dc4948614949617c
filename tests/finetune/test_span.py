"""task.kind span (extractive QA) end to end: tcli finetune on small SQuAD files the tests write (v1.1 and v2.0),
metrics and best.pt by f1, exact resume after SIGKILL, one-line errors before anything is written, tcli predict
(JSON lines in, {id, answer, score, start} out), tcli evaluate, export-hf as BertForQuestionAnswering (whose
logits and answers transformers reproduces) and count-params."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from transformer_cli.cli import app

from ..conftest import ROOT, one_line_error, run_killed, run_tcli

THINGS = "apple river stone cloud tiger lamp violin garden rocket maple".split()
COLOURS = "red blue green yellow purple orange black white".split()


def squad(contexts: int, seed: int, v2: bool = False) -> dict:
    """Contexts like "The lamp is red. The tiger is blue. ..."; a question per thing ("What colour is the
    tiger?"), and with `v2` one more about a thing the context never names (no answer)."""
    rng = random.Random(seed)
    data = []
    for c in range(contexts):
        things = rng.sample(THINGS, 4)
        colours = [rng.choice(COLOURS) for _ in things]
        context = " ".join(f"The {t} is {colour}." for t, colour in zip(things, colours))
        qas = []
        for i, (t, colour) in enumerate(zip(things, colours)):
            start = context.index(f"The {t} is ") + len(f"The {t} is ")
            answers = [{"text": colour, "answer_start": start}]
            qas.append({"id": f"{seed}-{c}-{i}", "question": f"What colour is the {t}?", "answers": answers})
        if v2:
            other = next(t for t in THINGS if t not in things)
            qas.append({"id": f"{seed}-{c}-x", "question": f"What colour is the {other}?", "answers": []})
            qas[-1]["is_impossible"] = True
        data.append({"title": f"t{c}", "paragraphs": [{"context": context, "qas": qas}]})
    return {"version": "v2.0" if v2 else "1.1", "data": data}


@pytest.fixture(scope="module")
def squad_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("squad")
    for name, contexts, seed, v2 in (("train", 12, 0, False), ("dev", 4, 1, False), ("train2", 12, 0, True)):
        (folder / f"{name}.json").write_text(json.dumps(squad(contexts, seed, v2)))
    (folder / "dev2.json").write_text(json.dumps(squad(4, 1, True)))
    return folder


def write_config(path: Path, data: Path, *extra: str, train: str = "train.json", valid: str = "dev.json") -> Path:
    # windows of 48 pieces sharing 8: the contexts (~80 pieces) take several windows each; the questions (~17
    # pieces) are whole, as transformers keeps them
    path.write_text(
        "\n".join(
            [
                "task: {kind: span, max_answer_len: 8}",
                f"data: {{dir: {data}, train: {train}, valid: {valid}, max_seq_len: 48, doc_stride: 8, "
                "max_query_len: 24}",
                "model: {init: none, d_model: 32, layers: 1, heads: 2, ffn_dim: 64, max_positions: 64, "
                "classifier_dropout: 0.0}",
                "vocab: {size: 120}",
                "train: {batch_size: 16, max_steps: 10, lr: 0.003, eval_every: 5, log_every: 2, precision: fp32, "
                "warmup_steps: 2}",
                *extra,
            ]
        )
        + "\n"
    )
    return path


def invoke(*args: str):
    """tcli finetune ARGS on the CPU, quiet."""
    return CliRunner().invoke(app, [*args, "--device", "cpu", "--quiet"])


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def events(run: Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if e["event"] == kind]


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory, squad_dir) -> Path:
    folder = tmp_path_factory.mktemp("qa")
    cfg = write_config(folder / "qa.yaml", squad_dir)
    result = invoke("finetune", "--config", str(cfg), "--out", str(folder / "run"))
    assert result.exit_code == 0, result.output
    return folder / "run"


def questions(path: Path) -> list[dict]:
    return [
        {"id": qa["id"], "question": qa["question"], "context": p["context"], "answers": qa["answers"]}
        for a in json.loads(path.read_text())["data"]
        for p in a["paragraphs"]
        for qa in p["qas"]
    ]


def test_finetune_logs_squad_metrics_and_keeps_best_by_f1(qa_run):
    evals = events(qa_run, "eval")
    assert {5, 10} <= {e["step"] for e in evals}  # (and at the epoch's end)
    for e in evals:
        assert {"exact_match", "f1", "score"} <= set(e) and e["score"] == e["f1"]
        assert 0.0 <= e["exact_match"] <= e["f1"] <= 100.0
    assert not any(k.startswith(("HasAns", "NoAns", "best_")) for k in evals[-1])  # v1 data, v1 scores
    best = torch.load(qa_run / "checkpoints" / "best.pt", weights_only=False)
    assert best["train_state"]["step"] == max(evals, key=lambda e: e["f1"])["step"]
    meta = best["finetune"]
    assert meta["kind"] == "span" and meta["metrics"] == ["f1"]
    assert meta["settings"] == {
        "doc_stride": 8,
        "max_query_len": 24,
        "max_answer_len": 8,
        "n_best": 20,
        "null_threshold": 0.0,
        "version_2": False,
    }
    assert best["model"]["qa_outputs.weight"].shape == (2, 32) and best["model"]["qa_outputs.bias"].shape == (2,)
    assert any((qa_run / "tb").iterdir())


def test_evaluate_scores_a_squad_file_as_training_did(qa_run, squad_dir):
    best = qa_run / "checkpoints" / "best.pt"
    step = torch.load(best, weights_only=False)["train_state"]["step"]
    logged = next(e for e in events(qa_run, "eval") if e["step"] == step)
    for where in (["--input", str(squad_dir / "dev.json")], ["--split", "valid"]):
        result = cli("evaluate", "--checkpoint", str(best), *where, "--json", "--device", "cpu")
        assert result.exit_code == 0, result.output
        scores = json.loads(result.output.strip().splitlines()[-1])
        assert scores["examples"] == 16
        assert scores["f1"] == pytest.approx(logged["f1"])
        assert scores["exact_match"] == pytest.approx(logged["exact_match"])


def test_predict_answers_json_lines_with_spans_of_the_context(qa_run, squad_dir, tmp_path):
    best = str(qa_run / "checkpoints" / "best.pt")
    qs = questions(squad_dir / "dev.json")
    lines = [json.dumps({"question": q["question"], "context": q["context"]}) for q in qs[:3]]
    # answers a line carries are not read (nor checked): predict answers questions
    wrong = {"text": ["nowhere"], "answer_start": [0]}
    mine = {"id": "mine", "question": qs[3]["question"], "context": qs[3]["context"], "answers": wrong}
    lines.append(json.dumps(mine))
    result = run_tcli("predict", "--checkpoint", best, "--device", "cpu", input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o["id"] for o in out] == ["1", "2", "3", "mine"]  # the line number where no id is given
    for o, q in zip(out, qs):
        assert set(o) == {"id", "answer", "score", "start"} and 0.0 < o["score"] <= 1.0
        assert o["answer"] and q["context"][o["start"] : o["start"] + len(o["answer"])] == o["answer"]
    # a SQuAD file: one line per question, as the JSON lines of the same questions
    result = cli("predict", "--checkpoint", best, "--input", str(squad_dir / "dev.json"), "--device", "cpu")
    assert result.exit_code == 0, result.output
    whole = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [o["id"] for o in whole] == [q["id"] for q in qs]
    assert [(o["answer"], o["start"]) for o in whole[:4]] == [(o["answer"], o["start"]) for o in out]


def test_questions_predict_and_evaluate_cannot_read_are_one_line(qa_run, squad_dir, tmp_path):
    best = str(qa_run / "checkpoints" / "best.pt")
    good = json.dumps({"question": "What colour is the lamp?", "context": "The lamp is red."})
    for text, fragment in (
        (good + "\nWhat colour is the lamp?\n", "<stdin>:2: not valid JSON"),
        (good + "\n" + json.dumps({"question": "Why?"}) + "\n", "<stdin>:2: no key 'context'"),
        (json.dumps({"question": "Why?", "context": " "}) + "\n", 'no "context" text'),
    ):
        result = run_tcli("predict", "--checkpoint", best, "--device", "cpu", input=text)
        one_line_error(result, fragment)
    table = tmp_path / "dev.tsv"
    table.write_text("question\tcontext\nWhy?\tBecause.\n")
    one_line_error(run_tcli("predict", "--checkpoint", best, "--input", str(table)), "reads a SQuAD .json")
    one_line_error(run_tcli("evaluate", "--checkpoint", best, "--input", str(table)), "scores SQuAD files")


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, squad_dir):
    data = tmp_path / "data"
    data.mkdir()
    broken = squad(2, 0)
    broken["data"][1]["paragraphs"][0]["qas"][2]["answers"][0]["answer_start"] += 3
    (data / "train.json").write_text(json.dumps(broken))
    (data / "dev.json").write_text((squad_dir / "dev.json").read_text())
    (data / "train.tsv").write_text("sentence\tlabel\na\tb\n")
    cases = [
        ((), "answer_start"),
        (("--set", "data.train=train.tsv"), "reads SQuAD files"),
        (("--set", "data.doc_stride=24"), "data.doc_stride 24 must be at least 1 and less than the 21 context pieces"),
        (("--set", "data.text=question"), "data.text is for tables"),
        (("--set", "task.kind=classification"), "task.max_answer_len is for task.kind span"),
    ]
    for extra, fragment in cases:
        cfg = write_config(tmp_path / "qa.yaml", data)
        result = run_tcli("finetune", "--config", str(cfg), "--out", str(tmp_path / "run"), "--device", "cpu", *extra)
        one_line_error(result, fragment)
        assert not (tmp_path / "run").exists(), extra


@pytest.fixture(scope="module")
def qa_v2_run(tmp_path_factory, squad_dir) -> Path:
    folder = tmp_path_factory.mktemp("qa2")
    cfg = write_config(folder / "qa.yaml", squad_dir, train="train2.json", valid="dev2.json")
    result = invoke("finetune", "--config", str(cfg), "--out", str(folder / "run"), "--set", "train.max_steps=6")
    assert result.exit_code == 0, result.output
    return folder / "run"


def test_squad_v2_scores_no_answers_and_finds_the_best_threshold(qa_v2_run, squad_dir):
    last = events(qa_v2_run, "eval")[-1]
    assert {"exact_match", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"} <= set(last)
    assert last["best_f1"] >= last["f1"]
    best = qa_v2_run / "checkpoints" / "best.pt"
    assert torch.load(best, weights_only=False)["finetune"]["settings"]["version_2"] is True
    # a v2 model may answer nothing: then with no start
    qs = questions(squad_dir / "dev2.json")
    lines = [json.dumps({"question": q["question"], "context": q["context"]}) for q in qs]
    result = run_tcli("predict", "--checkpoint", str(best), "--device", "cpu", input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(out) == len(qs) and all((o["start"] is None) == (o["answer"] == "") for o in out)


@pytest.mark.slow
def test_resume_after_sigkill_is_exact(tmp_path, squad_dir):
    """Killed after step 6 (between evaluations) and resumed = uninterrupted, bitwise (CPU, fp32)."""
    cfg = write_config(tmp_path / "qa.yaml", squad_dir)
    common = ("finetune", "--config", str(cfg), "--device", "cpu", "--quiet", "--set", "model.dropout=0.1")
    common += ("--set", "train.max_steps=9", "--set", "train.eval_every=4")
    full = run_tcli(*common, "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    killed = run_killed(6, "step", *common, "--out", str(tmp_path / "cut"))
    assert killed.returncode != 0
    resumed = run_tcli(*common, "--out", str(tmp_path / "cut"), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    full_scores, cut_scores = (
        [(e["step"], e["exact_match"], e["f1"]) for e in events(tmp_path / run, "eval")] for run in ("full", "cut")
    )
    assert full_scores == cut_scores


def test_count_params_counts_the_qa_head(qa_run):
    result = cli("count-params", "--checkpoint", str(qa_run / "checkpoints" / "best.pt"), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    model = torch.load(qa_run / "checkpoints" / "best.pt", weights_only=True)["model"]
    assert report["total"] == sum(t.numel() for t in model.values())
    assert report["hf_class"] == "BertForQuestionAnswering" and report["formula_matches"]


def run_qa_answers(
    folder: Path, qs: list[dict], max_len: int, stride: int, version_2: bool = False, diffs: list | None = None
) -> list[tuple[str, int | None]]:
    """transformers' model and tokenizer from the exported folder, windows and answers as run_qa.py (and the
    question-answering pipeline, gone from transformers 5) make them: 20 best starts by 20 best ends; with
    `version_2`, no answer where the least [CLS] score over the windows beats the best span (threshold 0), that
    difference appended to `diffs` for each question."""
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(folder).eval()
    enc = tokenizer(
        [q["question"] for q in qs],
        [q["context"] for q in qs],
        truncation="only_second",
        max_length=max_len,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=True,
        return_tensors="pt",
    )
    with torch.inference_mode():
        out = model(enc["input_ids"], attention_mask=enc["attention_mask"], token_type_ids=enc["token_type_ids"])
    best: dict[int, tuple[float, str, int]] = {}
    null: dict[int, float] = {}
    for f in range(enc["input_ids"].size(0)):
        n, seq = int(enc["overflow_to_sample_mapping"][f]), enc.sequence_ids(f)
        offsets = enc["offset_mapping"][f].tolist()
        s, e = out.start_logits[f], out.end_logits[f]
        null[n] = min(null.get(n, float("inf")), float(s[0] + e[0]))
        for i in s.argsort(descending=True)[:20].tolist():
            for j in e.argsort(descending=True)[:20].tolist():
                if seq[i] != 1 or seq[j] != 1 or j < i or j - i + 1 > 8:
                    continue
                score = float(s[i] + e[j])
                if n not in best or score > best[n][0]:
                    a, b = offsets[i][0], offsets[j][1]
                    raw = qs[n]["context"][a:b]  # (a sentencepiece "▁" piece stands for the space before a word)
                    best[n] = (score, raw.strip(), a + len(raw) - len(raw.lstrip()))
    if diffs is not None:
        diffs += [null[n] - best[n][0] for n in range(len(qs))]
    answered = [n in best and not (version_2 and null[n] - best[n][0] > 0) for n in range(len(qs))]
    return [(best[n][1], best[n][2]) if answered[n] else ("", None) for n in range(len(qs))]


def test_export_hf_of_a_v2_model_answers_nothing_where_tcli_does(qa_v2_run, squad_dir, tmp_path):
    pytest.importorskip("transformers")
    best = qa_v2_run / "checkpoints" / "best.pt"
    result = cli("export-hf", "--checkpoint", str(best), "--out", str(tmp_path / "hf"))
    assert result.exit_code == 0, result.output
    qs = questions(squad_dir / "dev2.json")
    lines = [json.dumps({"id": q["id"], "question": q["question"], "context": q["context"]}) for q in qs]
    ours = run_tcli("predict", "--checkpoint", str(best), "--device", "cpu", input="\n".join(lines) + "\n")
    assert ours.returncode == 0, ours.stderr
    tcli_answers = [(o["answer"], o["start"]) for o in map(json.loads, ours.stdout.splitlines())]
    hf_diffs: list[float] = []
    hf_answers = run_qa_answers(tmp_path / "hf", qs, 48, 8, version_2=True, diffs=hf_diffs)
    same = sum(a == b for a, b in zip(tcli_answers, hf_answers))
    assert same >= 0.99 * len(qs), [(a, b) for a, b in zip(tcli_answers, hf_answers) if a != b]
    # the no-answer score's lead over the best span, which decides for any null_threshold, is transformers' too
    from transformer_cli.data.squad import read_squad
    from transformer_cli.finetune.predict import Predictor
    from transformer_cli.kinds.finetuned import decide, features_of, length_order, predict_logits

    p = Predictor(best, "cpu")
    examples = read_squad(squad_dir / "dev2.json")
    feats = features_of(p.meta, examples)
    pad, limit = p.meta.tokenizer.pad_id, p.meta.max_seq_len
    logits = predict_logits(p.model, feats, length_order(feats, 8), pad, "span", p.runtime, limit)
    preds, _ = decide(p.meta, logits, examples, feats)
    assert [pred.null_diff for pred in preds] == pytest.approx(hf_diffs, abs=1e-4)


def test_export_hf_is_bert_for_question_answering_with_tcli_answers(qa_run, squad_dir, tmp_path):
    pytest.importorskip("transformers")
    best = qa_run / "checkpoints" / "best.pt"
    folder = tmp_path / "hf"
    result = cli("export-hf", "--checkpoint", str(best), "--out", str(folder))
    assert result.exit_code == 0, result.output
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["BertForQuestionAnswering"]
    from safetensors.torch import load_file

    weights = load_file(folder / "model.safetensors")
    assert {"qa_outputs.weight", "qa_outputs.bias"} <= set(weights) and not any("pooler" in k for k in weights)
    # questions under max_query_len: transformers' windows are tcli's; the answers must be the same spans
    qs = questions(squad_dir / "dev.json") + questions(squad_dir / "train.json")[:24]
    lines = [json.dumps({"id": q["id"], "question": q["question"], "context": q["context"]}) for q in qs]
    ours = run_tcli("predict", "--checkpoint", str(best), "--device", "cpu", input="\n".join(lines) + "\n")
    assert ours.returncode == 0, ours.stderr
    tcli_answers = [(o["answer"], o["start"]) for o in map(json.loads, ours.stdout.splitlines())]
    hf_answers = run_qa_answers(folder, qs, 48, 8)
    same = sum(a == b for a, b in zip(tcli_answers, hf_answers))
    assert same >= 0.99 * len(qs), [(a, b) for a, b in zip(tcli_answers, hf_answers) if a != b]


def test_qa_head_loss_is_the_mean_of_start_and_end_cross_entropy_and_ignores_padding():
    from transformer_cli.models.bert import Bert
    from transformer_cli.models.heads import BertQuestionAnswering

    torch.manual_seed(0)
    model = BertQuestionAnswering(Bert(50, 16, 1, 2, 32, 32, dropout=0.0, attention_dropout=0.0)).eval()
    ids = torch.randint(5, 50, (3, 10))
    types = torch.zeros_like(ids)
    labels = torch.tensor([[0, 0], [2, 4], [9, 9]])
    out = model(ids, types, labels)
    assert out.logits.shape == (3, 10, 2)
    start, end = out.logits[..., 0], out.logits[..., 1]
    cross_entropy = torch.nn.functional.cross_entropy
    mean = (cross_entropy(start, labels[:, 0]) + cross_entropy(end, labels[:, 1])) / 2
    torch.testing.assert_close(out.loss / 3, mean)
    pad = torch.zeros(3, 5, dtype=torch.long)  # (pad_id 0)
    padded = model(torch.cat([ids, pad], 1), torch.cat([types, pad], 1), labels)
    torch.testing.assert_close(padded.loss, out.loss)


def test_the_shipped_squad_config_loads_and_a_dumped_span_config_round_trips():
    import yaml

    from transformer_cli.config import FinetuneRunConfig, dump_config, load_config

    cfg = load_config(FinetuneRunConfig, ROOT / "configs" / "finetune_squad.yaml")
    assert cfg.task.kind == "span" and (cfg.data.max_seq_len, cfg.data.doc_stride) == (384, 128)
    assert FinetuneRunConfig.model_validate(yaml.safe_load(dump_config(cfg))) == cfg


def test_damaged_span_settings_in_a_checkpoint_are_one_line(qa_run, tmp_path):
    ckpt = torch.load(qa_run / "checkpoints" / "best.pt", weights_only=False)
    good = dict(ckpt["finetune"]["settings"])
    for damage in ({"doc_stride": 0}, {"n_best": 2.5}, {"version_2": "yes"}, {"unknown": 1}):
        ckpt["finetune"]["settings"] = {**good, **damage}
        torch.save(ckpt, tmp_path / "damaged.pt")
        for command in ("predict", "evaluate", "count-params") if "unknown" in damage else ("predict",):
            extra = ("--split", "valid") if command == "evaluate" else ()
            result = run_tcli(command, "--checkpoint", str(tmp_path / "damaged.pt"), *extra, input="")
            one_line_error(result, "the stored settings of its span head are damaged")
