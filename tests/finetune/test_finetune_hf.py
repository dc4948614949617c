"""Fine-tuning from Hugging Face folders: one written by tcli export-hf (its tokenizer.json) and a WordPiece
vocab.txt BERT built here with transformers (offline); pieces and encoder outputs equal the folder's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from transformer_cli.cli import app
from transformer_cli.config import FinetuneRunConfig, load_config

from ..conftest import ROOT, write_hf_bert

transformers = pytest.importorskip("transformers")
TEXTS = ["The cat sat on the mat.", "A dog ran to the house, quickly!", "unbelievable GARDEN friends"]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    from transformer_cli.bert.setup import pretrain_bert
    from transformer_cli.config import BertRunConfig

    out = tmp_path_factory.mktemp("bert")
    sets = ["model.d_model=32", "model.layers=1", "model.heads=2", "model.ffn_dim=64", "model.max_positions=64"]
    sets += ["vocab.size=200", "train.max_steps=2", "train.eval_every=2", "train.batch_size=4"]
    pretrain_bert(
        load_config(BertRunConfig, ROOT / "configs" / "bert_quickstart.yaml", sets), out / "r", "cpu", quiet=True
    )
    return out / "r" / "checkpoints" / "last.pt"


@pytest.fixture(scope="module")
def wordpiece_folder(tmp_path_factory) -> Path:
    """A random tiny BertModel with a WordPiece vocab.txt (lower-casing), as a published BERT folder is laid out."""
    folder = tmp_path_factory.mktemp("wp")
    words = "the cat sat on mat a dog ran to house quick ##ly un ##believ ##able garden friend ##s . , !".split()
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *words,
        *"abcdefghijklmnopqrstuvwxyz",
        *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"],
    ]
    return write_hf_bert(folder, vocab, {"do_lower_case": True})


def _cfg(init: Path, data: Path, *extra: str) -> FinetuneRunConfig:
    sets = [f"model.init={init}", f"data.dir={data}", "data.max_seq_len=32", *extra]
    return load_config(FinetuneRunConfig, None, sets)


def _data(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    rows = [f"{t}\t{i % 2}" for i, t in enumerate(TEXTS * 4)]
    for split in ("train", "dev"):
        (folder / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return folder


def test_wordpiece_folder_tokenises_and_encodes_as_transformers(tmp_path, wordpiece_folder):
    from transformer_cli.finetune.setup import read_labelled, resolve_init
    from transformer_cli.kinds.finetuned import FinetuneMeta, build_classifier
    from transformer_cli.vocab.bert_tokenizer import pack

    cfg = _cfg(wordpiece_folder, _data(tmp_path / "d"))
    source = resolve_init(cfg, read_labelled(cfg))
    hf_tok = transformers.BertTokenizerFast(str(wordpiece_folder / "vocab.txt"), do_lower_case=True)
    a, b = source.tokenizer.encode(TEXTS), source.tokenizer.encode(TEXTS[::-1])
    for i in range(len(TEXTS)):
        ids, types, _ = pack(a[i], b[i], 64, source.tokenizer.cls_id, source.tokenizer.sep_id)
        want = hf_tok(TEXTS[i], TEXTS[::-1][i])
        assert ids == want["input_ids"] and types == want["token_type_ids"]
    meta = FinetuneMeta("classification", ["0", "1"], source.encoder, source.vocab_size, source.tokenizer, 32)
    model = build_classifier(meta).eval()
    model.load_state_dict(source.weights, strict=False)
    hf = transformers.BertModel.from_pretrained(wordpiece_folder).eval()
    batch = hf_tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = hf(**batch)
        hidden = model.bert.encode(batch["input_ids"], batch["token_type_ids"])
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(hidden[mask], want.last_hidden_state[mask], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(model.bert.pooled(hidden), want.pooler_output, atol=1e-5, rtol=1e-4)


def test_export_hf_folder_gives_the_checkpoints_pieces_and_weights(tmp_path, tiny_bert):
    from transformer_cli.finetune.setup import read_labelled, resolve_init

    folder = tmp_path / "hf"
    assert CliRunner().invoke(app, ["export-hf", "--checkpoint", str(tiny_bert), "--out", str(folder)]).exit_code == 0
    data = _data(tmp_path / "d")
    from_hf = resolve_init(_cfg(folder, data), read_labelled(_cfg(folder, data)))
    from_ckpt = resolve_init(_cfg(tiny_bert, data), read_labelled(_cfg(tiny_bert, data)))
    assert from_hf.tokenizer.kind == "hf" and from_ckpt.tokenizer.kind == "sentencepiece"
    assert from_hf.tokenizer.encode(TEXTS) == from_ckpt.tokenizer.encode(TEXTS)
    assert from_hf.weights.keys() == from_ckpt.weights.keys()
    for name, tensor in from_ckpt.weights.items():
        assert torch.equal(tensor, from_hf.weights[name]), name


def test_finetune_from_a_wordpiece_folder_end_to_end(tmp_path, wordpiece_folder):
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(
        f"model: {{init: {wordpiece_folder}}}\ndata: {{dir: {_data(tmp_path / 'd')}, max_seq_len: 32}}\n"
        "train: {batch_size: 4, max_steps: 3, eval_every: 3, precision: fp32}\n"
    )
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["finetune", "--config", str(cfg), "--out", str(run), "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.output
    assert (run / "vocab" / "tokenizer.json").is_file()
    result = CliRunner().invoke(
        app, ["predict", "--checkpoint", str(run / "checkpoints" / "last.pt"), "--device", "cpu"], input="the cat\n"
    )
    assert result.exit_code == 0 and result.stdout.split("\t")[0] in ("0", "1"), result.output
    # its export names the files it wrote: no spiece.model for a WordPiece tokenizer
    out = tmp_path / "hf"
    result = CliRunner().invoke(
        app, ["export-hf", "--checkpoint", str(run / "checkpoints" / "last.pt"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    named = result.output.strip().split(" (")[1].rstrip(")").split(", ")
    assert sorted(named) == sorted(p.name for p in out.iterdir()) and "spiece.model" not in named


def test_a_folder_without_a_tokenizer_is_one_line(tmp_path, wordpiece_folder):
    folder = tmp_path / "bare"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((wordpiece_folder / name).read_bytes())
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(f"model: {{init: {folder}}}\ndata: {{dir: {_data(tmp_path / 'd')}}}\ntrain: {{max_steps: 1}}\n")
    result = CliRunner().invoke(app, ["finetune", "--config", str(cfg), "--out", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 2 and "no tokenizer.json or vocab.txt" in result.output
    assert not (tmp_path / "run").exists()


def test_a_folder_with_a_tensor_tcli_cannot_load_is_one_line(tmp_path, wordpiece_folder):
    """Each tensor is checked under the folder's own name before query, key and value are joined: a query of
    another width, a float8, sparse or integer tensor were tracebacks (or the wrong name in the message)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(wordpiece_folder / "model.safetensors"))
    query = next(name for name in weights if name.endswith("encoder.layer.0.attention.self.query.weight"))
    for change, message in (
        (lambda t: t[:, :-1].contiguous(), "query.weight has shape"),
        (lambda t: t.to(torch.float8_e4m3fn), "query.weight is float8_e4m3fn, which tcli does not load"),
        (lambda t: t.long(), "query.weight is int64, not floating-point"),
    ):
        folder = tmp_path / "damaged"
        folder.mkdir(exist_ok=True)
        for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
            (folder / name).write_bytes((wordpiece_folder / name).read_bytes())
        save_file({**weights, query: change(weights[query])}, str(folder / "model.safetensors"))
        cfg = tmp_path / "ft.yaml"
        cfg.write_text(f"model: {{init: {folder}}}\ndata: {{dir: {_data(tmp_path / 'd')}}}\ntrain: {{max_steps: 1}}\n")
        result = CliRunner().invoke(app, ["finetune", "--config", str(cfg), "--out", str(tmp_path / "run"), "-q"])
        assert result.exit_code == 2 and message in result.output, result.output
        assert f"model.init {folder}: " in result.output and len(result.output.strip().splitlines()) == 1
        assert not (tmp_path / "run").exists()
    (folder / "model.safetensors").unlink()
    torch.save({**weights, query: weights[query].to_sparse()}, folder / "pytorch_model.bin")
    result = CliRunner().invoke(app, ["finetune", "--config", str(cfg), "--out", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 2 and "query.weight is a sparse_coo tensor" in result.output, result.output


def test_a_folder_missing_an_encoder_tensor_is_one_line(tmp_path, wordpiece_folder):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "damaged"
    folder.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        (folder / name).write_bytes((wordpiece_folder / name).read_bytes())
    weights = load_file(str(wordpiece_folder / "model.safetensors"))
    missing = next(name for name in weights if name.endswith("encoder.layer.1.attention.self.key.weight"))
    del weights[missing]
    save_file(weights, str(folder / "model.safetensors"))
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(f"model: {{init: {folder}}}\ndata: {{dir: {_data(tmp_path / 'd')}}}\ntrain: {{max_steps: 1}}\n")
    result = CliRunner().invoke(app, ["finetune", "--config", str(cfg), "--out", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 2, result.output
    assert f"model.init {folder}: the HF weights lack bert.encoder.layer.1.attention.self.key.weight" in result.output
    assert "not a BERT model" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def _set_json(path: Path, **values) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


DAMAGES = {
    # tokenizer_config.json: types transformers refuses ("false" as a string turned lower-casing on)
    "lower_as_text": (lambda f: _set_json(f / "tokenizer_config.json", do_lower_case="false"), "do_lower_case is"),
    "accents_as_text": (lambda f: _set_json(f / "tokenizer_config.json", strip_accents="yes"), "strip_accents is"),
    # vocab.txt that the WordPiece tokenizer cannot use (tracebacks from tokenizers)
    "no_sep": (lambda f: (f / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n"), "not a usable WordPiece"),
    "binary": (lambda f: (f / "vocab.txt").write_bytes(bytes(range(128, 256))), "not a usable WordPiece"),
    "twice": (lambda f: (f / "vocab.txt").write_text((f / "vocab.txt").read_text() * 2), "ids go up to"),
    # config.json that is no JSON object, as --init-from-hf words it (line and column; the type it holds)
    "config_list": (lambda f: (f / "config.json").write_text("[1, 2]"), "holds a JSON list, not an object"),
    "config_broken": (lambda f: (f / "config.json").write_text('{"hidden_size": 16,'), "not valid JSON (line 1"),
    # config.json: function keys refused as --init-from-hf refuses them, sizes that cannot build a BERT
    "eps": (lambda f: _set_json(f / "config.json", layer_norm_eps=1e-5), "sets layer_norm_eps to"),
    "decoder": (lambda f: _set_json(f / "config.json", is_decoder=True), "sets is_decoder to"),
    "heads": (lambda f: _set_json(f / "config.json", num_attention_heads=3), "not divisible by num_attention_heads"),
    "float_vocab": (lambda f: _set_json(f / "config.json", vocab_size=120.9), "vocab_size is"),
    # sizes and rates out of tcli's bounds, named by config.json's key (not "1 validation error for ...")
    "zero_width": (lambda f: _set_json(f / "config.json", hidden_size=0), "hidden_size is 0: input should be"),
    "layers": (lambda f: _set_json(f / "config.json", num_hidden_layers=10**9), "num_hidden_layers is 1000000000"),
    "dropout": (lambda f: _set_json(f / "config.json", hidden_dropout_prob=1.5), "hidden_dropout_prob is 1.5"),
    "null_dropout": (
        lambda f: _set_json(f / "config.json", attention_probs_dropout_prob=None),
        "probs_dropout_prob is",
    ),
    # a tensor of a layer config.json does not have was dropped in silence
    "extra_layer": (lambda f: _add_tensor(f, "bert.encoder.layer.9.attention.self.query.weight"), "layer 9"),
}


def _add_tensor(folder: Path, name: str) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    save_file({**weights, name: torch.zeros(2, 2)}, str(folder / "model.safetensors"))


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_wordpiece_folder_is_one_line_and_writes_nothing(tmp_path, wordpiece_folder, damage):
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(wordpiece_folder, folder)
    make, fragment = DAMAGES[damage]
    make(folder)
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(f"model: {{init: {folder}}}\ndata: {{dir: {_data(tmp_path / 'd')}}}\ntrain: {{max_steps: 1}}\n")
    result = CliRunner().invoke(app, ["finetune", "--config", str(cfg), "--out", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 2 and fragment in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_tokenizer_json_with_its_own_truncation_and_padding_encodes_whole(tmp_path, tiny_bert):
    """transformers turns a tokenizer.json's stored truncation and padding off at each call; tcli did not, and a
    stored max_length of 2 cut every example to 2 pieces in silence."""
    from transformer_cli.vocab.bert_tokenizer import tokenizer_of_hf_folder

    result = CliRunner().invoke(app, ["export-hf", "--checkpoint", str(tiny_bert), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    plain = tokenizer_of_hf_folder(tmp_path / "hf").encode(TEXTS)
    path = tmp_path / "hf" / "tokenizer.json"
    _set_json(path, truncation={"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 0})
    assert tokenizer_of_hf_folder(tmp_path / "hf").encode(TEXTS) == plain
    _set_json(
        path,
        truncation=None,
        padding={
            "strategy": {"Fixed": 20},
            "direction": "Right",
            "pad_to_multiple_of": None,
            "pad_id": 0,
            "pad_type_id": 0,
            "pad_token": "[PAD]",
        },
    )
    assert tokenizer_of_hf_folder(tmp_path / "hf").encode(TEXTS) == plain
    assert max(map(len, plain)) > 2


def test_a_folder_without_a_pooler_fine_tunes_from_the_classifiers_own_pooler(tmp_path, wordpiece_folder):
    """A BertForMaskedLM or token-classification folder has no pooler: it was refused as "not a BERT model";
    transformers starts the pooler from random weights, and so does tcli (seeded by train.seed), saying so."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "mlm"
    shutil.copytree(wordpiece_folder, folder)
    weights = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if "pooler" not in k}, str(folder / "model.safetensors"))
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(
        f"model: {{init: {folder}}}\ndata: {{dir: {_data(tmp_path / 'd')}, max_seq_len: 32}}\n"
        "train: {batch_size: 4, max_steps: 1, eval_every: 1, precision: fp32}\n"
    )
    runs = []
    for name in ("a", "b"):
        result = CliRunner().invoke(
            app, ["finetune", "--config", str(cfg), "--out", str(tmp_path / name), "--device", "cpu"]
        )
        assert result.exit_code == 0, result.output
        assert "has no pooler: it starts from random weights" in result.output
        runs.append(torch.load(tmp_path / name / "checkpoints" / "last.pt", weights_only=True)["model"])
    assert torch.equal(runs[0]["bert.pooler.weight"], runs[1]["bert.pooler.weight"])  # the seed's, both times
