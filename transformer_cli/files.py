"""Files that survive a kill: atomic writes, and the temporaries a killed writer leaves behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from transformer_cli.errors import UserError


def write_atomic(data: bytes, path: Path) -> None:
    """Temporary file, fsync, rename: a kill at any moment leaves the old file or the new one, never half.

    A failed write (a full disk) removes its temporary file, leaves the old file as it was, and is a
    one-line error that says what to do.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(e, path) from None
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_error(e: OSError, path: Path) -> UserError:
    """A failed write as one line; a full disk says that nothing saved before was lost."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return UserError(
            f"no space left on the device while writing {path}; files saved before are intact: "
            "free some space and run the command again (a training run: add --resume auto)"
        )
    return UserError(f"cannot write {path}: {e.strerror or e}")


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete `.NAME.tmpPID` files that a killed writer left behind; only call this while holding the
    folder's lock (no live writer can own them)."""
    removed = []
    if folder.is_dir():
        for tmp in folder.glob(".*.tmp*"):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed
