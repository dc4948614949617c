"""tcli average: the element-wise mean of checkpoints of one model; anything else refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer_cli.checkpoint import read_checkpoint, serialize
from transformer_cli.config import BertRunConfig, TranslationRunConfig, build_config
from transformer_cli.core.files import write_atomic
from transformer_cli.core.metrics_log import read_metrics
from transformer_cli.models.builders import build_bert, build_transformer
from transformer_cli.vocab.spm import train_vocab

from ..conftest import TOY, run_tcli, tcli, toy_subset

MODEL = {"d_model": 16, "heads": 2, "ffn_dim": 32, "enc_layers": 1, "dec_layers": 1, "max_positions": 64}


def write_checkpoint(path: Path, vocab, seed: int, step: int, data=None, train=None, **model) -> Path:
    """A checkpoint in the trainer's layout, with weights from a seeded initialisation."""
    raw = {
        "data": {"max_len": 40, **(data or {})},
        "train": {"max_steps": 1, **(train or {})},
        "model": {**MODEL, **model},
    }
    cfg = build_config(TranslationRunConfig, raw, "test")
    torch.manual_seed(seed)
    weights = build_transformer(cfg.model, len(vocab), len(vocab)).state_dict()
    state = {
        "tcli": {"kind": "translation", "version": "test"},
        "config": cfg.model_dump(mode="json"),
        "vocab": {"joint": vocab.model_bytes},
        "model": weights,
        "optimizer": {"state": {}},
        "train_state": {"step": step},
    }
    write_atomic(serialize(state), path)
    return path


def write_bert_checkpoint(path: Path) -> Path:
    vocab = train_vocab(
        (TOY / "train.src").read_text(encoding="utf-8").splitlines(),
        size=100,
        pad_piece="[PAD]",
        unk_piece="[UNK]",
        control_symbols=("[CLS]", "[SEP]", "[MASK]"),
        bos_eos=False,
    )
    cfg = build_config(
        BertRunConfig,
        {
            "model": {"d_model": 16, "layers": 1, "heads": 2, "ffn_dim": 32, "max_positions": 160},
            "train": {"max_steps": 1},
        },
        "test",
    )
    state = {
        "tcli": {"kind": "bert", "version": "test"},
        "config": cfg.model_dump(mode="json"),
        "vocab": {"bert": vocab.model_bytes},
        "model": build_bert(cfg.model, len(vocab)).state_dict(),
    }
    write_atomic(serialize(state), path)
    return path


@pytest.fixture(scope="module")
def vocab(toy_vocab):
    return toy_vocab


def test_average_of_two_is_the_elementwise_mean_and_reads_like_any_checkpoint(tmp_path, vocab):
    a = write_checkpoint(tmp_path / "a.pt", vocab, seed=1, step=10)
    b = write_checkpoint(tmp_path / "b.pt", vocab, seed=2, step=20)
    out = tmp_path / "avg.pt"
    code, err = tcli("average", "--checkpoints", str(a), str(b), "--out", str(out))
    assert code == 0, err
    wa, wb = read_checkpoint(a).weights, read_checkpoint(b).weights
    avg = read_checkpoint(out, kind="translation")
    assert avg.weights.keys() == wa.keys()
    for name in wa:
        assert torch.allclose(avg.weights[name], (wa[name] + wb[name]) / 2, atol=1e-7), name
    assert not torch.equal(wa["encoder.0.ffn.w1.weight"], wb["encoder.0.ffn.w1.weight"])  # a real mean
    model = avg.build_model()  # tied embeddings stay one tensor
    assert model.out_proj.weight is model.src_embed.weight
    assert avg.state["tcli"]["averaged"] == {"checkpoints": [str(a), str(b)], "steps": [10, 20]}
    assert "optimizer" not in avg.state and avg.state["config"] == read_checkpoint(a).state["config"]
    translated = run_tcli("translate", "--checkpoint", str(out), "--beam", "2", input="ein test\n")
    assert translated.returncode == 0, translated.stderr  # a user's command reads it like any checkpoint

    code, err = tcli("average", "--checkpoints", str(a), str(b), "--out", str(out))
    assert code == 2 and "exists; pass --force" in err
    assert tcli("average", "--checkpoints", str(a), str(b), "--out", str(out), "--force")[0] == 0
    # an average as an input would weigh its own checkpoints as one (and its step was printed as None)
    for order in ([out, a], [a, out]):
        code, err = tcli("average", "--checkpoints", *map(str, order), "--out", str(tmp_path / "again.pt"))
        assert code == 2 and f"{out} is itself an average (of steps 10, 20)" in err and err.count("\n") == 1, err
    assert not (tmp_path / "again.pt").exists()


