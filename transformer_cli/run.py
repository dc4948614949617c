"""The run lifecycle every task shares: the run directory and its lock, config.yaml, the vocabulary,
resume checks, and the end of a run. A task (translation, BERT, fine-tuning) only says what differs: how it
reads its data, makes its vocabulary (or tokenizer) and builds its model (`TaskSetup`).

The order is what makes the guarantees: lock the directory; read and check everything (the checkpoint
to resume, the config against it, the data, the memory the model needs); only then write (config.yaml,
the vocabulary, the logs); then train. A refused run changes nothing on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from transformer_cli import __version__
from transformer_cli.config import VocabConfig, dump_config
from transformer_cli.console import say
from transformer_cli.datasets import shards
from transformer_cli.datasets.shards import Manifest, describe_file, read_manifest
from transformer_cli.errors import UserError
from transformer_cli.files import RUN_MARKER, RUN_PARTS, check_not_a_run_part, remove_stale_temporaries, write_atomic
from transformer_cli.metrics_file import check_log
from transformer_cli.train.stop import saved_stop_reason
from transformer_cli.vocab import Vocab

if TYPE_CHECKING:  # this module is imported by `tcli preprocess`, which never loads torch
    from transformer_cli.checkpoint import Checkpoint
    from transformer_cli.runtime import Runtime

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
            _remove_made_folder(self.path)
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
            _empty_but_the_lock(self.path)
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


def _remove_made_folder(folder: Path) -> None:
    """A folder a refused command made, holding only its lock file: removed (left where something else came in)."""
    (folder / LOCK).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass


def _empty_but_the_lock(folder: Path) -> None:
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


# ----------------------------------------------------------------------------- resume checks


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_resume_config(stored: dict[str, Any], new: dict[str, Any], path: Path) -> None:
    """Refuse a resume whose config changes anything but SAFE_ON_RESUME, naming the key and both values."""
    old, now = flatten(stored), flatten(new)
    changed = [k for k in now if old.get(k, now[k]) != now[k] and k not in SAFE_ON_RESUME]
    if changed:
        key = changed[0]
        why = {"model": "the model", "vocab": "the vocabulary"}.get(
            key.split(".")[0], "what the saved data position and optimizer state mean"
        )
        more = f" (and {', '.join(changed[1:3])}{', ...' if len(changed) > 3 else ''})" if len(changed) > 1 else ""
        raise UserError(
            f"cannot resume {path} with {key} changed ({old[key]!r} -> {now[key]!r}){more}: it changes "
            f"{why}; keep the old value or use a new --out (keys that may change on resume: "
            "max_steps, max_epochs, max_minutes, eval_every, save_every, log_every, keep_last, average_last, "
            "patience, eval.*; see the README)"
        )


# ----------------------------------------------------------------------------- memory


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_training_memory(parameters: int, extra_elements: int, device: Any) -> None:
    """Refuse, before allocating, a model whose weights, gradients and AdamW moments (16 bytes a parameter)
    cannot fit in the device's memory."""
    need = 16 * parameters + 4 * extra_elements
    if device.type == "cuda":
        import torch

        have = torch.cuda.get_device_properties(device).total_memory
    else:
        have = physical_memory_bytes()
    if have is not None and need > have:
        raise UserError(
            f"the model has {parameters:,} parameters: training needs at least {need / 2**30:,.1f} GiB "
            f"for weights, gradients and optimizer state, more than the {have / 2**30:,.1f} GiB of "
            f"{device.type}; make model.d_model, ffn_dim or the layer count smaller"
        )


# ----------------------------------------------------------------------------- the lifecycle


