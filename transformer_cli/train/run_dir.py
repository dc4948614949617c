"""The run directory: its marker, its lock (one process at a time) and what a run may find in it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_cli import __version__
from transformer_cli.config import dump_config
from transformer_cli.core.errors import UserError
from transformer_cli.core.files import RUN_MARKER, RUN_PARTS, remove_stale_temporaries, write_atomic

if TYPE_CHECKING:  # this module is imported by `tcli preprocess`, which never loads torch
    pass


MARKER = RUN_MARKER  # names a tcli run directory: kind, version, status
LOCK = ".lock"
OWN_ENTRIES = {MARKER, LOCK, "config.yaml", "metrics.jsonl", *RUN_PARTS}

# Keys that may differ when a run is resumed: they change neither the model, the vocabulary, nor the order
# in which the data are fed (which the checkpoint's saved position refers to). Everything else is refused.
SAFE_ON_RESUME = frozenset(
    {
        "data.dir",  # the training files are compared by their hash, wherever they are
        "data.preprocessed",  # so are preprocessed ones (their manifest holds the hash of the text they came from)
        "data.test",
        "train.max_steps",
        "train.max_epochs",
        "train.max_minutes",
        "train.eval_every",
        "train.save_every",
        "train.log_every",
        "train.keep_last",
        "train.patience",
        "train.average_last",
        "train.compile",
        "train.precision",
        "vocab.max_sentences",  # a resume takes the checkpoint's vocabulary; this only bounds training a new one
        "eval.beam",
        "eval.lenpen",
        "eval.max_len_a",
        "eval.max_len_b",
        "eval.max_tokens",
    }
)


# ----------------------------------------------------------------------------- the run directory


class RunDirectory:
    """`--out DIR`: refuses a folder that holds anything but a tcli run of this kind, and holds an exclusive
    lock (fcntl.flock on DIR/.lock, released by the OS however the process ends) for the whole run."""

    def __init__(self, path: Path, kind: str):
        self.path, self.kind = Path(path), kind
        self.ckpt_dir = self.path / "checkpoints"
        self._lock_fd: int | None = None
        self._created = False  # this process made the directory: a refused run removes it again
        self._was_empty = False  # ... or found it empty (but for a lock file): a refused run empties it again
        self.started = False
        self._before: dict[str, bytes | None] = {}  # run.json and config.yaml as start() found them
        self.checkpointed = False  # a last.pt has been written (run.json says so from then on)

    # -- guard and lock

    def acquire(self) -> None:
        self._guard()
        self._created = not self.path.exists()
        self._was_empty = self._created or not {p.name for p in self.path.iterdir()} - {LOCK}
        advice = "wait for it to end or choose another --out"
        self._lock_fd = lock_directory(self.path, "the run directory", "run", advice)

    def release(self) -> None:
        """Give the lock back; a run refused before it started leaves no directory it made itself."""
        if self._lock_fd is None:
            return
        if self._created and not self.started:
            remove_made_folder(self.path)
        unlock_directory(self._lock_fd, wrote=self.started)
        self._lock_fd = None

    def _guard(self) -> None:
        try:
            str(self.path.absolute()).encode("utf-8")
        except UnicodeEncodeError:  # TensorBoard's writer takes text paths only
            raise UserError(
                f"--out {self.path!s}: the path holds bytes that are not UTF-8, where TensorBoard cannot write; "
                "choose a name in UTF-8"
            ) from None
        if not self.path.exists():
            return
        if not self.path.is_dir():
            raise UserError(f"--out {self.path} is a file, not a directory")
        entries = {p.name for p in self.path.iterdir()}
        marker = self._marker()
        if marker is not None:
            if marker.get("kind") != self.kind:
                raise UserError(
                    f"{self.path} holds a {marker.get('kind')} run, not a {self.kind} run; choose another --out"
                )
            self._check_own_entries()
            return
        legacy = "checkpoints" in entries or "metrics.jsonl" in entries
        foreign = sorted(entries - OWN_ENTRIES)
        if entries - {LOCK} and (foreign or not legacy):  # .lock alone: a run killed before it wrote anything
            shown = ", ".join((foreign or sorted(entries))[:3])
            raise UserError(
                f"--out {self.path} is not empty and is not a tcli run directory (it holds {shown}"
                f"{', ...' if len(entries) > 3 else ''}); choose a new or empty directory"
            )
        if legacy and (self.ckpt_dir / "last.pt").is_file():
            from transformer_cli.checkpoint import read_checkpoint

            found = read_checkpoint(self.ckpt_dir / "last.pt").kind
            if found != self.kind:
                raise UserError(f"{self.path} holds a {found} run, not a {self.kind} run; choose another --out")

    def _check_own_entries(self) -> None:
        """The run's own names hold what the run writes there (a file, or a folder), checked before any write: a
        `metrics.jsonl` that had become a folder refused the resume only after run.json and config.yaml changed."""
        files = [self.path / name for name in sorted(OWN_ENTRIES - set(RUN_PARTS))]  # run.json, .lock, ...
        for folder in ("vocab", "checkpoints"):
            if (self.path / folder).is_dir():
                files += [p for p in (self.path / folder).iterdir() if not p.name.startswith(".")]
        for path in files:
            if os.path.lexists(path) and not path.is_file():
                what = "a folder" if path.is_dir() else "no regular file"
                raise UserError(f"{path} is {what}, where the run keeps a file; move it away, then run again")
        for name in RUN_PARTS:
            path = self.path / name
            if os.path.lexists(path) and not path.is_dir():
                raise UserError(f"{path} is not a folder, where the run keeps one; move it away, then run again")

    # -- what the directory holds

    def _marker(self) -> dict[str, Any] | None:
        try:
            data = json.loads((self.path / MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return None
        return data if isinstance(data, dict) else None

    def checkpoints(self) -> list[Path]:
        return sorted(self.ckpt_dir.glob("*.pt")) if self.ckpt_dir.is_dir() else []

    def first_save_interrupted(self) -> bool:
        """Checkpoint files without last.pt in a run whose first save never completed (run.json says no
        last.pt was ever written): they are the leftovers of that save, not a run to keep."""
        marker = self._marker()
        return marker is not None and marker.get("checkpointed") is False

    def was_checkpointed(self) -> bool:
        """Whether run.json says a last.pt was written (its logs belong to checkpoints, wherever they are now)."""
        marker = self._marker()
        return marker is not None and marker.get("checkpointed") is True

    def finished_step(self) -> int | None:
        """The step at which this run's end was logged (test scores, end event), or None."""
        marker = self._marker() or {}
        return marker.get("finished_step") if marker.get("status") == "finished" else None

    # -- writing (only after every check has passed)

    def start(self, cfg: Any, fresh: bool) -> None:
        """Clean what a killed process left, reset the logs of a run that starts over, write config.yaml."""
        self.started = True
        self._before = {name: _bytes_or_none(self.path / name) for name in (MARKER, "config.yaml")}
        for folder in (self.path, self.ckpt_dir, self.path / "vocab"):
            remove_stale_temporaries(folder)
        if fresh:  # a run killed before its first checkpoint starts over: no duplicate steps in the logs
            (self.path / "metrics.jsonl").unlink(missing_ok=True)
            shutil.rmtree(self.path / "tb", ignore_errors=True)
        self.checkpointed = not fresh
        self._write_marker("running")
        write_atomic(dump_config(cfg).encode("utf-8"), self.path / "config.yaml")

    def abandon(self) -> None:
        """A new run refused after `start` (no sentence pairs left once the data are tokenised): a directory this
        process made, or found empty, is left as it was, whatever the run wrote there (config, vocabulary, data);
        `release` removes the lock of a directory it made."""
        if self._was_empty and self.started and not self.checkpointed:
            empty_but_the_lock(self.path)
            self.started = False

    def undo_start(self) -> None:
        """A resume refused after `start` (a training state that does not load, found only when the trainer takes
        it): run.json and config.yaml go back to what they were, and the lock file with them (`release`)."""
        for name, data in self._before.items():
            if data is None:
                (self.path / name).unlink(missing_ok=True)
            else:
                write_atomic(data, self.path / name)
        self.started = False

    def saved(self, step: int) -> None:
        """Called after every write of last.pt; the first one is recorded in run.json."""
        if not self.checkpointed:
            self.checkpointed = True
            self._write_marker("running")

    def finish(self, step: int) -> None:
        self._write_marker("finished", finished_step=step)

    def _write_marker(self, status: str, **extra: Any) -> None:
        data = {"tcli": __version__, "kind": self.kind, "status": status, "checkpointed": self.checkpointed, **extra}
        write_atomic((json.dumps(data, indent=1) + "\n").encode(), self.path / MARKER)


