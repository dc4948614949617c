"""The run lifecycle's guarantees: one run per directory, nothing overwritten, refused runs change nothing,
finished runs stay finished, resume refuses changes that would silently alter a run, full disks."""

from __future__ import annotations

import hashlib
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from transformer_cli.core.metrics_log import read_metrics

from ..conftest import ROOT, TEST_PRECISION, one_line_error, run_tcli, toy_subset

CONFIG = """
data: {{dir: {data}, src_lang: src, tgt_lang: tgt, train: train, valid: val, test: test, max_len: 60}}
vocab: {{size: 120}}
model: {{d_model: 32, heads: 4, ffn_dim: 64, enc_layers: 1, dec_layers: 1, dropout: 0.1}}
train: {{max_steps: {steps}, max_tokens: 400, lr: 0.003, warmup_steps: 2, precision: {precision},
        eval_every: 4, log_every: 2, seed: 3, keep_last: 2}}
eval: {{beam: 1, max_len_b: 5, bleu: false}}
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return toy_subset(tmp_path_factory.mktemp("integrity_data"), train=200, valid=10)


def config(tmp_path: Path, data: Path, steps: int = 4, name: str = "tiny.yaml") -> Path:
    path = tmp_path / name
    path.write_text(CONFIG.format(data=data, steps=steps, precision=TEST_PRECISION))
    return path


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under folder (names and content hashes) but the lock file, which names its last holder:
    what "nothing changed" means."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def last_holder(run: Path) -> tuple[bytes, int]:
    """The lock file as an earlier process left it (another PID than this test process's), and its time."""
    lock = run / ".lock"
    lock.write_bytes(b"99999\n")
    return lock.read_bytes(), lock.stat().st_mtime_ns


def train(cfg: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_tcli("train", "--config", str(cfg), "--out", str(out), "--quiet", *extra)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("finished")
    cfg = config(root, data)
    result = train(cfg, root / "run")
    assert result.returncode == 0, result.stderr
    return cfg, root / "run"


# ----------------------------------------------------------------------------- one run per directory


def test_second_run_on_a_locked_directory_exits_2_naming_the_holder(tmp_path, data):
    cfg = config(tmp_path, data, steps=100000)
    run = tmp_path / "run"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "transformer_cli",
            "train",
            "--config",
            str(cfg),
            "--out",
            str(run),
            "--quiet",
            "--set",
            "train.eval_every=100000",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (run / "metrics.jsonl").exists():
            time.sleep(0.2)
        before = (run / "config.yaml").read_bytes()
        second = train(cfg, run, "--resume", "auto")
        one_line_error(second, str(run), f"PID {first.pid}", "in use")
        other = train(config(tmp_path, data, steps=3, name="other.yaml"), run)
        one_line_error(other, f"PID {first.pid}")
        assert (run / "config.yaml").read_bytes() == before
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM
    again = train(cfg, run, "--resume", "auto", "--set", "train.max_steps=1")  # the lock died with its process
    assert again.returncode == 0, again.stderr


def test_new_run_never_overwrites_checkpoints_or_user_files(tmp_path, finished_run, data):
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "checkpoints" / "last.pt").unlink()
    before = snapshot(copy)
    one_line_error(train(cfg, copy), "already holds a run", "best.pt")  # best.pt without last.pt
    one_line_error(train(cfg, copy, "--resume", "auto"), "no last.pt")
    assert snapshot(copy) == before
    # no checkpoint left at all (checkpoints/ emptied or deleted): starting over would rewrite metrics.jsonl and tb/
    for path in (copy / "checkpoints").iterdir():
        path.unlink()
    before = snapshot(copy)
    for args in (["--resume", "auto"], []):
        one_line_error(train(cfg, copy, *args), "run.json says last.pt was written", "holds no checkpoint")
    (copy / "checkpoints").rmdir()
    one_line_error(train(cfg, copy, "--resume", "auto"), "holds no checkpoint")
    assert snapshot(copy) == before

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("my own notes\n")
    one_line_error(train(cfg, mine), "not a tcli run directory", "config.yaml")
    assert (mine / "config.yaml").read_text() == "my own notes\n" and len(list(mine.iterdir())) == 1


def test_refused_resume_changes_nothing(tmp_path, finished_run):
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    before, holder = snapshot(copy), last_holder(copy)
    one_line_error(train(cfg, copy, "--resume", "auto", "--set", "model.ffn_dim=48"), "model.ffn_dim")
    bert = tmp_path / "bert.yaml"
    bert.write_text("train: {max_steps: 1}\n")
    one_line_error(
        run_tcli("pretrain-bert", "--config", str(bert), "--out", str(copy), "--resume", "auto"),
        "holds a translation run",
    )
    one_line_error(run_tcli("pretrain-bert", "--config", str(bert), "--out", str(copy)), "holds a translation run")
    assert snapshot(copy) == before
    assert ((copy / ".lock").read_bytes(), (copy / ".lock").stat().st_mtime_ns) == holder  # the lock file too


@pytest.mark.parametrize("resume", [False, True])
def test_a_folder_holding_only_its_lock_starts_over(tmp_path, finished_run, resume):
    """A run SIGKILLed while training its vocabulary leaves only .lock: it was refused as "not a tcli run directory"
    forever; it is the run's own, and the run starts (or is resumed from nothing) cleanly."""
    cfg, _ = finished_run
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text("12345 2026-12-07T00:00:00\n")
    result = train(cfg, out, "--set", "train.max_steps=2", *(["--resume", "auto"] if resume else []))
    assert result.returncode == 0, result.stderr
    assert (out / "checkpoints" / "last.pt").is_file()


def test_a_run_whose_best_pt_was_removed_says_its_test_split_is_not_scored(tmp_path, finished_run):
    """best.pt deleted by hand, then the run continued: no later evaluation beat the saved best, so no best.pt was
    written again and the end had no test scores, in silence."""
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "checkpoints" / "best.pt").unlink()
    result = train(cfg, copy, "--resume", "auto", "--set", "train.max_steps=5")
    assert result.returncode == 0, result.stderr
    tests = [e for e in read_metrics(copy) if e["event"] == "test" and e["step"] == 5]
    assert tests or "best.pt is missing, so the test split is not scored" in result.stderr, result.stderr


