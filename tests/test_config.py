"""Config loading: shipped configs load, overrides apply, mistakes are one-line errors naming key and file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from transformer_cli.config import TranslationRunConfig, dump_config, load_config, parse_overrides
from transformer_cli.errors import UserError

from .conftest import ROOT

OTHER_KINDS = ("bert", "finetune")  # prefixes of the shipped configs of the other commands
TRANSLATION_CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if not p.name.startswith(OTHER_KINDS))


@pytest.mark.parametrize("path", TRANSLATION_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_translation_config_loads(path):
    cfg = load_config(TranslationRunConfig, path)
    assert cfg.model.d_model % cfg.model.heads == 0


def test_shipped_configs_exist():
    names = {p.name for p in TRANSLATION_CONFIGS}
    assert {"quickstart.yaml", "multi30k_en_de.yaml"} <= names


def test_required_keys_exist():
    cfg = load_config(TranslationRunConfig, None, ["train.max_steps=1"])
    for key in [
        "data.dir",
        "data.src_lang",
        "data.tgt_lang",
        "vocab.size",
        "model.d_model",
        "model.heads",
        "model.ffn_dim",
        "model.enc_layers",
        "model.dec_layers",
        "model.dropout",
        "train.max_steps",
        "train.max_epochs",
        "train.max_tokens",
        "train.lr",
        "train.warmup_steps",
        "train.precision",
        "train.seed",
        "train.eval_every",
    ]:
        section, name = key.split(".")
        assert name in type(getattr(cfg, section)).model_fields, key


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_overrides_are_yaml_scalars_and_nest():
    assert parse_overrides(["train.lr=1e-3", "model.norm=pre", "data.test=null", "train.compile=true"]) == {
        "train": {"lr": 1e-3, "compile": True},
        "model": {"norm": "pre"},
        "data": {"test": None},
    }
    cfg = load_config(TranslationRunConfig, None, ["train.max_steps=5", "model.d_model=64", "model.heads=4"])
    assert (cfg.train.max_steps, cfg.model.d_model) == (5, 64)


def test_override_beats_file(tmp_path):
    path = write(tmp_path, "train: {max_steps: 10, lr: 0.1}\n")
    cfg = load_config(TranslationRunConfig, path, ["train.lr=0.5"])
    assert cfg.train.lr == 0.5 and cfg.train.max_steps == 10


@pytest.mark.parametrize(
    "text, overrides, expected",
    [
        ("train: {max_steps: 10, lrr: 0.1}\n", [], r"train\.lrr: unknown key; valid keys here: max_steps"),
        ("train: {max_steps: ten}\n", [], r"train\.max_steps: .*integer"),
        ("train: {max_steps: 10, lr: -1}\n", [], r"train\.lr: .*greater than 0"),
        ("train: {max_steps: 10}\nmodel: {norm: middle}\n", [], r"model\.norm: .*'post' or 'pre'"),
        ("train: {max_steps: 10}\nmodel: {d_model: 30, heads: 4}\n", [], r"model\.d_model \(30\).*model\.heads \(4\)"),
        (
            "train: {max_steps: 10}\n",
            ["model.dropout=1.5"],
            r"--set model\.dropout=1\.5: model\.dropout: .*less than 1",
        ),
        ("train: {}\n", [], r"train\.max_steps, train\.max_epochs or train\.max_minutes"),
        ("train: {max_steps: 10}\nsurprise: 1\n", [], r"surprise: unknown key; valid keys here: data, vocab"),
    ],
)
def test_bad_values_name_key_and_file(tmp_path, text, overrides, expected):
    path = write(tmp_path, text)
    with pytest.raises(UserError, match=expected) as err:
        load_config(TranslationRunConfig, path, overrides)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "kind, metrics, expected",
    [
        ("classification", "[bleu]", r"unknown metric 'bleu'; a classification task takes accuracy, f1, mcc"),
        ("classification", "[entity_f1]", r"entity_f1 does not score a classification task"),
        ("classification", "[pearson]", r"pearson does not score a classification task"),
        ("regression", "[accuracy]", r"accuracy does not score a regression task; it takes pearson, spearman"),
        ("regression", "[f1, pearson]", r"f1 does not score a regression task"),
        ("tagging", "[pearson]", r"pearson does not score a tagging task; it takes entity_f1"),
        ("tagging", "[accuracy]", r"accuracy does not score a tagging task"),
        ("tagging", "[]", r"task\.metrics is empty"),
        ("regression", "[spearman, spearman]", r"names spearman twice"),
    ],
)
def test_finetune_metrics_that_cannot_score_the_task_are_config_errors(tmp_path, kind, metrics, expected):
    """Caught when the config loads, not at the first evaluation after minutes of training."""
    from transformer_cli import task_metrics
    from transformer_cli.config import FinetuneRunConfig

    path = write(tmp_path, f"task: {{kind: {kind}, metrics: {metrics}}}\n")
    with pytest.raises(UserError, match=expected) as err:
        load_config(FinetuneRunConfig, path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    for kind, names in task_metrics.BY_KIND.items():  # every metric a kind takes loads, alone and all together
        for chosen in [[name] for name in names] + [list(names)]:
            assert load_config(FinetuneRunConfig, None, [f"task.kind={kind}", f"task.metrics={chosen}"])


def test_a_config_of_another_command_names_the_command_that_runs_it():
    """Every shipped config given to a command of another kind: one line naming the command, not an unknown key."""
    from transformer_cli.config import COMMANDS, SCHEMAS, config_kind, read_yaml

    kinds = {"finetune": "finetune", "bert": "bert"}
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        kind = next((k for prefix, k in kinds.items() if path.name.startswith(prefix)), "translation")
        assert kind == "finetune" or config_kind(read_yaml(path)) == kind
        for other, schema in SCHEMAS.items():
            if other == kind:
                continue
            with pytest.raises(UserError) as err:
                load_config(schema, path)
            assert f"run it with `{COMMANDS[kind]} --config`" in str(err.value), (path, other, str(err.value))


def test_invalid_yaml_names_line(tmp_path):
    path = write(tmp_path, "train:\n  max_steps: 10\n  lr: [1, 2\n")
    with pytest.raises(UserError, match=r"run\.yaml line \d+: invalid YAML"):
        load_config(TranslationRunConfig, path)


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        load_config(TranslationRunConfig, tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="expected key.sub=value"):
        parse_overrides(["train.lr"])


def test_dump_roundtrip():
    cfg = load_config(TranslationRunConfig, None, ["train.max_steps=3", "train.adam_betas=[0.9, 0.99]"])
    again = TranslationRunConfig.model_validate(yaml.safe_load(dump_config(cfg)))
    assert again == cfg


def test_config_is_frozen():
    cfg = load_config(TranslationRunConfig, None, ["train.max_steps=3"])
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="frozen"):
        cfg.train.lr = 1.0


def test_cuda_devices_that_do_not_exist_are_user_errors(monkeypatch):
    """cuda:N past the visible GPUs, and torchrun starting more processes on a machine than it has GPUs,
    end in one line that names the fix (not in an error deep inside CUDA)."""
    from transformer_cli import runtime

    monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runtime.torch.cuda, "device_count", lambda: 1)
    assert runtime.pick_device("cuda:0") == runtime.torch.device("cuda", 0)
    with pytest.raises(UserError, match=r"--device cuda:1: this machine has 1 CUDA device \(cuda:0 to cuda:0\)"):
        runtime.pick_device("cuda:1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(UserError, match=r"local rank 1 .* 1 CUDA device: use --nproc_per_node 1 .* --device cpu"):
        runtime.Runtime.create("cuda")
    with pytest.raises(UserError, match="local rank 1"):
        runtime.Runtime.create("auto")