def test_tied_weights_stored_apart_are_averaged_as_the_model_ties_them(tmp_path, vocab):
    """A checkpoint converted to half precision ({k: v.half()}) stores its three tied matrices as three tensors:
    the average took its ties from the file and failed (KeyError). They come from the model; the file's dtype stays."""
    a = write_checkpoint(tmp_path / "a.pt", vocab, seed=1, step=10)
    b = write_checkpoint(tmp_path / "b.pt", vocab, seed=2, step=20)
    state = torch.load(a, weights_only=True)
    state["model"] = {name: t.half() for name, t in state["model"].items()}
    torch.save(state, a)
    assert len({t.data_ptr() for t in torch.load(a, weights_only=True)["model"].values()}) == len(state["model"])
    out = tmp_path / "avg.pt"
    code, err = tcli("average", "--checkpoints", str(a), str(b), "--out", str(out))
    assert code == 0, err
    wa, wb, avg = (read_checkpoint(p).weights for p in (a, b, out))
    for name in wa:
        assert avg[name].dtype == torch.float16
        assert torch.allclose(avg[name].float(), (wa[name].float() + wb[name]) / 2, atol=1e-3), name
    assert avg["out_proj.weight"] is avg["src_embed.weight"] is avg["tgt_embed.weight"]


def test_run_last_n_takes_the_newest_steps_by_number(tmp_path, vocab):
    ckpts = tmp_path / "run" / "checkpoints"
    for seed, step in ((1, 9), (2, 10), (3, 100)):
        write_checkpoint(ckpts / f"step_{step}.pt", vocab, seed=seed, step=step)
    write_checkpoint(ckpts / "best.pt", vocab, seed=4, step=10)
    out = tmp_path / "avg.pt"
    code, err = tcli("average", "--run", str(tmp_path / "run"), "--last", "2", "--out", str(out))
    assert code == 0, err
    assert read_checkpoint(out).state["tcli"]["averaged"]["steps"] == [10, 100]  # not step_9 (string order)
    code, err = tcli("average", "--run", str(tmp_path / "run"), "--last", "4", "--out", str(out), "--force")
    assert code == 2 and "holds only 3 step_<N>.pt" in err


