"""GPU readiness check (issue 14): one command, one JSON file, at most 8 minutes on one GPU.

    scripts/gpu_check.sh [--out FILE] [--only SECTION,...] [--cpu-tests]

Sections, each in its own process with its own time limit, so that one failing (an error, an
out-of-memory, a hang) is recorded and the others still run:

- device: the GPU, its bf16 dense peak from a table of datasheet values (or, for a GPU not in the
  table, a measured large bf16 matmul, which is always measured and reported too);
- train_translation_base, train_bert_base, train_bert_large: bf16 training throughput of tcli's own
  models (built from the count-params presets by `transformer_cli.models.builders`, each step the
  trainer's own `Trainer.update`) on synthetic random token batches: tokens/s, sequences/s, peak GPU
  memory, model FLOPs utilisation;
- decode_beam5: beam-5 decoding tokens/s of a transformer-base-size model (`transformer_cli.translation.decode`);
- tests: the test suite with CUDA visible (`pytest -v`, on pytest-xdist workers where it is installed),
  under the time that is left (every failure named).

Without CUDA every GPU section is recorded as skipped with its reason and the whole run takes
seconds; `--cpu-tests` runs the test suite anyway. `--device cpu --tiny` runs the measurement
sections with tiny models on the CPU (a smoke test of the code paths, not a measurement).

The measurements live in scripts/gpu_measure.py; both modules import without a GPU (tests/scripts/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from gpu_measure import (
    FLOPS_FORMULA,
    measure_bert,
    measure_decode,
    measure_device,
    measure_translation,
    resolve_peak,
)

_IMPORTED = time.perf_counter()  # a section process's budget counts from about here (torch is imported)
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # transformer_cli from this checkout, even where it is not pip-installed
    sys.path.insert(1, str(ROOT))
TOTAL_BUDGET_S = 470.0  # the whole check, tests included: under 8 minutes with margin for start-up
NESTED_ENV = "TCLI_GPU_CHECK_ACTIVE"  # set for the test suite this check runs: no check inside a check
TARGET = {"what": "BERT-large pretraining, sequence length 128, bf16, one H200", "sequences_per_s": 1200}

SECTIONS: dict[str, str] = {
    "device": "GPU name, memory and bf16 peak (table, measured matmul)",
    "train_translation_base": "translation training throughput, transformer-base size",
    "train_bert_base": "BERT-base training throughput, sequence length 128",
    "train_bert_large": "BERT-large training throughput, sequence length 128",
    "decode_beam5": "beam-5 decoding speed, transformer-base size",
    "tests": "the test suite (python -m pytest -v, on xdist workers where installed)",
}
LIMITS_S = {
    "device": 40,
    "train_translation_base": 80,
    "train_bert_base": 80,
    "train_bert_large": 100,
    "decode_beam5": 70,
    "tests": 300,
}

# Shapes of the full-size measurements; --tiny replaces them for a CPU smoke run.
FULL = {
    "train_translation_base": {
        "preset": "transformer-base",
        "vocab": 32000,
        "batch": 256,
        "src_len": 48,
        "tgt_len": 48,
        "loss_check": True,
    },
    "train_bert_base": {"preset": "bert-base", "vocab": 30522, "batch": 256, "seq_len": 128, "masked": 20},
    "train_bert_large": {
        "preset": "bert-large",
        "vocab": 30522,
        "batch": 256,
        "seq_len": 128,
        "masked": 20,
        "profile": True,
        "data_check": True,
    },
    "decode_beam5": {
        "preset": "transformer-base",
        "vocab": 32000,
        "batch": 256,
        "src_len": 32,
        "out_len": 32,
        "beam": 5,
        "reps": 5,
    },
}
TINY_NMT = ["model.d_model=32", "model.heads=2", "model.ffn_dim=64", "model.enc_layers=1", "model.dec_layers=1"]
TINY_BERT = ["model.d_model=32", "model.heads=2", "model.ffn_dim=64", "model.layers=2"]
TINY = {
    "train_translation_base": {"vocab": 256, "batch": 8, "src_len": 12, "tgt_len": 12, "overrides": TINY_NMT},
    "train_bert_base": {"vocab": 256, "batch": 8, "seq_len": 32, "masked": 5, "overrides": TINY_BERT},
    "train_bert_large": {"vocab": 256, "batch": 8, "seq_len": 32, "masked": 5, "overrides": TINY_BERT},
    "decode_beam5": {"vocab": 256, "batch": 4, "src_len": 8, "out_len": 8, "reps": 1, "overrides": TINY_NMT},
}


# ----------------------------------------------------------------------------- the test suite


def parse_pytest_summary(output: str) -> dict[str, Any]:
    """Counts from pytest's last summary line ('3 passed, 1 failed, 2 skipped in 4.2s'), and its duration."""
    counts: dict[str, Any] = {}
    lines = [line for line in output.splitlines() if re.search(r"\b(passed|failed|error|no tests ran)\b", line)]
    if lines:
        last = lines[-1]
        for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)", last):
            counts["errors" if what.startswith("error") else what] = int(n)
        took = re.search(r" in ([\d.]+)s", last)
        if took:
            counts["pytest_seconds"] = float(took.group(1))
    failures = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    if failures:
        counts["failures"] = failures
    return counts


