"""Chinese fine-tuning: a Hugging Face Chinese BERT folder (WordPiece vocab.txt, tokenizer_config.json, no
tokenizer.json, as bert-base-chinese is laid out) gives the ids transformers' own tokenizer gives, fine-tunes and
predicts; CLUE's header-less tables (AFQMC pairs) train, predict and evaluate by data.columns."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from ..conftest import one_line_error, run_tcli, write_hf_bert

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CHNSENTICORP_DEV = Path(__file__).resolve().parents[2].parent / "shared/data/zh-clf/ChnSentiCorp/dev.tsv"
WRITTEN = [
    "这间酒店环境和服务态度亦算不错，但房间空间太小！",
    "推荐所有喜欢《红楼梦》的红迷们一定要收藏这本书。",
    "15.4寸笔记本的键盘确实爽，基本跟台式机差不多了",
    "Hotel很好 CAFÉ café，iPhone 12 Pro的价格是¥5999。",
    "服务员态度很差，再也不来了……",
    "北京天安门 ｈｏｔｅｌ 𠀀㐀豈 [MASK] 好\u200b的\t呀",
]


def sentences() -> list[str]:
    """ChnSentiCorp dev reviews when the shared data is here, and written ones (mixed scripts, full-width
    letters, rare CJK extension characters, a zero-width space) always."""
    lines = []
    if CHNSENTICORP_DEV.is_file():
        rows = CHNSENTICORP_DEV.read_text(encoding="utf-8").splitlines()[1:41]
        lines = [row.split("\t")[2][:120] for row in rows]
    return [*lines, *WRITTEN]


@pytest.fixture(scope="module")
def zh_folder(tmp_path_factory) -> Path:
    """A random tiny BertForMaskedLM with a Chinese WordPiece vocab.txt: the commonest characters (the rarest are
    left out, to be [UNK]), a few English words and pieces, as bert-base-chinese's vocab.txt mixes them."""
    folder = tmp_path_factory.mktemp("zh")
    counts = Counter(c for text in sentences() for c in text if not c.isspace())
    chars = [c for c, _ in counts.most_common(180)]
    english = ["hotel", "cafe", "café", "ip", "##hone", "pro", "12", "##99", "59", "¥", "ｈ", "##ｏ", "##ｔ"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *english, *chars, "Hotel", "CAFÉ", "##s"]
    vocab = list(dict.fromkeys(vocab))
    return write_hf_bert(
        folder, vocab, {"do_lower_case": False, "tokenize_chinese_chars": True}, layers=1, cls="BertForMaskedLM"
    )


def _variant(zh_folder: Path, tmp_path: Path, settings: dict, tokenizer_json: dict | None = None) -> Path:
    folder = tmp_path / "variant"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(zh_folder, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    if tokenizer_json is not None:  # a tokenizer.json whose BertNormalizer says otherwise than tokenizer_config
        from transformer_cli.vocab.bert_tokenizer import tokenizer_of_hf_folder

        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_json))
        (folder / "tokenizer.json").write_bytes(tokenizer_of_hf_folder(folder).data)
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


SETTINGS = [
    {"do_lower_case": False, "tokenize_chinese_chars": True},  # bert-base-chinese's
    {},  # BertTokenizerFast's defaults: lower-case, accents stripped, Chinese characters split
    {"tokenize_chinese_chars": False},
    {"do_lower_case": True, "strip_accents": False},
    {"do_lower_case": False, "strip_accents": True},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=json.dumps)
@pytest.mark.parametrize("with_json", [False, True], ids=["vocab.txt", "tokenizer.json"])
def test_ids_are_those_of_transformers_own_tokenizer(tmp_path, zh_folder, settings, with_json):
    from transformer_cli.vocab.bert_tokenizer import pack, tokenizer_of_hf_folder

    opposite = {"do_lower_case": not settings.get("do_lower_case", True), "tokenize_chinese_chars": False}
    folder = _variant(zh_folder, tmp_path, settings, opposite if with_json else None)
    ours = tokenizer_of_hf_folder(folder)
    theirs = [transformers.AutoTokenizer.from_pretrained(str(folder))]
    if not with_json:
        theirs.append(transformers.BertTokenizerFast.from_pretrained(str(folder)))
    texts = sentences()
    got = ours.encode(texts)
    for reference in theirs:
        assert got == [reference(t, add_special_tokens=False)["input_ids"] for t in texts], type(reference)
        for a, b, ids_a, ids_b in zip(texts, texts[1:], got, got[1:]):
            ids, types, _ = pack(ids_a, ids_b, 512, ours.cls_id, ours.sep_id)
            want = reference(a, b)
            assert (ids, types) == (want["input_ids"], want["token_type_ids"])
    assert ours.unk_id in {i for ids in got for i in ids}  # the left-out characters


def test_the_settings_change_the_ids(tmp_path, zh_folder):
    """The comparison above could not pass by ignoring tokenizer_config.json: each setting changes some ids."""
    from transformer_cli.vocab.bert_tokenizer import tokenizer_of_hf_folder

    seen = [tokenizer_of_hf_folder(_variant(zh_folder, tmp_path, s)).encode(sentences()) for s in SETTINGS]
    assert len({json.dumps(ids) for ids in seen}) == len(SETTINGS)


def _write(path: Path, rows: list[str]) -> Path:
    path.write_text("".join(f"{row}\n" for row in rows), encoding="utf-8")
    return path