@pytest.mark.parametrize(
    "change, message",
    [
        ("vocab", "different vocabularies"),
        ({"d_model": 32}, "model.d_model is 16 in one and 32 in the other"),
        ({"norm": "pre"}, "model.norm is post in one and pre in the other"),
        ("kind", "one holds a translation model, the other a bert model"),
        ("direction", "one translates src->tgt, the other tgt->src"),
    ],
)
def test_mismatched_checkpoints_are_refused_in_one_line(tmp_path, vocab, change, message):
    a = write_checkpoint(tmp_path / "a.pt", vocab, seed=1, step=1)
    if change == "vocab":
        other = train_vocab((TOY / "train.src").read_text(encoding="utf-8").splitlines(), size=100)
        b = write_checkpoint(tmp_path / "b.pt", other, seed=2, step=2)
    elif change == "kind":
        b = write_bert_checkpoint(tmp_path / "b.pt")
    elif change == "direction":  # the same vocabulary (joint) and sizes, trained the other way round
        b = write_checkpoint(tmp_path / "b.pt", vocab, seed=2, step=2, data={"src_lang": "tgt", "tgt_lang": "src"})
    else:
        b = write_checkpoint(tmp_path / "b.pt", vocab, seed=2, step=2, **change)
    code, err = tcli("average", "--checkpoints", str(a), str(b), "--out", str(tmp_path / "avg.pt"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err and str(a) in err and str(b) in err, err
    assert not (tmp_path / "avg.pt").exists()


def test_checkpoints_of_two_runs_are_averaged_with_a_warning(tmp_path, vocab):
    """Same shapes, another train.seed: a valid average, but rarely a good model; stderr says so."""
    a = write_checkpoint(tmp_path / "a.pt", vocab, seed=1, step=1)
    b = write_checkpoint(tmp_path / "b.pt", vocab, seed=2, step=2, train={"seed": 7})
    code, err = tcli("average", "--checkpoints", str(a), str(b), "--out", str(tmp_path / "avg.pt"))
    assert code == 0 and (tmp_path / "avg.pt").is_file(), err
    assert f"warning: {b} was trained with another train.seed than {a}" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--checkpoints", "{d}/A.pt"], "at least two checkpoints"),
        (["--checkpoints", "{d}/A.pt", "{d}/missing.pt"], "checkpoint not found: {d}/missing.pt"),
        (["--checkpoints", "{d}/A.pt", "{d}/A.pt", "--run", "{d}"], "pass either --checkpoints"),
        (["--run", "{d}"], "--run needs --last"),
        ([], "pass either --checkpoints"),
        (["--run", "{d}/nowhere", "--last", "2"], "no checkpoints/ folder"),
    ],
)
def test_bad_arguments_exit_2(tmp_path, vocab, args, message):
    write_checkpoint(tmp_path / "A.pt", vocab, seed=1, step=1)
    code, err = tcli("average", *(a.format(d=tmp_path) for a in args), "--out", str(tmp_path / "avg.pt"))
    assert code == 2 and message.format(d=tmp_path) in err, err
    assert len(err.strip().splitlines()) == 1


def test_train_average_last_writes_and_scores_the_mean_of_the_last_step_checkpoints(tmp_path):

    data = toy_subset(tmp_path / "data", train=200, valid=10)
    config = tmp_path / "avg.yaml"
    config.write_text(
        f"data: {{dir: {data}, max_len: 60}}\nvocab: {{size: 100}}\n"
        "model: {d_model: 16, heads: 2, ffn_dim: 32, enc_layers: 1, dec_layers: 1}\n"
        "train: {max_steps: 6, max_tokens: 400, lr: 0.003, warmup_steps: 2, precision: fp32,\n"
        "        eval_every: 6, save_every: 2, log_every: 2, keep_last: 3, average_last: 3}\n"
        "eval: {beam: 1, max_len_b: 5}\n"
    )
    run = tmp_path / "run"
    result = run_tcli("train", "--config", str(config), "--out", str(run), "--quiet")
    assert result.returncode == 0, result.stderr
    steps = [run / "checkpoints" / f"step_{n}.pt" for n in (2, 4, 6)]
    averaged = read_checkpoint(run / "checkpoints" / "averaged.pt").weights
    parts = [read_checkpoint(p).weights for p in steps]
    for name, tensor in averaged.items():
        mean = sum(p[name] for p in parts) / 3
        assert torch.allclose(tensor, mean, atol=1e-6), name
    log = read_metrics(run)
    assert [e["checkpoint"] for e in log if e["event"] == "test"] == ["best.pt", "averaged.pt"]
    assert [e["checkpoints"] for e in log if e["event"] == "averaged"] == [["step_2.pt", "step_4.pt", "step_6.pt"]]
    refused = run_tcli("train", "--config", str(config), "--out", str(tmp_path / "r2"), "--set", "train.keep_last=2")
    assert refused.returncode == 2 and "train.average_last (3) needs train.keep_last >= 3" in refused.stderr
    # a run's own checkpoint files are no --out, --force or not (an average in place of last.pt cannot resume)
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    for name in ("last.pt", "best.pt", "averaged.pt", "step_4.pt", "step_8.pt"):
        out = run / "checkpoints" / name
        code, err = tcli("average", "--checkpoints", str(steps[0]), str(steps[1]), "--out", str(out), "--force")
        assert code == 2 and f"is the run {run}'s own {name}; write the average beside it" in err, err
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before
    beside = run / "avg.pt"
    assert tcli("average", "--checkpoints", str(steps[0]), str(steps[1]), "--out", str(beside))[0] == 0
