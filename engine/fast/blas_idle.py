"""OpenBLAS's idle worker threads sleep at once instead of spinning: set before NumPy loads OpenBLAS.

Why: after each matrix product OpenBLAS's worker threads busy-wait for the next one, by default for
2^28 cycles (~0.1 s). Between two products a rank runs its own elementwise work, shared among its
threads (engine.fast.thread_pool): the spinning BLAS worker holds a core that work needs, so on a rank with
two threads the "shared" kernels ran on one core and a half. With the workers asleep at once, gpt-mini's step
came closer to PyTorch's: a wake-up costs microseconds, the spin milliseconds per step (the runs, with their
machine, in docs/benchmark-history.md).

OpenBLAS reads the variable once, when the library loads, so this runs from engine/__init__.py, before
any engine module imports NumPy; rank processes inherit it. A value the user set is kept. In a process
that loaded NumPy before importing the engine it has no effect (nothing can change it at run time).
"""

from __future__ import annotations

import os

THREAD_TIMEOUT_VAR = "OPENBLAS_THREAD_TIMEOUT"
THREAD_TIMEOUT = "4"  # log2 of the spin in cycles; 4 is OpenBLAS's minimum


def sleep_when_idle() -> None:
    """Ask OpenBLAS (when it has not loaded yet) to put idle workers to sleep at once."""
    os.environ.setdefault(THREAD_TIMEOUT_VAR, THREAD_TIMEOUT)
