"""tcli export-hf: a folder whose fast tokenizer encodes like tcli on real text, whose fill-mask answers like the
tcli checkpoint, that HF classes load and --init-from-hf reads back; and every damaged folder a one-line error."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
import torch

from transformer_cli.checkpoint import read_checkpoint, serialize
from transformer_cli.config import BertRunConfig, build_config
from transformer_cli.core.files import write_atomic
from transformer_cli.models.builders import build_bert
from transformer_cli.vocab.spm import Vocab

from ..conftest import SHARED, WIKITEXT, needs_wikitext, tcli

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install -e .[dev])")
MODEL = {"d_model": 32, "layers": 2, "heads": 4, "ffn_dim": 64, "max_positions": 128}


def wikitext_lines() -> list[str]:
    return (WIKITEXT / "valid.txt").read_text(encoding="utf-8").splitlines()


def bert_vocab(vocab_type: str) -> Vocab:
    """A small BERT vocabulary trained by tcli's own function on WikiText-2 valid; a character coverage under
    1 leaves rare characters out, so the corpus holds unknowns."""
    from transformer_cli.bert.setup import train_bert_vocab

    cfg = build_config(
        BertRunConfig,
        {"vocab": {"size": 800, "type": vocab_type, "character_coverage": 0.9995}, "train": {"max_steps": 1}},
        "test",
    )
    return train_bert_vocab(wikitext_lines(), cfg)


def write_bert_checkpoint(path: Path, vocab: Vocab, seed: int = 1) -> Path:
    """A BERT checkpoint in the trainer's layout; the MLM bias is spread out so that the fill-mask scores
    of the top candidates differ clearly (an untrained head would give every token nearly 1/V)."""
    cfg = build_config(BertRunConfig, {"model": MODEL, "data": {"max_seq_len": 64}, "train": {"max_steps": 1}}, "test")
    torch.manual_seed(seed)
    weights = build_bert(cfg.model, len(vocab)).state_dict()
    weights["mlm_bias"] = torch.randn(len(vocab)) * 3
    state = {
        "tcli": {"kind": "bert", "version": "test"},
        "config": cfg.model_dump(mode="json"),
        "vocab": {"bert": vocab.model_bytes},
        "model": weights,
    }
    write_atomic(serialize(state), path)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path, Vocab]:
    if not WIKITEXT.is_dir():
        pytest.skip(f"no WikiText-2 at {WIKITEXT} (../shared absent)")
    out = tmp_path_factory.mktemp("hf")
    vocab = bert_vocab("unigram")
    ckpt = write_bert_checkpoint(out / "bert.pt", vocab)
    code, err = tcli("export-hf", "--checkpoint", str(ckpt), "--out", str(out / "hf"))
    assert code == 0, err
    return ckpt, out / "hf", vocab


def pair_ids(vocab: Vocab, a: str, b: str) -> tuple[list[int], list[int]]:
    """tcli's BERT input for a sentence pair: [CLS] A [SEP] B [SEP] and token types 0 / 1."""
    ea, eb = vocab.encode([a, b])
    return [2, *ea, 3, *eb, 3], [0] * (len(ea) + 2) + [1] * (len(eb) + 1)


@needs_wikitext
@pytest.mark.parametrize("vocab_type", ["unigram", "bpe"])
def test_fast_tokenizer_ids_equal_tcli_on_every_wikitext_line(tmp_path, exported, vocab_type):
    from transformer_cli.export.hf_tokenizer import model_proto

    vocab = exported[2] if vocab_type == "unigram" else bert_vocab("bpe")
    assert model_proto(vocab).normalizer_spec.name == "nmt_nfkc"  # sentencepiece's default, which tcli keeps
    folder = exported[1]
    if vocab_type == "bpe":
        write_bert_checkpoint(tmp_path / "bpe.pt", vocab)
        assert tcli("export-hf", "--checkpoint", str(tmp_path / "bpe.pt"), "--out", str(tmp_path / "hf"))[0] == 0
        folder = tmp_path / "hf"
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.is_fast
    lines = wikitext_lines()
    ours = vocab.encode(lines)
    assert sum(ids.count(1) for ids in ours) > 0  # unknown characters are part of the test
    theirs = tokenizer(lines, add_special_tokens=False)["input_ids"]
    same = sum(a == b for a, b in zip(ours, theirs))
    assert same == len(lines), f"{len(lines) - same} of {len(lines)} lines differ"
    pairs = [(a, b) for a, b in zip(lines, lines[1:]) if a.strip() and b.strip()]
    encoded = tokenizer([a for a, _ in pairs], [b for _, b in pairs])
    for (a, b), ids, types in zip(pairs, encoded["input_ids"], encoded["token_type_ids"]):
        assert (ids, types) == pair_ids(vocab, a, b)
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tokenizer.mask_token_id == 4 and tokenizer.pad_token_id == 0 and tokenizer.model_max_length == 128


