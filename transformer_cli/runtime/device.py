"""Where and how the model runs: device, precision (autocast, grad scaler), attention kernel.

The models never see any of this: the trainer and the decoder wrap their calls in `Runtime.context()`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

from transformer_cli.core.errors import UserError
from transformer_cli.runtime import malloc
from transformer_cli.runtime.cpu import has_bf16_matmul

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@functools.cache
def keep_large_allocations_in_heap() -> bool:
    """glibc serves allocations above a threshold (at most 32 MB) with fresh mmap'd pages, which the kernel
    zero-fills on first touch; a training step allocates and frees several such tensors (the vocabulary-
    sized logits and softmax among them), paying those page faults every step. A fixed 1 GB threshold
    keeps them in the heap for reuse (measured: docs/benchmarks/speed.md). Linux/glibc
    only, and only when glibc's malloc serves the process (not under mimalloc: malloc.py); elsewhere this
    does nothing."""
    if not sys.platform.startswith("linux") or malloc.in_use() != "system":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 1 << 30))
    except (OSError, AttributeError):
        return False


def release_free_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc malloc_trim). With the 1 GB thresholds above the
    heap keeps what it once held; evaluation and checkpointing allocate other sizes than a training
    step, and without this each of them would leave the process's resident memory a step higher.
    Linux/glibc only (not under mimalloc, which reuses what it holds: malloc.py); elsewhere this does nothing."""
    if not sys.platform.startswith("linux") or malloc.in_use() != "system":
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def pick_device(name: str) -> torch.device:
    """`auto` -> CUDA when present, else CPU. Asking for CUDA without it is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible (use --device cpu or auto)")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index):
        # torch knows more names (mps, xla, meta, ...) than tcli runs on: they failed later, inside torch
        raise UserError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(
            f"--device {name}: this machine has {_cuda_devices()} (cuda:0 to "
            f"cuda:{torch.cuda.device_count() - 1}); pick one of them, or auto"
        )
    return device


def _cuda_devices() -> str:
    count = torch.cuda.device_count()
    return f"{count} CUDA device{'s' if count != 1 else ''}"


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto`: bf16 where the hardware multiplies bf16 natively, fp16 on older GPUs, else fp32."""
    if precision != "auto":
        if precision == "fp16" and device.type == "cpu":
            raise UserError(
                "precision fp16 needs a GPU; on CPU use bf16, fp32 or auto (train.precision or --precision)"
            )
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if device.type == "cpu" and has_bf16_matmul() else "fp32"


def distributed_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when launched by torchrun, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))


@dataclass
class Runtime:
    """Device + resolved precision (+ the process's place in a torchrun job); `context()` is what every
    forward pass runs under."""

    device: torch.device
    precision: str  # fp32 | bf16 | fp16
    rank: int = 0
    world_size: int = 1
    patient_group: Any = None  # see barrier()

    @classmethod
    def create(cls, device: str = "auto", precision: str = "auto") -> Runtime:
        """A plain process, or, under torchrun, one rank of the job: NCCL and cuda:LOCAL_RANK on GPUs,
        gloo on CPU. A collective that waits longer than TCLI_DIST_TIMEOUT seconds (default 600) fails
        instead of hanging."""
        env = distributed_env()
        dev = pick_device(device)
        if dev.type == "cpu":
            keep_large_allocations_in_heap()
        if env is None:
            return cls(dev, resolve_precision(precision, dev))
        rank, world, local_rank = env
        import torch.distributed as dist

        if dev.type == "cuda":
            if local_rank >= torch.cuda.device_count():  # one process per GPU; more would fail deep in CUDA
                raise UserError(
                    f"torchrun started local rank {local_rank} but this machine has {_cuda_devices()}: "
                    f"use --nproc_per_node {torch.cuda.device_count()} (one process per GPU), "
                    f"or --device cpu"
                )
            dev = torch.device("cuda", local_rank)
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            timeout = datetime.timedelta(seconds=float(os.environ.get("TCLI_DIST_TIMEOUT", 600)))
            dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=timeout)
        runtime = cls(dev, resolve_precision(precision, dev), rank, world)
        # For the one wait that may last long (rank 0 tokenising a corpus): a gloo group without the timeout.
        runtime.patient_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=7))
        return runtime

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return None if self.precision == "fp32" else DTYPES[self.precision]

    @property
    def kernel_per_shape(self) -> bool:
        """Whether this runtime's matmuls compile a kernel per shape: half precision on a CPU, which torch
        multiplies through oneDNN (fp32 goes through MKL, which compiles none; GPUs' libraries neither). Where they
        do, a batch dimension that takes any value costs a compilation per value, and more kernels than oneDNN's
        cache holds are compiled again and again; rounding it to a few sizes pays for its padding there."""
        return self.device.type == "cpu" and self.precision != "fp32"

    def context(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if self.autocast_dtype is not None:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.autocast_dtype))
        if self.device.type == "cpu":
            # At the short sequence lengths of translation and BERT-small, the CPU flash kernel's
            # block overhead loses to plain matmul + softmax (measured: docs/benchmarks/speed.md); and the math kernel
            # need not copy bf16 queries/keys/values to fp32 first (its softmax accumulates in fp32).
            from torch.nn.attention import SDPBackend, sdpa_kernel

            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
            stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        return stack

    def grad_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

    def barrier(self, patient: bool = False) -> None:
        """Wait for every rank. `patient`: rank 0 may take long (tokenising a corpus, training a vocabulary)
        while the others wait, so this one waits on a gloo group of its own without the collective timeout
        (a rank that dies still ends the job: torchrun stops the others)."""
        if self.distributed:
            import torch.distributed as dist

            dist.barrier(group=self.patient_group if patient else None)

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Sum a few numbers over the ranks (a no-op in a single process)."""
        if not self.distributed:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def broadcast(self, values: list[float]) -> list[float]:
        """Rank 0's numbers on every rank."""
        if not self.distributed:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.broadcast(t, src=0)
        return t.tolist()

    def shutdown(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.destroy_process_group()

    def describe(self) -> str:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "CPU"
        where = f", rank {self.rank} of {self.world_size}" if self.distributed else ""
        threads = torch.get_num_threads()
        return f"{self.device} ({name}), {self.precision}, {threads} threads, malloc {malloc.in_use()}{where}"