def _reviews(folder: Path) -> Path:
    """ChnSentiCorp's layout: train.tsv `label<TAB>text_a`, dev.tsv `qid<TAB>label<TAB>text_a`."""
    folder.mkdir()
    texts = [t.replace("\t", " ") for t in sentences()]
    train = [f"{i % 2}\t{t}" for i, t in enumerate(texts)]
    _write(folder / "train.tsv", ["label\ttext_a", *train])
    dev = texts[:8]
    _write(folder / "dev.tsv", ["qid\tlabel\ttext_a", *(f"{i}\t{i % 2}\t{t}" for i, t in enumerate(dev))])
    return folder


def _finetune(tmp_path: Path, init: Path, data: Path, *sets: str) -> Path:
    from ..conftest import ROOT

    run = tmp_path / "run"
    result = run_tcli(
        "finetune",
        "--config",
        str(ROOT / "configs" / "finetune_chnsenticorp.yaml"),
        "--set",
        f"model.init={init}",
        "--set",
        f"data.dir={data}",
        *(
            arg
            for s in ["data.max_seq_len=64", "train.max_steps=3", "train.eval_every=3", "train.batch_size=8", *sets]
            for arg in ("--set", s)
        ),
        "--out",
        str(run),
        "--device",
        "cpu",
        "-q",
    )
    assert result.returncode == 0, result.stderr
    return run / "checkpoints" / "last.pt"


def test_a_chinese_bert_folder_fine_tunes_and_predicts(tmp_path, zh_folder):
    data = _reviews(tmp_path / "ChnSentiCorp")
    last = _finetune(tmp_path, zh_folder, data, "train.precision=fp32")
    result = run_tcli("predict", "--checkpoint", str(last), "--input", str(data / "dev.tsv"), "--device", "cpu")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = len((data / "dev.tsv").read_text(encoding="utf-8").splitlines()) - 1  # (its header)
    assert len(lines) == rows and all(line.split("\t")[0] in ("0", "1") for line in lines), lines
    result = run_tcli("predict", "--checkpoint", str(last), "--device", "cpu", input="这家酒店很好\n太差了！\n")
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 2, result.stderr
    # the run keeps the folder's own tokenizer: its ids are the ones transformers gives
    from transformer_cli.checkpoint import read_checkpoint

    tok = read_checkpoint(last, kind="finetune").finetune.tokenizer
    reference = transformers.AutoTokenizer.from_pretrained(str(zh_folder))
    assert tok.encode(WRITTEN) == [reference(t, add_special_tokens=False)["input_ids"] for t in WRITTEN]


def _pairs(folder: Path) -> Path:
    """CLUE AFQMC's layout: train.txt and dev.txt, `sentence1<TAB>sentence2<TAB>label`, no header."""
    folder.mkdir()
    texts = [t.replace("\t", " ") for t in sentences()]
    rows = [f"{a}\t{b}\t{i % 2}" for i, (a, b) in enumerate(zip(texts, texts[1:]))]
    _write(folder / "train.txt", rows)
    _write(folder / "dev.txt", rows[:6])
    return folder


AFQMC = ["data.train=train.txt", "data.valid=dev.txt", "data.columns=[sentence1,sentence2,label]"]
AFQMC += ["data.text=sentence1", "data.pair=sentence2"]


def test_a_headerless_pair_table_trains_predicts_and_evaluates(tmp_path, zh_folder):
    data = _pairs(tmp_path / "AFQMC")
    last = _finetune(tmp_path, zh_folder, data, *AFQMC)
    dev = data / "dev.txt"
    by_file = run_tcli("predict", "--checkpoint", str(last), "--input", str(dev), "--device", "cpu")
    pairs = "".join("\t".join(line.split("\t")[:2]) + "\n" for line in dev.read_text(encoding="utf-8").splitlines())
    by_pairs = run_tcli("predict", "--checkpoint", str(last), "--device", "cpu", input=pairs)
    rows = dev.read_text(encoding="utf-8")
    by_rows = run_tcli("predict", "--checkpoint", str(last), "--device", "cpu", input=rows)  # label and all
    assert by_file.returncode == by_pairs.returncode == by_rows.returncode == 0, by_file.stderr + by_pairs.stderr
    n = len(dev.read_text(encoding="utf-8").splitlines())
    assert len(by_file.stdout.splitlines()) == n and by_file.stdout == by_pairs.stdout == by_rows.stdout
    shutil.copy(dev, tmp_path / "dev.tsv")  # a .tsv without a header is read by the model's columns too
    by_tsv = run_tcli("predict", "--checkpoint", str(last), "--input", str(tmp_path / "dev.tsv"), "--device", "cpu")
    assert by_tsv.stdout == by_file.stdout, by_tsv.stderr
    result = run_tcli("evaluate", "--checkpoint", str(last), "--input", str(dev), "--device", "cpu", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["examples"] == n


def test_a_bad_row_of_a_headerless_table_is_one_line_and_writes_nothing(tmp_path, zh_folder):
    data = _pairs(tmp_path / "AFQMC")
    bad = len((data / "dev.txt").read_text(encoding="utf-8").splitlines()) + 1
    with (data / "dev.txt").open("a", encoding="utf-8") as f:
        f.write("只有一句\t1\n")
    run = tmp_path / "run"
    from ..conftest import ROOT

    sets = ["--set", f"model.init={zh_folder}", "--set", f"data.dir={data}"]
    config = str(ROOT / "configs" / "finetune_afqmc.yaml")  # (its data keys are AFQMC's)
    result = run_tcli("finetune", "--config", config, *sets, "--out", str(run), "--device", "cpu")
    one_line_error(result, f"{data / 'dev.txt'}:{bad}: 2 fields but the columns given are 3 (sentence1, sentence2,")
    assert not run.exists()
    result = run_tcli("finetune", "--config", config, *sets, "--set", "data.text=question", "--out", str(run))
    one_line_error(result, "data.text is 'question', which is not one of data.columns")
    assert not run.exists()
