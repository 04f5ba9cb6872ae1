"""Work split into blocks and shared among the rank's threads: the pool behind engine.fast.lowp's
conversions and engine.fast.kernels' fused ops.

Why blocks: a chain of NumPy passes over a block of BLOCK elements keeps the block's temporaries in
the core's cache between passes, where whole-array passes each go through main memory. Why threads:
NumPy's elementwise loops run on one core; handing contiguous runs of blocks to `threads` workers
lets the rank's cores share the work, as they share its matrix products (BLAS). NumPy releases the
GIL inside its loops, so the workers really run at once.

`set_threads(n)` sizes the pool (engine.comm.cores does, with the figure it gives BLAS); 1 runs every
block on the caller's thread. Where numba is installed the workers are engine.fast.spin_pool's: they poll
for the next share with the GIL released for a while after each, and a share none has started when the
caller finishes its own is run by the caller; else a ThreadPoolExecutor's, which sleep between shares.

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
import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from engine.fast import spin_pool

BLOCK = 1 << 15  # elements per block: a few float32 temporaries of it fit a core's L2 cache
HANDOFF_TRIALS = 16  # empty hand-offs a new pool times (~1 ms in all)
# run() shares a kernel's blocks when that saves at least this many hand-offs' time (handoff_s(), timed when
# the pool starts): a short kernel shared lost to its hand-offs, a long one gained (docs/benchmarks.md,
# "Blocks are shared only when that repays the hand-offs").
SHARE_AFTER_HANDOFFS = 4
SPIN_VAR = "NANODIST_SPIN"  # "1" / "0" (or on/off, true/false, yes/no): polling workers or sleeping ones
# Polling workers (engine.fast.spin_pool) where numba is installed: True, False (the executor's sleeping
# ones), or None (unset): polling where the products run on MKL (engine.fast.blas sets
# `products_split` at import), which splits them among the workers. On NumPy's OpenBLAS a product wakes
# OpenBLAS's own threads, which then compete with a polling worker for the cores: measured, gpt-mini's
# step 1.40-1.43x PyTorch's with polling workers against 1.14-1.17x with sleeping ones (docs/benchmarks.md).
_SWITCH = {"1": True, "on": True, "true": True, "yes": True,
           "0": False, "off": False, "false": False, "no": False}
SPIN: bool | None = _SWITCH.get(os.environ.get(SPIN_VAR, "").strip().lower())


def products_split() -> bool:
    """Whether engine.fast.blas splits products among polling workers (it replaces this at import)."""
    return False

_pool: ThreadPoolExecutor | None = None
_spin: list[spin_pool.Worker] | None = None  # the polling workers, where numba is installed (else _pool's)
_threads = 1
_lock = threading.Lock()
_WORKER_PREFIX = "nanodist-kernel"
_local = threading.local()  # .sharing: this thread runs one share of a split or run already
_handoff_s = 0.0  # the pool's measured hand-off (handoff_s)


def set_threads(n: int) -> None:
    """Share each kernel's blocks among `n` threads (1: the caller's thread alone); a new pool measures
    its hand-off (handoff_s)."""
    global _pool, _spin, _threads, _handoff_s
    with _lock:
        n = max(1, int(n))
        if n == _threads:
            return
        if _pool is not None:
            _pool.shutdown(wait=False)
        for worker in _spin or ():
            worker.stop()
        _pool, _spin = None, None
        if n > 1 and (products_split() if SPIN is None else SPIN):
            _spin = spin_pool.start(n - 1, _WORKER_PREFIX)
        if n > 1 and _spin is None:
            _pool = ThreadPoolExecutor(n - 1, thread_name_prefix=_WORKER_PREFIX)
        _threads = n
        _handoff_s = _measure_handoff() if n > 1 else 0.0


def threads() -> int:
    return _threads


def handoff_s() -> float:
    """Median seconds to hand an empty share to a pool worker and have its result back (0 without a pool):
    two thread wake-ups, ~10 us on an idle bare-metal core, ~70 us on this project's 2-core virtual
    machines."""
    return _handoff_s


def _measure_handoff() -> float:
    samples = []
    for _ in range(HANDOFF_TRIALS):
        t0 = time.perf_counter()
        _hand_over(0, _nothing, 0, 0).result()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def spin_workers() -> list[spin_pool.Worker] | None:
    """The polling workers a caller may hand product blocks to now (engine.fast.blas), or None: none
    started, or this thread runs a share already (nested work stays on it)."""
    return _spin if _sharing_allowed() else None


def _nothing(lo: int = 0, hi: int = 0) -> None:
    pass


def _sharing_allowed() -> bool:
    """False inside a share of work already handed out (nested calls: a conversion inside one range of a
    split): every thread is busy with its own share, and a worker waiting for other workers could leave
    nobody free to run them."""
    in_share = getattr(_local, "sharing", False)
    return not (in_share or threading.current_thread().name.startswith(_WORKER_PREFIX))


def _shared_pool() -> bool:
    """Whether to hand work to the workers (there are some, and _sharing_allowed)."""
    return (_pool is not None or _spin is not None) and _sharing_allowed()


def _as_share(fn: Callable[[int, int], None], lo: int, hi: int) -> None:
    """fn(lo, hi) on the caller's thread as its share of handed-out work (nested calls stay here)."""
    _local.sharing = True
    try:
        fn(lo, hi)
    finally:
        _local.sharing = False


