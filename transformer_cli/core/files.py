"""Files that survive a kill: atomic writes, the temporaries a killed writer leaves behind, and the one check
of the paths a user gives."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from transformer_cli.core.errors import UserError

NAME_MAX = 255  # bytes in one path component on Linux, macOS and Windows file systems
PATH_MAX = 4096
# `.NAME.tmpPID` (write_atomic) and `.NAME.tmpPID` folders (export-ct2's staging): the PID names the writer.
_TEMPORARY = re.compile(r"^\..+\.tmp(\d+)$")


def check_user_path(path: str | os.PathLike, what: str) -> None:
    """A one-line error for a path no file system can hold: a component over 255 bytes, a path over 4,096
    bytes, or a NUL byte. Checked before anything is read or written, for every path a user gives."""
    text = os.fspath(path)
    raw = os.fsencode(text)
    if b"\0" in raw:
        raise UserError(f"{what}: the path holds a NUL byte; give another path")
    if len(raw) > PATH_MAX:
        raise UserError(f"{what}: the path is {len(raw):,} bytes long, over the {PATH_MAX:,} a path may have")
    for part in Path(text).parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            raise UserError(
                f"{what}: the name {part[:40]!r}... is {size} bytes long, over the {NAME_MAX} bytes a file "
                "or folder name may have; give a shorter name"
            )


def check_user_paths(values: Iterable[tuple[str, object]]) -> None:
    """`check_user_path` for every (option, value) whose value is a path or a list of paths."""
    for what, value in values:
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, os.PathLike):
                check_user_path(item, what)


def check_file(path: Path, message: str) -> None:
    """One line when `path` is no regular file: `message` (which names it) with `{what}`: "not found", "is a
    folder, not a file", or "is a FIFO, device or socket, not a regular file" (reading it could block, or
    never end)."""
    if path.is_file():
        return
    if path.is_dir():
        what = "is a folder, not a file"
    else:
        what = "is a FIFO, device or socket, not a regular file" if path.exists() else "not found"
    raise UserError(message.format(what=what))


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same inode where both exist (hard and symbolic links included),
    else the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        try:
            return Path(a).resolve() == Path(b).resolve()
        except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13): it names no file
            return False


def check_distinct(outputs: Iterable[tuple[str, Path | None]], inputs: Iterable[tuple[str, Path | None]]) -> None:
    """A one-line error, before any work, when an output path names a file the command reads (its checkpoint, its
    input, a reference) or another of its outputs: writing it would destroy that file. `-` (stdin) is no file."""
    sources = [(what, path) for what, path in inputs if path is not None and str(path) != "-"]
    for what, path in outputs:
        if path is None:
            continue
        for other, source in sources:
            if same_file(path, source):
                raise UserError(
                    f"{what} {path} is the same file as {other} {source}: writing it would destroy that file; "
                    f"give {what} another path"
                )
        sources.append((what, path))


def temporary_name(path: Path) -> Path:
    """Where `path` is written before its rename: hidden, beside it, named by this process."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


RUN_MARKER = "run.json"  # names a tcli run directory (train/run_dir.py)
RUN_PARTS = ("vocab", "data", "checkpoints", "tb")  # the folders a run writes in it


def check_not_a_run_part(out: Path, option: str = "--out") -> None:
    """A folder a tcli run owns (the run folder itself, or its vocab/, data/, checkpoints/, tb/) is no output
    folder for an export or a preprocessing, --force or not: its files would replace or delete the run's own
    (export-hf --force into a run's vocab/ deleted its vocab.json).

    The folder is compared as the system finds it (`--out .` inside one, a link to one) and at any depth
    under vocab/, data/, checkpoints/ and tb/; other folders of a run (runs/bert/hf) are fine."""
    try:
        real = out.resolve()
    except (OSError, RuntimeError):  # a link loop: no run's folder, and the write says what it is
        return
    if (real / RUN_MARKER).is_file():
        raise UserError(
            f"{option} {out} is a tcli run folder: its files are the run's own; write to a folder of its own "
            f"(e.g. {out / 'export'})"
        )
    for part in [real, *real.parents]:
        if part.name in RUN_PARTS and (part.parent / RUN_MARKER).is_file():
            raise UserError(
                f"{option} {out} is {'' if part == real else 'inside '}the {part.name}/ folder of the run "
                f"{part.parent}: its files are the run's own; write to a folder of its own "
                f"(e.g. {part.parent / 'export'})"
            )


