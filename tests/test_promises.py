"""The README's "What tcli guarantees" for the commands that read or write a user's files (issue 25): every bad
input, odd path or refused run is one line with exit code 2 and leaves the disk as it was.

Each test holds a class of faults, not one example: every command with a path option, every damage of a
preprocessed array, every config.json key that changes the model. Commands run in this process (CliRunner);
tests/test_writers_atomic.py holds the ones whose subject is a signal or a killed process.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from transformer_cli.checkpoint import serialize
from transformer_cli.config import BertRunConfig, TranslationRunConfig, build_config
from transformer_cli.core.files import write_atomic
from transformer_cli.models.builders import build_transformer

from .conftest import ROOT, one_line_error, run_tcli, toy_subset

TRANSLATION = {
    "data": {"max_len": 40},
    "vocab": {"size": 100, "max_sentences": 300},
    "model": {"d_model": 16, "heads": 2, "ffn_dim": 32, "enc_layers": 1, "dec_layers": 1, "max_positions": 64},
    "train": {"max_steps": 2, "max_tokens": 300, "warmup_steps": 1, "eval_every": 2, "log_every": 1},
    "eval": {"beam": 1},
}
BERT = {
    "data": {"max_seq_len": 32, "max_predictions": 5},
    "vocab": {"size": 120, "max_sentences": 300},
    "model": {"d_model": 16, "layers": 1, "heads": 2, "ffn_dim": 32, "max_positions": 32},
    "train": {"max_steps": 2, "batch_size": 8, "warmup_steps": 1, "eval_every": 2, "log_every": 1},
}
LONG = "n" * 300  # one path component over the 255 bytes file systems allow


def tcli(*args: str) -> tuple[int, str]:
    """The command in this process: exit code, stderr."""
    from typer.testing import CliRunner

    from transformer_cli.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stderr


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones included) with the hash of its bytes."""
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
        if p.name != ".lock"
    }