class TaskSetup(Protocol):
    """What a task tells the runner: its data, its vocabulary, its model.

    A "vocabulary" is what the run's vocab/ folder holds and what a resume takes from the checkpoint: any object
    with `model_bytes` (the file's content). Translation and BERT train sentencepiece models (`Vocab`); fine-tuning
    writes the starting model's own tokenizer. A task whose data are not token arrays (`has_shards` False, as
    fine-tuning's small labelled files, tokenised in memory) has no data/ folder: `make_task` gets `data` None and
    the preprocessing methods are not called."""

    kind: str  # "translation" | "bert" | "finetune"
    has_shards: bool  # the data are token arrays in the run's data/ folder (or data.preprocessed)

    def resuming(self, ckpt: Checkpoint) -> None: ...  # told the checkpoint a resume continues, before any check
    def read_data(self) -> None: ...  # check the data can be read (before anything is written)
    def data_fingerprint(self) -> str: ...  # a hash of the training files
    def valid_fingerprint(self) -> str: ...  # a hash of the validation files (best.pt compares scores on them)
    def valid_names(self) -> list[str]: ...  # their names
    def count_parameters(self) -> tuple[int, int]: ...  # (parameters, other elements) from the config
    def vocab_files(self) -> list[str]: ...  # names of the vocabulary's .model files, e.g. ["joint"]
    def vocab_paths(self, folder: Path) -> list[Path]: ...  # the vocabulary's files in `folder`
    def load_vocabs(self, folder: Path) -> list[Any]: ...  # the vocabulary read back from `folder`
    def vocab_settings(self) -> dict[str, Any]: ...  # what the vocabulary was built from
    def train_vocabs(self, quiet: bool) -> list[Any]: ...  # from a bounded sample of the text, or given
    def vocabs_from_checkpoint(self, ckpt: Checkpoint) -> list[Any]: ...
    def preprocessed(self) -> Manifest | None: ...  # the data.preprocessed folder (checked), if any
    def split_names(self) -> list[str]: ...  # the splits the task reads (a preprocessed folder must hold them)
    def data_settings(self) -> dict[str, Any]: ...  # what the token arrays depend on besides the vocabulary
    def sources(self) -> dict[str, Any]: ...  # sizes and hashes of the text files
    def write_shards(self, folder: Path, vocabs: list[Vocab], quiet: bool) -> dict[str, Any]: ...  # -> splits
    def make_task(self, vocabs: list[Any], data: Manifest | None, runtime: Runtime, quiet: bool) -> Any: ...  # -> Task
    def train_config(self, task: Any) -> Any: ...  # the trainer's config (the run's train section, resolved)


class SetupBase:
    """What both tasks' setups share: the folder named by data.preprocessed (read and checked once), and the
    text files' sizes and hashes (taken from read_data's read of them, when it made one)."""

    kind: str
    cfg: Any
    has_shards = True

    def __init__(self) -> None:
        self._manifest: Manifest | None = None
        self._sources: dict[str, Any] | None = None
        self._read: dict[Path, dict[str, Any]] = {}  # path -> {"size", "sha256"} of the files read_data read

    def resuming(self, ckpt: Checkpoint) -> None:
        pass

    def vocab_files(self) -> list[str]:
        raise NotImplementedError

    def vocab_paths(self, folder: Path) -> list[Path]:
        return [folder / f"{name}.model" for name in self.vocab_files()]

    def load_vocabs(self, folder: Path) -> list[Any]:
        return [Vocab.load(p) for p in self.vocab_paths(folder)]

    def train_config(self, task: Any) -> Any:
        return self.cfg.train

    def data_settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def source_files(self) -> list[Path]:
        raise NotImplementedError

    def preprocessed(self) -> Manifest | None:
        if self.cfg.data.preprocessed is not None and self._manifest is None:
            self._manifest = read_manifest(Path(self.cfg.data.preprocessed), self.kind)
            check_preprocessed(self._manifest, self.data_settings(), self.cfg.vocab)
            for name in self.split_names():  # before the run folder is written, not when the task reads them
                self._manifest.split(name)
        return self._manifest

    def valid_fingerprint(self) -> str:
        """The sha256 of the validation split's text files, from the preprocessed folder's manifest (its sources)
        or from read_data's read of them."""
        manifest = self.preprocessed()
        sources = (manifest.data.get("sources") or {}) if manifest is not None else self.sources()
        hashes = {name: (sources.get(name) or {}).get("sha256") for name in self.valid_names()}
        return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()

    def valid_names(self) -> list[str]:
        raise NotImplementedError

    def sources(self) -> dict[str, Any]:
        if self._sources is None:
            self._sources = {p.name: self._read.get(p) or describe_file(p) for p in self.source_files()}
        return self._sources