# A per-test line of `pytest -v`: "tests/a.py::t[x] PASSED  [ 40%]" (ids may hold spaces), and of
# pytest-xdist's -v: "[gw1] [ 40%] PASSED tests/a.py::t[x]".
_OUTCOMES = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
_SERIAL_LINE = re.compile(rf"^(?!\[gw\d+\])(\S.*?::.*?) ({_OUTCOMES})(?: |$)", re.MULTILINE)
_XDIST_LINE = re.compile(rf"^\[gw\d+\] \[\s*\d+%\] ({_OUTCOMES}) (\S.*?::.*?)\s*$", re.MULTILINE)


def progress_counts(output: str) -> dict[str, Any]:
    """Outcomes read off pytest -v's per-test lines (serial or pytest-xdist): what ran before a timeout cut
    it, with the failing tests named."""
    outcomes = _SERIAL_LINE.findall(output) + [(test, what) for what, test in _XDIST_LINE.findall(output)]
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for _, what in outcomes:
        key = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped"}.get(what)
        if key:
            counts[key] += 1
    failures = [test for test, what in outcomes if what in ("FAILED", "ERROR")]
    if failures:
        counts["failures"] = failures
    return counts


def xdist_workers(cpus: int | None) -> int:
    """pytest-xdist workers for the suite where xdist is installed (the H200 image lent here lists it), else
    0: one per two cores, at most 8, so that a machine of 16 cores can run the suite within the tests section's
    few minutes (not yet measured on a GPU machine)."""
    if importlib.util.find_spec("xdist") is None or not cpus or cpus < 4:
        return 0
    return min(8, cpus // 2)


def pytest_command(workers: int = 0) -> list[str]:
    """The suite's command: the README's quick set (`-m "not slow"`, as the project's addopts say), with -v and
    those addopts cleared (-q and -v would cancel out and print no per-test lines to count after a timeout),
    parallel with `workers` > 0."""
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-v", "-m", "not slow", "-p", "no:cacheprovider"]
    return cmd + (["-n", str(workers)] if workers else [])


def run_tests(limit_s: float) -> dict[str, Any]:
    """The test suite in the repository (`pytest_command`), killed after limit_s. Not -x: a GPU machine's few
    minutes should name every test that fails there, not only the first."""
    workers = xdist_workers(os.cpu_count())
    cmd = pytest_command(workers)
    env = {**os.environ, NESTED_ENV: "1"}  # the suite's conftest runs each test process on one thread
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env
    )
    try:
        output, _ = proc.communicate(timeout=limit_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        output, _ = proc.communicate()
        timed_out = True
    seconds = time.perf_counter() - t0
    counts = progress_counts(output) if timed_out else parse_pytest_summary(output)
    status = "timeout" if timed_out else ("ok" if proc.returncode == 0 else "failed")
    result = {
        "status": status,
        "command": " ".join(["python", *cmd[1:]]),
        "returncode": proc.returncode,
        "seconds": round(seconds, 1),
        "xdist_workers": workers,
        **counts,
    }
    if timed_out:
        result["reason"] = f"killed after {limit_s:.0f}s; counts read off the progress lines"
    if status != "ok":
        result["output_tail"] = output[-3000:]
    return result


# ----------------------------------------------------------------------------- sections and the report


def section_kwargs(name: str, tiny: bool) -> dict[str, Any]:
    kwargs = dict(FULL[name])
    if tiny:
        kwargs.update(TINY[name])
    return kwargs


def run_section(
    name: str, device: str, tiny: bool, warmup: int, steps: int, peak: float | None, budget_s: float | None
) -> dict[str, Any]:
    """One measurement section in this process (the child side of `_child`)."""
    if name == "device":
        return measure_device(device, matmul_n=256 if tiny else 8192)
    kwargs = section_kwargs(name, tiny)
    if name == "decode_beam5":
        return measure_decode(device, budget_s=budget_s, **kwargs)
    if peak:
        source = "the device section's"
    else:  # the device section failed or did not run: this section finds the peak itself
        peak, source = resolve_peak(device, matmul_n=256 if tiny else 8192)
    measure = measure_translation if name == "train_translation_base" else measure_bert
    result = measure(device, warmup=warmup, steps=steps, peak_tflops=peak, budget_s=budget_s, **kwargs)
    return {**result, "peak_tflops": peak, "peak_source": source}


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _child(name: str, args: argparse.Namespace, peak: float | None, limit_s: float) -> dict[str, Any]:
    """Run a section in a fresh process: a crash, an out-of-memory or a hang stays inside it."""
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--section",
            name,
            "--result",
            str(result_file),
            "--device",
            args.device,
            "--warmup",
            str(args.warmup),
            "--steps",
            str(args.steps),
            "--budget",
            str(round(0.75 * limit_s, 1)),
        ]
        if peak:
            cmd += ["--peak", str(peak)]
        if args.tiny:
            cmd.append("--tiny")
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            output, _ = proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            output, _ = proc.communicate()
            return {
                "status": "timeout",
                "reason": f"killed after its limit of {limit_s:.0f}s",
                "output_tail": output[-2000:],
            }
        if result_file.exists():
            return json.loads(result_file.read_text())
        return {
            "status": "error",
            "error": f"the section process exited with code {proc.returncode} and no result",
            "output_tail": output[-3000:],
        }