def _damage(state: dict, how: str) -> None:
    weights = state["model"]
    name = next(k for k in weights if k.endswith("qkv_proj.weight"))
    if how == "missing":
        del weights[name]
    elif how == "shape":
        weights[name] = weights[name][:-1]
    elif how == "int":
        weights[name] = weights[name].long()  # loaded as its truncated values: zeros
    elif how == "nan":
        weights[name][0, 0] = float("nan")
    elif how == "valid_fingerprint":
        state["valid_fingerprint"] = ["not", "a", "hash"]
    elif how == "moments":
        first = next(iter(state["optimizer"]["state"].values()))
        first["exp_avg"] = torch.zeros(3)
    elif how == "no_moment":
        next(iter(state["optimizer"]["state"].values())).pop("exp_avg_sq")
    elif how == "nan_moment":
        next(iter(state["optimizer"]["state"].values()))["exp_avg_sq"].fill_(float("nan"))
    elif how == "nan_lr":
        state["optimizer"]["param_groups"][0]["lr"] = float("nan")
    elif how == "rng":
        state["rng"]["python"] = "x"
    elif how == "scheduler":
        state["scheduler"] = {}
    elif how in ("schedule_step", "schedule_behind", "far_step"):  # the schedule failed at the first update
        key, value = {"schedule_step": ("last_epoch", "x"), "schedule_behind": ("last_epoch", -100)}.get(how, (0, 0))
        if how == "far_step":
            state["train_state"]["step"] = 10**18  # ended the run at once, at step 10**18
        else:
            state["scheduler"][key] = value
    elif how == "base_lrs":
        state["scheduler"]["base_lrs"][0] = math.nan
    elif how == "other_base_lrs":
        state["scheduler"]["base_lrs"] = [0.5] * len(state["scheduler"]["base_lrs"])
    elif how in ("betas", "eps"):  # betas (0.9,) failed at the first update, after the logs were opened
        state["optimizer"]["param_groups"][0][how] = {"betas": (0.9,), "eps": -1.0}[how]
    elif how == "negative_moment":
        next(iter(state["optimizer"]["state"].values()))["exp_avg_sq"].view(-1)[0] = -1.0
    elif how == "ids":  # the saved moments attached to no parameter: AdamW started afresh
        for group in state["optimizer"]["param_groups"]:
            group["params"] = [i + 1000 for i in group["params"]]
    elif how == "adam_step":
        next(iter(state["optimizer"]["state"].values()))["step"] = torch.tensor(1e9)
    elif how == "sparse":
        weights[name] = weights[name].to_sparse()
    elif how.startswith("interval_"):  # the sums of a logging interval cut by the save
        interval, key = state["train_state"]["interval"], how.removeprefix("interval_")
        if key == "type":
            state["train_state"]["interval"] = [1, 2]
        elif key == "sums":
            interval["sums"] = {"loss": [math.inf, 3]}
        else:
            interval[key] = {"steps": 99, "tokens": -1, "seconds": "1.5", "grad_norm": math.nan}[key]
    elif how in ("best", "step", "batch_in_epoch", "train_seconds"):
        state["train_state"][how] = {"best": "abc", "step": -3, "batch_in_epoch": -5, "train_seconds": math.nan}[how]