def run_training(
    setup: TaskSetup, cfg: Any, run_dir: Path, device: str = "auto", resume: bool = False, quiet: bool = False
) -> dict[str, Any]:
    """Train a run from its config, start to end, with every guarantee of the README's "What tcli
    guarantees"; returns the end event."""
    from transformer_cli.runtime import Runtime
    from transformer_cli.train.loop import Trainer, resume_requested

    runtime = Runtime.create(device, cfg.train.precision)
    quiet, resume = quiet or not runtime.is_main, resume_requested(resume)
    directory = RunDirectory(run_dir, setup.kind)
    try:
        if runtime.is_main:
            directory.acquire()
        ckpt = _checkpoint_to_resume(directory, resume, quiet)
        finished = None
        if ckpt is not None:
            setup.resuming(ckpt)
            check_resume_config(ckpt.state["config"], cfg.model_dump(mode="json"), ckpt.path)
            if ckpt.state.get("data_fingerprint") != setup.data_fingerprint():
                folder = getattr(cfg.data, "preprocessed", None) or cfg.data.dir  # where the hashed files are
                raise UserError(
                    f"the training data differ from those {ckpt.path} was trained on (the files under {folder}, "
                    "compared by sha256); resume with the same files or use a new --out"
                )
            if setup.preprocessed() is not None:
                _check_preprocessed_vocab(setup, setup.vocabs_from_checkpoint(ckpt))
            finished = saved_stop_reason(cfg.train, ckpt.state["train_state"])
            step = ckpt.state["train_state"]["step"]
            if finished and directory.finished_step() == step:
                say(quiet, f"{run_dir} finished at step {step} ({finished}); nothing to do")
                return {"event": "end", "step": step, "stop": finished, "already_finished": True}
            try:
                check_log(directory.path)
            except ValueError as e:
                raise UserError(f"{e}: remove or repair that line (one event per line), then resume") from None
        check_training_memory(*setup.count_parameters(), runtime.device)
        setup.read_data()
        valid_hash = setup.valid_fingerprint()  # (fine-tuning hashes its dev files for it: once)
        saved_valid = ckpt.state.get("valid_fingerprint") if ckpt is not None else None  # (None: saved before it)
        if saved_valid is not None and saved_valid != valid_hash:
            raise UserError(
                f"the validation data ({', '.join(setup.valid_names())}) differ from those {ckpt.path} was evaluated "
                "on (compared by sha256): best.pt and early stopping compare scores on them; resume with the same "
                "files or use a new --out"
            )
        data_folder = directory.path / "data"
        if runtime.is_main:
            vocabs = choose_vocab(directory.path, setup, ckpt, quiet)  # refusals come here, before any write
            if ckpt is None:  # a resume's vocabulary (the checkpoint's) was checked against data.preprocessed above
                _check_preprocessed_vocab(setup, vocabs)
            directory.start(cfg, fresh=ckpt is None)
        try:  # what the data or the model refuse once tokenised: a directory made for this run goes again
            if runtime.is_main:
                say(quiet, f"run directory {run_dir}; {runtime.describe()}")
                save_vocab(directory.path, setup, vocabs, ckpt)
                data = prepare_data(data_folder, setup, vocabs, quiet) if setup.has_shards else None
            runtime.barrier(patient=True)  # the other ranks wait while rank 0 trains the vocabulary and tokenises
            if not runtime.is_main:  # the other ranks map the same files: the page cache holds one copy
                vocabs = setup.load_vocabs(directory.path / "vocab")
                data = (setup.preprocessed() or read_manifest(data_folder, setup.kind)) if setup.has_shards else None
            task = setup.make_task(vocabs, data, runtime, quiet)
            trainer = Trainer(task, setup.train_config(task), run_dir, runtime, quiet)
            trainer.on_saved = directory.saved
            trainer.run_meta = {"valid_fingerprint": valid_hash}
            if ckpt is not None:
                try:
                    trainer.restore(ckpt)
                except UserError:
                    if runtime.is_main:
                        directory.undo_start()
                    raise
        except UserError:
            if runtime.is_main:
                directory.abandon()
            raise
        end = trainer.run(finished=finished)
        if runtime.is_main:
            directory.finish(end["step"])
        return end
    finally:
        directory.release()
        runtime.shutdown()


