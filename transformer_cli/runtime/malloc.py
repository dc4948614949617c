"""The C memory allocator a tcli process runs with.

glibc's malloc, with the thresholds tcli sets (`runtime.keep_large_allocations_in_heap`), keeps a training
step's large temporaries in its heap for reuse, but the heap fragments: each validation's beam search leaves
gaps that the next steps' tensors do not fit, and the resident memory of a translation run climbs with every
validation while the memory in use stays flat. mimalloc serves each size class from pages of its own: under it
the same run stays flat, and trains faster on every CPU measured. BERT pretraining, whose memory glibc keeps flat,
trains slower under mimalloc on an AVX-512 BF16 EPYC but faster on a Xeon with AMX, and fine-tuning faster there
with less memory (measured: docs/benchmarks/speed.md, "Memory"); so `tcli train` (translation, validated with
beam search) runs under mimalloc on every CPU, and BERT pretraining and fine-tuning (`pretrain-bert`, `finetune`,
`glue`) on CPUs with AMX. A process chooses its allocator when it
starts, so such a command starts itself once more, same pid, arguments and standard streams, with mimalloc in
`LD_PRELOAD` (Linux; the `cmeel-mimalloc` wheel, a dependency there). `TCLI_MALLOC=system` keeps the C
library's malloc, and an allocator the user preloads is left alone.

This module imports nothing heavy: it runs before the command line is read.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from transformer_cli.runtime import cpu

CHOICE = "TCLI_MALLOC"  # auto (default): mimalloc where installed; system: the C library's malloc
STARTED = "TCLI_MALLOC_STARTED"  # set in the started process, which does not start itself again
# By default mimalloc hands pages that stayed free past a short delay back to the OS (purging); a training step
# frees its large tensors and allocates the same sizes again soon after, and a purged page is faulted in again,
# zero-filled, which slows translation training (measured: docs/benchmarks/speed.md). Kept, they are reused,
# and the resident memory is what the largest step and validation need, which does not grow.
MIMALLOC_SETTINGS = {"MIMALLOC_PURGE_DELAY": "-1"}
_PRELOADED = ("mimalloc", "jemalloc", "tcmalloc")  # allocators a user may have preloaded
EVERYWHERE = ("train",)  # the commands that run under mimalloc on every CPU (see above)
WITH_AMX = ("pretrain-bert", "finetune", "glue")  # and those that do on a CPU with AMX


def commands() -> tuple[str, ...]:
    """The commands that run under mimalloc on this CPU."""
    return EVERYWHERE + WITH_AMX if cpu.has_amx() else EVERYWHERE


def library() -> str | None:
    """The path of the mimalloc shared library of the `cmeel-mimalloc` wheel, or None (not Linux, or not
    installed)."""
    if not sys.platform.startswith("linux"):
        return None
    # The wheel puts its files under cmeel.prefix/ in site-packages (a stat per path entry, no metadata scan).
    found = (Path(entry or ".", "cmeel.prefix", "lib", "libmimalloc.so") for entry in sys.path)
    return next((str(path.resolve()) for path in found if path.is_file()), None)


def start_with_mimalloc(
    args: list[str], environ: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]] | None:
    """The interpreter's arguments and environment that run this same command (`args`, tcli's arguments) again
    with mimalloc preloaded, or None where this process keeps its allocator: a command not in `commands()`, not
    Linux, TCLI_MALLOC=system, started so already, an allocator preloaded by the user, or no mimalloc."""
    env = dict(os.environ if environ is None else environ)
    command = next((arg for arg in args if not arg.startswith("-")), None)
    if command not in commands() or env.get(CHOICE, "auto") == "system" or STARTED in env or not sys.executable:
        return None
    if any(name in env.get("LD_PRELOAD", "") for name in _PRELOADED):
        return None
    lib = library()
    if lib is None:
        return None
    env["LD_PRELOAD"] = ":".join(filter(None, [lib, env.get("LD_PRELOAD", "")]))
    for key, value in MIMALLOC_SETTINGS.items():
        env.setdefault(key, value)
    env[STARTED] = lib
    return [sys.executable, *sys.orig_argv[1:]], env


def restart_with_mimalloc() -> None:
    """Replace this process by the same command under mimalloc, or return where there is nothing to change
    (see `start_with_mimalloc`). A TCLI_MALLOC that is neither auto nor system is a user's error: one line,
    exit code 2."""
    choice = os.environ.get(CHOICE, "auto")
    if choice not in ("auto", "system"):
        print(f"error: {CHOICE}={choice!r}: expected auto (the default) or system", file=sys.stderr)
        sys.exit(2)
    started = start_with_mimalloc(sys.argv[1:])
    if started is not None:
        argv, env = started
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(argv[0], argv, env)


@functools.cache
def in_use() -> str:
    """The allocator serving this process: the name of a preloaded one whose library is mapped in, else
    'system'."""
    preloaded = os.environ.get("LD_PRELOAD", "")
    try:
        mapped = Path("/proc/self/maps").read_text()
    except OSError:
        return "system"
    return next((name for name in _PRELOADED if name in preloaded and f"lib{name}" in mapped), "system")
