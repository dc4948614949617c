"""core/arrays.py: rows appended in chunks come back from np.load as one array each; a failed run leaves the old file
and no temporary behind."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_cli.core.arrays import ArrayWriter


def test_chunks_of_rows_make_one_npz(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "out.npz"
    vectors, words = [], []
    with ArrayWriter(path, {"vectors": (np.float32, (4,)), "word": (str, ()), "line": (np.int64, ())}) as out:
        for n in (3, 0, 5, 1):
            v = rng.standard_normal((n, 4)).astype(np.float32)
            w = [f"w{k}" * (k + 1) for k in range(n)] + (["苹果"] if n == 1 else [])
            w = w[:n]
            out.append(vectors=v, word=w, line=np.arange(n))
            vectors.append(v)
            words += w
        out.finish(extra={"similarity": np.eye(2)})
    with np.load(path) as z:
        assert sorted(z.files) == ["line", "similarity", "vectors", "word"]
        np.testing.assert_array_equal(z["vectors"], np.concatenate(vectors))
        assert z["word"].tolist() == words and z["line"].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0]
        np.testing.assert_array_equal(z["similarity"], np.eye(2))
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]


def test_npy_holds_the_first_array_and_strings_keep_unicode(tmp_path):
    path = tmp_path / "v.npy"
    with ArrayWriter(path, {"vectors": (np.float32, (2,)), "piece": (str, ())}) as out:
        out.append(vectors=np.ones((2, 2)), piece=["苹", "▁果"])
        np.testing.assert_array_equal(out.raw_rows("vectors"), np.ones((2, 2)))
        out.finish()
    np.testing.assert_array_equal(np.load(path), np.ones((2, 2), np.float32))
    npz = tmp_path / "p.npz"
    with ArrayWriter(npz, {"piece": (str, ())}) as out:
        out.append(piece=["苹", "▁果果"])
        out.finish()
    assert np.load(npz)["piece"].tolist() == ["苹", "▁果果"]


def test_an_error_before_finish_leaves_the_old_file(tmp_path):
    path = tmp_path / "out.npz"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), ArrayWriter(path, {"vectors": (np.float32, (2,))}) as out:
        out.append(vectors=np.zeros((3, 2)))
        raise RuntimeError("interrupted")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["out.npz"]
    with pytest.raises(ValueError), ArrayWriter(path, {"vectors": (np.float32, (2,))}) as out:
        out.append(vectors=np.zeros((3, 5)))  # rows of another width
    assert path.read_bytes() == b"old"
