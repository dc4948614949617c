"""scripts/gpu_check.py on a CPU machine: the JSON with skipped GPU sections, the MFU arithmetic, and a tiny CPU
run of each measurement (the code path a GPU run takes: the trainer's own update on synthetic batches)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_cli.models.params import bert_train_flops
from transformer_cli.tools.count_params import count_config, preset_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402
import gpu_measure  # noqa: E402

GPU_SECTIONS = ["device", "train_translation_base", "train_bert_base", "train_bert_large", "decode_beam5"]


def run_check(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """scripts/gpu_check.sh with CUDA hidden, so that it takes the CPU path on any machine."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("OUT", gpu_check.NESTED_ENV)}
    full_env.update({"CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def test_cpu_run_skips_gpu_sections_and_writes_json(tmp_path):
    result = run_check(env={"OUT": str(tmp_path)})  # no --out: $OUT/gpu_check.json
    assert result.returncode == 0, result.stderr
    for name in GPU_SECTIONS:  # one line per section
        assert re.search(rf"^no CUDA device.*: skipped {name} \(", result.stdout, re.MULTILINE), result.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(report["sections"]) == [*GPU_SECTIONS, "tests"]
    for name, section in report["sections"].items():
        assert section["status"] == "skipped", name
        assert section["reason"].startswith("no CUDA device"), name
    assert "--cpu-tests" in report["sections"]["tests"]["reason"]
    assert report["environment"]["cuda_available"] is False
    assert report["target"] == {**gpu_check.TARGET, "met": None}
    assert "6 x" in report["flops_formula"]["summary"] and "synthetic" in report["data"]


def test_skip_reasons(monkeypatch):
    env = {"torch": "2.13.0+cpu", "torch_cuda_build": None, "cuda_available": False, "nvidia_smi": None}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_check.skip_reason(env) == "no CUDA device"
    smi = {**env, "nvidia_smi": ["NVIDIA H200, 570.86, 143771 MiB"]}
    assert "CPU-only build" in gpu_check.skip_reason(smi) and "H200" in gpu_check.skip_reason(smi)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_check.skip_reason(smi) == "no CUDA device (CUDA_VISIBLE_DEVICES is empty)"


def test_a_section_over_its_limit_is_recorded_and_the_others_run(tmp_path):
    out = tmp_path / "r.json"
    result = run_check(
        "--device",
        "cpu",
        "--tiny",
        "--only",
        "device,train_translation_base,tests",
        "--limit",
        "train_translation_base=0.5",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    sections = json.loads(out.read_text())["sections"]
    assert sections["device"]["status"] == "ok" and sections["device"]["peak_tflops"] > 0
    assert sections["train_translation_base"]["status"] == "timeout"
    assert sections["tests"]["status"] == "skipped"  # CPU, no --cpu-tests: --device cpu runs no test suite


def test_a_failing_section_records_its_error(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gpu_check, "run_section", broken)
    result_file = tmp_path / "section.json"
    assert gpu_check.main(["--section", "train_bert_base", "--result", str(result_file), "--device", "cpu"]) == 0
    result = json.loads(result_file.read_text())
    assert result["status"] == "error" and "illegal memory access" in result["error"] and result["traceback"]


def test_mfu():
    """Model FLOPs (transformer_cli.models.params, tested in tests/models/test_flops.py) over time over the peak."""
    flops = 1.79e13
    assert gpu_measure.mfu(flops, 0.01, 989.0) == pytest.approx(flops / 0.01 / 989e12)
    assert gpu_measure.mfu(flops, 0.01, None) is None


def test_peak_table():
    peak = gpu_measure.table_peak_tflops
    assert peak("NVIDIA H200") == peak("NVIDIA H100 80GB HBM3") == peak("NVIDIA GH200 480GB") == 989.0
    assert peak("NVIDIA H100 PCIe") == 756.0 and peak("NVIDIA H200 NVL") == 835.0
    assert peak("NVIDIA A100-SXM4-80GB") == peak("NVIDIA A100 80GB PCIe") == 312.0
    assert peak("NVIDIA L4") == 121.0 and peak("NVIDIA L40S") == 362.0
    assert peak("NVIDIA GeForce RTX 3090") is None  # measured instead


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from more threads; on a loaded machine, OpenMP threads waiting for each
    other made a tiny step about 50 times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_tiny_training_and_decoding_on_cpu(one_thread):
    """The measurement functions a GPU run calls, with tiny models on the CPU: they train and decode."""
    bert = gpu_measure.measure_bert(
        "cpu",
        vocab=256,
        batch=4,
        seq_len=16,
        masked=3,
        warmup=1,
        steps=2,
        overrides=gpu_check.TINY_BERT,
        precision="bf16",
        peak_tflops=0.5,
        profile=True,
        data_check=True,
    )
    assert bert["steps_timed"] == 2 and bert["batches_tried"] == [4] and bert["loss_finite"]
    assert bert["tokens_per_s"] == pytest.approx(16 * bert["sequences_per_s"], rel=1e-2)
    assert bert["mfu"] > 0 and bert["precision"] == "bf16" and bert["peak_memory_allocated_gib"] is None
    tiny_bert = preset_config("bert-base", [*gpu_check.TINY_BERT, "vocab.size=256"])
    assert bert["parameters"] == count_config(tiny_bert)["total"]
    assert bert["model_flops_per_step"] == bert_train_flops(tiny_bert.model, 256, 4 * 16, 16, 4 * 3, 4)
    assert len(bert["loss_first_last"]) == 2
    nmt = gpu_measure.measure_translation(
        "cpu",
        vocab=256,
        batch=8,
        src_len=12,
        tgt_len=10,
        warmup=1,
        steps=2,
        overrides=gpu_check.TINY_NMT,
        precision="fp32",
        peak_tflops=0.5,
        loss_check=True,
    )
    assert nmt["tgt_tokens_per_step"] == 80 and nmt["loss_finite"] and nmt["mfu"] > 0
    loss = nmt["loss_fwd_bwd"]
    assert loss["rows"] == 80 and min(loss["tcli_chunked_ms"], loss["tcli_one_chunk_ms"]) > 0, loss
    profile = bert["profile"]
    assert profile["steps"] == 3 and profile["top"] and "Name" in profile["table"], profile
    data = bert["host_data"]
    assert data["batch_sequences"] == 4 and data["host_sequences_per_s"] > 0, data
    dec = gpu_measure.measure_decode(
        "cpu", vocab=256, batch=4, src_len=8, out_len=6, reps=1, overrides=gpu_check.TINY_NMT, precision="fp32"
    )
    assert dec["all_full_length"] and dec["decoded_tokens"] == 4 * 6 and dec["tokens_per_s"] > 0


def test_out_of_memory_halves_the_batch():
    def run(batch: int) -> dict:
        if batch > 64:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"batch": batch}

    assert gpu_measure._fit_batch(run, 256, torch.device("cpu")) == {"batch": 64, "batches_tried": [256, 128, 64]}

    def broken(batch: int) -> dict:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        gpu_measure._fit_batch(broken, 256, torch.device("cpu"))


def test_pytest_output_parsing():
    out = "....s.F\n=== short test summary info ===\nFAILED tests/x.py::t\n1 failed, 5 passed, 1 skipped in 12.34s\n"
    assert gpu_check.parse_pytest_summary(out) == {
        "failed": 1,
        "passed": 5,
        "skipped": 1,
        "pytest_seconds": 12.34,
        "failures": ["tests/x.py::t"],
    }
    progress = (
        "tests/a.py::t1 PASSED  [ 10%]\ntests/a.py::t2[x-1] SKIPPED (no data)  [ 20%]\n"
        "tests/b.py::t3 FAILED  [ 30%]\ntests/b.py::t4 PASSED  [ 40%]\ntests/c.py::t5 ERROR  [ 50%]\n"
    )
    assert gpu_check.progress_counts(progress) == {
        "passed": 2,
        "failed": 1,
        "errors": 1,
        "skipped": 1,
        "failures": ["tests/b.py::t3", "tests/c.py::t5"],
    }
    spaced = "tests/a.py::t[train: {max_steps: 10}\\n-x] FAILED [ 50%]\ntests/a.py::u[a b] PASSED [100%]\n"
    assert gpu_check.progress_counts(spaced) == {
        "passed": 1,
        "failed": 1,
        "errors": 0,
        "skipped": 0,
        "failures": ["tests/a.py::t[train: {max_steps: 10}\\n-x]"],
    }
    xdist = (
        "tests/a.py::t1 \ntests/b.py::t3 \n[gw1] [ 25%] PASSED tests/a.py::t1 \n"
        "[gw0] [ 50%] FAILED tests/b.py::t3 \n[gw1] [ 75%] SKIPPED tests/a.py::t2[x y] \n"
    )
    assert gpu_check.progress_counts(xdist) == {
        "passed": 1,
        "failed": 1,
        "errors": 0,
        "skipped": 1,
        "failures": ["tests/b.py::t3"],
    }


@pytest.mark.parametrize("workers", [0, 2])
def test_the_suite_command_prints_a_line_per_test(workers):
    """Under the project's own pytest settings (addopts -q), the command gpu_check runs prints the per-test
    lines that a timed-out run is counted from: as many as the summary counts."""
    if workers and not gpu_check.xdist_workers(8):
        pytest.skip("pytest-xdist is not installed (gpu_check runs the suite serially then)")
    cmd = [*gpu_check.pytest_command(workers), "tests/test_config.py"]
    done = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", gpu_check.NESTED_ENV: "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:]
    summary = gpu_check.parse_pytest_summary(done.stdout)
    assert summary["passed"] >= 10
    assert gpu_check.progress_counts(done.stdout)["passed"] == summary["passed"]


def test_report_is_strict_json_even_with_a_diverged_loss(tmp_path):
    path = tmp_path / "r.json"
    gpu_check.write_report({"sections": {"x": {"loss_first_last": [float("nan"), float("inf")], "mfu": 0.4}}}, path)

    def refuse(constant):
        raise ValueError(constant)

    report = json.loads(path.read_text(), parse_constant=refuse)
    assert report["sections"]["x"] == {"loss_first_last": ["nan", "inf"], "mfu": 0.4}


def test_timed_steps_stop_at_the_deadline():
    calls = []

    def step() -> int:
        calls.append(1)
        return len(calls)

    cpu = torch.device("cpu")
    _, done, outputs = gpu_measure._timed_steps(step, warmup=5, steps=20, device=cpu, deadline=0.0)  # long past
    assert (done, len(calls), outputs) == (1, 2, [1, 2])  # one warm-up step, one timed step: first and last
    calls.clear()
    _, done, _ = gpu_measure._timed_steps(step, warmup=2, steps=3, device=cpu, deadline=None)
    assert (done, len(calls)) == (3, 5)
