"""Work split into blocks and shared among the rank's threads: the pool behind engine.fast.lowp's
conversions and engine.fast.kernels' fused ops.

Why blocks: a chain of NumPy passes over a block of BLOCK elements keeps the block's temporaries in
the core's cache between passes, where whole-array passes each go through main memory. Why threads:
NumPy's elementwise loops run on one core; handing contiguous runs of blocks to `threads` workers
lets the rank's cores share the work, as they share its matrix products (BLAS). NumPy releases the
GIL inside its loops, so the workers really run at once.

`set_threads(n)` sizes the pool (engine.comm.cores does, with the figure it gives BLAS); 1 runs every
block on the caller's thread.

    run(fn, n, block)     fn(lo, hi) over [0, n) block by block: chains of passes kept in cache,
                          shared only when the first block's time says sharing repays its hand-offs
    split(fn, n, grain)   fn(lo, hi) once per thread over contiguous ranges of at least `grain`: work
                          that is already one call per range (a stack of small products, an update
                          that walks its own chunks)

The caller's thread always takes the first range, so one thread, or work too small to share, costs
nothing beyond the call.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

BLOCK = 1 << 15  # elements per block: a few float32 temporaries of it fit a core's L2 cache
HANDOFF_TRIALS = 16  # empty hand-offs a new pool times (~1 ms in all)
# run() shares a kernel's blocks when that saves at least this many hand-offs' time. Measured on the 2-core
# machines (hand-off ~70 us): fp32 GELU over 256 Ki elements (~0.15 ms on one thread) took twice as long
# shared, fp16 GELU and fp32 layer norm over 1 Mi elements (~1 ms) ~30% less.
SHARE_AFTER_HANDOFFS = 4

_pool: ThreadPoolExecutor | None = None
_threads = 1
_lock = threading.Lock()
_WORKER_PREFIX = "nanodist-kernel"
_local = threading.local()  # .sharing: this thread runs one share of a split or run already
_handoff_s = 0.0  # the pool's measured hand-off (handoff_s)


def set_threads(n: int) -> None:
    """Share each kernel's blocks among `n` threads (1: the caller's thread alone); a new pool measures
    its hand-off (handoff_s)."""
    global _pool, _threads, _handoff_s
    with _lock:
        n = max(1, int(n))
        if n == _threads:
            return
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool = ThreadPoolExecutor(n - 1, thread_name_prefix=_WORKER_PREFIX) if n > 1 else None
        _threads = n
        _handoff_s = _measure_handoff(_pool) if _pool is not None else 0.0


def threads() -> int:
    return _threads


def handoff_s() -> float:
    """Median seconds to hand an empty share to a pool worker and have its result back (0 without a pool):
    two thread wake-ups, ~10 us on an idle bare-metal core, ~70 us on this project's 2-core virtual
    machines."""
    return _handoff_s


def _measure_handoff(pool: ThreadPoolExecutor) -> float:
    samples = []
    for _ in range(HANDOFF_TRIALS):
        t0 = time.perf_counter()
        pool.submit(_nothing).result()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _nothing() -> None:
    pass


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
    """fn(lo, hi) over [0, n) in blocks of `block`. The first block runs on the caller's thread and is
    timed; the rest are split into contiguous runs, one per thread, only when the time that saves is
    worth SHARE_AFTER_HANDOFFS hand-offs (handoff_s()): a kernel's blocks each call back into Python
    between compiled loops, and with two threads each such call can wait for the other to let go of the
    GIL. The blocks are the same either way, so are the bits."""
    pool, workers = _shared_pool(), _threads
    start = 0
    if pool is not None and n >= 2 * block:
        t0 = time.perf_counter()
        fn(0, block)
        first, start = time.perf_counter() - t0, block
        left = math.ceil((n - block) / block)
        if first * left * (1 - 1 / workers) >= SHARE_AFTER_HANDOFFS * _handoff_s:
            _run_shared(pool, fn, block, n, block, workers)
            return
    for lo in range(start, n, block):
        fn(lo, min(n, lo + block))


def _run_shared(pool: ThreadPoolExecutor, fn: Callable[[int, int], None], begin: int, n: int, block: int,
                workers: int) -> None:
    """The blocks of [begin, n) (begin on a block boundary) in contiguous runs of whole blocks, one run per
    thread, the caller's thread taking the first."""
    per = math.ceil(math.ceil((n - begin) / block) / workers) * block

    def run_from(start: int) -> None:
        for lo in range(start, min(n, start + per), block):
            fn(lo, min(n, lo + block, start + per))
    futures = [_hand_over(pool, lambda start, _: run_from(start), start, 0)
               for start in range(begin + per, n, per)]
    _as_share(lambda start, _: run_from(start), begin, 0)
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