@pytest.mark.parametrize(
    "how, fragment",
    [
        ("missing", "the weights lack"),
        ("shape", "has shape"),
        ("int", "is int64, not floating-point"),
        ("nan", "NaN or infinite"),
        ("moments", "optimizer's exp_avg of parameter"),
        ("no_moment", "lacks exp_avg_sq"),
        ("nan_moment", "exp_avg_sq of parameter 0 holds NaN"),
        ("nan_lr", "lr of parameter group 0 is nan"),
        ("rng", "training state does not load"),
        ("scheduler", "training state does not load"),
        ("schedule_step", "the schedule is at step 'x'"),
        ("schedule_behind", "the schedule is at step -100"),
        ("far_step", "the train state at 1000000000000000000"),
        ("base_lrs", "the schedule's base_lrs is [nan"),
        ("other_base_lrs", "the schedule's base_lrs is [0.5, 0.5], where the config gives"),
        ("betas", "betas of parameter group 0 is (0.9,), where the config gives"),
        ("eps", "eps of parameter group 0 is -1.0, where the config gives"),
        ("negative_moment", "exp_avg_sq of parameter 0 holds negative values"),
        ("ids", "names parameter 0, which no parameter group holds"),
        ("adam_step", "step of parameter 0 is 1000000000.0"),
        ("sparse", "is a sparse_coo tensor"),
        ("best", "train_state.best"),
        ("step", "train_state.step is -3"),
        ("batch_in_epoch", "train_state.batch_in_epoch is -5"),
        ("train_seconds", "train_state.train_seconds is nan"),
        ("interval_type", "train_state.interval (the updates since the last train event) is a list"),
        ("interval_sums", "holds sums['loss'] = [inf, 3]"),
        ("interval_steps", "counts 99 updates, more than the run's"),
        ("interval_tokens", "holds tokens = -1, where a count"),
        ("interval_seconds", "holds seconds = '1.5', where a time in seconds"),
        ("interval_grad_norm", "holds grad_norm = nan"),
        ("valid_fingerprint", "valid_fingerprint (a hash)"),
    ],
)
def test_a_damaged_last_pt_is_refused_on_resume(tmp_path, finished_run, how, fragment):
    """A last.pt whose weights, optimizer, schedule, RNG or train state are damaged: one line, not a traceback from
    load_state_dict (or from the first update or evaluation), not training on zeroed or NaN weights, and the folder
    as it was, its lock file included (a state found bad only once the trainer takes it puts back run.json and
    config.yaml, which had said "running" and the new max_steps)."""
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    last = copy / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=True)
    _damage(state, how)
    torch.save(state, last)
    before = snapshot(copy)
    holder = ((copy / ".lock").read_bytes(), (copy / ".lock").stat().st_mtime_ns)
    one_line_error(train(cfg, copy, "--resume", "auto", "--set", "train.max_steps=6"), fragment)
    assert snapshot(copy) == before
    assert ((copy / ".lock").read_bytes(), (copy / ".lock").stat().st_mtime_ns) == holder