def bert_text(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name, n in (("train.txt", 1200), ("valid.txt", 200)):
        lines = (ROOT / "data" / "bert_toy" / name).read_text(encoding="utf-8").splitlines()[:n]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def write_config(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(json.dumps(raw))  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """Configs, their preprocessed folders, a finished BERT run, checkpoints and an HF export: made once."""
    root = tmp_path_factory.mktemp("promises")
    tr = {**TRANSLATION, "data": {**TRANSLATION["data"], "dir": str(toy_subset(root / "toy", 150, 8))}}
    bert = {**BERT, "data": {**BERT["data"], "dir": str(bert_text(root / "bert_toy"))}}
    w = {
        "root": root,
        "tr_yaml": write_config(root / "tr.yaml", tr),
        "bert_yaml": write_config(root / "bert.yaml", bert),
    }
    for kind in ("tr", "bert"):
        w[f"pre_{kind}"] = root / f"pre_{kind}"
        code, err = tcli("preprocess", "--config", w[f"{kind}_yaml"], "--out", w[f"pre_{kind}"], "--quiet")
        assert code == 0, err
    w["bert_run"] = root / "bert_run"
    code, err = tcli("pretrain-bert", "--config", w["bert_yaml"], "--out", w["bert_run"], "--quiet", "--device", "cpu")
    assert code == 0, err
    w["tr_ckpt"] = write_translation_checkpoint(root / "tr.pt", seed=1)
    w["tr_ckpt2"] = write_translation_checkpoint(root / "tr2.pt", seed=2)
    w["bert_ckpt"] = w["bert_run"] / "checkpoints" / "last.pt"
    w["hf"] = root / "hf"
    code, err = tcli("export-hf", "--checkpoint", w["bert_ckpt"], "--out", w["hf"])
    assert code == 0, err
    return w


def write_translation_checkpoint(path: Path, seed: int) -> Path:
    from transformer_cli.core.text import read_lines
    from transformer_cli.vocab.spm import train_vocab

    vocab = train_vocab(read_lines(ROOT / "data" / "toy" / "train.src")[:500], size=100)
    cfg = build_config(TranslationRunConfig, TRANSLATION, "test")
    torch.manual_seed(seed)
    state = {
        "tcli": {"kind": "translation", "version": "test"},
        "config": cfg.model_dump(mode="json"),
        "vocab": {"joint": vocab.model_bytes},
        "model": build_transformer(cfg.model, len(vocab), len(vocab)).state_dict(),
        "train_state": {"step": seed},
    }
    write_atomic(serialize(state), path)
    return path


# ----------------------------------------------------------------------------- 1. preprocess into another kind


@pytest.mark.parametrize("into", ["tr", "bert"])
def test_preprocess_never_replaces_the_other_kind_without_force(world, tmp_path, into):
    other = "bert" if into == "tr" else "tr"
    folder = tmp_path / "pre"
    shutil.copytree(world[f"pre_{into}"], folder)
    before = snapshot(folder)
    one_line_error(tcli("preprocess", "--config", world[f"{other}_yaml"], "--out", folder, "--quiet"))
    assert snapshot(folder) == before
    code, err = tcli("preprocess", "--config", world[f"{other}_yaml"], "--out", folder, "--quiet", "--force")
    assert code == 0, err
    # only the new kind's files: the same names as a preprocessing into an empty folder
    assert sorted(snapshot(folder)) == sorted(snapshot(world[f"pre_{other}"]))


# ----------------------------------------------------------------------------- 2, 9. damaged arrays


def damage(folder: Path, how: str) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    dtype = np.dtype(manifest["dtype"])
    binary = sorted(folder.glob("train.*.bin"))[0]
    if how == "id_beyond_vocab":
        ids = np.fromfile(binary, dtype)
        ids[len(ids) // 2] = np.iinfo(dtype).max if dtype.kind == "u" else 1 << 30
        ids.tofile(binary)
    elif how == "offsets_backwards":
        index = binary.with_suffix(".idx")
        offsets = np.fromfile(index, "<i8")
        offsets[1], offsets[2] = offsets[2], offsets[1]
        offsets.tofile(index)
    elif how == "negative_id":
        manifest["dtype"] = "<i2" if dtype.itemsize == 2 else "<i4"
        (folder / "manifest.json").write_text(json.dumps(manifest))
        ids = np.fromfile(binary, manifest["dtype"])
        ids[3] = -5
        ids.tofile(binary)


@pytest.mark.parametrize("kind", ["tr", "bert"])
@pytest.mark.parametrize("how", ["id_beyond_vocab", "offsets_backwards", "negative_id"])
def test_a_damaged_preprocessed_folder_is_refused_before_anything_is_written(world, tmp_path, kind, how):
    folder = tmp_path / "pre"
    shutil.copytree(world[f"pre_{kind}"], folder)
    damage(folder, how)
    out = tmp_path / "run"
    command = "train" if kind == "tr" else "pretrain-bert"
    set_ = f"data.preprocessed={folder}"
    code, err = tcli(command, "--config", world[f"{kind}_yaml"], "--out", out, "--set", set_, "--quiet")
    one_line_error((code, err))
    assert str(folder) in err and "preprocess" in err
    assert not out.exists()  # no config.yaml, run.json or vocabulary left behind
    # tcli preprocess agrees with training: the folder is redone, not "up to date"
    code, err = tcli("preprocess", "--config", world[f"{kind}_yaml"], "--out", folder)
    assert code == 0 and "up to date" not in err, err
    assert sorted(snapshot(folder)) == sorted(snapshot(world[f"pre_{kind}"]))


def test_a_refused_resume_with_init_from_hf_changes_nothing(world, tmp_path):
    """A finished run, raised max_steps, and an HF folder of another vocabulary: refused, naming the folder,
    and run.json, config.yaml and the logs stay as they were (the next plain resume does not rerun the end)."""
    run = tmp_path / "run"
    shutil.copytree(world["bert_run"], run)
    other = tmp_path / "hf_other"
    shutil.copytree(world["hf"], other)
    # a BERT vocabulary of the same size from other text: the folder loads, only its vocabulary differs
    from transformer_cli.bert.setup import train_bert_vocab

    lines = (ROOT / "data" / "bert_toy" / "train.txt").read_text(encoding="utf-8").splitlines()[5000:8000]
    vocab = train_bert_vocab(lines, build_config(BertRunConfig, BERT, "test"))
    assert len(vocab) == json.loads((other / "config.json").read_text())["vocab_size"]
    (other / "spiece.model").write_bytes(vocab.model_bytes)
    before = snapshot(run)
    code, err = tcli(
        "pretrain-bert",
        "--config",
        world["bert_yaml"],
        "--out",
        run,
        "--resume",
        "auto",
        "--set",
        "train.max_steps=4",
        "--init-from-hf",
        other,
        "--quiet",
    )
    one_line_error((code, err))
    assert "another vocabulary" in err and str(other) in err
    assert snapshot(run) == before


# ----------------------------------------------------------------------------- 3. not a training checkpoint


@pytest.mark.parametrize("replace_with", ["average", "export_like", "no_rng", "bad_train_state"])
def test_resume_from_a_checkpoint_that_is_not_a_training_state_is_one_line(world, tmp_path, replace_with):
    run = tmp_path / "run"
    shutil.copytree(world["bert_run"], run)
    last = run / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=True)
    if replace_with == "average":
        step = sorted((run / "checkpoints").glob("*.pt"))
        code, err = tcli("average", "--checkpoints", last, step[0], "--out", tmp_path / "avg.pt")
        if code != 0:  # best.pt is last.pt here (2 steps): average two distinct files
            state = {k: v for k, v in state.items() if k not in ("optimizer", "train_state")}
            state["tcli"] = {**state["tcli"], "averaged": {"checkpoints": [], "steps": []}}
            write_atomic(serialize(state), tmp_path / "avg.pt")
        shutil.copy(tmp_path / "avg.pt", last)
    elif replace_with == "export_like":
        write_atomic(serialize({k: state[k] for k in ("tcli", "config", "vocab", "model")}), last)
    elif replace_with == "no_rng":
        write_atomic(serialize({k: v for k, v in state.items() if k != "rng"}), last)
    else:
        write_atomic(serialize({**state, "train_state": {**state["train_state"], "step": "2"}}), last)
    before = snapshot(run)
    code, err = tcli(
        "pretrain-bert", "--config", world["bert_yaml"], "--out", run, "--resume", "auto", "--set", "train.max_steps=4"
    )
    one_line_error((code, err))
    assert "last.pt" in err
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "entry", ["metrics.jsonl", "config.yaml", "vocab/bert.model", "vocab/vocab.json", "checkpoints/step_1.pt", "tb"]
)
def test_a_run_whose_own_file_became_a_folder_is_refused_before_any_write(world, tmp_path, entry):
    """A resume refused for `metrics.jsonl` being a folder had already marked the run "running" and written the new
    max_steps into config.yaml, so the next plain resume ran its end again. The run's own names are checked first."""
    run = tmp_path / "run"
    shutil.copytree(world["bert_run"], run)
    path = run / entry
    if path.is_dir():
        shutil.rmtree(path)
        path.write_text("not a folder")
    else:
        path.unlink(missing_ok=True)
        path.mkdir()
    before = snapshot(run)
    code, err = tcli(
        "pretrain-bert", "--config", world["bert_yaml"], "--out", run, "--resume", "auto", "--set", "train.max_steps=4"
    )
    one_line_error((code, err))
    assert str(path) in err and "move it away" in err
    assert snapshot(run) == before


# ----------------------------------------------------------------------------- 4. names over 255 bytes


FINETUNE_YAML = Path(__file__).resolve().parents[1] / "configs" / "finetune_sst2.yaml"


def long_name_cases(w: dict[str, Path], tmp: Path) -> list[list]:
    long = tmp / LONG
    return [
        ["plot", long],
        ["plot", w["bert_run"], "--out", long / "c.png"],
        ["plot", w["bert_run"], "--out", tmp / f"{LONG}.png"],
        ["average", "--checkpoints", w["tr_ckpt"], w["tr_ckpt2"], "--out", tmp / f"{LONG}.pt"],
        ["average", "--checkpoints", w["tr_ckpt"], long, "--out", tmp / "a.pt"],
        ["export-hf", "--checkpoint", w["bert_ckpt"], "--out", long],
        ["export-hf", "--checkpoint", long, "--out", tmp / "x"],
        ["export-ct2", "--checkpoint", w["tr_ckpt"], "--out", long],
        ["preprocess", "--config", w["tr_yaml"], "--out", long],
        ["preprocess", "--config", long, "--out", tmp / "p"],
        ["evaluate", "--checkpoint", w["tr_ckpt"], "--input", long, "--reference", long],
        ["evaluate", "--checkpoint", long, "--split", "val"],
        ["pretrain-bert", "--config", w["bert_yaml"], "--out", tmp / "r", "--init-from-hf", long],
        ["pretrain-bert", "--config", w["bert_yaml"], "--out", tmp / "r", "--set", f"data.preprocessed={long}"],
        ["train", "--config", w["tr_yaml"], "--out", long],
        ["train", "--config", w["tr_yaml"], "--out", tmp / "r", "--set", f"data.dir={long}"],
        ["translate", "--checkpoint", w["tr_ckpt"], "--output", tmp / f"{LONG}.txt", "--input", w["tr_yaml"]],
        ["translate", "--checkpoint", w["tr_ckpt"], "--attention", long, "--input", w["tr_yaml"]],
        ["fill-mask", "--checkpoint", w["bert_ckpt"], "--input", long],
        ["count-params", "--checkpoint", long],
        ["finetune", "--config", FINETUNE_YAML, "--out", long],
        ["finetune", "--config", FINETUNE_YAML, "--out", tmp / "r", "--set", f"model.init={long / 'b.pt'}"],
        ["finetune", "--config", FINETUNE_YAML, "--out", tmp / "r", "--set", f"data.dir={long}"],
        ["predict", "--checkpoint", long, "--input", w["tr_yaml"]],
        ["predict", "--checkpoint", w["bert_ckpt"], "--input", w["tr_yaml"], "--output", tmp / f"{LONG}.txt"],
        ["glue", "--checkpoint", "none", "--data-dir", long, "--out", tmp / "g"],
        ["glue", "--checkpoint", long, "--data-dir", tmp, "--out", tmp / "g"],
        ["glue", "--checkpoint", "none", "--data-dir", tmp, "--out", long],
    ]


def test_a_name_over_255_bytes_is_one_line_for_every_command_and_path(world, tmp_path):
    for case in long_name_cases(world, tmp_path):
        code, err = tcli(*case)
        assert code == 2 and "Traceback" not in err, (case[:2], err)
        assert "255" in err or "too long" in err, (case[:2], err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written anywhere


def test_a_run_folder_whose_name_is_not_utf8_is_refused_before_any_write(world, tmp_path):
    """TensorBoard writes text paths only: `--out bad<0xff>name` trained the vocabulary, tokenised the data and then
    failed (first with a wrong "not a sentencepiece model"). Refused first; preprocessing there works."""
    folder = tmp_path / os.fsdecode(b"bad\xffname")
    for command, config in (("train", "tr_yaml"), ("pretrain-bert", "bert_yaml")):
        code, err = tcli(command, "--config", world[config], "--out", folder / "run", "--quiet")
        one_line_error((code, err))
        assert "not UTF-8" in err
    assert list(tmp_path.iterdir()) == []
    code, err = tcli("preprocess", "--config", world["tr_yaml"], "--out", folder / "pre", "--quiet")
    assert code == 0, err


# ----------------------------------------------------------------------------- 5. plot


@pytest.mark.parametrize(
    "log",
    [
        b'{"event":"train","step":"abc","loss":1.0}\n{"event":"train","step":2,"loss":0.5,"lr":0.1}\n',
        b'{"event":"train","step":1,"loss":NaN}\n{"event":"eval","step":2,"valid_loss":1,"wall_s":"x"}\n',
        b'{"event":"train","step":true,"loss":1}\n{"event":"train","step":2,"loss":0.5}\n',
        b'{"event":"train","step":1e999,"loss":1}\n{"event":"train","step":3,"loss":0.5}\n',
        bytes(range(256)) * 40,
        b"\xff\xfe" + '{"event":"train","step":1,"loss":1}'.encode("utf-16-le"),
        b'[1,2]\n"text"\n{"event":"eval"}\n' + b"[" * 100_000 + b"\n",
    ],
)
def test_plot_reads_any_metrics_file_without_a_traceback(tmp_path, log):
    pytest.importorskip("matplotlib")
    (tmp_path / "metrics.jsonl").write_bytes(log)
    code, err = tcli("plot", tmp_path, "--out", tmp_path / "c.png")
    if code != 0:
        one_line_error((code, err))
    else:
        assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("out", ["/proc/curves.png", "/sys/curves.png", "c.txt", "c.docx", "dir.png/"])
def test_plot_refuses_outputs_it_cannot_write(world, tmp_path, out):
    pytest.importorskip("matplotlib")
    target = tmp_path / out if not out.startswith("/") else Path(out)
    if out.endswith("/"):
        target.mkdir()
    one_line_error(tcli("plot", world["bert_run"], "--out", target))
    assert [p.name for p in tmp_path.iterdir()] == (["dir.png"] if out.endswith("/") else [])


@pytest.mark.parametrize("name", ["noext", "curves.png", "curves.svg", "curves.pdf"])
def test_plot_writes_exactly_the_file_it_names(world, tmp_path, name):
    pytest.importorskip("matplotlib")
    code, err = tcli("plot", world["bert_run"], "--out", tmp_path / name)
    assert code == 0, err
    assert err.strip() == f"wrote {tmp_path / name}"
    assert [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.parametrize(
    "name, content",
    [("ckcopy", "checkpoint"), ("c.png", b"notes\n"), (".lock", b""), ("c.svg", b"\x89PNG\r\n\x1a\n"), ("c.pdf", b"x")],
)
def test_plot_replaces_only_an_image_of_its_format(world, tmp_path, name, content):
    """`--out ckcopy` (a checkpoint copied under a name without an extension) was replaced by a PNG, exit 0: plot
    replaces a file only where it holds an image of the format it writes (its own earlier plot)."""
    pytest.importorskip("matplotlib")
    target = tmp_path / name
    target.write_bytes(
        Path(world["bert_run"], "checkpoints", "last.pt").read_bytes() if content == "checkpoint" else content
    )
    before = target.read_bytes()
    one_line_error(tcli("plot", world["bert_run"], "--out", target))
    assert target.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [name]
    again = target.with_suffix(".png") if name == "c.svg" else tmp_path / "plot.png"
    for _ in range(2):  # its own image, replaced
        code, err = tcli("plot", world["bert_run"], "--out", again)
        assert code == 0 and again.read_bytes()[:4] == b"\x89PNG", err


def test_plot_to_pgf_without_tex_is_one_line(world, tmp_path, monkeypatch):
    """matplotlib draws .pgf through xelatex: without it, a traceback after the drawing had begun."""
    pytest.importorskip("matplotlib")
    import shutil

    monkeypatch.setattr(shutil, "which", lambda *_: None)
    code, err = tcli("plot", world["bert_run"], "--out", tmp_path / "c.pgf")
    one_line_error((code, err))
    assert "xelatex, which is not installed" in err and list(tmp_path.iterdir()) == []


def test_plot_of_a_run_whose_name_holds_a_control_character_warns_of_nothing(world, tmp_path):
    """The title is the run folder's name: a tab in it was a missing glyph, and matplotlib's warning on stderr."""
    pytest.importorskip("matplotlib")
    import warnings

    from transformer_cli.tools.plot import plot_run

    run = tmp_path / "tab\there"
    shutil.copytree(world["bert_run"], run)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_run(run, tmp_path / "c.png")
    assert [str(w.message) for w in caught] == []


# ----------------------------------------------------------------------------- 6. silent wrong results


@pytest.mark.parametrize("twice", ["same_path", "dot_path", "symlink", "copy", "hardlink"])
def test_average_refuses_a_checkpoint_given_twice(world, tmp_path, twice, monkeypatch):
    a = tmp_path / "a.pt"
    shutil.copy(world["tr_ckpt"], a)
    monkeypatch.chdir(tmp_path)
    second = {
        "same_path": lambda: a,
        "dot_path": lambda: Path("./a.pt"),
        "symlink": lambda: (tmp_path / "l.pt").symlink_to(a) or tmp_path / "l.pt",
        "copy": lambda: shutil.copy(a, tmp_path / "c.pt") and tmp_path / "c.pt",
        "hardlink": lambda: (tmp_path / "h.pt").hardlink_to(a) or tmp_path / "h.pt",
    }[twice]()
    one_line_error(tcli("average", "--checkpoints", a, world["tr_ckpt2"], second, "--out", tmp_path / "avg.pt"))
    assert not (tmp_path / "avg.pt").exists()


# (key, value): each changes what the model computes; absent keys take transformers' defaults, tcli's values.
FUNCTION_CHANGES = [
    ("hidden_act", "relu"),
    ("hidden_act", "gelu_new"),
    ("layer_norm_eps", 1e-5),
    ("position_embedding_type", "relative_key"),
    ("type_vocab_size", 3),
    ("is_decoder", True),
    ("tie_word_embeddings", False),
    ("model_type", "roberta"),
]


@pytest.mark.parametrize("key,value", FUNCTION_CHANGES)
def test_init_from_hf_refuses_a_config_key_that_changes_the_function(world, tmp_path, key, value):
    folder = tmp_path / "hf"
    shutil.copytree(world["hf"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    out = tmp_path / "run"
    code, err = tcli("pretrain-bert", "--config", world["bert_yaml"], "--out", out, "--init-from-hf", folder)
    one_line_error((code, err))
    assert key in err
    assert not out.exists()


def test_init_from_hf_refuses_an_untied_decoder(world, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "hf"
    shutil.copytree(world["hf"], folder)
    weights = load_file(folder / "model.safetensors")
    weights["cls.predictions.decoder.weight"] = weights["bert.embeddings.word_embeddings.weight"] + 1
    save_file(weights, folder / "model.safetensors")
    one_line_error(
        tcli("pretrain-bert", "--config", world["bert_yaml"], "--out", tmp_path / "r", "--init-from-hf", folder)
    )


def test_init_from_hf_defaults_and_the_export_itself_are_accepted(world):
    """Keys left out take transformers' defaults, which are tcli's values: such a folder loads."""
    from transformer_cli.export.hf import load_hf_bert

    cfg = build_config(BertRunConfig, BERT, "test")
    load_hf_bert(world["hf"], cfg.model)
    config = json.loads((world["hf"] / "config.json").read_text())
    from transformer_cli.export.hf import FUNCTION_KEYS, check_hf_config, hf_config

    check_hf_config({k: v for k, v in config.items() if k not in FUNCTION_KEYS}, hf_config(cfg.model, 0), "x")


# ----------------------------------------------------------------------------- 7. unbounded work


@pytest.mark.parametrize("beam", ["0", "257", "100000"])
def test_evaluate_bounds_the_beam_like_translate(world, beam):
    for command, data in (("translate", ["--input", world["tr_yaml"]]), ("evaluate", ["--split", "val"])):
        code, err = tcli(command, "--checkpoint", world["tr_ckpt"], "--beam", beam, *data)
        assert code == 2 and "--beam" in err and "Traceback" not in err, err


def test_a_heatmap_draws_a_bounded_number_of_pieces(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    from transformer_cli.core.figures import HEATMAP_MAX_PIECES, heatmaps

    for n in (HEATMAP_MAX_PIECES, 3000):
        labels = [f"p{i}" for i in range(n)]
        path = tmp_path / f"{n}.png"
        weights = np.full((n, n), 1.0 / n, np.float32)
        heatmaps(path, [("layer 0", weights)], labels, labels, "t", "x", "y")
        assert matplotlib.image.imread(path).shape[:2] == matplotlib.image.imread(tmp_path / f"{n}.png").shape[:2]
    assert (
        matplotlib.image.imread(tmp_path / "3000.png").shape
        == matplotlib.image.imread(tmp_path / f"{HEATMAP_MAX_PIECES}.png").shape
    )


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
def test_an_endless_line_from_a_device_is_one_line_for_every_reader(world):
    """`evaluate --input /dev/zero` on a BERT checkpoint read until the kernel killed it (24 GB), and so did
    fill-mask: a line from a stream that is no regular file is bounded (64 MiB)."""
    for case in (
        ["evaluate", "--checkpoint", world["bert_ckpt"], "--input", "/dev/zero", "--device", "cpu"],
        ["evaluate", "--checkpoint", world["tr_ckpt"], "--input", "/dev/zero", "--reference", "/dev/zero"],
        ["fill-mask", "--checkpoint", world["bert_ckpt"], "--input", "/dev/zero"],
    ):
        code, err = tcli(*case)
        one_line_error((code, err))
        assert "/dev/zero: line 1 has over 64 MiB and no line end" in err


def test_evaluate_refuses_a_reference_it_would_ignore(world, tmp_path):
    """--split scores the split's own targets: `--split val --reference test.tgt` printed val's scores as if."""
    ref = tmp_path / "ref.txt"
    ref.write_text("a b\n")
    code, err = tcli("evaluate", "--checkpoint", world["tr_ckpt"], "--split", "val", "--reference", ref)
    one_line_error((code, err))
    assert "--reference goes with --input" in err


# ----------------------------------------------------------------------------- 10. messages


@pytest.mark.parametrize(
    "change,expected",
    [
        ({"hidden_size": "16"}, "'16' (str)"),
        ({"num_attention_heads": 2.0}, "2.0 (float)"),
        ({"hidden_size": None}, "None (NoneType)"),
        ({"model_type": "gpt2", "n_embd": 16}, "'gpt2'"),
        ({"layer_norm_eps": "1e-12"}, "layer_norm_eps"),
        ({"vocab_size": "its own, as a float"}, "vocab_size is"),  # 400.0 == 400: it was accepted
        ({"vocab_size": True}, "vocab_size is True (bool)"),
    ],
)
def test_init_from_hf_config_messages_name_the_key_and_the_value(world, tmp_path, change, expected):
    folder = tmp_path / "hf"
    shutil.copytree(world["hf"], folder)
    config = json.loads((folder / "config.json").read_text())
    if change.get("vocab_size") == "its own, as a float":
        change = {"vocab_size": float(config["vocab_size"])}
        expected = f"vocab_size is {change['vocab_size']} (float); it must be an integer"
    if change.get("model_type") == "gpt2":
        config = {k: v for k, v in config.items() if k not in ("hidden_size", "num_hidden_layers")}
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    code, err = tcli("pretrain-bert", "--config", world["bert_yaml"], "--out", tmp_path / "r", "--init-from-hf", folder)
    one_line_error((code, err))
    assert expected in err, err
    assert "model.d_model=None" not in err and "is 16 but" not in err


def test_evaluate_on_pairs_that_are_all_too_long_names_the_files_and_the_limit(world, tmp_path):
    src, ref = tmp_path / "in.src", tmp_path / "in.ref"
    src.write_text("dog " * 200 + "\n")
    ref.write_text("Hund " * 200 + "\n")
    code, err = tcli("evaluate", "--checkpoint", world["tr_ckpt"], "--input", src, "--reference", ref)
    one_line_error((code, err))
    assert str(src) in err and str(ref) in err and "model.max_positions" in err
    assert "the the" not in err and "data.max_len" not in err


def test_help_shows_every_bracket_of_every_docstring():
    """The help renderer takes text as it is written: `pip install -e ".[ct2]"` keeps its [ct2]."""
    from typer.testing import CliRunner

    from transformer_cli.cli import app

    for command in app.registered_commands:
        doc = command.callback.__doc__ or ""
        name = command.name or command.callback.__name__.replace("_", "-")
        shown = " ".join(CliRunner().invoke(app, [name, "--help"]).output.split())
        for bracket in {part.split("]")[0] for part in doc.split("[")[1:]}:
            assert f"[{bracket}]" in shown, (name, bracket)
    assert '".[ct2]"' in " ".join(CliRunner().invoke(app, ["export-ct2", "--help"]).output.split())


# ----------------------------------------------------------------------------- attention maps under bf16


def test_attention_maps_are_fp32_probabilities_under_bf16_autocast():
    """`translate --attention` under bf16 (what precision auto picks on AMX CPUs and recent GPUs): the
    recorded weights are computed in fp32, so every row sums to 1 like fp32's (bf16 would be off by ~1e-3)."""
    import contextlib

    from transformer_cli.translation.attention import teacher_forced_attention

    cfg = build_config(TranslationRunConfig, TRANSLATION, "test")
    torch.manual_seed(0)
    model = build_transformer(cfg.model, 100, 100).eval()
    g = torch.Generator().manual_seed(1)
    pairs = [
        (torch.randint(4, 100, (n,), generator=g).tolist(), torch.randint(4, 100, (n + 3,), generator=g).tolist())
        for n in (7, 30)
    ]

    def bf16() -> contextlib.AbstractContextManager:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    fp32 = teacher_forced_attention(model, pairs, 2, 3, torch.device("cpu"))
    for maps, reference in zip(teacher_forced_attention(model, pairs, 2, 3, torch.device("cpu"), bf16), fp32):
        for kind in ("encoder", "decoder", "cross"):
            assert maps[kind].dtype == np.float32
            np.testing.assert_allclose(maps[kind].sum(-1), 1.0, atol=1e-5)
            np.testing.assert_allclose(maps[kind], reference[kind], atol=0.05)  # the same Q and K, rounded by bf16


def test_plot_draws_a_finetuning_run_and_names_a_file_given_as_run(tmp_path):
    """A fine-tuning run logs its dev metrics (accuracy, pearson, entity_f1, ...), not BLEU or MLM accuracy: they
    are its validation row (plot refused such a run: "no finite values of a plotted metric")."""
    pytest.importorskip("matplotlib")
    from transformer_cli.tools.plot import _rows, read_events

    lines = [
        {"event": "train", "step": 2, "loss": 0.7, "lr": 1e-4, "tokens_per_sec": 900.0},
        {"event": "eval", "step": 2, "accuracy": 0.6, "f1": 0.5, "score": 0.55, "wall_s": 1.0},
        {"event": "eval", "step": 4, "accuracy": 0.7, "f1": 0.6, "score": 0.65, "wall_s": 2.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    rows = dict(_rows(read_events(tmp_path)))
    assert [label for label, *_ in rows["validation"]] == ["accuracy", "f1"]
    code, err = tcli("plot", tmp_path, "--out", tmp_path / "c.png")
    assert code == 0 and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG", err
    code, err = tcli("plot", tmp_path / "c.png", "--out", tmp_path / "d.png")
    one_line_error((code, err))
    assert "is not a run directory (a file)" in err
    for run, what in ((tmp_path / "c.png", "a file"), (tmp_path / "nowhere", "no such folder")):
        code, err = tcli("plot", run)  # the default --out is inside the run: it was the option the error named
        one_line_error((code, err))
        assert f"is not a run directory ({what})" in err and "--out" not in err.replace("'s --out named", ""), err


# ----------------------------------------------------------------------------- 6. options (fuzzed, 2026-12-06)


@pytest.mark.parametrize("device", ["mps", "xla", "meta", "cpu:1", "vulkan", "cuda:x"])
def test_devices_tcli_does_not_run_on_are_one_line(world, device):
    """torch knows mps, xla and meta: they passed the check and failed inside torch with a traceback."""
    code, err = tcli("count-params", "--checkpoint", world["tr_ckpt"])  # the checkpoint itself is fine
    assert code == 0, err
    source = world["root"] / "src.txt"
    source.write_text("a b\n")
    code, err = tcli("translate", "--checkpoint", world["tr_ckpt"], "--input", source, "--device", device)
    one_line_error((code, err))
    assert "expected auto, cpu, cuda or cuda:N" in err or "no CUDA device is visible" in err, err


def test_translate_output_options_protect_checkpoints_and_take_dash_as_stdout(world, tmp_path):
    """-o naming a checkpoint (any name) is refused, the file intact; `-o -` is standard output, as `-i -` is
    standard input (it wrote a file named -); --stats-json - is refused."""
    source = tmp_path / "src.txt"
    source.write_text("a b\nc d\n")
    other = tmp_path / "other_model.bin"
    shutil.copyfile(world["tr_ckpt2"], other)
    before = hashlib.sha256(other.read_bytes()).hexdigest()
    code, err = tcli("translate", "--checkpoint", world["tr_ckpt"], "--input", source, "--output", other)
    one_line_error((code, err))
    assert "holds a checkpoint" in err and hashlib.sha256(other.read_bytes()).hexdigest() == before
    from typer.testing import CliRunner

    from transformer_cli.cli import app

    result = CliRunner().invoke(app, ["translate", "--checkpoint", str(world["tr_ckpt"]), "-i", str(source), "-o", "-"])
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 2 and not Path("-").exists(), result.stderr
    code, err = tcli("translate", "--checkpoint", world["tr_ckpt"], "--input", source, "--stats-json", "-")
    one_line_error((code, err))
    assert "give a file name" in err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_translate_files_that_fail_when_written_are_the_only_line_on_stderr(world, tmp_path):
    """/dev/full opens and fails when written: --stats-json there printed the scores and speed, then the error."""
    source = tmp_path / "src.txt"
    source.write_text("a b\nc d\n")
    code, err = tcli(
        "translate",
        "--checkpoint",
        world["tr_ckpt"],
        "--input",
        source,
        "--reference",
        source,
        "--stats-json",
        "/dev/full",
    )
    one_line_error((code, err))
    assert err.strip().startswith("error: --stats-json /dev/full: cannot write") and len(err.strip().splitlines()) == 1


def test_evaluate_lenpen_is_bounded_like_translates(world, tmp_path):
    """`evaluate --lenpen 400` overflowed a float in beam search (a traceback); inf ranked nothing."""
    source = tmp_path / "src.txt"
    source.write_text("a b\n")
    for value in ("400", "inf", "1e309"):
        code, err = tcli(
            "evaluate", "--checkpoint", world["tr_ckpt"], "--input", source, "--reference", source, "--lenpen", value
        )
        assert code == 2 and "'--lenpen'" in err and "less than or equal to 10" in err, err  # main() makes it one line


def test_exports_and_preprocessing_never_write_into_a_runs_own_folders(world, tmp_path, monkeypatch):
    """--force or not: export-hf into a run's vocab/ deleted its vocab.json; preprocess into its data/ replaced
    the arrays a resume reads. The run folder and its vocab/, data/, checkpoints/, tb/ are refused, however they
    are named (`.` inside one, a link to one) and at any depth below them."""
    run = tmp_path / "run"
    shutil.copytree(world["bert_run"], run)
    (tmp_path / "link").symlink_to(run / "vocab")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    for out in (run, run / "vocab", run / "checkpoints", run / "tb" / "x", tmp_path / "link", run / "vocab" / ".."):
        code, err = tcli("export-hf", "--checkpoint", world["bert_ckpt"], "--out", out, "--force")
        one_line_error((code, err))
        assert "the run's own" in err
    monkeypatch.chdir(run / "checkpoints")
    for command in (["export-hf", "--checkpoint", world["bert_ckpt"]], ["preprocess", "--config", world["bert_yaml"]]):
        code, err = tcli(*command, "--out", ".", "--force")
        one_line_error((code, err))
        assert "the run's own" in err
    code, err = tcli("preprocess", "--config", world["bert_yaml"], "--out", run / "data", "--force", "--quiet")
    one_line_error((code, err))
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"} == before
    code, err = tcli("export-hf", "--checkpoint", world["bert_ckpt"], "--out", run / "hf")  # a folder of its own
    assert code == 0, err


def test_an_output_that_is_a_pipe_is_checked_without_opening_it(tmp_path):
    """`-o >(gzip > out.gz)` or a named pipe: the checkpoint check reads only regular files (opening a FIFO to
    read blocks until a writer comes). An alarm turns a hang into a failure."""
    import os

    from transformer_cli.core.streams import check_writable

    from .conftest import fails_if_it_hangs

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with fails_if_it_hangs("check_writable of a FIFO (it opened it)"):
        check_writable(fifo, "--output")


# ----------------------------------------------------------------------------- the command line itself


def _single_valued_options():
    """(command, option, a value for it) for every option of every command that is not a list."""
    import typer

    from transformer_cli.cli import app

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        for param in command.params:
            if param.param_type_name == "option" and not param.multiple and param.name != "help":
                yield name, param.opts[0], None if param.is_flag else "1"


@pytest.mark.parametrize("command,option,value", list(_single_valued_options()), ids=lambda v: str(v))
def test_an_option_given_twice_is_refused_not_overridden(tmp_path, command, option, value):
    """`--beam 4 ... --beam 5` would silently run with 5: every option that takes one value (flags too) is refused
    when given twice, before anything is read or written; `--set` and `--checkpoints` repeat."""
    twice = [option] * 2 if value is None else [option, value, option, value]
    result = run_tcli(command, *twice, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {option}") and "given twice" in result.stderr
    assert list(tmp_path.iterdir()) == []


def _numeric_options():
    """(command, option) for every option of every command that takes an int or a float."""
    import typer

    from transformer_cli.cli import app

    for name, command in typer.main.get_command(app).commands.items():
        for param in command.params:
            if param.param_type_name == "option" and param.type_descriptor.annotation in (int, float):
                yield name, param.opts[0]


@pytest.mark.parametrize("command,option", list(_numeric_options()), ids=lambda v: str(v))
def test_a_number_option_is_read_as_written_in_decimal(command, option):
    """Python's int() and float() read `--beam 3_0` as 30 and ` 5` or an Arabic-Indic digit as 5: a number
    option takes decimal digits only, before anything is read or written."""
    for written in ("3_0", " 5", "\u0665", "0x1f"):
        result = run_tcli(command, option, written)
        code, err = result.returncode, result.stderr
        assert code == 2 and err.count("\n") == 1, (written, err)
        assert err.startswith(f"error: {option} ") and "in decimal digits" in err, (written, err)


def test_repeatable_options_still_repeat():
    code, err = tcli("average", "--checkpoints", "a.pt", "--checkpoints", "b.pt")
    assert code == 2 and "given twice" not in err and "--out is required" in err
    code, err = tcli("train", "--set", "train.lr=1", "--set", "train.seed=2", "--config", "no/such.yaml")
    assert code == 2 and "given twice" not in err


def test_tcli_alone_shows_the_help():
    """Not the help squeezed into one `error:` line."""
    result = run_tcli()
    assert result.returncode == 0 and result.stdout.startswith("Usage: "), result.stderr
    assert "tcli [OPTIONS] COMMAND" in result.stdout and "\n  train " in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    "command,option",
    [(c, o) for c, o, value in _single_valued_options() if value is not None and (c, o) not in _numeric_options()],
    ids=str,
)
def test_a_file_named_with_a_final_slash_is_refused_as_the_system_would(tmp_path, command, option):
    """`best.pt/` names a folder (`cat best.pt/`: Not a directory); a path would drop the slash and read the file."""
    (tmp_path / "best.pt").write_bytes(b"kept")
    result = run_tcli(command, option, "best.pt/", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {option} 'best.pt/': not a directory")
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"] and (tmp_path / "best.pt").read_bytes() == b"kept"


def _file_outputs():
    import typer

    from transformer_cli.cli import app

    for name, command in typer.main.get_command(app).commands.items():
        for param in command.params:
            if param.param_type_name == "option" and param.metavar == "FILE":
                yield name, param.opts[0]


def test_every_file_output_is_declared_so():
    """The options that name a file to write are the ones a new name ending in '/' is refused for."""
    assert sorted(_file_outputs()) == [
        ("average", "--out"),
        ("embed", "--output"),
        ("embed", "--plot"),
        ("plot", "--out"),
        ("predict", "--output"),
        ("translate", "--output"),
        ("translate", "--stats-json"),
    ]


@pytest.mark.parametrize("command,option", list(_file_outputs()), ids=str)
def test_a_new_file_to_write_named_with_a_final_slash_is_refused(tmp_path, command, option):
    """`--output out/` wrote a file named `out`; the system refuses `open("out/", "w")`."""
    result = run_tcli(command, option, "out/", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {option} 'out/': not a directory")
    assert list(tmp_path.iterdir()) == []


def test_average_checks_the_checkpoints_listed_after_its_option(tmp_path):
    (tmp_path / "a.pt").write_bytes(b"a")
    result = run_tcli("average", "--checkpoints", "a.pt", "a.pt/", "--out", "avg.pt", cwd=tmp_path)
    assert result.returncode == 2 and "'a.pt/': not a directory" in result.stderr
