"""Where and how the model runs: device, precision (autocast, grad scaler), attention kernel.

The models never see any of this: the trainer and the decoder wrap their calls in `Runtime.context()`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_cli.errors import UserError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@functools.cache
def cpu_has_bf16_matmul() -> bool:
    """True when the CPU has native bf16 matrix instructions (AVX512-BF16 or AMX), where bf16 pays off."""
    if sys.platform == "darwin":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in flags for flag in (" avx512_bf16", " amx_bf16"))


def pick_device(name: str) -> torch.device:
    """`auto` -> CUDA when present, else CPU. Asking for CUDA without it is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible (use --device cpu or auto)")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N") from None


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto`: bf16 where the hardware multiplies bf16 natively, fp16 on older GPUs, else fp32."""
    if precision != "auto":
        if precision == "fp16" and device.type == "cpu":
            raise UserError("train.precision fp16 needs a GPU; on CPU use bf16, fp32 or auto")
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if device.type == "cpu" and cpu_has_bf16_matmul() else "fp32"


@dataclass
class Runtime:
    """Device + resolved precision; `context()` is what every forward pass runs under."""

    device: torch.device
    precision: str  # fp32 | bf16 | fp16

    @classmethod
    def create(cls, device: str = "auto", precision: str = "auto") -> Runtime:
        dev = pick_device(device)
        return cls(dev, resolve_precision(precision, dev))

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return None if self.precision == "fp32" else DTYPES[self.precision]

    def context(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if self.autocast_dtype is not None:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.autocast_dtype))
        if self.device.type == "cpu":
            # At the short sequence lengths of translation and BERT-small, the CPU flash kernel's
            # block overhead loses to plain matmul + softmax (see BENCHMARKS.md).
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        return stack

    def grad_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

    def describe(self) -> str:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "CPU"
        return f"{self.device} ({name}), {self.precision}, {torch.get_num_threads()} threads"