@needs_wikitext
def test_fill_mask_pipeline_answers_like_the_tcli_checkpoint(exported):
    ckpt, folder, vocab = exported
    fill = transformers.pipeline("fill-mask", model=str(folder), top_k=5)
    model = read_checkpoint(ckpt, kind="bert").build_model().eval()
    for left, right in (
        ("The European lobster is a species of", "from the eastern Atlantic Ocean ."),
        ("It may grow to a length of 60 cm ( 24 in ) and a", "of 6 kilograms ."),
    ):
        theirs = fill(f"{left} [MASK] {right}")
        ea, eb = vocab.encode([left, right])
        ids = torch.tensor([[2, *ea, 4, *eb, 3]])
        with torch.no_grad():
            logits, _ = model(ids, torch.zeros_like(ids))
        probs = logits[0, len(ea) + 1].softmax(-1)
        top = probs.topk(5)
        assert [r["token"] for r in theirs] == top.indices.tolist()
        for r, p in zip(theirs, top.values.tolist()):
            assert abs(r["score"] - p) < 1e-4
        assert top.values[0] > 0.01  # scores far from uniform (1/V), so the tolerance means something


@needs_wikitext
def test_tcli_fill_mask_answers_like_the_hf_pipeline_on_the_export(exported):
    """`tcli fill-mask` on the checkpoint and HF's fill-mask pipeline on its export: same top-5, same scores."""
    from transformer_cli.bert.fill_mask import fill_mask

    ckpt, folder, vocab = exported
    fill = transformers.pipeline("fill-mask", model=str(folder), top_k=5)
    model = read_checkpoint(ckpt, kind="bert").build_model().eval()
    lines = []
    for line in wikitext_lines():
        words = line.split()
        if 6 <= len(words) <= 40 and not line.strip().startswith("="):
            lines.append(" ".join(words[:3] + ["[MASK]"] + words[4:]))
        if len(lines) == 25:
            break
    ours = fill_mask(model, vocab, lines, 5, torch.device("cpu"))
    for line, (mask,) in zip(lines, ours):
        theirs = fill(line)
        assert [r["token"] for r in theirs] == [p.id for p in mask.predictions], line
        assert all(abs(r["score"] - p.score) < 1e-4 for r, p in zip(theirs, mask.predictions)), line


@needs_wikitext
def test_sequence_classification_initialises_only_the_classifier(exported):
    _, folder, _ = exported
    _, info = transformers.BertForSequenceClassification.from_pretrained(
        str(folder), num_labels=3, output_loading_info=True
    )
    assert sorted(info["missing_keys"]) == ["classifier.bias", "classifier.weight"]
    assert not info["mismatched_keys"]


@needs_wikitext
def test_init_from_hf_reads_the_folder_back_with_equal_logits(exported):
    from transformer_cli.export.hf import load_hf_bert

    ckpt, folder, vocab = exported
    original = read_checkpoint(ckpt, kind="bert")
    weights, loaded_vocab = load_hf_bert(folder, original.cfg.model)
    assert loaded_vocab == vocab
    again = build_bert(original.cfg.model, len(loaded_vocab))
    again.load_state_dict(weights)
    ids, types = pair_ids(vocab, "Homarus gammarus is a lobster .", "It is blue .")
    ids, types = torch.tensor([ids]), torch.tensor([types])
    with torch.no_grad():
        a = original.build_model().eval()(ids, types)
        b = again.eval()(ids, types)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@needs_wikitext
def test_non_empty_folder_needs_force_and_force_removes_foreign_files(tmp_path, exported):
    ckpt = exported[0]
    out = tmp_path / "hf"
    out.mkdir()
    (out / "vocab.txt").write_text("[PAD]\nhello\n")
    (out / "pytorch_model.bin").write_bytes(b"old")
    (out / "model-00001-of-00002.safetensors").write_bytes(b"old")
    (out / "notes.md").write_text("mine")
    code, err = tcli("export-hf", "--checkpoint", str(ckpt), "--out", str(out))
    assert code == 2 and f"--out {out} is not empty; pass --force" in err and len(err.strip().splitlines()) == 1
    assert (out / "vocab.txt").exists() and not (out / "config.json").exists()  # refused before writing
    code, err = tcli("export-hf", "--checkpoint", str(ckpt), "--out", str(out), "--force")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "notes.md",
        "special_tokens_map.json",
        "spiece.model",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def damage(folder: Path, how: str) -> str:
    """Damage a copy of an exported folder; returns the file the error must name."""
    if how == "bad json":
        (folder / "config.json").write_text('{"hidden_size": 32,')
        return "config.json is not valid JSON"
    if how == "json list":
        (folder / "config.json").write_text("[1, 2]")
        return "config.json holds a JSON list, not an object"
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:5000])
        return "model.safetensors is not a readable safetensors file"
    weights = load_file(str(path))
    if how == "missing tensor":
        del weights["bert.encoder.layer.1.attention.self.key.weight"]
    else:
        weights["bert.encoder.layer.1.output.dense.weight"] = torch.zeros(32, 63)
    save_file(weights, str(path))
    return {
        "missing tensor": "model.safetensors: the weights lack bert.encoder.layer.1.attention.self.key.weight",
        "misshaped": "bert.encoder.layer.1.output.dense.weight has shape (32, 63) but the config needs (32, 64)",
    }[how]


