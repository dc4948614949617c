"""Output folders of the exports: refused when not empty unless --force, which removes only the files the
export's readers would load, so that nothing of an earlier model there is read with the new one."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from transformer_cli.core.errors import UserError
from transformer_cli.core.files import check_not_a_run_part, remove_stale_temporaries, temporary_name

STAGING = "export"  # `.export.tmpPID`: the folder an export writes into before its files are renamed into place


def prepare_folder(out_dir: Path, force: bool, owned: Iterable[str], what: str) -> None:
    """Create `out_dir`, or check it: a non-empty folder needs `force`, which deletes the files named or
    matched (glob patterns) by `owned` there. `what` names those files in the error ("HF model and tokenizer").

    The temporaries an interrupted export left there (its hidden `.NAME.tmpPID` files and staging folder,
    whose process has ended) are removed first: they are never the user's, and never block the next export."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file, not a folder")
    check_not_a_run_part(out_dir)
    try:
        for name in [STAGING, *(n for n in owned if "*" not in n)]:
            remove_stale_temporaries(out_dir, name, live_writers=True)
        if out_dir.is_dir() and any(out_dir.iterdir()):
            if not force:
                raise UserError(f"--out {out_dir} is not empty; pass --force to replace the {what} files in it")
            for pattern in owned:
                for path in out_dir.glob(pattern):
                    if path.is_file() or path.is_symlink():
                        path.unlink()
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot write the folder {out_dir}: {e.strerror or e}") from None


def check_writable_file(out: Path) -> None:
    """A file path whose folder exists or can be created; a one-line error otherwise."""
    if out.exists() and not out.is_file():
        raise UserError(f"{out} is not a file")
    if any(parent.exists() and not parent.is_dir() for parent in out.parents):
        raise UserError(f"cannot write {out}: a part of its path is a file, not a folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the folder of {out}: {e.strerror or e}") from None


def write_staged(out_dir: Path, write: Callable[[Path], None], last: str = "config.json") -> None:
    """An export's files written whole or not at all: `write(staging)` fills a staging folder inside `out_dir`
    (nothing in `out_dir` changes meanwhile), then its files are renamed into place, `last` after the others
    (readers open it first, so a folder whose renames were cut short is not loadable as a model). The staging
    folder is removed however this ends; a kill's is removed by the next export (`prepare_folder`)."""
    staging = temporary_name(out_dir / STAGING)
    try:
        staging.mkdir()
        try:
            write(staging)
            for f in sorted(staging.iterdir(), key=lambda f: f.name == last):
                os.replace(f, out_dir / f.name)
        finally:
            remove_stale_temporaries(out_dir, STAGING)
    except OSError as e:
        raise UserError(f"cannot write {out_dir}: {e.strerror or e}") from None
