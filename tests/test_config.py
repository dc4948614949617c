"""Config loading: shipped configs load, overrides apply, mistakes are one-line errors naming key and file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from transformer_cli.config import TranslationRunConfig, dump_config, load_config, parse_overrides, yaml_load
from transformer_cli.core.errors import UserError

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


def test_a_file_key_ending_in_a_slash_is_refused_as_the_system_would(tmp_path):
    """`data.train: train.tsv/` trained on train.tsv (a path drops the slash); the command-line options refused it.
    model.init names a file or a folder: a folder may end in '/', a file may not."""
    from transformer_cli.config import BertRunConfig, FinetuneRunConfig

    ckpt = tmp_path / "best.pt"
    ckpt.write_bytes(b"x")
    (tmp_path / "hf").mkdir()
    cases = [
        (TranslationRunConfig, "data.train", "train/"),
        (TranslationRunConfig, "data.test", "test/"),
        (TranslationRunConfig, "vocab.model", "joint.model/"),
        (BertRunConfig, "data.valid", "valid.txt/"),
        (FinetuneRunConfig, "data.train", "train.tsv/"),
        (FinetuneRunConfig, "data.valid", "dev.tsv/"),
        (FinetuneRunConfig, "model.init", f"{ckpt}/"),
    ]
    for schema, key, value in cases:
        with pytest.raises(UserError, match=rf"{key}: a file is named without the final '/'") as err:
            load_config(schema, None, ["train.max_steps=1", f"{key}={value}"])
        assert "\n" not in str(err.value)
    cfg = load_config(FinetuneRunConfig, None, ["train.max_steps=1", f"model.init={tmp_path / 'hf'}/"])
    assert cfg.model.init == f"{tmp_path / 'hf'}/"
    assert load_config(TranslationRunConfig, None, ["train.max_steps=1", "data.dir=data/toy/"]).data.dir == "data/toy/"


@pytest.mark.parametrize("written", ["010", "0x18", "0o17", "2_4", "1:30", "1_0.5", "1:30.5"])
def test_yaml_1_1_number_forms_are_text_not_silently_other_numbers(tmp_path, written):
    """`layers: 010` was 8 (octal), 0x18 and 2_4 were 24, 1:30 was 90 (base 60): a number key refuses them,
    in the file and in --set, and a split name keeps them as written."""
    assert yaml_load(written) == written
    path = write(tmp_path, f"train: {{max_steps: {written}}}\n")
    with pytest.raises(UserError, match=r"train\.max_steps: write a decimal number") as err:
        load_config(TranslationRunConfig, path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"model\.dropout: write a decimal number"):
        load_config(TranslationRunConfig, None, ["train.max_steps=5", f"model.dropout={written}"])
    cfg = load_config(TranslationRunConfig, None, ["train.max_steps=5", f"data.valid={written}"])
    assert cfg.data.valid == written
    for plain, value in (("10", 10), ("-3", -3), ("1e-4", 1e-4), ("3.", 3.0), (".5", 0.5), ("01.5", 1.5)):
        assert yaml_load(plain) == value and type(yaml_load(plain)) is type(value)


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
    from transformer_cli.config import FinetuneRunConfig
    from transformer_cli.metrics import task_metrics

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


def test_a_config_without_end_is_read_bounded(tmp_path):
    """`--config /dev/zero` read until the machine's memory was gone; a config of over 1 MiB is refused."""
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    for path in (big, *([Path("/dev/zero")] if Path("/dev/zero").exists() else [])):
        with pytest.raises(UserError, match="holds over 1 MiB, more than a config's few lines of YAML"):
            load_config(TranslationRunConfig, path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_config_from_a_pipe_is_read_once(tmp_path):
    """`count-params --config <(cat x.yaml)`: the kind was read from the pipe, then the config again, and the
    second open waited for a writer forever."""
    import threading

    from transformer_cli.config import file_config

    pipe = tmp_path / "config.yaml"
    os.mkfifo(pipe)
    text = (ROOT / "configs" / "quickstart.yaml").read_text()
    threading.Thread(target=pipe.write_text, args=(text,), daemon=True).start()
    got = []
    reader = threading.Thread(target=lambda: got.append(file_config(pipe)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert got and got[0] == load_config(TranslationRunConfig, ROOT / "configs" / "quickstart.yaml")


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
    from transformer_cli.runtime import device as runtime

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


def _number_keys(schema) -> list[tuple[str, str]]:
    """(section, key) of every field of `schema`'s sections that takes a number."""
    from transformer_cli.config import _takes_a_number

    return [
        (section, key)
        for section, field in schema.model_fields.items()
        for key, inner in field.annotation.model_fields.items()
        if _takes_a_number(inner.annotation)
    ]


@pytest.mark.parametrize("kind", ["translation", "bert", "finetune"])
def test_true_or_false_for_a_number_is_refused_for_every_numeric_key(kind):
    """Pydantic's lax mode reads true as 1 (train.max_steps=true trained one step); every numeric key of every
    config refuses it, in a tuple too, while the bool keys still take it."""
    from transformer_cli.config import SCHEMAS

    schema = SCHEMAS[kind]
    keys = _number_keys(schema)
    assert ("train", "lr") in keys and ("train", "max_steps") in keys and ("train", "adam_betas") in keys
    for section, key in keys:
        for value in ("true", "false", "[true, 0.9]") if key == "adam_betas" else ("true", "false"):
            with pytest.raises(UserError, match=rf"{section}\.{key}: write a number, not true or false") as err:
                ends = [] if (section, key) == ("train", "max_steps") else ["train.max_steps=3"]
                load_config(schema, None, [*ends, f"{section}.{key}={value}"])
            assert "\n" not in str(err.value)
    assert load_config(schema, None, ["train.max_steps=3", "train.compile=true"]).train.compile is True


@pytest.mark.parametrize("kind", ["translation", "bert", "finetune"])
def test_a_quoted_number_is_refused_for_every_numeric_key(kind):
    """`train.lr: "3"` is text in YAML; pydantic's lax mode read it as 3. Every numeric key refuses it, in a tuple
    too; a key that also takes text (none yet) would keep it."""
    from transformer_cli.config import SCHEMAS, _takes_a_number

    schema = SCHEMAS[kind]
    for section, key in _number_keys(schema):
        if not _takes_a_number(schema.model_fields[section].annotation.model_fields[key].annotation, but_not=str):
            continue
        for value in ('["0.9", 0.98]',) if key == "adam_betas" else ('"3"', "'1e-3'"):
            with pytest.raises(UserError, match=rf"{section}\.{key}: write a decimal number without quotes") as err:
                ends = [] if (section, key) == ("train", "max_steps") else ["train.max_steps=3"]
                load_config(schema, None, [*ends, f"{section}.{key}={value}"])
            assert "\n" not in str(err.value)


def test_a_key_given_twice_with_set_is_refused():
    with pytest.raises(UserError, match=r"--set train\.lr is given twice \('train\.lr=1' and 'train\.lr=2'\)"):
        parse_overrides(["train.lr=1", "train.max_steps=3", "train.lr=2"])


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["data.train=val"], r"data\.train and data\.valid are both 'val'"),
        (["data.train=test"], r"data\.train and data\.test are both 'test'"),
        (["data.test="], r"data\.test: String should have at least 1 character"),
    ],
)
def test_translation_splits_must_differ_and_have_names(overrides, expected):
    """The preprocessed files are named by split, so training on the validation split failed at the first
    evaluation on a file tcli itself had not written."""
    with pytest.raises(UserError, match=expected):
        load_config(TranslationRunConfig, None, ["train.max_steps=3", *overrides])
    assert load_config(TranslationRunConfig, None, ["train.max_steps=3", "data.test=null"]).data.test is None


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # init none: a size given alone must fit BERT-base's other (768 wide, 12 heads)
        (["model.d_model=30"], r"model\.d_model \(30\) must be divisible by model\.heads \(12, the default\)"),
        (["model.heads=5"], r"model\.d_model \(768, the default\) must be divisible by model\.heads \(5\)"),
        # a starting checkpoint brings its tokenizer
        (["model.init=bert.pt", "vocab.size=16"], r"vocab\.size is set but model\.init brings its own tokenizer"),
        (["model.init=bert.pt", "vocab.type=bpe"], r"vocab\.type is set but model\.init"),
        (["vocab.joint=false"], r"vocab\.joint is for translation"),
        # a GLUE task gives its files and columns
        (["task.glue=WNLI", "data.text=nope"], r"data\.text is set but task\.glue \(WNLI\) gives"),
        (["task.glue=WNLI", "data.train=x.tsv"], r"data\.train is set but task\.glue"),
        (["task.glue=WNLI", "data.format=csv"], r"data\.format is set but task\.glue"),
        # tagging reads CoNLL: no columns
        (["task.kind=tagging", "data.pair=foo"], r"data\.pair names a table column, but tagging reads CoNLL"),
        (["task.kind=tagging", "data.label=tag"], r"data\.label names a table column"),
        # one column in two roles: the label leaked into the input (dev score 1.0 on random labels)
        (["data.pair=label"], r"data\.pair and data\.label both name the column 'label'"),
        (["data.text=label"], r"data\.text and data\.label both name the column 'label'"),
        (["data.pair=sentence"], r"data\.text and data\.pair both name the column 'sentence'"),
        (["task.kind=regression", "data.label=s", "data.text=s"], r"data\.text and data\.label both name"),
    ],
)
def test_finetune_keys_that_would_be_ignored_or_crash_are_config_errors(overrides, expected):
    from transformer_cli.config import FinetuneRunConfig

    with pytest.raises(UserError, match=expected) as err:
        load_config(FinetuneRunConfig, None, overrides)
    assert "\n" not in str(err.value)