@pytest.mark.parametrize("line", [b"[1]\n", b"\xff\xfe\n", b"[" * 100_000 + b"]" * 100_000 + b"\n", b"{oops\n"])
def test_a_damaged_metrics_line_is_refused_on_resume(tmp_path, finished_run, line):
    """A whole line of metrics.jsonl that is no event (not tcli's writing: a kill cuts only the last line short,
    which the resume drops) was a traceback after run.json said "running", or was dropped in silence."""
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    log = copy / "metrics.jsonl"
    events = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(events[:2]) + line + b"".join(events[2:]))
    before = snapshot(copy)
    one_line_error(train(cfg, copy, "--resume", "auto", "--set", "train.max_steps=6"), "metrics.jsonl line 3 is not")
    assert snapshot(copy) == before


@pytest.mark.parametrize(
    "key, value",
    [
        ("data.max_len", 50),
        ("train.max_tokens", 300),
        ("train.accum_steps", 2),
        ("train.seed", 4),
        ("train.pad_to_multiple", 4),
        ("train.lr", 0.001),
        ("vocab.size", 100),
        ("data.src_lang", "tgt"),
    ],
)
def test_resume_refuses_keys_that_change_the_run(tmp_path, finished_run, key, value):
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    before = snapshot(copy)
    one_line_error(
        train(cfg, copy, "--resume", "auto", "--set", f"{key}={value}", "--set", "train.max_steps=6"), key, "new --out"
    )
    assert snapshot(copy) == before


def test_resume_allows_safe_keys_and_continues(tmp_path, finished_run):
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    more = train(
        cfg,
        copy,
        "--resume",
        "auto",
        "--set",
        "train.max_steps=6",
        "--set",
        "train.eval_every=3",
        "--set",
        "train.log_every=1",
        "--set",
        "train.patience=5",
        "--set",
        "eval.beam=2",
    )
    assert more.returncode == 0, more.stderr
    log = read_metrics(copy)
    assert [e["step"] for e in log if e["event"] == "end"] == [6]
    assert [e["step"] for e in log if e["event"] == "train"] == [2, 4, 5, 6]


# ----------------------------------------------------------------------------- finished runs


def test_resuming_a_finished_run_changes_nothing(tmp_path, finished_run):
    cfg, run = finished_run
    before, holder = snapshot(run), last_holder(run)
    again = run_tcli("train", "--config", str(cfg), "--out", str(run), "--resume", "auto")
    assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr
    assert snapshot(run) == before
    assert ((run / ".lock").read_bytes(), (run / ".lock").stat().st_mtime_ns) == holder  # the lock file too


def test_max_epochs_run_does_not_train_an_extra_epoch(tmp_path, data):
    cfg = config(tmp_path, data)
    run = tmp_path / "run"
    first = train(cfg, run, "--set", "train.max_steps=null", "--set", "train.max_epochs=1")
    assert first.returncode == 0, first.stderr
    step = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["train_state"]["step"]
    before = snapshot(run)
    again = run_tcli(
        "train",
        "--config",
        str(cfg),
        "--out",
        str(run),
        "--resume",
        "auto",
        "--set",
        "train.max_steps=null",
        "--set",
        "train.max_epochs=1",
    )
    assert again.returncode == 0 and f"finished at step {step}" in again.stderr
    assert snapshot(run) == before


# ----------------------------------------------------------------------------- vocabulary and logs


