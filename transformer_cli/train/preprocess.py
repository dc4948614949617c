"""Preprocessed data: the shards and manifest a run trains from, checked against the vocabulary and settings
that made them, and `tcli preprocess`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_cli import __version__
from transformer_cli.core.console import say
from transformer_cli.core.errors import UserError
from transformer_cli.core.files import check_not_a_run_part, remove_stale_temporaries, write_atomic
from transformer_cli.data import shards
from transformer_cli.data.shards import Manifest, read_manifest
from transformer_cli.train.run_dir import LOCK, empty_but_the_lock, lock_directory, remove_made_folder, unlock_directory
from transformer_cli.train.task_setup import TaskSetup
from transformer_cli.vocab.spm import Vocab

if TYPE_CHECKING:  # this module is imported by `tcli preprocess`, which never loads torch
    from transformer_cli.checkpoint import Checkpoint


# ----------------------------------------------------------------------------- preprocessed data


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


def check_preprocessed_vocab(setup: TaskSetup, vocabs: list[Vocab]) -> None:
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
            empty_but_the_lock(out)
            wrote = False
        raise
    finally:
        unlock_directory(fd, wrote)
        if created and not wrote:
            remove_made_folder(out)


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