def check_replaceable(path: Path) -> None:
    """A one-line error unless a rename may put a file at `path`: nothing there, a regular file, or a link to one
    or to nothing (the link itself is replaced); not a folder, a device (/dev/null), a FIFO, a socket or a link
    to one of those (/dev/stdout); nothing in /dev, /proc or /sys, whatever it names (/dev/stdout, when stdout
    is a file, is a link to that file: the rename would replace the system's link)."""
    system = os.path.realpath(path.parent if str(path.parent) else ".")
    if any(system == top or system.startswith(top + "/") for top in ("/dev", "/proc", "/sys")):
        raise UserError(f"{path} is in {system}, a folder of the system, not a file to write; give another path")
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return
    link = ""
    if stat.S_ISLNK(mode):
        try:
            mode, link = os.stat(path).st_mode, "a link to "
        except OSError:  # dangling, or a loop: nothing behind it to protect
            return
    if not stat.S_ISREG(mode):
        what = "a folder" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
        raise UserError(f"{path} is {link}{what}, not a file; give a file path to write")


def write_atomic(data: bytes, path: Path) -> None:
    """Temporary file, fsync, rename: a kill at any moment leaves the old file or the new one, never half.

    A failed write (a full disk) removes its temporary file, leaves the old file as it was, and is a
    one-line error that says what to do. An interrupt (Ctrl-C, or SIGTERM as the CLI raises it) removes
    the temporary file too; only SIGKILL leaves one, which `remove_stale_temporaries` deletes later.
    Only a regular file (or a link, itself replaced, to a file or to nothing) is replaced: the rename would put
    the file in the place of a device (/dev/null), a FIFO or a socket, or of a link to one (/dev/stdout).
    """
    check_replaceable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(e, path) from None
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        _unlink_quietly(tmp)
        raise write_error(e, path) from None
    except BaseException:
        _unlink_quietly(tmp)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def write_error(e: OSError, path: Path) -> UserError:
    """A failed write as one line; a full disk says that nothing saved before was lost."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return UserError(
            f"no space left on the device while writing {path}; files saved before are intact: "
            "free some space and run the command again (a training run: add --resume auto)"
        )
    if e.errno == errno.EISDIR or (e.errno == errno.ENOTEMPTY and path.is_dir()):
        return UserError(f"cannot write {path}: it is a folder; give a file name")
    return UserError(f"cannot write {path}: {e.strerror or e}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid < 1 << 22  # another user's live process (or a PID no system gives: not alive)
    return True


def is_temporary(entry: str, name: str | None = None) -> bool:
    """Whether the folder entry `entry` is a writer's temporary `.NAME.tmpPID` (of `name`, when given)."""
    return _TEMPORARY.match(entry) is not None and (name is None or entry.startswith(f".{name}.tmp"))


def remove_stale_temporaries(folder: Path, name: str | None = None, live_writers: bool = False) -> list[Path]:
    """Delete the `.NAME.tmpPID` files and folders that a killed writer left in `folder` (only those of
    `name` when given). Without a lock on the folder (`live_writers`), a temporary whose process still runs
    is another writer's and is kept."""
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not is_temporary(entry.name, name):
            continue
        if live_writers and _alive(int(_TEMPORARY.match(entry.name).group(1))):
            continue
        _remove_tree(entry)
        removed.append(entry)
    return removed


def _remove_tree(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                _remove_tree(child)
            path.rmdir()
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass
