"""tcli fill-mask and tcli evaluate on a tiny trained BERT: the numbers equal the model's and the trainer's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ..conftest import TEST_PRECISION, one_line_error, run_tcli
from .test_bert_train import CONFIG, events, write_corpus


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory) -> Path:
    """A BERT trained for 12 updates (evaluations at 6 and 12); its run directory."""
    root = tmp_path_factory.mktemp("bert_inspect")
    write_corpus(root / "train.txt", 120, seed=1)
    write_corpus(root / "valid.txt", 20, seed=2)
    (root / "bert.yaml").write_text(CONFIG.format(data=root, steps=12, precision=TEST_PRECISION))
    run = root / "run"
    done = run_tcli("pretrain-bert", "--config", str(root / "bert.yaml"), "--out", str(run), "--quiet")
    assert done.returncode == 0, done.stderr
    return run


def checkpoint_step(path: Path) -> int:
    return torch.load(path, weights_only=True)["train_state"]["step"]


@pytest.mark.parametrize("name", ["best.pt", "last.pt"])
def test_evaluate_bert_equals_training_time_evaluation(bert_run, name):
    ckpt = bert_run / "checkpoints" / name
    result = run_tcli("evaluate", "--checkpoint", str(ckpt), "--split", "valid", "--json")
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    logged = {e["step"]: e for e in events(bert_run) if e["event"] == "eval"}[checkpoint_step(ckpt)]
    for key in ("mlm_loss", "mlm_acc", "nsp_acc", "ppl"):
        assert round(got[key], 6) == logged[key], key  # metrics.jsonl rounds to 6 decimals
    assert got["instances"] > 0 and got["step"] == logged["step"]

    # the same text given as a file, in plain text output
    text = run_tcli("evaluate", "--checkpoint", str(ckpt), "--input", str(bert_run.parent / "valid.txt"))
    assert text.returncode == 0, text.stderr
    assert f"MLM loss {got['mlm_loss']:.4f}" in text.stdout and f"NSP accuracy {got['nsp_acc']:.4f}" in text.stdout


@pytest.mark.parametrize(
    "text, advice",
    [
        ("One sentence here.\nAnother one follows.\n", "the checkpoint reads data.format: text, where blank lines"),
        ("Lonely.\n\nAlone.\n", "the checkpoint reads one sentence per line (data.split_sentences: false)"),
    ],
)
def test_evaluate_explains_how_the_checkpoint_reads_a_file_it_cannot_use(bert_run, tmp_path, text, advice):
    path = tmp_path / "in.txt"
    path.write_text(text)
    result = run_tcli("evaluate", "--checkpoint", str(bert_run / "checkpoints" / "best.pt"), "--input", str(path))
    one_line_error(result, advice)
    assert "use data.format" not in result.stderr and "set data.split_sentences" not in result.stderr


def direct_probabilities(ckpt_path: Path, text: str) -> tuple[torch.Tensor, list[int]]:
    """Softmax of the model's MLM logits at the [MASK] positions, computed without tcli fill-mask."""
    from transformer_cli.checkpoint import read_checkpoint

    ckpt = read_checkpoint(ckpt_path, kind="bert")
    model = ckpt.build_model().eval()
    vocab = ckpt.vocabs[0]
    parts = [vocab.sp.encode(p) for p in text.split("[MASK]")]
    ids = [2] + parts[0] + [i for p in parts[1:] for i in (4, *p)] + [3]
    with torch.no_grad():
        mlm, _ = model(torch.tensor([ids]), torch.zeros(1, len(ids), dtype=torch.long))
    positions = [k for k, i in enumerate(ids) if i == 4]
    return mlm[0, positions].softmax(-1), positions


def test_fill_mask_scores_are_the_softmax_of_the_mlm_logits(bert_run, tmp_path):
    ckpt = bert_run / "checkpoints" / "best.pt"
    text = "The king [MASK] the castle near the [MASK]."
    result = run_tcli("fill-mask", "--checkpoint", str(ckpt), text, "--top-k", "4", "--json")
    assert result.returncode == 0, result.stderr
    (obj,) = [json.loads(line) for line in result.stdout.splitlines()]
    probs, positions = direct_probabilities(ckpt, text)
    assert obj["text"] == text and [m["position"] for m in obj["masks"]] == positions
    for mask, p in zip(obj["masks"], probs):
        scores = [x["score"] for x in mask["predictions"]]
        top = p.topk(4)
        assert [x["id"] for x in mask["predictions"]] == top.indices.tolist()
        assert scores == pytest.approx(top.values.tolist(), abs=1e-6)
        assert scores == sorted(scores, reverse=True) and sum(scores) <= 1 + 1e-6
        assert all(x["token"] for x in mask["predictions"])

    lines = tmp_path / "lines.txt"
    lines.write_text(f"{text}\n[MASK] saw the river.\n", encoding="utf-8")
    plain = run_tcli("fill-mask", "--checkpoint", str(ckpt), "--input", str(lines))
    assert plain.returncode == 0, plain.stderr
    out = plain.stdout.splitlines()
    assert out[0] == text and out[1].startswith(f"  [MASK] 1 (position {positions[0]}): ")
    assert out[2].startswith(f"  [MASK] 2 (position {positions[1]}): ")
    assert out[3] == "[MASK] saw the river." and out[4].startswith("  [MASK] 1 (position 1): ")
    assert len(out[1].split(": ", 1)[1].split("  ")) == 5  # --top-k defaults to 5


def test_fill_mask_bad_input_is_one_line(bert_run, tmp_path):
    ckpt = str(bert_run / "checkpoints" / "best.pt")
    one_line_error(run_tcli("fill-mask", "--checkpoint", ckpt, "no mask here"), "line 1 has no [MASK]")
    long = tmp_path / "long.txt"
    long.write_text("The [MASK] saw it.\n" + "river " * 80 + "[MASK]\n", encoding="utf-8")
    one_line_error(run_tcli("fill-mask", "--checkpoint", ckpt, "--input", str(long)), "line 2", "max_positions")
    one_line_error(run_tcli("fill-mask", "--checkpoint", ckpt, input=""), "<stdin> is empty")
    one_line_error(run_tcli("fill-mask", "--checkpoint", ckpt, "a [MASK]", "--input", str(long)), "not both")
    # stdin, as translate and predict read it: no text and no --input, or --input -
    short = tmp_path / "short.txt"
    short.write_text("The [MASK] saw it.\n", encoding="utf-8")
    by_file = run_tcli("fill-mask", "--checkpoint", ckpt, "--input", str(short))
    for args in ((), ("--input", "-")):
        by_stdin = run_tcli("fill-mask", "--checkpoint", ckpt, *args, input="The [MASK] saw it.\n")
        assert by_stdin.returncode == 0 and by_stdin.stdout == by_file.stdout, by_stdin.stderr
    one_line_error(run_tcli("evaluate", "--checkpoint", ckpt, "--split", "test"), "train and valid")
