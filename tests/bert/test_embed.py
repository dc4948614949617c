"""tcli embed on the tiny trained BERT (and a fine-tuned one, and a Hugging Face folder): the vectors are the
model's hidden states, words and sentences are pooled as promised whatever the batch, the similarity of a word's
occurrences (English and Chinese), nearest lines, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ..conftest import one_line_error, run_tcli, write_hf_bert
from .test_fill_mask_evaluate_bert import bert_run  # noqa: F401 - the module's trained BERT, reused

LINES = [
    "The king saw the river near the castle.",
    "A wolf crossed the bridge.",
    "",
    "The farmer sold the horse near the market and the storm left the village before winter.",
    "Summer.",
]


@pytest.fixture(scope="module")
def ckpt(bert_run) -> Path:  # noqa: F811
    return bert_run / "checkpoints" / "best.pt"


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def embed(source: Path, lines: Path, out: Path, *options: str) -> dict[str, np.ndarray]:
    """Run tcli embed (on the CPU) writing `out`, return the .npz's arrays."""
    result = run_tcli("embed", "--checkpoint", str(source), "-i", str(lines), "-o", str(out), *options, "--device=cpu")
    assert result.returncode == 0, result.stderr
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def direct_states(model, ids: list[int], layer: int | None = None) -> torch.Tensor:
    """The hidden states of `[CLS] ids [SEP]` computed here, without tcli embed: (T + 2, d)."""
    x = torch.tensor([[2, *ids, 3]])
    with torch.no_grad():
        if layer is None:
            return model.encode(x, torch.zeros_like(x))[0]
        h = model.embeddings(x, torch.zeros_like(x))
        for block in model.encoder[:layer]:
            h = block(h, x.eq(0))
        return h[0]