def test_vocabulary_is_rebuilt_when_its_settings_change_before_a_checkpoint(tmp_path, data):
    from ..conftest import run_killed

    cfg = config(tmp_path, data, steps=8)
    run = tmp_path / "run"
    crash = run_killed(1, "step", "train", "--config", str(cfg), "--out", str(run), "--quiet")
    assert crash.returncode == -signal.SIGKILL
    first = (run / "vocab" / "joint.model").read_bytes()
    restarted = train(cfg, run, "--resume", "auto", "--set", "vocab.size=90", "--set", "train.max_steps=1")
    assert restarted.returncode == 0, restarted.stderr
    from transformer_cli.vocab.spm import Vocab

    vocab = Vocab.load(run / "vocab" / "joint.model")
    assert vocab.model_bytes != first and len(vocab) == 90
    assert "size: 90" in (run / "config.yaml").read_text()
    stored = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["vocab"]["joint"]
    assert stored == vocab.model_bytes


def test_the_metrics_reader_names_a_damaged_line_or_skips_it(tmp_path):
    lines = ['{"event": "train", "step": 2}', '{"event": "train", "st', "[1]", '{"event": "end"}']
    (tmp_path / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    with pytest.raises(ValueError, match="line 2 is not a JSON object"):
        read_metrics(tmp_path)
    assert [e["event"] for e in read_metrics(tmp_path, skip_damaged=True)] == ["train", "end"]
    assert read_metrics(tmp_path, "end", skip_damaged=True) == [{"event": "end"}]


def test_stale_temporary_files_are_removed_on_resume(tmp_path, finished_run):
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    stale = copy / "checkpoints" / ".last.pt.tmp99999"
    stale.write_bytes(b"x" * 1000)
    more = train(cfg, copy, "--resume", "auto", "--set", "train.max_steps=5")
    assert more.returncode == 0, more.stderr
    assert not stale.exists()


# ----------------------------------------------------------------------------- bad numbers and divergence


def test_a_diverging_run_stops_with_one_line_and_no_nan_best(tmp_path, data):
    cfg = config(tmp_path, data, steps=30)
    run = tmp_path / "run"
    result = train(cfg, run, "--set", "train.weight_decay=1e30", "--set", "train.warmup_steps=0")
    one_line_error(result, "diverged")
    for ckpt in run.glob("checkpoints/*.pt"):
        weights = torch.load(ckpt, weights_only=True)["model"]
        assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point()), ckpt


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.weight_decay=.inf", "train.weight_decay"),
        ("train.adam_eps=.inf", "train.adam_eps"),
        ("train.lr=.nan", "train.lr"),
        ("model.ffn_dim=1e12", "model.ffn_dim"),
        ("model.max_positions=1e12", "model.max_positions"),
        ("train.pad_to_multiple=1000", "pad_to_multiple"),
        ("train.seed=1e30", "train.seed"),
        ("eval.max_len_a=.inf", "eval.max_len_a"),
        ("eval.beam=100000", "eval.beam"),
    ],
)
def test_values_that_make_no_sense_are_one_line_errors(tmp_path, data, override, fragment):
    cfg = config(tmp_path, data)
    one_line_error(train(cfg, tmp_path / "run", "--set", override), fragment)
    assert not (tmp_path / "run").exists()


def test_a_model_too_large_for_memory_is_refused_before_allocating(tmp_path, data):
    cfg = config(tmp_path, data)
    result = train(
        cfg,
        tmp_path / "run",
        "--set",
        "model.d_model=65536",
        "--set",
        "model.heads=1",
        "--set",
        "model.ffn_dim=1048576",
        "--set",
        "model.enc_layers=100",
    )
    one_line_error(result, "parameters", "GiB")


# ----------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MB tmpfs (root only; skipped where mounting is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.decode().strip()[:80]}); needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(folder: Path, leave: int) -> Path:
    """Fill the file system of `folder` up to `leave` free bytes."""
    filler = folder / "filler"
    free = shutil.disk_usage(folder).free
    filler.write_bytes(b"\0" * max(free - leave, 0))
    return filler


