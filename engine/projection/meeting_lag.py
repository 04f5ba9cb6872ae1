"""How late the last rank reaches a collective when ranks outnumber the host's cores (time-slicing).

With more busy ranks than cores, the scheduler runs them in turns: at any moment some rank is off its core,
and a collective completes only once the last rank, the one the scheduler ran last, reaches it. So under
time-slicing every meeting of the ranks costs a lag of about a scheduler time slice, beside the compute
that the time-slicing stretches (engine.projection.compute's demand factor) — where nothing hides it (the
last bucket after backward, a blocking all-reduce) it is waited for. Measured, not assumed: 2 × cores rank
processes (one thread each) compute a fixed chunk of CHUNK_S seconds between barriers, and the lag is how
long a rank waits at a barrier: the median over rounds (a burst of load hits a round), then over ranks.
Chunks longer than a time slice (tens of milliseconds) measure the slice itself: 2, 10 and 34 ms chunks
gave waits of 2.0, 3.3 and 4.3 ms per meeting on this 2-core machine. How much of the lag a step waits
for is the step model's business (engine.projection.timeline: the late rank catches up while the others
wait on communication).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from engine.comm.launch import run_ranks

CHUNK_S = 0.03  # seconds of compute between two meetings, on a core of its own
ROUNDS = 12


def measure_meeting_lag(cores: int) -> float:
    """Seconds the ranks wait at each meeting with 2 ranks per core (0 on a host without cores to count)."""
    if cores < 1:
        return 0.0
    waits = run_ranks(2 * cores, "processes", _lag_rank, (ROUNDS, CHUNK_S), timeout_s=120.0)
    return statistics.median(waits)


def _chunk(a: np.ndarray, reps: int) -> None:
    for _ in range(reps):
        a @ a


def _lag_rank(comm, emit, rounds: int, chunk_s: float) -> float:
    """This rank's median wait at a barrier after each chunk of compute (the first round discarded)."""
    a = np.ones((160, 160), np.float32)
    t0 = time.thread_time()
    _chunk(a, 20)
    reps = max(1, round(20 * chunk_s / max(time.thread_time() - t0, 1e-6)))  # chunk_s of this thread's CPU
    comm.barrier()
    waits = []
    for _ in range(rounds + 1):
        _chunk(a, reps)
        t1 = time.perf_counter()
        comm.barrier()
        waits.append(time.perf_counter() - t1)
    return statistics.median(waits[1:])
