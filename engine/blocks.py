"""Work split into blocks and shared among the rank's threads: the pool behind engine.lowp's
conversions and engine.kernels' fused ops.

Why blocks: a chain of NumPy passes over a block of BLOCK elements keeps the block's temporaries in
the core's cache between passes, where whole-array passes each go through main memory. Why threads:
NumPy's elementwise loops run on one core; handing contiguous runs of blocks to `threads` workers
lets the rank's cores share the work, as they share its matrix products (BLAS). NumPy releases the
GIL inside its loops, so the workers really run at once.

`set_threads(n)` sizes the pool (engine.comm.cores does, with the figure it gives BLAS); 1 runs every
block on the caller's thread.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

BLOCK = 1 << 15  # elements per block: a few float32 temporaries of it fit a core's L2 cache

_pool: ThreadPoolExecutor | None = None
_threads = 1
_lock = threading.Lock()


def set_threads(n: int) -> None:
    """Share each kernel's blocks among `n` threads (1: the caller's thread alone)."""
    global _pool, _threads
    with _lock:
        n = max(1, int(n))
        if n == _threads:
            return
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool = ThreadPoolExecutor(n - 1, thread_name_prefix="nanodist-kernel") if n > 1 else None
        _threads = n


def threads() -> int:
    return _threads


def run(fn: Callable[[int, int], None], n: int, block: int = BLOCK) -> None:
    """fn(lo, hi) over [0, n) in blocks of `block`, split into contiguous runs, one per thread."""
    pool, workers = _pool, _threads
    if pool is None or n < 2 * block:
        for lo in range(0, n, block):
            fn(lo, min(n, lo + block))
        return
    per = math.ceil(math.ceil(n / block) / workers) * block  # whole blocks per thread

    def run_from(start: int) -> None:
        for lo in range(start, min(n, start + per), block):
            fn(lo, min(n, lo + block, start + per))
    futures = [pool.submit(run_from, start) for start in range(per, n, per)]
    run_from(0)
    for future in futures:
        future.result()
