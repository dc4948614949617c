"""On one small model trained on the toy pair: tcli evaluate = the trainer's numbers, alignments recover
Toyish word order, attention heatmaps and .npz files, tcli plot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_cli.core.metrics_log import read_metrics

from ..conftest import ROOT, TEST_PRECISION, TOY, one_line_error, run_tcli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CONFIG = """
data: {{dir: {data}, src_lang: src, tgt_lang: tgt, train: train, valid: val, test: null, max_len: 64}}
vocab: {{size: 400}}
model: {{d_model: 64, heads: 4, ffn_dim: 128, enc_layers: 2, dec_layers: 2, dropout: 0.1}}
train: {{max_steps: 320, max_tokens: 1024, lr: 0.003, warmup_steps: 100, precision: {precision}, seed: 1,
        eval_every: 160, log_every: 40}}
eval: {{beam: 2, max_len_b: 5}}
"""


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    """A 2+2-layer model trained 320 updates on the toy training set (validation: 80 pairs)."""
    root = tmp_path_factory.mktemp("toy_inspect")
    data = root / "data"
    data.mkdir()
    for lang in ("src", "tgt"):
        (data / f"train.{lang}").write_bytes((TOY / f"train.{lang}").read_bytes())
        val = (TOY / f"val.{lang}").read_text(encoding="utf-8").splitlines()[:80]
        (data / f"val.{lang}").write_text("\n".join(val) + "\n", encoding="utf-8")
    (root / "toy.yaml").write_text(CONFIG.format(data=data, precision=TEST_PRECISION))
    run = root / "run"
    done = run_tcli("train", "--config", str(root / "toy.yaml"), "--out", str(run), "--quiet")
    assert done.returncode == 0, done.stderr
    return run


def events(run: Path) -> list[dict]:
    return read_metrics(run)


# ----------------------------------------------------------------------------- tcli evaluate


def test_evaluate_equals_training_time_evaluation(toy_run):
    evals = {e["step"]: e for e in events(toy_run) if e["event"] == "eval"}
    data = toy_run.parent / "data"
    for name in ("best.pt", "last.pt"):
        ckpt = toy_run / "checkpoints" / name
        step = torch.load(ckpt, weights_only=True)["train_state"]["step"]
        result = run_tcli("evaluate", "--checkpoint", str(ckpt), "--split", "val", "--json")
        assert result.returncode == 0, result.stderr
        got = json.loads(result.stdout)
        logged = evals[step]
        assert (round(got["loss"], 6), round(got["ppl"], 6), round(got["bleu"], 6), round(got["chrf"], 6)) == (
            logged["valid_loss"],
            logged["valid_ppl"],
            logged["bleu"],
            logged["chrf"],
        )  # metrics.jsonl rounds to 6 decimals
        assert got["step"] == step and got["sentences"] == 80 and got["beam"] == 2
        assert 0 <= got["chrf"] <= 100 and got["bleu_lc"] >= got["bleu"] - 1e-9
        assert all("nrefs:1" in got[k] for k in ("bleu_signature", "bleu_lc_signature", "chrf_signature"))

    files = run_tcli(
        "evaluate",
        "--checkpoint",
        str(ckpt),
        "--input",
        str(data / "val.src"),
        "--reference",
        str(data / "val.tgt"),
        "--beam",
        "1",
    )
    assert files.returncode == 0, files.stderr
    assert f"loss {got['loss']:.4f} (per-token NLL)" in files.stdout and "beam 1" in files.stdout
    assert "BLEU lowercased" in files.stdout and "chrF" in files.stdout and "nrefs:1" in files.stdout
    moved = run_tcli("evaluate", "--checkpoint", str(ckpt), "--split", "val", "--data-dir", str(toy_run))
    assert moved.returncode == 2 and "--data-dir" in moved.stderr


# ----------------------------------------------------------------------------- alignments


def toy_lexicon() -> dict:
    """Source content word -> a test on target words, from the toy generator's own word lists."""
    spec = importlib.util.spec_from_file_location("make_toy_data", ROOT / "scripts" / "make_toy_data.py")
    toy = importlib.util.module_from_spec(spec)
    sys.modules["make_toy_data"] = toy
    spec.loader.exec_module(toy)
    endings = {"noun": ("o", "oj", "a", "aj"), "verb": ("as", "an", "is", "in")}
    rules = {}
    for singular, plural, stem, _ in toy.NOUNS:
        rules[singular] = rules[plural] = (stem, endings["noun"])
    for adjective, stem in toy.ADJECTIVES:
        rules[adjective] = (stem, endings["noun"])
    for base, third, past, stem in toy.TRANSITIVE_VERBS + toy.INTRANSITIVE_VERBS:
        rules[base] = rules[third] = rules[past] = (stem, endings["verb"])
    for english, toyish in toy.PREPOSITIONS + toy.NUMBERS + [(n.lower(), n.lower()) for n in toy.NAMES]:
        rules[english] = (toyish, ("",))
    return rules


