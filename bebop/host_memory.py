"""Host memory that a long CPU job frees, handed back to the operating system.

glibc's malloc keeps the blocks a program frees for its next requests instead of returning them. A train-mtp step
allocates and frees a different set of blocks for each batch shape (the head's chain, its chunked readout over the
draft vocabulary, recomputed in backward), and the holes they leave in the heap do not fit the next shapes well: on
SmolLM2's broad corpus the resident memory of a 300-step fused run kept rising with the steps, to 4.0-4.3 GiB, where
its first 30 steps peaked at 3.1 (docs/real-model.md). `malloc_trim` every few steps (`RELEASE_EVERY` in
`bebop.heads.train`) gives the free pages back, so the peak stays near one step's working set instead of growing
with the heap's history. Elsewhere (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc: nothing to hand back this way


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the operating system (glibc's `malloc_trim(0)`); False where the C
    library has no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