def test_finetune_configs_that_fit_still_load():
    """What the checks above must not refuse: both sizes given, dumped configs (every key, defaults included) of
    each kind, a GLUE task with data.dir and max_seq_len."""
    from transformer_cli.config import FinetuneRunConfig

    assert load_config(FinetuneRunConfig, None, ["model.d_model=30", "model.heads=5"]).model.heads == 5
    assert load_config(FinetuneRunConfig, None, ["vocab.size=16"]).vocab.size == 16  # init none trains one
    cfg = load_config(FinetuneRunConfig, None, ["task.glue=WNLI", "data.dir=glue", "data.max_seq_len=64"])
    assert cfg.data.max_seq_len == 64
    for extra in (["model.init=bert.pt"], ["task.kind=tagging"], ["task.glue=RTE", "model.init=bert.pt"]):
        cfg = load_config(FinetuneRunConfig, None, extra)
        assert FinetuneRunConfig.model_validate(yaml.safe_load(dump_config(cfg))) == cfg


def test_finetune_warmup_steps_replace_the_ratio():
    """As in Hugging Face's Trainer: warmup_steps above 0 is used as given; otherwise warmup_ratio of all updates.
    (warmup_steps alone was ignored while warmup_ratio kept its default of 0.1.)"""
    from transformer_cli.config import FinetuneTrainConfig
    from transformer_cli.finetune.setup import resolved_train

    assert resolved_train(FinetuneTrainConfig(max_steps=1000, max_epochs=None), 50).warmup_steps == 100
    assert resolved_train(FinetuneTrainConfig(max_steps=1000, max_epochs=None, warmup_steps=7), 50).warmup_steps == 7
    assert resolved_train(FinetuneTrainConfig(max_epochs=2, warmup_ratio=0.25), 50).warmup_steps == 25
    assert resolved_train(FinetuneTrainConfig(max_steps=1000, max_epochs=None, warmup_ratio=0.0), 50).warmup_steps == 0
    assert resolved_train(FinetuneTrainConfig(max_minutes=5, max_epochs=None, warmup_steps=3), 50).warmup_steps == 3