def gold_word_pairs(source: str, translation: str, lexicon: dict) -> list[tuple[int, int]]:
    """(source word, target word) of content words whose translation occurs exactly once in the output.
    Toyish order differs: SOV, adjectives after the noun in mirror order, postpositions."""
    src = [w.strip(".").lower() for w in source.split()]
    tgt = [w.strip(".").lower() for w in translation.split()]
    pairs = []
    for i, word in enumerate(src):
        if word not in lexicon or src.count(word) > 1:
            continue
        stem, ends = lexicon[word]
        matches = [j for j, t in enumerate(tgt) if any(t == stem + e for e in ends)]
        if len(matches) == 1:
            pairs.append((i, matches[0]))
    return pairs


def test_word_alignments_recover_the_toy_word_order(toy_run):
    data = toy_run.parent / "data"
    sources = (data / "val.src").read_text(encoding="utf-8").splitlines()
    result = run_tcli(
        "translate",
        "--checkpoint",
        str(toy_run / "checkpoints" / "best.pt"),
        "--input",
        str(data / "val.src"),
        "--print-alignment",
        "--alignment-unit",
        "word",
        "--alignment-layer",
        "-1",
        "--quiet",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")[:-1]
    translations, alignments = lines[0::2], lines[1::2]
    assert len(translations) == len(sources) == 80
    lexicon = toy_lexicon()
    hits = total = crossing = crossing_hits = 0
    for source, translation, line in zip(sources, translations, alignments):
        predicted = {tuple(map(int, pair.split("-"))) for pair in line.split()}
        assert all(0 <= i < len(source.split()) and 0 <= j < len(translation.split()) for i, j in predicted)
        gold = gold_word_pairs(source, translation, lexicon)
        hits += len(predicted & set(gold))
        total += len(gold)
        # word pairs whose order the translation reverses (adjective-noun, verb-object, ...)
        for a in gold:
            for b in gold:
                if a[0] < b[0] and a[1] > b[1]:
                    crossing += 1
                    crossing_hits += a in predicted and b in predicted
    assert total > 150  # measured: 224 content words, 218 aligned right; 94 crossing pairs, 87 right
    assert hits / total > 0.8, (hits, total)
    assert crossing > 50 and crossing_hits / crossing > 0.7, (crossing_hits, crossing)


def test_piece_alignments_format_and_default_layer(toy_run):
    lines = ["A dog sleeps.", "", "The big red dog sees a cat."]
    result = run_tcli(
        "translate",
        "--checkpoint",
        str(toy_run / "checkpoints" / "best.pt"),
        "--print-alignment",
        "--beam",
        "3",
        "--nbest",
        "2",
        "--quiet",
        input="\n".join(lines) + "\n",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.split("\n")[:-1]
    assert len(out) == 2 * (2 + 1 + 2)  # every hypothesis line followed by its alignment line
    assert out[0].startswith("0\t") and out[2].startswith("0\t") and out[4] == "1\t0.0000\t" and out[5] == ""
    for pair in out[1].split():
        i, j = map(int, pair.split("-"))
        assert i >= 0 and j >= 0
    bad = run_tcli(
        "translate",
        "--checkpoint",
        str(toy_run / "checkpoints" / "best.pt"),
        "--print-alignment",
        "--alignment-layer",
        "2",
        input="A dog sleeps.\n",
    )
    one_line_error(bad, "--alignment-layer 2", "2 layers")


# ----------------------------------------------------------------------------- heatmaps and curves


def assert_png(path: Path) -> np.ndarray:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.05  # not a blank canvas
    return image


def test_attention_heatmaps_and_weights(toy_run, tmp_path):
    pytest.importorskip("matplotlib")
    lines = ["", "Two big black dogs did not see a red cat in the garden.", "A dog sleeps.", "The cat runs."]
    folder = tmp_path / "attention"
    result = run_tcli(
        "translate",
        "--checkpoint",
        str(toy_run / "checkpoints" / "best.pt"),
        "--attention",
        str(folder),
        "--attention-max",
        "2",
        "--precision",  # bf16 autocast (what `auto` picks on AMX CPUs and recent GPUs): the maps stay fp32
        "bf16",
        input="\n".join(lines) + "\n",
    )
    assert result.returncode == 0, result.stderr
    assert "attention of 2 sentences" in result.stderr
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(
        f"{i:04d}{suffix}"
        for i in (1, 2)
        for suffix in (".npz", "_cross.png", "_cross_heads.png", "_encoder.png", "_decoder.png")
    )
    for name in names:
        if name.endswith(".png"):
            assert_png(folder / name)
    weights = np.load(folder / "0001.npz")
    S, T = len(weights["src_pieces"]), len(weights["tgt_pieces"])
    assert weights["src_pieces"][-1] == "</s>" and weights["tgt_pieces"][-1] == "</s>"
    assert weights["encoder"].shape == (2, 4, S, S) and weights["decoder"].shape == (2, 4, T, T)
    assert weights["cross"].shape == (2, 4, T, S)
    for key in ("encoder", "decoder", "cross"):
        np.testing.assert_allclose(weights[key].sum(-1), 1.0, atol=1e-5)
    assert np.abs(np.triu(weights["decoder"], 1)).max() == 0  # causal
    assert str(weights["translation"]) == result.stdout.split("\n")[1]


def test_missing_matplotlib_is_one_line(toy_run, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed: `import matplotlib...` fails
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for args in (
        ["translate", "--checkpoint", str(toy_run / "checkpoints" / "best.pt"), "--attention", str(tmp_path / "a")],
        ["plot", str(toy_run)],
    ):
        one_line_error(run_tcli(*args, input="A dog sleeps.\n"), "matplotlib", "transformer-cli[plot]")


def test_plot_curves(toy_run, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "curves.png"
    result = run_tcli("plot", str(toy_run), "--out", str(out))
    assert result.returncode == 0, result.stderr
    image = assert_png(out)
    assert image.shape[1] > image.shape[0] / 2  # two columns: step and wall time
    default = run_tcli("plot", str(toy_run))
    assert default.returncode == 0 and (toy_run / "curves.png").exists()
    empty = tmp_path / "empty_run"
    empty.mkdir()
    one_line_error(run_tcli("plot", str(empty)), "metrics.jsonl not found")
    (empty / "metrics.jsonl").write_text("")
    one_line_error(run_tcli("plot", str(empty)), "no train or eval events")


def test_attention_maps_are_not_written_into_a_run_s_own_folders(toy_run):
    """--attention runs/x/checkpoints wrote images among the run's checkpoints; exports refuse such folders too."""
    before = sorted(p.name for p in (toy_run / "checkpoints").iterdir())
    for folder in (toy_run, toy_run / "checkpoints", toy_run / "vocab" / "maps"):
        args = ["translate", "--checkpoint", str(toy_run / "checkpoints" / "best.pt"), "--attention", str(folder)]
        one_line_error(run_tcli(*args, input="A dog sleeps.\n"), "--attention", "the run's own")
    assert sorted(p.name for p in (toy_run / "checkpoints").iterdir()) == before
    assert not (toy_run / "vocab" / "maps").exists()
