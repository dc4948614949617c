"""The run lifecycle every task shares: the resume checks, the memory check, the vocabulary and the end of
a run. A task (translation, BERT, fine-tuning) only says what differs (`train.task_setup.TaskSetup`).

The order is what makes the guarantees: lock the directory; read and check everything (the checkpoint
to resume, the config against it, the data, the memory the model needs); only then write (config.yaml,
the vocabulary, the logs); then train. A refused run changes nothing on disk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_cli.core.console import say
from transformer_cli.core.errors import UserError
from transformer_cli.core.metrics_log import check_log
from transformer_cli.data.shards import read_manifest
from transformer_cli.train.preprocess import check_preprocessed_vocab, choose_vocab, prepare_data, save_vocab
from transformer_cli.train.run_dir import SAFE_ON_RESUME, RunDirectory
from transformer_cli.train.stop import saved_stop_reason
from transformer_cli.train.task_setup import TaskSetup

if TYPE_CHECKING:  # this module is imported by `tcli preprocess`, which never loads torch
    from transformer_cli.checkpoint import Checkpoint


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
    if now.get("vocab.character_coverage") == "auto" and isinstance(old.get("vocab.character_coverage"), (int, float)):
        # A run from before `auto` stored the old default 1.0, or a number auto stands for: a resume takes the
        # checkpoint's vocabulary, made from the same training text (the resume checks its hash).
        old["vocab.character_coverage"] = "auto"
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


def run_training(
    setup: TaskSetup, cfg: Any, run_dir: Path, device: str = "auto", resume: bool = False, quiet: bool = False
) -> dict[str, Any]:
    """Train a run from its config, start to end, with every guarantee of the README's "What tcli
    guarantees"; returns the end event."""
    from transformer_cli.runtime.device import Runtime
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
                check_preprocessed_vocab(setup, setup.vocabs_from_checkpoint(ckpt))
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
                check_preprocessed_vocab(setup, vocabs)
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