def test_full_disk_mid_run_keeps_last_checkpoint_and_resumes_once_freed(tmp_path, data, small_disk):
    cfg = config(tmp_path, data, steps=12)
    run = small_disk / "run"
    first = train(cfg, run, "--set", "train.max_steps=2", "--set", "train.eval_every=2")
    assert first.returncode == 0, first.stderr
    size = (run / "checkpoints" / "last.pt").stat().st_size
    filler = fill(small_disk, size // 2)  # room for half a checkpoint
    before = (run / "checkpoints" / "last.pt").read_bytes()
    full = train(cfg, run, "--resume", "auto", "--set", "train.eval_every=2")
    one_line_error(full, "no space left")
    assert (run / "checkpoints" / "last.pt").read_bytes() == before
    assert not [p for p in run.rglob("*") if ".tmp" in p.name]
    filler.unlink()
    resumed = train(cfg, run, "--resume", "auto", "--set", "train.eval_every=2")
    assert resumed.returncode == 0, resumed.stderr
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["train_state"]["step"] == 12


def test_starting_on_a_full_disk_is_one_line_and_leaves_no_empty_files(tmp_path, data, small_disk):
    cfg = config(tmp_path, data)
    fill(small_disk, 0)
    run = small_disk / "run"
    one_line_error(train(cfg, run), "no space left")
    assert not any(p.is_file() and p.stat().st_size == 0 and p.name != ".lock" for p in run.rglob("*"))


# ----------------------------------------------------------------------------- data and translate edges


def test_cr_only_files_and_tiny_corpora_train(tmp_path):
    folder = toy_subset(tmp_path / "cr", train=40, valid=5, newline="\r")
    cfg = config(tmp_path, folder, steps=2)
    result = train(cfg, tmp_path / "run", "--set", "vocab.size=100")
    assert result.returncode == 0, result.stderr


def test_blank_validation_split_is_named(tmp_path, data):
    folder = tmp_path / "blank"
    shutil.copytree(data, folder)
    (folder / "val.src").write_text("\n\n\n")
    (folder / "val.tgt").write_text("\n\n\n")
    one_line_error(
        train(config(tmp_path, folder), tmp_path / "run"),
        f"{folder / 'val.src'} / {folder / 'val.tgt'}: no sentence pairs left",
        "empty side",
    )


def test_translate_warns_about_lines_longer_than_the_positions(tmp_path, finished_run):
    _, run = finished_run
    ckpt = run / "checkpoints" / "last.pt"
    long_line = " ".join(["the white dog"] * 800)
    out = run_tcli("translate", "--checkpoint", str(ckpt), "--beam", "1", "--quiet", input=f"a dog\n{long_line}\n")
    assert out.returncode == 0, out.stderr
    assert "line 2:" in out.stderr and "max_positions" in out.stderr and "line 1:" not in out.stderr
    assert len(out.stdout.splitlines()) == 2


def test_translate_checks_output_paths_before_decoding(tmp_path, finished_run):
    _, run = finished_run
    ckpt = str(run / "checkpoints" / "last.pt")
    missing = tmp_path / "no" / "such" / "dir"
    one_line_error(
        run_tcli("translate", "--checkpoint", ckpt, "--output", str(missing / "out.txt"), input="a\n"),
        "--output",
        "does not exist",
    )
    one_line_error(
        run_tcli("translate", "--checkpoint", ckpt, "--stats-json", str(missing / "s.json"), input="a\n"),
        "--stats-json",
    )
    one_line_error(
        run_tcli("translate", "--checkpoint", ckpt, "--output", str(tmp_path), input="a\n"), "is a directory"
    )
    # an output that names a file translate reads, or its other output, would destroy it
    source = tmp_path / "src.txt"
    source.write_text("a dog\n")
    saved = Path(ckpt).read_bytes()
    for args, named in (
        (["--output", ckpt], "--checkpoint"),
        (["--input", str(source), "--output", str(source)], "--input"),
        (["--input", str(source), "--reference", str(source), "--stats-json", str(source)], "--input"),
        (["--output", str(tmp_path / "o.txt"), "--stats-json", str(tmp_path / "o.txt")], "--output"),
    ):
        one_line_error(run_tcli("translate", "--checkpoint", ckpt, *args, input="a\n"), f"same file as {named}")
    assert Path(ckpt).read_bytes() == saved and source.read_text() == "a dog\n"


def test_options_that_would_be_ignored_are_refused(tmp_path):
    """An option that only shapes another option's output, given without it, is a mistake said in one line
    (checked before the checkpoint is read), not a silent no-op."""
    ckpt = str(tmp_path / "any.pt")
    for args, message in (
        (["translate", "--alignment-unit", "word"], "add --print-alignment"),
        (["translate", "--alignment-layer", "1"], "add --print-alignment"),
        (["translate", "--attention-max", "3"], "add --attention"),
        (["evaluate", "--input", "x.en", "--reference", "x.de", "--data-dir", "data"], "--data-dir"),
    ):
        one_line_error(run_tcli(args[0], "--checkpoint", ckpt, *args[1:], input="a\n"), message)


def test_yaml_traps_are_one_line_errors(tmp_path, data):
    dup = tmp_path / "dup.yaml"
    dup.write_text(CONFIG.format(data=data, steps=2, precision=TEST_PRECISION) + "train: {max_steps: 3}\n")
    one_line_error(train(dup, tmp_path / "r1"), "appears twice", "lines 5 and 8")
    laughs = tmp_path / "laughs.yaml"
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev, name = chr(ord("a") + i - 1), chr(ord("a") + i)
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    laughs.write_text("\n".join(levels) + "\n")
    start = time.perf_counter()
    result = train(laughs, tmp_path / "r2")
    one_line_error(result, "aliases")
    assert time.perf_counter() - start < 30 and len(result.stderr) < 1000


def test_language_codes_and_split_names_stay_strings(tmp_path):
    from transformer_cli.config import TranslationRunConfig, load_config

    path = tmp_path / "no.yaml"
    path.write_text("data: {src_lang: no, tgt_lang: on, test: 2016}\ntrain: {max_steps: 1, compile: false}\n")
    cfg = load_config(TranslationRunConfig, path)
    assert (cfg.data.src_lang, cfg.data.tgt_lang, cfg.data.test, cfg.train.compile) == ("no", "on", "2016", False)
    assert load_config(TranslationRunConfig, None, ["data.src_lang=no", "train.max_steps=1"]).data.src_lang == "no"


@pytest.mark.parametrize("value", ["no", "yes", "on", "off", "1", "0", "'true'", "y"])
@pytest.mark.parametrize("key", ["train.compile", "model.tie_output", "vocab.joint", "eval.bleu"])
def test_bool_keys_take_only_true_and_false(key, value):
    """YAML 1.1's yes/no/on/off (and numbers, and quoted text) are not booleans here, in a file or --set alike."""
    from transformer_cli.config import TranslationRunConfig, load_config
    from transformer_cli.core.errors import UserError

    separate = ["model.share_embeddings=false"]  # so that vocab.joint may be false
    with pytest.raises(UserError, match=rf"{key}: write true or false") as err:
        load_config(TranslationRunConfig, None, [f"{key}={value}", "train.max_steps=1"])
    assert "\n" not in str(err.value)
    for text, expected in (("true", True), ("false", False), ("True", True), ("FALSE", False)):
        cfg = load_config(TranslationRunConfig, None, [f"{key}={text}", "train.max_steps=1", *separate])
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) is expected


