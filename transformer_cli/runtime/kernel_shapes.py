"""What a shape-keyed matmul kernel cache sees: the distinct GEMM shapes of a workload, and oneDNN's kernel
creations, counted over a window of steps after warm-up.

oneDNN (PyTorch's CPU matmul library for bf16 on AVX-512/AMX) compiles a kernel per matmul shape and keeps
`ONEDNN_PRIMITIVE_CACHE_CAPACITY` of them; a shape that comes back after eviction is compiled again. Where
torch multiplies through another library (fp32 through MKL on most CPUs) oneDNN creates nothing, so the
check any CPU can run is the shapes themselves: `GemmShapes` records (op, batch, M, N, K, dtype) of every
mm/addmm/bmm/baddbmm a step dispatches (linear and matmul reach these), and a workload whose batches come
from a bounded set shows no new shape after warm-up. `onednn_creations` counts oneDNN's own
`create:cache_miss` lines over the same window where oneDNN is in use.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_GEMMS = {
    _aten.mm.default: "mm",
    _aten.addmm.default: "addmm",
    _aten.bmm.default: "bmm",
    _aten.baddbmm.default: "baddbmm",
    # Under inference mode composite ops reach a dispatch mode undecomposed.
    _aten.linear.default: "linear",
    _aten.matmul.default: "matmul",
    _aten.scaled_dot_product_attention.default: "sdpa",
}


def _keys(name: str, args: tuple) -> list[tuple]:
    """(op, batch, M, N, K, dtype) of each GEMM of a call, as the library below torch would see it."""
    if name == "sdpa":  # the math kernel's two products: q (.., T, d_k) k^T -> (.., T, S), then (.., T, S) v
        q, k = args[0], args[1]
        batch, T, S, d_k = q.numel() // (q.size(-2) * q.size(-1)), q.size(-2), k.size(-2), q.size(-1)
        return [("bmm", batch, T, S, d_k, q.dtype), ("bmm", batch, T, d_k, S, q.dtype)]
    return [_key(name, args)]


def _key(name: str, args: tuple) -> tuple:
    """(op, batch, M, N, K, dtype) of one GEMM call."""
    if name == "linear":  # input (..., K), weight (N, K): one (M, K) x (K, N) product
        x, w = args[0], args[1]
        return (
            "addmm" if len(args) > 2 and args[2] is not None else "mm",
            1,
            x.numel() // x.size(-1),
            w.size(0),
            w.size(1),
            x.dtype,
        )
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
    if name == "matmul":
        batch = a.numel() // (a.size(-2) * a.size(-1)) if a.dim() > 2 else 1
        name = "bmm" if a.dim() > 2 and b.dim() > 2 else "mm"
        if name == "mm" and a.dim() > 2:  # (..., M, K) x (K, N) folds the batch into M
            return ("mm", 1, a.numel() // a.size(-1), b.size(-1), a.size(-1), a.dtype)
    else:
        batch = a.size(0) if a.dim() == 3 else 1
    return (name, batch, a.size(-2), b.size(-1), a.size(-1), a.dtype)


class GemmShapes(TorchDispatchMode):
    """Records the GEMM shapes dispatched while active: `seen` (all), `new` (first seen since `mark()`)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple] = set()
        self.new: set[tuple] = set()

    def mark(self) -> None:
        """Start a window: shapes seen from now on that were not seen before count as new."""
        self.new = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = _GEMMS.get(func)
        for key in _keys(name, args) if name is not None else ():
            key = (*key[:5], str(key[5]).removeprefix("torch."))
            if key not in self.seen:
                self.seen.add(key)
                self.new.add(key)
        return func(*args, **(kwargs or {}))


def summary(shapes: set[tuple]) -> dict[str, int]:
    """Counts of projection GEMMs (mm/addmm) and attention GEMMs (bmm/baddbmm) in a set of shapes."""
    return {
        "projection": sum(1 for s in shapes if s[0] in ("mm", "addmm")),
        "attention": sum(1 for s in shapes if s[0] in ("bmm", "baddbmm")),
    }


@contextlib.contextmanager
def onednn_creations() -> Iterator[dict[str, int]]:
    """Counts oneDNN primitive creations (`create:cache_miss` verbose lines) while active, into the yielded
    dict's "created" (the lines themselves into "misses", all "create:" lines into "create_lines"). oneDNN
    writes its verbose lines to the process's stdout: that file descriptor is sent to a temporary file for the
    duration."""
    counts: dict = {"created": 0, "create_lines": 0, "misses": []}
    libc = ctypes.CDLL(None)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        libc.fflush(None)
        saved = os.dup(1)
        os.dup2(sink.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):
                yield counts
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode("utf-8", "replace").splitlines():
                if "create:" in line:
                    counts["create_lines"] += 1
                    if "create:cache_miss" in line:
                        counts["misses"].append(line)
            counts["created"] = len(counts["misses"])


def created_again(misses: list[str]) -> int:
    """How many of oneDNN's `create:cache_miss` lines create a kernel it had created before (evicted from its
    cache and needed again): lines equal but for their last field, the milliseconds the creation took."""
    kernels = [line.rsplit(",", 1)[0] for line in misses]
    return len(kernels) - len(set(kernels))


def ending_sentences_at_random(model: torch.nn.Module, eos_id: int, seed: int = 0) -> None:
    """Make an untrained translation model end its sentences at various steps, as a trained one does, so that
    a beam-search batch shrinks: a random bonus on EOS's logit of each hypothesis row (a forward hook on the
    output projection)."""
    bonus = torch.Generator().manual_seed(seed)

    def raise_eos(module, args, out):
        out[:, eos_id] += torch.randn(out.size(0), generator=bonus) * 4 + 2
        return out

    model.out_proj.register_forward_hook(raise_eos)


def creation_ms(misses: list[str]) -> float:
    """Milliseconds oneDNN spent creating the kernels of its `create:cache_miss` lines (each line's last field)."""
    return sum(float(line.rsplit(",", 1)[1]) for line in misses)