def _section_main(args: argparse.Namespace) -> int:
    """--section NAME: measure, write the result (or the error) to --result."""
    budget = None if args.budget is None else args.budget - (time.perf_counter() - _IMPORTED)
    try:
        result = {
            "status": "ok",
            **run_section(args.section, args.device, args.tiny, args.warmup, args.steps, args.peak, budget),
        }
    except Exception as e:  # recorded in the report; the other sections still run
        result = {
            "status": "error",
            "error": f"{type(e).__name__}: {e}"[:1000],
            "traceback": traceback.format_exc()[-3000:],
        }
    Path(args.result).write_text(json.dumps(result, indent=1))
    return 0


def environment() -> dict[str, Any]:
    """Versions, the git commit, and what CUDA this torch build and the driver see."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "cpu_count": os.cpu_count(),
    }
    try:
        git = ["git", "-C", str(ROOT)]
        env["git_commit"] = (
            subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
            or None
        )
        env["git_dirty"] = bool(
            subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, timeout=10).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        env["git_commit"] = None
    if shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            env["nvidia_smi"] = smi.stdout.strip().splitlines() or smi.stderr.strip()[-300:]
        except (OSError, subprocess.SubprocessError) as e:
            env["nvidia_smi"] = f"failed: {e}"
    else:
        env["nvidia_smi"] = None
    return env


def skip_reason(env: dict[str, Any]) -> str:
    """Why there is no CUDA device; always starts with 'no CUDA device'."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and not hidden.strip():
        return "no CUDA device (CUDA_VISIBLE_DEVICES is empty)"
    gpus = env.get("nvidia_smi")
    if gpus and isinstance(gpus, list) and not env["torch_cuda_build"]:
        return (
            f"no CUDA device: torch {env['torch']} is a CPU-only build, although nvidia-smi lists {gpus}; "
            "install the torch build for this machine's CUDA"
        )
    if gpus and isinstance(gpus, list):
        return (
            f"no CUDA device visible to torch {env['torch']} (CUDA {env['torch_cuda_build']}), although "
            f"nvidia-smi lists {gpus}: check the driver against this CUDA version and CUDA_VISIBLE_DEVICES"
        )
    return "no CUDA device"