def test_an_empty_vocabulary_file_is_one_line_without_sentencepiece_logs(tmp_path, capfd):
    """sentencepiece reads no bytes as a model of no pieces and logs "Model is not initialized" from C++ at each
    lookup: eleven lines on stderr before the error of `--init-from-hf` with an empty spiece.model."""
    from transformer_cli.core.errors import UserError
    from transformer_cli.vocab.spm import Vocab, load_model_file

    empty = tmp_path / "spiece.model"
    empty.write_bytes(b"")
    for load in (Vocab.load, load_model_file):
        with pytest.raises(UserError, match="the file is empty, not a sentencepiece model"):
            load(empty)
    assert capfd.readouterr().err == ""


def test_a_run_refused_once_its_data_are_tokenised_leaves_its_folder_as_it_found_it(tmp_path, data):
    """`data.max_len: 1` is found to leave no pairs only when the data are tokenised, after run.json, config.yaml
    and vocab/ were written: a folder the run made goes again, and one it found empty is empty again (the
    second attempt, with a fixed config, trains)."""
    cfg = config(tmp_path, data)
    for out, existed in ((tmp_path / "new", False), (tmp_path / "empty", True)):
        if existed:
            out.mkdir()
        one_line_error(train(cfg, out, "--set", "data.max_len=1"), "no sentence pairs left", "data.max_len")
        assert (sorted(p.name for p in out.iterdir()) == [".lock"]) if existed else not out.exists()
    assert train(cfg, tmp_path / "new", "--set", "train.max_steps=1").returncode == 0
    many = tmp_path / "kept"  # a run folder with a checkpoint is not a folder the refused run made: kept
    shutil.copytree(tmp_path / "new", many)
    before = snapshot(many)
    one_line_error(train(cfg, many, "--resume", "auto", "--set", "data.max_len=1"), "data.max_len")
    assert snapshot(many) == before