def lock_directory(folder: Path, name: str, holder: str, advice: str) -> int:
    """Create `folder` if needed and hold an exclusive lock on folder/.lock (fcntl.flock: released by the OS
    however the process ends), the holder's PID written in it: the one lock of run directories and preprocessed
    folders. Returns the descriptor (closing it releases the lock). One-line errors: `cannot create {name}` and
    `{folder} is in use by another tcli {holder} (PID n); {advice}`."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UserError(f"cannot create {name} {folder}: {e.strerror}") from None
    if not _try_lock(fd):
        pid = _read_pid(fd)
        os.close(fd)
        raise UserError(f"{folder} is in use by another tcli {holder} (PID {pid}); {advice}")
    _BEFORE[fd] = (_read_all(fd), os.fstat(fd))
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


_BEFORE: dict[int, tuple[bytes, os.stat_result]] = {}  # a held lock file as it was (the last holder's PID)


def _bytes_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def remove_made_folder(folder: Path) -> None:
    """A folder a refused command made, holding only its lock file: removed (left where something else came in)."""
    (folder / LOCK).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass


def empty_but_the_lock(folder: Path) -> None:
    """Remove what a refused command wrote in a folder it had found new or empty, keeping the lock it holds."""
    for entry in folder.iterdir():
        if entry.name != LOCK:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def unlock_directory(fd: int, wrote: bool) -> None:
    """Give the lock of `lock_directory` back. A command that wrote nothing in the folder (refused, or nothing
    to do) puts the lock file back as it found it: it leaves the folder byte for byte as it was."""
    before = _BEFORE.pop(fd, None)
    if not wrote and before is not None:
        data, stat = before
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.utime(fd, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # its times too
        except (OSError, NotImplementedError):  # a system without utime on a descriptor keeps the new times
            pass
    os.close(fd)  # the lock file stays; its lock goes with the descriptor


def _read_all(fd: int) -> bytes:
    try:
        return os.pread(fd, 4096, 0)
    except OSError:
        return b""


def _try_lock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, as before
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode().strip() or "unknown"
    except (OSError, UnicodeDecodeError):
        return "unknown"
