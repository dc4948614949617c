"""Arrays written as they are made, in bounded memory: rows appended chunk by chunk to raw files in a hidden
staging folder, then one .npz (or .npy) assembled from them and renamed into place.

A .npy header holds the array's shape, unknown until the last row is in; so each array's rows go to a raw file
first, and the header and the rows are copied into the final file block by block at the end. The final file is
written under a temporary name and renamed: a kill at any moment leaves the old file or the new one, never half;
the staging folder is `.NAME.tmpPID` (core/files.py), which `remove_stale_temporaries` removes if a SIGKILL left it.
Strings are stored as numpy's fixed-width unicode ('<U' + the longest), as np.savez stores a list of str.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

from transformer_cli.core.files import check_replaceable, remove_stale_temporaries, temporary_name, write_error

COPY_ROWS = 1 << 16  # rows copied at a time when the final file is assembled


class _Column:
    """One array's rows so far: raw bytes of a numeric dtype, or UTF-8 lines for strings."""

    def __init__(self, path: Path, dtype: np.dtype | None, row_shape: tuple[int, ...]):
        self.path, self.dtype, self.row_shape = path, dtype, row_shape
        self.file: BinaryIO = open(path, "wb")
        self.rows, self.longest = 0, 1

    def append(self, values: np.ndarray | list[str]) -> None:
        if self.dtype is None:  # strings: one per line (they hold no newline: pieces and words of a line)
            self.longest = max(self.longest, *(len(s) for s in values)) if len(values) else self.longest
            self.file.write("".join(s + "\n" for s in values).encode("utf-8"))
        else:
            array = np.ascontiguousarray(values, dtype=self.dtype)
            if array.shape[1:] != self.row_shape:
                raise ValueError(f"rows of shape {array.shape[1:]} appended to an array of rows {self.row_shape}")
            self.file.write(array.tobytes())
        self.rows += len(values)

    def dtype_shape(self) -> tuple[np.dtype, tuple[int, ...]]:
        dtype = self.dtype if self.dtype is not None else np.dtype(f"<U{self.longest}")
        return dtype, (self.rows, *self.row_shape)

    def copy_into(self, out: BinaryIO) -> None:
        """The .npy header, then the rows."""
        self.file.close()
        dtype, shape = self.dtype_shape()
        np.lib.format.write_array_header_2_0(
            out, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        )
        with open(self.path, "rb") as f:
            if self.dtype is not None:
                shutil.copyfileobj(f, out, 1 << 20)
                return
            block: list[str] = []
            for line in f:
                block.append(line[:-1].decode("utf-8"))
                if len(block) == COPY_ROWS:
                    out.write(np.array(block, dtype=dtype).tobytes())
                    block = []
            if block:
                out.write(np.array(block, dtype=dtype).tobytes())


class ArrayWriter:
    """Named arrays whose rows are appended in chunks, written at `finish()` as one .npz (every array) or .npy
    (the first array alone). Use as a context manager: leaving on an error removes every temporary file.

        with ArrayWriter(path, {"vectors": (np.float32, (768,)), "piece": (str, ())}) as out:
            out.append(vectors=chunk_vectors, piece=chunk_pieces)
            out.finish(extra={"similarity": matrix})
    """

    def __init__(self, path: Path, columns: dict[str, tuple[type | np.dtype, tuple[int, ...]]]):
        check_replaceable(path)
        self.path, self.npy = path, path.suffix.lower() == ".npy"
        remove_stale_temporaries(path.parent, path.name, live_writers=True)
        self.staging = temporary_name(path)
        try:
            self.staging.mkdir()
        except OSError as e:
            raise write_error(e, path) from None
        self.columns = {
            name: _Column(self.staging / f"{name}.raw", None if kind is str else np.dtype(kind), tuple(shape))
            for name, (kind, shape) in columns.items()
        }
        self.finished = False

    def __enter__(self) -> ArrayWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def rows(self) -> int:
        return next(iter(self.columns.values())).rows

    def append(self, **values: np.ndarray | list[str]) -> None:
        """Rows of every array at once (the same count each, so that row i of one belongs to row i of another)."""
        counts = {len(v) for v in values.values()}
        if set(values) != set(self.columns) or len(counts) != 1:
            raise ValueError(f"append needs as many rows of each of {', '.join(self.columns)}")
        try:
            for name, column in self.columns.items():
                column.append(values[name])
        except OSError as e:
            raise write_error(e, self.path) from None

    def raw_rows(self, name: str) -> np.ndarray:
        """A numeric array's rows written so far, memory-mapped read-only (nothing is loaded)."""
        column = self.columns[name]
        column.file.flush()
        dtype, shape = column.dtype_shape()
        if column.rows == 0:
            return np.zeros(shape, dtype)
        return np.memmap(column.path, dtype=dtype, mode="r", shape=shape)

    def finish(self, extra: dict[str, np.ndarray] | None = None) -> None:
        """Assemble the final file (with `extra` whole arrays in a .npz) and rename it into place."""
        final = self.staging / "final"
        try:
            if self.npy:
                with open(final, "wb") as out:
                    next(iter(self.columns.values())).copy_into(out)
                    _sync(out)
            else:
                with zipfile.ZipFile(final, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
                    for name, column in self.columns.items():
                        with archive.open(f"{name}.npy", "w", force_zip64=True) as out:
                            column.copy_into(out)
                    for name, array in (extra or {}).items():
                        with archive.open(f"{name}.npy", "w", force_zip64=True) as out:
                            np.lib.format.write_array(out, np.asarray(array), allow_pickle=False)
                with open(final, "rb+") as f:
                    _sync(f)
            os.replace(final, self.path)
        except OSError as e:
            raise write_error(e, self.path) from None
        self.finished = True
        self.close()

    def close(self) -> None:
        """Remove the staging folder (after `finish`, or on an error: the old file at `path` stays as it was)."""
        for column in self.columns.values():
            column.file.close()
        shutil.rmtree(self.staging, ignore_errors=True)


def _sync(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