def _checkpoint_to_resume(directory: RunDirectory, resume: bool, quiet: bool) -> Checkpoint | None:
    last = directory.ckpt_dir / "last.pt"
    saved = directory.checkpoints()
    if not saved and directory.was_checkpointed():  # starting over would rewrite metrics.jsonl and tb/
        raise UserError(
            f"{directory.path}: its run.json says last.pt was written, but {directory.ckpt_dir} holds no checkpoint "
            "(moved or deleted?); put the checkpoints back to resume, or choose another --out"
        )
    if not resume:
        if saved:
            names = ", ".join(p.name for p in saved[:3])
            raise UserError(
                f"{directory.path} already holds a run ({names}); resume it with --resume auto or choose another --out"
            )
        return None
    if last.is_file():
        from transformer_cli.checkpoint import check_resumable, read_checkpoint

        ckpt = read_checkpoint(last, kind=directory.kind)
        check_resumable(ckpt)
        ckpt.check()  # names, shapes, dtypes and finite weights, before anything in the folder changes
        return ckpt
    if saved and directory.first_save_interrupted():
        say(quiet, f"the first checkpoint of {directory.path} was interrupted: starting the run over")
        for path in saved:
            path.unlink()
        return None
    if saved:
        raise UserError(
            f"{directory.path} holds {saved[0].name} but no last.pt, so the run cannot be resumed; "
            "choose another --out (or start from a copy of it with tcli average / export)"
        )
    say(quiet, f"no {last} yet: starting a new run")
    return None


def prepare_vocab(root: Path, setup: TaskSetup, ckpt: Checkpoint | None, quiet: bool) -> list[Vocab]:
    """`choose_vocab`, then `save_vocab`."""
    vocabs = choose_vocab(root, setup, ckpt, quiet)
    save_vocab(root, setup, vocabs, ckpt)
    return vocabs


def choose_vocab(root: Path, setup: TaskSetup, ckpt: Checkpoint | None, quiet: bool) -> list[Vocab]:
    """The vocabulary of a run (or of a preprocessed folder) in `root`/vocab, writing nothing: the checkpoint's
    when resuming; else the one in `root`/vocab if it was built from the same settings and data (vocab/vocab.json
    says so); else a new one. Every refusal about the vocabulary is raised here, before the run writes."""
    folder = root / "vocab"
    paths = setup.vocab_paths(folder)
    if ckpt is not None:
        return setup.vocabs_from_checkpoint(ckpt)
    # A model file copied in by hand (another vocab.size's) is not the one vocab.json describes: trained anew.
    # (A vocab.json without the files' hashes, from before they were recorded: trained anew too, to the same model.)
    if all(p.is_file() for p in paths) and _read_json(folder / "vocab.json") == _vocab_record(setup, paths):
        return setup.load_vocabs(folder)
    return setup.train_vocabs(quiet)


def _vocab_record(setup: TaskSetup, paths: list[Path], models: list[bytes] | None = None) -> dict[str, Any]:
    """vocab/vocab.json: the settings a vocabulary was built from and the sha256 of each of its files (`models`, else
    the files at `paths`)."""
    models = models if models is not None else [p.read_bytes() for p in paths]
    return {
        **setup.vocab_settings(),
        "files_sha256": {p.name: shards.sha256_bytes(m) for p, m in zip(paths, models)},
    }