def default_out() -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu_check.json"
    return Path("gpu_check.json")


def strict_json(value: Any) -> Any:
    """JSON has no NaN or infinity (a diverged loss): such numbers become the strings 'nan', 'inf'."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def write_report(report: dict[str, Any], path: Path) -> None:
    """Atomically, after every section: a check cut short still leaves the sections done so far."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(strict_json(report), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def summary_line(name: str, r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        detail = r.get("reason") or r.get("error") or ""
        return f"gpu_check: {name}: {r['status']}" + (f" ({detail.splitlines()[0][:200]})" if detail else "")
    if name == "device":
        return (
            f"gpu_check: device: {r['name']}, peak {r['peak_tflops']} TFLOP/s bf16 ({r['peak_source']}), "
            f"matmul {r['measured_bf16_matmul_tflops']} TFLOP/s"
        )
    if name == "tests":
        return f"gpu_check: tests: {r.get('passed', 0)} passed, {r.get('failed', 0)} failed in {r['seconds']}s"
    if name == "decode_beam5":
        return f"gpu_check: decode_beam5: {r['tokens_per_s']:,.0f} tokens/s, {r['sentences_per_s']:,.0f} sentences/s"
    share = f", MFU {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else ""
    tokens = r.get("tokens_per_s") or r.get("tgt_tokens_per_s")
    return f"gpu_check: {name}: {r['sequences_per_s']:,.0f} sequences/s, {tokens:,.0f} tokens/s{share}"


def _target_met(sections: dict[str, Any]) -> bool | None:
    r = sections.get("train_bert_large", {})
    device = sections.get("device", {}).get("name", "")
    if r.get("status") != "ok" or "H200" not in device:
        return None  # measured elsewhere than on an H200 (or not at all): not comparable
    return r["sequences_per_s"] >= TARGET["sequences_per_s"]


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    out = Path(args.out) if args.out else default_out()
    env = environment()
    gpu = env["cuda_available"] if args.device == "auto" else args.device != "cpu" or args.tiny
    device = "cuda" if args.device == "auto" else args.device
    args.device = device
    report: dict[str, Any] = {
        "tool": "scripts/gpu_check.py",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join(sys.argv),
        "budget_s": args.budget_total,
        "limits_s": args.limits,
        "environment": env,
        "target": {**TARGET, "met": None},
        "flops_formula": FLOPS_FORMULA,
        "data": (
            "synthetic: uniformly random token ids, no padding, one batch reused for every step; throughput "
            "covers forward, backward, gradient clipping and the fused AdamW step (as Trainer.train_step), "
            "not data loading or host-to-device copies"
        ),
        "tiny": args.tiny,
        "sections": {},
    }
    names = [n for n in SECTIONS if n in args.only] if args.only else list(SECTIONS)
    peak = args.peak
    for name in names:
        remaining = args.budget_total - (time.perf_counter() - started)
        limit = min(args.limits[name], remaining - 5)
        t0 = time.perf_counter()
        if name == "tests":
            result = _tests_section(args, env, limit)
        elif not gpu:
            reason = skip_reason(env)
            print(f"{reason}: skipped {name} ({SECTIONS[name]})", flush=True)
            result = {"status": "skipped", "reason": reason}
        elif limit <= 0:
            result = {"status": "skipped", "reason": f"the check's {args.budget_total:.0f}s budget is spent"}
        else:
            result = _child(name, args, peak, limit)
            result.setdefault("limit_s", round(limit))
            if name == "device" and result["status"] == "ok":
                peak = peak or result["peak_tflops"]
        result.setdefault("wall_s", round(time.perf_counter() - t0, 1))
        report["sections"][name] = result
        report["target"]["met"] = _target_met(report["sections"])
        report["wall_s"] = round(time.perf_counter() - started, 1)
        write_report(report, out)
        if result["status"] != "skipped":
            print(summary_line(name, result), flush=True)
    print(f"gpu_check: wrote {out} ({report['wall_s']}s)", flush=True)
    return report