def test_a_resume_refuses_changed_validation_text(tmp_path):
    """best.pt and early stopping compare validation scores across a resume: the validation text changed between
    the two (a line appended) would compare scores on two sets. Refused, as changed training text is; the
    test split may change. (A checkpoint saved before the hash was kept resumes as before.)"""
    data = toy_subset(tmp_path / "data", train=200, valid=10)
    cfg, run = config(tmp_path, data, steps=2), tmp_path / "run"
    assert train(cfg, run).returncode == 0
    original = (data / "val.src").read_bytes()
    (data / "val.src").write_bytes(original + b"ein neuer satz\n")
    (data / "val.tgt").write_bytes((data / "val.tgt").read_bytes() + b"a new sentence\n")
    before = snapshot(run)
    refused = train(cfg, run, "--resume", "auto", "--set", "train.max_steps=4")
    one_line_error(refused, "the validation data (val.src, val.tgt) differ from those", "compared by sha256")
    assert snapshot(run) == before
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    del state["valid_fingerprint"]  # as a checkpoint of an earlier tcli
    torch.save(state, run / "checkpoints" / "last.pt")
    assert train(cfg, run, "--resume", "auto", "--set", "train.max_steps=4").returncode == 0


def test_the_validation_hash_is_that_of_the_validation_files_in_both_tasks_and_from_a_preprocessed_folder(
    tmp_path, data
):
    from transformer_cli.bert.setup import BertSetup
    from transformer_cli.config import BertRunConfig, TranslationRunConfig, load_config
    from transformer_cli.translation.setup import TranslationSetup

    def valid_hash(setup_type, cfg):
        setup = setup_type(cfg)
        setup.read_data()
        return setup.valid_fingerprint()

    def append(path: Path, line: bytes) -> None:
        path.write_bytes(path.read_bytes() + line)

    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    path = config(tmp_path, copy)
    cfg = load_config(TranslationRunConfig, path)
    first = valid_hash(TranslationSetup, cfg)
    for name in ("train", "test"):  # not validation text
        append(copy / f"{name}.src", b"x\n")
        append(copy / f"{name}.tgt", b"y\n")
    assert valid_hash(TranslationSetup, cfg) == first
    append(copy / "val.src", b"x\n")
    append(copy / "val.tgt", b"y\n")
    changed = valid_hash(TranslationSetup, cfg)
    assert changed != first
    pre = tmp_path / "pre"
    result = run_tcli("preprocess", "-q", "--config", str(path), "--out", str(pre))
    assert result.returncode == 0, result.stderr
    from_folder = load_config(TranslationRunConfig, path, [f"data.preprocessed={pre}"])
    assert valid_hash(TranslationSetup, from_folder) == changed  # the manifest's hashes of the same files
    text = tmp_path / "bert"
    shutil.copytree(ROOT / "data" / "bert_toy", text)
    bert = load_config(BertRunConfig, None, [f"data.dir={text}", "train.max_steps=1"])
    before = valid_hash(BertSetup, bert)
    append(text / "train.txt", b"\nMore text here. And more.\n")
    assert valid_hash(BertSetup, bert) == before
    append(text / "valid.txt", b"\nMore text here. And more.\n")
    assert valid_hash(BertSetup, bert) != before
