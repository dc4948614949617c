"""scripts/download_tatoeba.py on files the test writes (no network): a split decided by the English sentence
alone, deterministic, every row kept once, and bad rows refused with the file and line."""

from __future__ import annotations

import importlib.util
import io
import sys
import zipfile
from pathlib import Path

import pytest

from transformer_cli.core.text import read_lines

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_CMN = REPO_ROOT.parent / "shared" / "data" / "en-zh" / "cmn.txt"


def _load_script():
    spec = importlib.util.spec_from_file_location("download_tatoeba", REPO_ROOT / "scripts" / "download_tatoeba.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


script = _load_script()
ATTRIBUTION = "CC-BY 2.0 (France) Attribution: tatoeba.org #{0} (a) & #{1} (b)"


def write_cmn(path: Path, sentences: int = 400) -> list[str]:
    """A cmn.txt as manythings.org writes it (a BOM, three columns), with each English sentence twice (two
    translations), the copies far apart."""
    rows = [f"Sentence number {i}.\t第{i}句。\t" + ATTRIBUTION.format(i, i + 1) for i in range(sentences)]
    rows += [f"sentence  number {i}.\t这是第{i}句。\t" + ATTRIBUTION.format(i, i + 2) for i in range(0, sentences, 3)]
    path.write_bytes(("\ufeff" + "".join(row + "\n" for row in rows)).encode("utf-8"))
    return rows


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = script.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_split_keeps_every_row_once_and_no_english_sentence_in_two_splits(tmp_path, capsys):
    rows = write_cmn(tmp_path / "cmn.txt")
    out = tmp_path / "out"
    code, printed, err = run(capsys, "--from", str(tmp_path / "cmn.txt"), "--out", str(out), "--valid-permille", "100")
    assert code == 0, err
    splits = {split: read_lines(out / f"{split}.tsv") for split in script.SPLITS}
    assert sorted(row for part in splits.values() for row in part) == sorted(rows)  # each row once, as it was
    for split, part in splits.items():
        assert part == [row for row in rows if row in set(part)]  # in the file's order
        assert f"{split}: {len(part):,} pairs" in printed
    # "Sentence number 3." and "sentence  number 3." are one sentence (case, spaces): one split
    english = {split: {" ".join(r.split("\t")[0].split()).lower() for r in part} for split, part in splits.items()}
    assert not english["train"] & english["valid"] and not english["train"] & english["test"]
    assert not english["valid"] & english["test"]
    assert 20 <= len(english["valid"]) <= 70 and 2 <= len(english["test"]) <= 30  # about 10% and 3% of 400

    again = tmp_path / "again"
    assert run(capsys, "--from", str(tmp_path / "cmn.txt"), "--out", str(again), "--valid-permille", "100")[0] == 0
    for split in script.SPLITS:
        assert (again / f"{split}.tsv").read_bytes() == (out / f"{split}.tsv").read_bytes()


def test_a_pairs_split_does_not_depend_on_the_other_rows(tmp_path, capsys):
    rows = write_cmn(tmp_path / "cmn.txt")
    (tmp_path / "half.txt").write_text("".join(row + "\n" for row in rows[::2]), encoding="utf-8")
    full, half = tmp_path / "full", tmp_path / "half"
    assert run(capsys, "--from", str(tmp_path / "cmn.txt"), "--out", str(full))[0] == 0
    assert run(capsys, "--from", str(tmp_path / "half.txt"), "--out", str(half))[0] == 0
    for split in script.SPLITS:
        assert set(read_lines(half / f"{split}.tsv")) <= set(read_lines(full / f"{split}.tsv"))


def test_text_format_and_a_zip_give_aligned_en_and_zh_files(tmp_path, capsys):
    rows = write_cmn(tmp_path / "cmn.txt")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("_about.txt", "about")
        archive.writestr("cmn.txt", (tmp_path / "cmn.txt").read_bytes())
    (tmp_path / "cmn-eng.zip").write_bytes(buffer.getvalue())
    out = tmp_path / "out"
    code, _, err = run(capsys, "--from", str(tmp_path / "cmn-eng.zip"), "--out", str(out), "--format", "text")
    assert code == 0, err
    pairs = set()
    for split in script.SPLITS:
        en, zh = read_lines(out / f"{split}.en"), read_lines(out / f"{split}.zh")
        assert len(en) == len(zh) > 0
        pairs |= set(zip(en, zh))
    assert pairs == {tuple(row.split("\t")[:2]) for row in rows}


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"Hi.\t\xe5\x97\xa8\tCC\nRun.\n", "line 2: 1 tab-separated column"),
        (b"Hi.\t\xe5\x97\xa8\tCC\nRun.\t\xff\tCC\n", "line 2: invalid UTF-8"),
        (b"Hi.\t\xe5\x97\xa8\tCC\n\t\xe8\xb7\x91\tCC\n", "line 2: the source (column 0) is empty"),
    ],
)
def test_a_bad_row_stops_the_script_naming_file_and_line(tmp_path, capsys, content, fragment):
    (tmp_path / "cmn.txt").write_bytes(content)
    code, _, err = run(capsys, "--from", str(tmp_path / "cmn.txt"), "--out", str(tmp_path / "out"))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert f"cmn.txt {fragment}" in err
    assert not (tmp_path / "out").exists()


def test_the_shared_copy_of_cmn_txt_splits_by_english_sentence(tmp_path, capsys):
    if not SHARED_CMN.exists():
        pytest.skip("../shared/data/en-zh/cmn.txt not present")
    out = tmp_path / "out"
    code, printed, err = run(capsys, "--from", str(SHARED_CMN), "--out", str(out))
    assert code == 0, err
    english = {split: {row.split("\t")[0] for row in read_lines(out / f"{split}.tsv")} for split in script.SPLITS}
    assert not english["train"] & english["valid"] and not english["valid"] & english["test"]
    assert sum(len(read_lines(out / f"{split}.tsv")) for split in script.SPLITS) == len(read_lines(SHARED_CMN))
    assert "pairs from" in printed
