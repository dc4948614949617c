"""The few sizes a tensor dimension may take: lengths and row counts rounded up to a fixed set.

A CPU matmul library compiles (and caches) a kernel per matmul shape, and the allocator keeps blocks
per tensor size; a dimension that can take any value makes both grow over a run. Rounding up to
`steps` sizes per doubling bounds the set (about steps * log2(largest) sizes) at a padding cost of
at most 1/steps of the size, and less on average.
"""

from __future__ import annotations

STEPS = 8  # sizes per doubling: at most 12.5% padding


def bucket(n: int, multiple: int = 1, steps: int = STEPS) -> int:
    """n rounded up to the next size of the set: `multiple` times m, where m = ceil(n / multiple) rounded up
    to a multiple of 2**floor(log2 m) / steps (so the spacing doubles with each doubling of the size, and a
    size rounds to itself)."""
    if n <= 0:
        return 0
    m = -(-int(n) // multiple)
    spacing = max(1, (1 << (m.bit_length() - 1)) // steps)
    return -(-m // spacing) * spacing * multiple


def buckets_upto(limit: int, multiple: int = 1, steps: int = STEPS) -> list[int]:
    """Every size `bucket` returns for 1..limit, ascending."""
    sizes, n = [], 1
    while n <= limit:
        sizes.append(bucket(n, multiple, steps))
        n = sizes[-1] + 1
    return sizes