def _tests_section(args: argparse.Namespace, env: dict[str, Any], limit: float) -> dict[str, Any]:
    cuda = env["cuda_available"]
    if not cuda and not args.cpu_tests:
        reason = skip_reason(env)
        print(f"{reason}: skipped tests (the test suite; --cpu-tests runs it on the CPU)", flush=True)
        return {"status": "skipped", "reason": f"{reason} (--cpu-tests runs the suite on the CPU)"}
    if os.environ.get(NESTED_ENV):
        return {"status": "skipped", "reason": "inside a test suite that gpu_check started"}
    if limit <= 0:
        return {"status": "skipped", "reason": f"the check's {args.budget_total:.0f}s budget is spent"}
    result = run_tests(limit)
    result["limit_s"] = round(limit)
    result["cuda_visible"] = cuda
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", help="the JSON file (default $OUT/gpu_check.json, else ./gpu_check.json)")
    p.add_argument(
        "--only",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        help=f"comma-separated sections: {', '.join(SECTIONS)}",
    )
    p.add_argument("--cpu-tests", action="store_true", help="run the test suite even without CUDA")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cuda, cuda:N or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny models: a smoke test of the code paths, not a measurement")
    p.add_argument("--warmup", type=int, default=5, help="untimed training steps before the timed ones")
    p.add_argument("--steps", type=int, default=20, help="timed training steps")
    p.add_argument("--peak", type=float, help="bf16 peak TFLOP/s for MFU (default: the device section's)")
    p.add_argument("--budget-total", type=float, default=TOTAL_BUDGET_S, help="seconds for the whole check")
    p.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="SECTION=SECONDS",
        help="time limit of a section (repeatable); defaults: " + ", ".join(f"{k} {v}" for k, v in LIMITS_S.items()),
    )
    p.add_argument("--section", choices=[n for n in SECTIONS if n != "tests"], help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.only:
        unknown = sorted(set(args.only) - set(SECTIONS))
        if unknown:
            p.error(f"unknown section(s) {', '.join(unknown)}; valid: {', '.join(SECTIONS)}")
    if args.warmup < 1 or args.steps < 1:
        p.error("--warmup and --steps must be at least 1")
    args.limits = dict(LIMITS_S)
    for item in args.limit:
        name, _, seconds = item.partition("=")
        try:
            args.limits[name] = float(seconds)
        except ValueError:
            p.error(f"--limit {item!r}: expected SECTION=SECONDS")
        if name not in SECTIONS:
            p.error(f"--limit {item!r}: unknown section; valid: {', '.join(SECTIONS)}")
    if args.device == "cpu" and not args.tiny and not args.section:
        p.error("--device cpu measures nothing useful at full size; add --tiny for a smoke run")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.section:
        return _section_main(args)
    orchestrate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