class _Posted:
    """A share posted to a polling worker; result() as a Future's (the caller may run the share itself)."""

    def __init__(self, worker: spin_pool.Worker, seq: int):
        self.worker, self.seq = worker, seq

    def result(self) -> None:
        """The share's end: run here (as a share: nested calls stay on this thread) if no worker started
        it, else waited for."""
        try:
            task = self.worker.take_back(self.seq)
            if task is None:
                self.worker.wait_python(self.seq)
            else:
                _as_share(lambda lo, hi: task(), 0, 0)
        finally:
            self.worker.owner.release()


class _Inline:
    """A share whose worker another rank thread holds: run by the caller when it asks for the result."""

    def __init__(self, share: Callable[[], None]):
        self.share = share

    def result(self) -> None:
        self.share()


def _hand_over(i: int, fn: Callable[[int, int], None], lo: int, hi: int) -> Future | _Posted | _Inline:
    """fn(lo, hi) on worker i under the caller's NumPy error state (a state is per thread: a backward
    that expects overflow, under fp16 loss scaling, has turned its warnings off on the rank's thread)."""
    state = np.geterr()

    def share() -> None:
        with np.errstate(**state):
            fn(lo, hi)
    if _spin is not None:
        worker = _spin[i]
        if not worker.owner.acquire(blocking=False):
            return _Inline(lambda: _as_share(fn, lo, hi))
        worker.job[worker.jit.KIND], worker.task = worker.jit.PYTHON, share
        return _Posted(worker, worker.post())
    assert _pool is not None
    return _pool.submit(share)


def run(fn: Callable[[int, int], None], n: int, block: int = BLOCK) -> None:
    """fn(lo, hi) over [0, n) in blocks of `block`. The first block runs on the caller's thread and is
    timed; the rest are split into contiguous runs, one per thread, only when the time that saves is
    worth SHARE_AFTER_HANDOFFS hand-offs (handoff_s()): a kernel's blocks each call back into Python
    between compiled loops, and with two threads each such call can wait for the other to let go of the
    GIL. The blocks are the same either way, so are the bits."""
    pool, workers = _shared_pool(), _threads
    start = 0
    if pool and n >= 2 * block:
        t0 = time.perf_counter()
        fn(0, block)
        first, start = time.perf_counter() - t0, block
        left = math.ceil((n - block) / block)
        if first * left * (1 - 1 / workers) >= SHARE_AFTER_HANDOFFS * _handoff_s:
            _run_shared(fn, block, n, block, workers)
            return
    for lo in range(start, n, block):
        fn(lo, min(n, lo + block))


def _run_shared(fn: Callable[[int, int], None], begin: int, n: int, block: int, workers: int) -> None:
    """The blocks of [begin, n) (begin on a block boundary) in contiguous runs of whole blocks, one run per
    thread, the caller's thread taking the first."""
    per = math.ceil(math.ceil((n - begin) / block) / workers) * block

    def run_from(start: int) -> None:
        for lo in range(start, min(n, start + per), block):
            fn(lo, min(n, lo + block, start + per))
    futures = [_hand_over(i, lambda start, _: run_from(start), start, 0)
               for i, start in enumerate(range(begin + per, n, per))]
    _as_share(lambda start, _: run_from(start), begin, 0)
    for future in futures:
        future.result()


def split(fn: Callable[[int, int], None], n: int, grain: int = 1) -> None:
    """fn(lo, hi) once per range of a split of [0, n) into at most `threads()` contiguous ranges of at
    least `grain` items each (fewer ranges when n is small; one, on the caller's thread, below 2 grains)."""
    pool, workers = _shared_pool(), min(_threads, n // max(1, grain))
    if not pool or workers < 2:
        if n > 0:
            fn(0, n)
        return
    bounds = [n * i // workers for i in range(workers + 1)]
    futures = [_hand_over(i, fn, lo, hi) for i, (lo, hi) in enumerate(zip(bounds[1:-1], bounds[2:]))]
    _as_share(fn, bounds[0], bounds[1])
    for future in futures:
        future.result()