def save_vocab(root: Path, setup: TaskSetup, vocabs: list[Any], ckpt: Checkpoint | None) -> None:
    """`root`/vocab: the model files (rewritten only when they differ) and vocab.json, the settings they were
    built from."""
    folder = root / "vocab"
    meta_path = folder / "vocab.json"
    for vocab, path in zip(vocabs, setup.vocab_paths(folder)):
        if not path.is_file() or path.read_bytes() != vocab.model_bytes:
            write_atomic(vocab.model_bytes, path)
    if ckpt is None or not meta_path.is_file():
        record = _vocab_record(setup, setup.vocab_paths(folder), [v.model_bytes for v in vocabs])
        write_atomic((json.dumps(record, indent=1, sort_keys=True) + "\n").encode(), meta_path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


# ----------------------------------------------------------------------------- preprocessed data


def vocab_settings(kind: str, v: VocabConfig, seed: int, data: str) -> dict[str, Any]:
    """What a vocabulary was built from: its settings and data, or the hash of the user's own model."""
    settings = v.model_dump(mode="json")
    if v.model is not None:
        settings["model"] = describe_file(Path(v.model))["sha256"] if Path(v.model).is_file() else v.model
    return {"kind": kind, "vocab": settings, "seed": seed, "data": data}


def check_preprocessed(manifest: Manifest, settings: dict[str, Any], vocab: VocabConfig) -> None:
    """data.preprocessed must hold what the config describes: the same splits and filters, the same
    vocabulary settings; a difference names the key."""
    found = manifest.data["settings"]
    for key, value in settings.items():
        if found.get(key) != value:
            raise UserError(
                f"data.{key} is {value!r} in the config but {manifest.folder} was preprocessed with "
                f"{found.get(key)!r}; use the config it was made with, or preprocess again"
            )
    wanted = vocab_settings("", vocab, 0, "")["vocab"]
    built = manifest.data["vocab_settings"]["vocab"]
    for key, value in wanted.items():
        if built.get(key) != value:
            raise UserError(
                f"vocab.{key} is {value!r} in the config but {manifest.folder} was tokenised with a "
                f"vocabulary of {key} {built.get(key)!r}; use the config it was made with, or "
                "preprocess again"
            )


def prepare_data(folder: Path, setup: TaskSetup, vocabs: list[Vocab], quiet: bool) -> Manifest:
    """The run's token arrays: the data.preprocessed folder (run_training has checked it against the run's
    vocabulary before writing anything); else the run's own `data/` folder, reused when its manifest matches the
    settings, the vocabulary and the text files (a resume tokenises nothing), and written otherwise."""
    given = setup.preprocessed()
    if given is not None:
        return given
    expected = _expected_manifest(setup, vocabs)
    found = _complete(folder, setup.kind)
    if found is not None and _differences(found.data, expected) == []:
        say(quiet, f"tokenised data: {folder} (up to date)")
        return found
    return write_preprocessed(folder, setup, vocabs, expected, quiet)


def _check_preprocessed_vocab(setup: TaskSetup, vocabs: list[Vocab]) -> None:
    given = setup.preprocessed()
    if given is not None and given.data["vocab_sha256"] != _vocab_hashes(setup, vocabs):
        raise UserError(
            f"{given.folder} was tokenised with another vocabulary than this run's; preprocess "
            "again (with the run's vocab.model) or start a new --out"
        )


def _vocab_hashes(setup: TaskSetup, vocabs: list[Vocab]) -> dict[str, str]:
    return {name: shards.sha256_bytes(v.model_bytes) for name, v in zip(setup.vocab_files(), vocabs)}


def _expected_manifest(setup: TaskSetup, vocabs: list[Vocab]) -> dict[str, Any]:
    return {
        "kind": setup.kind,
        "settings": setup.data_settings(),
        "vocab_sha256": _vocab_hashes(setup, vocabs),
        "sources": setup.sources(),
    }


def _complete(folder: Path, kind: str) -> Manifest | None:
    try:
        return read_manifest(folder, kind)
    except UserError:
        return None


def _differences(found: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    return [key for key, value in expected.items() if found.get(key) != value]


def write_preprocessed(
    folder: Path, setup: TaskSetup, vocabs: list[Vocab], expected: dict[str, Any], quiet: bool
) -> Manifest:
    """Tokenise the text into `folder`: the old manifest goes first, the new one last (atomically)."""
    say(quiet, f"tokenising the data into {folder}")
    shards.begin(folder)
    for name, vocab in zip(setup.vocab_files(), vocabs):
        write_atomic(vocab.model_bytes, folder / "vocab" / f"{name}.model")
    splits = setup.write_shards(folder, vocabs, quiet)
    shards.finish(
        folder,
        {
            **expected,
            "tcli": __version__,
            "dtype": shards.token_dtype(max(len(v) for v in vocabs)).str,
            "vocab_files": setup.vocab_files(),
            "vocab_settings": setup.vocab_settings(),
            "data_fingerprint": setup.data_fingerprint(),
            "splits": splits,
        },
    )
    for name, split in splits.items():
        dropped = ", ".join(f"{n:,} {reason.replace('_', ' ')}" for reason, n in split.get("dropped", {}).items() if n)
        say(
            quiet,
            f"{name}: "
            + ", ".join(f"{n:,} {what}" for what, n in split["counts"].items())
            + (f" (dropped: {dropped})" if dropped else ""),
        )
    return read_manifest(folder, setup.kind)


PREPROCESSED_ENTRY = re.compile(
    r"^(manifest\.json|vocab|\.lock|.+\.(bin|idx|ref|docs)|bert_sample_map_\w+\.npy|"
    r"\..+\.tmp\d+)$"
)  # the sample map: BERT training caches it beside the arrays


def _manifest_kind(folder: Path) -> str | None:
    """The kind a folder's manifest.json names (complete or not); None without a readable one."""
    data = _read_json(folder / shards.MANIFEST)
    return str(data.get("kind")) if isinstance(data, dict) and data.get("kind") is not None else None


def _clear_preprocessing(folder: Path, vocab_files: list[str], keep_vocab: bool) -> None:
    """Before a folder is written again: the arrays, references and caches of the preprocessing it held go
    (none of them may sit beside the new ones), and so do the vocabularies that are not this task's. With
    `keep_vocab`, a vocabulary of this task stays, for prepare_vocab to reuse when its settings match."""
    shards.begin(folder)  # the manifest first: an interrupted clear never looks complete
    for entry in folder.iterdir():
        if entry.name in (LOCK, "vocab") or not PREPROCESSED_ENTRY.match(entry.name) or not entry.is_file():
            continue
        entry.unlink()
    vocab = folder / "vocab"
    if vocab.is_dir():
        for entry in vocab.iterdir():
            ours = entry.suffix == ".model" and entry.stem in vocab_files or entry.name == "vocab.json"
            if entry.is_file() and not (keep_vocab and ours):
                entry.unlink()


def run_preprocess(setup: TaskSetup, out: Path, force: bool = False, quiet: bool = False) -> Manifest:
    """`tcli preprocess`: the vocabulary and the token arrays of a config's data in `out`, for data.preprocessed.
    Up to date: nothing is done. Another preprocessing there is replaced only with --force."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory")
    check_not_a_run_part(out)
    foreign = sorted(p.name for p in out.iterdir() if not PREPROCESSED_ENTRY.match(p.name)) if out.is_dir() else []
    if foreign:
        raise UserError(
            f"--out {out} is not empty and is not a preprocessed-data folder (it holds "
            f"{', '.join(foreign[:3])}); choose a new or empty directory"
        )
    if setup.preprocessed() is not None:
        raise UserError(
            "the config sets data.preprocessed: tcli preprocess writes such a folder from the text "
            "files; remove the key"
        )
    setup.read_data()
    created = not out.exists()
    was_empty = created or not {p.name for p in out.iterdir()} - {LOCK}
    fd = lock_directory(out, "the folder", "command", "wait for it to end")
    wrote = False
    try:
        other = _manifest_kind(out)
        if other not in (None, setup.kind) and not force:
            raise UserError(
                f"{out} holds preprocessed {other} data; a {setup.kind} config would replace it: pass --force "
                "to replace it, or choose another --out"
            )
        found = _complete(out, setup.kind)
        if found is not None and not force:
            vocabs = [Vocab.load(p) for p in found.vocab_paths()]
            expected = {**_expected_manifest(setup, vocabs), "vocab_settings": setup.vocab_settings()}
            changed = _differences(found.data, expected)
            lacking = [name for name in setup.split_names() if name not in found.data["splits"]]
            if not changed and not lacking:
                say(quiet, f"{out} is up to date; nothing to do")
                return found
            if changed:  # (the same settings without a split the config names: damaged, and redone)
                key = changed[0]
                if isinstance(expected[key], dict):  # name the setting or file inside
                    inner = [
                        k
                        for k in {**expected[key], **found.data.get(key, {})}
                        if expected[key].get(k) != found.data.get(key, {}).get(k)
                    ]
                    key = f"{key} ({', '.join(map(str, inner[:3]))})" if inner else key
                raise UserError(
                    f"{out} holds preprocessed data with other {key}; use --force to replace it, or another --out"
                )
        wrote = True
        remove_stale_temporaries(out)
        _clear_preprocessing(out, setup.vocab_files(), keep_vocab=other in (None, setup.kind))
        vocabs = prepare_vocab(out, setup, None, quiet)
        return write_preprocessed(out, setup, vocabs, _expected_manifest(setup, vocabs), quiet)
    except UserError:  # refused (a vocab.size the text cannot fill, no pairs left): a folder new or empty stays so
        if was_empty:
            _empty_but_the_lock(out)
            wrote = False
        raise
    finally:
        unlock_directory(fd, wrote)
        if created and not wrote:
            _remove_made_folder(out)
