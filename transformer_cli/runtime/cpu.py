"""What the CPU offers, from /proc/cpuinfo: its bf16 matrix instructions. Imports nothing heavy, because the
allocator's choice (malloc.py) reads it before the command line is read."""

from __future__ import annotations

import functools
import sys
from pathlib import Path


@functools.cache
def flags() -> str:
    """/proc/cpuinfo's text (its flags lines), or '' where there is none."""
    if sys.platform == "darwin":
        return ""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def has_bf16_matmul() -> bool:
    """True when the CPU has native bf16 matrix instructions (AVX512-BF16 or AMX), where bf16 pays off."""
    return any(flag in flags() for flag in (" avx512_bf16", " amx_bf16"))


def has_amx() -> bool:
    """True when the CPU has AMX tile instructions for bf16 (Intel Xeon since Sapphire Rapids)."""
    return " amx_bf16" in flags()
