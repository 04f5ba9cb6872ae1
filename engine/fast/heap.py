"""Keep freed memory for reuse: the C allocator's settings for a process that trains.

A training step allocates and frees the same large temporaries op after op (products, softmax rows,
widened 16-bit operands: arrays of megabytes). glibc's malloc gives such blocks back to the operating
system as soon as they are freed (an mmap'd block is unmapped; the top of the heap is trimmed above
128 KiB) and the next op faults every page back in: on gpt-mini that was ~17,000 page faults and ~15%
of a one-thread fp32 step spent in the kernel. Raising the two thresholds keeps the freed blocks in
the heap, where the next op's arrays of the same sizes find them.

    M_MMAP_THRESHOLD  blocks at least this large get their own mapping: glibc's maximum (32 MiB)
    M_TRIM_THRESHOLD  free memory at the top of the heap kept before trimming: MAX_KEPT

The cost is that up to MAX_KEPT of freed memory stays with the process (resident only where it was
touched). Elsewhere than glibc (musl's mallopt does nothing, macOS and Windows have none) this does
nothing; results never depend on it.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20  # the largest value glibc accepts on 64-bit systems
MAX_KEPT = 256 << 20

_done = False


def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process; True when they were set."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, MAX_KEPT))
    return _done
