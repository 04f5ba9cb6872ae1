"""Work split into blocks and shared among the rank's threads: the pool behind engine.lowp's
conversions and engine.kernels' fused ops.

Why blocks: a chain of NumPy passes over a block of BLOCK elements keeps the block's temporaries in
the core's cache between passes, where whole-array passes each go through main memory. Why threads:
NumPy's elementwise loops run on one core; handing contiguous runs of blocks to `threads` workers
lets the rank's cores share the work, as they share its matrix products (BLAS). NumPy releases the
GIL inside its loops, so the workers really run at once.

`set_threads(n)` sizes the pool (engine.comm.cores does, with the figure it gives BLAS); 1 runs every
block on the caller's thread.

    run(fn, n, block)     fn(lo, hi) over [0, n) block by block: chains of passes kept in cache
    split(fn, n, grain)   fn(lo, hi) once per thread over contiguous ranges of at least `grain`: work
                          that is already one call per range (a stack of small products, an update
                          that walks its own chunks)

The caller's thread always takes the first range, so one thread, or work too small to share, costs
nothing beyond the call.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

BLOCK = 1 << 15  # elements per block: a few float32 temporaries of it fit a core's L2 cache

_pool: ThreadPoolExecutor | None = None
_threads = 1
_lock = threading.Lock()
_WORKER_PREFIX = "nanodist-kernel"
_local = threading.local()  # .sharing: this thread runs one share of a split or run already


def set_threads(n: int) -> None:
    """Share each kernel's blocks among `n` threads (1: the caller's thread alone)."""
    global _pool, _threads
    with _lock:
        n = max(1, int(n))
        if n == _threads:
            return
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool = ThreadPoolExecutor(n - 1, thread_name_prefix=_WORKER_PREFIX) if n > 1 else None
        _threads = n


def threads() -> int:
    return _threads


def _shared_pool() -> ThreadPoolExecutor | None:
    """The pool to hand work to, or None to run it on this thread. None inside a share of work already
    handed out (nested calls: a conversion inside one range of a split): every thread is busy with its
    own share, and a pool worker waiting for other workers could leave nobody free to run them."""
    if getattr(_local, "sharing", False) or threading.current_thread().name.startswith(_WORKER_PREFIX):
        return None
    return _pool


def _as_share(fn: Callable[[int, int], None], lo: int, hi: int) -> None:
    """fn(lo, hi) on the caller's thread as its share of handed-out work (nested calls stay here)."""
    _local.sharing = True
    try:
        fn(lo, hi)
    finally:
        _local.sharing = False


def _hand_over(pool: ThreadPoolExecutor, fn: Callable[[int, int], None], lo: int, hi: int) -> Future:
    """fn(lo, hi) on a pool worker under the caller's NumPy error state (a state is per thread: a backward
    that expects overflow, under fp16 loss scaling, has turned its warnings off on the rank's thread)."""
    state = np.geterr()

    def share() -> None:
        with np.errstate(**state):
            fn(lo, hi)
    return pool.submit(share)


def run(fn: Callable[[int, int], None], n: int, block: int = BLOCK) -> None:
    """fn(lo, hi) over [0, n) in blocks of `block`, split into contiguous runs, one per thread."""
    pool, workers = _shared_pool(), _threads
    if pool is None or n < 2 * block:
        for lo in range(0, n, block):
            fn(lo, min(n, lo + block))
        return
    per = math.ceil(math.ceil(n / block) / workers) * block  # whole blocks per thread

    def run_from(start: int) -> None:
        for lo in range(start, min(n, start + per), block):
            fn(lo, min(n, lo + block, start + per))
    futures = [_hand_over(pool, lambda start, _: run_from(start), start, 0) for start in range(per, n, per)]
    _as_share(lambda start, _: run_from(start), 0, 0)
    for future in futures:
        future.result()


def split(fn: Callable[[int, int], None], n: int, grain: int = 1) -> None:
    """fn(lo, hi) once per range of a split of [0, n) into at most `threads()` contiguous ranges of at
    least `grain` items each (fewer ranges when n is small; one, on the caller's thread, below 2 grains)."""
    pool, workers = _shared_pool(), min(_threads, n // max(1, grain))
    if pool is None or workers < 2:
        if n > 0:
            fn(0, n)
        return
    bounds = [n * i // workers for i in range(workers + 1)]
    futures = [_hand_over(pool, fn, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    _as_share(fn, bounds[0], bounds[1])
    for future in futures:
        future.result()
