"""What a task tells the lifecycle: how it reads its data, makes its vocabulary (or tokenizer) and builds its
model (`TaskSetup`), and the parts every task's setup shares (`SetupBase`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from transformer_cli.config import VocabConfig
from transformer_cli.core.errors import UserError
from transformer_cli.data.shards import Manifest, describe_file, read_manifest
from transformer_cli.vocab.spm import Vocab

if TYPE_CHECKING:  # this module is imported by `tcli preprocess`, which never loads torch
    from transformer_cli.checkpoint import Checkpoint
    from transformer_cli.runtime.device import Runtime


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
    built = manifest.data["vocab_settings"]["vocab"]
    # auto was resolved from the folder's own text (or its languages, which data_settings checks above)
    coverage = built.get("character_coverage") if vocab.character_coverage == "auto" else vocab.character_coverage
    wanted = vocab_settings("", vocab, 0, "", coverage)["vocab"]
    for key, value in wanted.items():
        if built.get(key) != value:
            raise UserError(
                f"vocab.{key} is {value!r} in the config but {manifest.folder} was tokenised with a "
                f"vocabulary of {key} {built.get(key)!r}; use the config it was made with, or "
                "preprocess again"
            )


def vocab_settings(kind: str, v: VocabConfig, seed: int, data: str, coverage: float | None) -> dict[str, Any]:
    """What a vocabulary was built from: its settings and data, or the hash of the user's own model.
    `coverage`: vocab.character_coverage resolved (auto is recorded as the number it stood for)."""
    settings = v.model_dump(mode="json")
    settings["character_coverage"] = coverage
    if not v.split_cjk:  # the settings of vocabularies made before the key existed
        del settings["split_cjk"]
    if v.model is not None:
        settings["model"] = describe_file(Path(v.model))["sha256"] if Path(v.model).is_file() else v.model
    return {"kind": kind, "vocab": settings, "seed": seed, "data": data}