def test_piece_vectors_are_the_models_hidden_states(tmp_path, ckpt):
    from transformer_cli.checkpoint import read_checkpoint

    path = write_lines(tmp_path / "in.txt", LINES)
    got = embed(ckpt, path, tmp_path / "p.npz", "--level", "piece")
    first = embed(ckpt, path, tmp_path / "p0.npz", "--level", "piece", "--layer", "-3")
    c = read_checkpoint(ckpt, kind="bert")
    model, sp = c.build_model().eval(), c.vocabs[0].sp
    expected, pieces, lines, layer0 = [], [], [], []
    for number, text in enumerate(LINES, 1):
        ids = sp.encode(text)
        expected.append(direct_states(model, ids)[1:-1])
        layer0.append(direct_states(model, ids, layer=0)[1:-1])
        pieces += [sp.id_to_piece(i) for i in ids]
        lines += [number] * len(ids)
    assert got["piece"].tolist() == pieces and got["line"].tolist() == lines
    assert got["position"].tolist() == [k for text in LINES for k in range(len(sp.encode(text)))]
    torch.testing.assert_close(torch.from_numpy(got["vectors"]), torch.cat(expected), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.from_numpy(first["vectors"]), torch.cat(layer0), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(torch.cat(expected), torch.cat(layer0), atol=1e-3)  # another layer, other vectors


def test_a_word_is_the_mean_of_its_pieces(tmp_path, ckpt):
    path = write_lines(tmp_path / "in.txt", LINES)
    pieces = embed(ckpt, path, tmp_path / "p.npz", "--level", "piece")
    words = embed(ckpt, path, tmp_path / "w.npz", "--level", "word")
    assert words["word"].tolist() == [w for text in LINES for w in text.split()]
    assert words["index"].tolist() == [k for text in LINES for k in range(len(text.split()))]
    expected, word = [], -1
    groups: list[list[int]] = []
    for k, (piece, position) in enumerate(zip(pieces["piece"], pieces["position"])):
        if position == 0 or piece.startswith("\u2581"):  # a sentencepiece word starts at '▁'
            groups.append([])
            word += 1
        groups[-1].append(k)
    expected = np.stack([pieces["vectors"][g].mean(0) for g in groups])
    assert len(groups) == len(words["vectors"]) and any(len(g) > 1 for g in groups)
    np.testing.assert_allclose(words["vectors"], expected, atol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sentence_pooling_in_batches_equals_one_line_at_a_time(tmp_path, ckpt, pooling):
    """Lines of different lengths share batches (padded); each line alone, and chunks of 2 lines, give the same."""
    from transformer_cli.bert.embed import Options, run_embed
    from transformer_cli.checkpoint import read_checkpoint

    path = write_lines(tmp_path / "in.txt", LINES * 3)
    together = embed(ckpt, path, tmp_path / "all.npz", "--pooling", pooling)
    options = Options("sentence", pooling)
    for chunk in (1, 2):
        out = tmp_path / f"chunk{chunk}.npy"
        run_embed(ckpt, path, out, options, device="cpu", chunk_lines=chunk)
        np.testing.assert_allclose(np.load(out), together["vectors"], atol=1e-5)
    c = read_checkpoint(ckpt, kind="bert")
    model, sp = c.build_model().eval(), c.vocabs[0].sp
    alone = []
    for text in LINES * 3:
        states = direct_states(model, sp.encode(text))
        alone.append(states[0] if pooling == "cls" else states.mean(0))
    assert together["line"].tolist() == list(range(1, 3 * len(LINES) + 1))
    np.testing.assert_allclose(together["vectors"], torch.stack(alone).numpy(), atol=1e-5)


def test_similarity_matrix_is_symmetric_with_ones_and_is_drawn(tmp_path, ckpt):
    path = write_lines(tmp_path / "in.txt", LINES)
    png, out = tmp_path / "the.png", tmp_path / "s.npz"
    result = run_tcli(
        "embed", "--checkpoint", str(ckpt), "-i", str(path), "--similarity", "the", "--plot", str(png),
        "--output", str(out), "--level", "piece", "--device", "cpu",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with np.load(out) as z:
        m, vectors = z["similarity"], z["similarity_vectors"]
        lines, labels = z["similarity_line"], z["similarity_label"]
        pieces, piece_vectors, piece_lines = z["piece"], z["vectors"], z["line"]
    # "the" (lower-case: "The" is another spelling) in line 1 twice, line 2 once, line 4 four times
    assert lines.tolist() == [1, 1, 2, 4, 4, 4, 4]
    assert all("[the]" in label for label in labels)
    np.testing.assert_allclose(m, m.T, atol=0)
    np.testing.assert_allclose(np.diag(m), 1.0, atol=1e-6)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(m, unit @ unit.T, atol=1e-5)
    # each occurrence's vector is the mean of the pieces that spell it ("▁the", or "▁t" "he" in a small vocabulary)
    target = [p for p in ("\u2581the",) if p in pieces.tolist()] or ["\u2581t", "he"]
    starts = [k for k in range(len(pieces)) if pieces[k : k + len(target)].tolist() == target]
    assert piece_lines[starts].tolist() == lines.tolist()
    expected = [piece_vectors[k : k + len(target)].mean(0) for k in starts]
    np.testing.assert_allclose(vectors, np.stack(expected), atol=1e-6)
    table = result.stdout.splitlines()
    assert len(table) == 2 * len(lines) + 1 and table[len(lines) + 1].split("\t")[1] == "1.0000"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_occurrences_are_whole_words_except_in_cjk():
    from transformer_cli.bert.embed import occurrences

    assert occurrences("the", "the other then the end") == [(0, 3), (15, 18)]
    assert occurrences("苹果", "我吃苹果和苹果派") == [(2, 4), (5, 7)]
    assert occurrences("apple", "pineapple apple, apples") == [(10, 15)]


def test_neighbours_are_the_most_similar_other_lines(tmp_path, ckpt):
    """Read from standard input, as a pipe gives it."""
    lines = ["The king saw the river.", "A wolf crossed the bridge.", "The king saw the river.", "Winter came."]
    text = "".join(line + "\n" for line in lines)
    result = run_tcli("embed", "--checkpoint", str(ckpt), "--neighbours", "2", "--device", "cpu", input=text)
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert len(out) == 4 and out[0].startswith("1 -> 3 (1.0000)") and out[2].startswith("3 -> 1 (1.0000)")
    assert all(len(line.split(" -> ")[1].split("  ")) == 2 for line in out)


def test_a_fine_tuned_checkpoint_gives_its_encoders_vectors(tmp_path, ckpt):
    from transformer_cli.checkpoint import read_checkpoint

    rows = ["sentence\tlabel", *(f"{t}\t{k % 2}" for k, t in enumerate([x for x in LINES if x] * 4))]
    for split in ("train", "dev"):
        (tmp_path / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    (tmp_path / "ft.yaml").write_text(
        "task: {kind: classification}\n"
        f"data: {{dir: {tmp_path}, train: train.tsv, valid: dev.tsv, text: sentence, label: label, max_seq_len: 32}}\n"
        f"model: {{init: {ckpt}}}\n"
        "train: {batch_size: 8, max_steps: 2, lr: 0.01, eval_every: 2, precision: fp32}\n"
    )
    run = tmp_path / "run"
    done = run_tcli("finetune", "--config", str(tmp_path / "ft.yaml"), "--out", str(run), "--device", "cpu", "-q")
    assert done.returncode == 0, done.stderr
    fine = run / "checkpoints" / "last.pt"
    path = write_lines(tmp_path / "in.txt", LINES)
    got = embed(fine, path, tmp_path / "f.npz", "--pooling", "cls")
    c = read_checkpoint(fine, kind="finetune")
    encoder, tok = c.build_model().bert.eval(), c.finetune.tokenizer
    expected = np.stack([direct_states(encoder, sum(tok.encode_words(t.split()), []))[0].numpy() for t in LINES])
    np.testing.assert_allclose(got["vectors"], expected, atol=1e-5)
    pretrained = embed(ckpt, path, tmp_path / "b.npz", "--pooling", "cls")
    assert not np.allclose(pretrained["vectors"], got["vectors"], atol=1e-4)  # fine-tuning changed the encoder


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A random tiny BertModel with a lower-casing WordPiece vocab.txt holding Chinese characters."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("hf")
    words = "the cat sat on mat a dog ran to house quick ##ly garden . , !".split()
    words += list("我喜欢吃苹果很好他买了手机。")  # full-width punctuation too
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *letters, *[f"##{c}" for c in letters]]
    return write_hf_bert(folder, vocab, {"do_lower_case": True})


HF_LINES = ["The cat sat on the mat.", "A dog ran to the house, quickly!", "我喜欢吃苹果", "他买了苹果手机。", "很好"]


def test_a_hugging_face_folder_gives_the_vectors_transformers_computes(tmp_path, hf_folder):
    transformers = pytest.importorskip("transformers")
    path = write_lines(tmp_path / "in.txt", HF_LINES)
    pieces = embed(hf_folder, path, tmp_path / "p.npz", "--level", "piece")
    middle = embed(hf_folder, path, tmp_path / "m.npz", "--layer", "1",
        "--pooling", "cls",
    )  # fmt: skip
    tokenizer = transformers.BertTokenizerFast(str(hf_folder / "vocab.txt"), do_lower_case=True)
    model = transformers.BertModel.from_pretrained(hf_folder).eval()
    last, first, tokens = [], [], []
    for text in HF_LINES:
        enc = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            states = model(**enc, output_hidden_states=True).hidden_states
        last.append(states[-1][0, 1:-1])
        first.append(states[1][0, 0])
        tokens += tokenizer.convert_ids_to_tokens(enc["input_ids"][0])[1:-1]
    assert pieces["piece"].tolist() == tokens
    np.testing.assert_allclose(pieces["vectors"], torch.cat(last).numpy(), atol=1e-5)
    np.testing.assert_allclose(middle["vectors"], torch.stack(first).numpy(), atol=1e-5)


def test_a_chinese_word_is_found_inside_lines_without_spaces(tmp_path, hf_folder):
    path = write_lines(tmp_path / "in.txt", HF_LINES)
    out = tmp_path / "s.npz"
    result = run_tcli(
        "embed", "--checkpoint", str(hf_folder), "-i", str(path), "--similarity", "苹果", "--output", str(out),
        "--level", "piece", "--plot", str(tmp_path / "s.png"), "--device", "cpu",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with np.load(out) as z:
        assert z["similarity_line"].tolist() == [3, 4]
        assert z["similarity_label"].tolist() == ["3: 我喜欢吃[苹果]", "4: 他买了[苹果]手机。"]
        rows = [k for k, (p, n) in enumerate(zip(z["piece"], z["line"])) if n == 3 and p in ("苹", "果")]
        np.testing.assert_allclose(z["similarity_vectors"][0], z["vectors"][rows].mean(0), atol=1e-6)
        assert z["similarity"].shape == (2, 2) and z["similarity"][0, 1] == z["similarity"][1, 0]
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_inputs_are_one_line_errors_and_leave_the_output_as_it_was(tmp_path, ckpt):
    path = write_lines(tmp_path / "in.txt", LINES)
    empty = write_lines(tmp_path / "empty.txt", [])
    out = tmp_path / "out.npz"
    np.savez(out, vectors=np.zeros(3))
    before = out.read_bytes()
    not_a_checkpoint = tmp_path / "model.pt"
    not_a_checkpoint.write_text("hello")
    base = ("embed", "--checkpoint", str(ckpt), "--device", "cpu")
    cases = [
        ((*base, "-i", str(path), "--similarity", "zebra", "-o", str(out)), "no line of", "zebra"),
        ((*base, "-i", str(empty), "-o", str(out)), "is empty"),
        (("embed", "--checkpoint", str(not_a_checkpoint), "-i", str(path), "-o", str(out)), "model.pt"),
        (("embed", "--checkpoint", str(tmp_path / "none.pt"), "-i", str(path), "-o", str(out)), "not found"),
        ((*base, "-i", str(path), "-o", str(tmp_path / "missing" / "v.npz")), "does not exist"),
        ((*base, "-i", str(path), "-o", str(tmp_path / "v.txt")), ".npz"),
        ((*base, "-i", str(path)), "--output"),
        ((*base, "-i", str(path), "-o", str(out), "--layer", "3"), "--layer 3", "2 layers"),
        ((*base, "-i", str(path), "-o", str(out), "--level", "piece", "--pooling", "cls"), "--pooling"),
        ((*base, "-i", str(path), "--neighbours", "2", "--level", "word"), "--neighbours"),
        ((*base, "-i", str(path), "-o", str(out), "--plot", str(tmp_path / "a.png")), "--similarity"),
        ((*base, "-i", str(path), "-o", str(ckpt)), "--output"),
        ((*base, "-i", str(path), "-o", "-"), "--output -", ".npz"),
    ]
    for args, *fragments in cases:
        one_line_error(run_tcli(*args), *fragments)
    assert out.read_bytes() == before  # replaced only by a run that succeeds
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "in.txt", "model.pt", "out.npz"]
    # the earlier .npz of arrays is replaced by a run that succeeds
    assert run_tcli(*base, "-i", str(path), "-o", str(out)).returncode == 0
    assert np.load(out)["vectors"].shape == (len(LINES), 32)


def test_a_line_longer_than_the_model_reads_is_cut_with_a_warning(tmp_path, ckpt):
    path = write_lines(tmp_path / "in.txt", ["the river " * 40, "A wolf."])
    out = tmp_path / "p.npz"
    result = run_tcli("embed", "--checkpoint", str(ckpt), "-i", str(path), "-o", str(out), "--level", "word")
    assert result.returncode == 0, result.stderr
    assert "warning: line 1:" in result.stderr and "split the line" in result.stderr
    with np.load(out) as z:
        words, lines = z["word"].tolist(), z["line"].tolist()
    first = [w for w, n in zip(words, lines) if n == 1]
    assert 0 < len(first) < 80 and first == ("the river " * 40).split()[: len(first)]
    assert [w for w, n in zip(words, lines) if n == 2] == ["A", "wolf."]


def test_a_folder_written_by_export_hf_gives_the_checkpoints_vectors(tmp_path, ckpt):
    """The same model read from the checkpoint and from its Hugging Face folder (its tokenizer.json): the same pieces,
    vectors and occurrences."""
    folder = tmp_path / "hf"
    done = run_tcli("export-hf", "--checkpoint", str(ckpt), "--out", str(folder))
    assert done.returncode == 0, done.stderr
    path = write_lines(tmp_path / "in.txt", LINES)
    options = ("--level", "piece", "--similarity", "the")
    ours = embed(ckpt, path, tmp_path / "a.npz", *options)
    theirs = embed(folder, path, tmp_path / "b.npz", *options)
    assert ours["piece"].tolist() == theirs["piece"].tolist()
    assert ours["similarity_line"].tolist() == theirs["similarity_line"].tolist() == [1, 1, 2, 4, 4, 4, 4]
    np.testing.assert_allclose(ours["vectors"], theirs["vectors"], atol=1e-5)


def test_neighbours_in_blocks_are_the_brute_force_best(capsys):
    from transformer_cli.bert.embed import print_neighbours

    vectors = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    print_neighbours(vectors, 3, "x", block=7)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = unit @ unit.T
    np.fill_diagonal(sims, -np.inf)
    for i, line in enumerate(capsys.readouterr().out.splitlines()):
        number, best = line.split(" -> ")
        assert int(number) == i + 1
        got = [int(item.split(" (")[0]) - 1 for item in best.split("  ")]
        assert got == np.argsort(-sims[i])[:3].tolist()