@needs_wikitext
@pytest.mark.parametrize("how", ["bad json", "json list", "truncated", "missing tensor", "misshaped"])
def test_damaged_folder_is_a_one_line_error(tmp_path, exported, how):
    from transformer_cli.core.errors import UserError
    from transformer_cli.export.hf import load_hf_bert

    ckpt, folder, _ = exported
    copy = tmp_path / "hf"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    message = damage(copy, how)
    with pytest.raises(UserError) as e:
        load_hf_bert(copy, read_checkpoint(ckpt).cfg.model)
    assert message in str(e.value) and str(copy) in str(e.value) and "\n" not in str(e.value)


def test_export_hf_refuses_a_translation_checkpoint_and_a_file_as_folder(tmp_path, toy_vocab, exported):
    from transformer_cli.config import TranslationRunConfig
    from transformer_cli.models.builders import build_transformer

    cfg = build_config(
        TranslationRunConfig,
        {
            "model": {"d_model": 16, "heads": 2, "ffn_dim": 32, "enc_layers": 1, "dec_layers": 1},
            "train": {"max_steps": 1},
        },
        "test",
    )
    state = {
        "tcli": {"kind": "translation", "version": "test"},
        "config": cfg.model_dump(mode="json"),
        "vocab": {"joint": toy_vocab.model_bytes},
        "model": build_transformer(cfg.model, len(toy_vocab), len(toy_vocab)).state_dict(),
    }
    write_atomic(serialize(state), tmp_path / "t.pt")
    code, err = tcli("export-hf", "--checkpoint", str(tmp_path / "t.pt"), "--out", str(tmp_path / "hf"))
    assert code == 2 and "holds a translation model, not a bert model; use it with tcli translate" in err
    (tmp_path / "file").write_text("x")
    code, err = tcli("export-hf", "--checkpoint", str(exported[0]), "--out", str(tmp_path / "file"))
    assert code == 2 and err.strip() == f"error: --out {tmp_path / 'file'} is a file, not a folder"


CHNSENTICORP = SHARED / "data" / "zh-clf" / "ChnSentiCorp"
needs_chnsenticorp = pytest.mark.skipif(
    not (CHNSENTICORP / "dev.tsv").is_file(), reason=f"no ChnSentiCorp at {CHNSENTICORP} (../shared absent)"
)


def chnsenticorp_reviews(split: str) -> list[str]:
    """The review texts of a ChnSentiCorp split (the last column; the first row is the header)."""
    rows = (CHNSENTICORP / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [row.split("\t")[-1] for row in rows]


@needs_chnsenticorp
@pytest.mark.parametrize("vocab_type, split_cjk", [("unigram", True), ("bpe", True), ("char", False)])
def test_fast_tokenizer_ids_equal_tcli_on_chinese_reviews(tmp_path, vocab_type, split_cjk):
    """A vocabulary of Chinese reviews that makes every ideograph a token (or a char model), trained with
    character_coverage auto: exported, AutoTokenizer gives tcli's ids on every dev review (unknowns included)."""
    from transformer_cli.bert.setup import train_bert_vocab
    from transformer_cli.core.cjk import IDEOGRAPH

    cfg = build_config(
        BertRunConfig,
        {"vocab": {"size": 2500, "type": vocab_type, "split_cjk": split_cjk}, "train": {"max_steps": 1}},
        "test",
    )
    vocab = train_bert_vocab(chnsenticorp_reviews("train")[:600], cfg)
    pieces = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
    assert all(len(IDEOGRAPH.findall(p)) <= 1 for p in pieces)  # each ideograph its own token
    ckpt = write_bert_checkpoint(tmp_path / "zh.pt", vocab)
    code, err = tcli("export-hf", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf"))
    assert code == 0, err
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    lines = chnsenticorp_reviews("dev")
    ours = vocab.encode(lines)
    assert sum(ids.count(1) for ids in ours) > 0  # auto left rare characters out: unknowns are part of the test
    theirs = tokenizer(lines, add_special_tokens=False)["input_ids"]
    differ = [line for line, a, b in zip(lines, ours, theirs) if a != b]
    assert not differ, f"{len(differ)} of {len(lines)} reviews differ, e.g. {differ[0][:60]!r}"
    text = "今天天气很[MASK]。"
    encoded = tokenizer(text)["input_ids"]
    assert encoded.count(4) == 1  # [MASK] stays one token among the split characters
    # decoded back without spaces between the characters (of a review with no unknown, which HF and sentencepiece
    # show differently): the review as sentencepiece normalises it (NFKC, runs of spaces as one)
    line, known = next((line, ids) for line, ids in zip(lines, ours) if 1 not in ids)
    assert tokenizer.decode(known) == vocab.decode([known])[0] == " ".join(unicodedata.normalize("NFKC", line).split())
