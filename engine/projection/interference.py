"""How much a collective running beside compute slows that compute, per CPU second the collective takes.

A rank's communication thread (engine.parallel.data.worker) runs its collectives while the training thread
goes on with backward (or, under ZeRO-3, forward). Where the ranks' threads fill the host's cores, the
collective's CPU time (calibrate.py measures it: framing, system calls, copies, reductions, the ring's
Python) comes out of compute twice over: it occupies a core that a training thread — this rank's or
another's — would use, and while it runs Python it holds this process's interpreter lock, so this rank's
training thread, itself mostly Python between its NumPy calls, waits for it even when a core is free.
So the slowdown of compute per CPU second of communication beside it, κ, is about 1 to 2 on a full host,
and it is measured rather than assumed:

    each busy rank runs forward + backward of the model alone, then again while a second thread runs our
    all-reduce of one bucket every GAP_S (as buckets leave during backward), that thread's CPU seconds
    counted around each step, and times how long its training thread did NOT run in a step (wall time
    minus the thread's own CPU time: descheduled, or waiting for the interpreter lock):
                                   κ = (off-CPU with − off-CPU alone) / (those CPU seconds per step)

Off-CPU time, not the step time, because the machine's own speed drifts by several per cent within
seconds on a shared host: that changes the step's CPU time and its wall time alike, and cancels here,
where a difference of two step times would drown a few milliseconds of interference in it.

The model's own compute between two all-reduces evicts the caches, as in a training step. So does the
ranks' drift: the ranks reach an all-reduce at different moments, and the one that waits pays for it on the
CPU too. A collective beside compute therefore takes more CPU time than the idle, cold one calibrate.py
fits; the median of what one took here is kept, and the projection scales the fitted CPU time of every
overlapping collective by that ratio at this bucket size (compute.py). Step times are
medians; "alone" is the mean of runs before and after.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

from engine.comm.collectives import all_reduce

STEPS = 6  # timed steps alone before, alone after, and (about) beside the communication
GAP_S = 0.01  # pause between two of the communication thread's all-reduces: a few per backward, as buckets


def kappa(alone_s: float, with_s: float, cpu_s: float) -> float:
    """Slowdown of compute per CPU second of communication beside it (1 when none ran to tell)."""
    if cpu_s <= 0:
        return 1.0
    return max(0.0, (with_s - alone_s) / cpu_s)


def measure_interference(comm, step: Callable[[], None], nbytes: int) -> dict:
    """{"interference": κ, "interference_cpu_s": the median CPU seconds of one all-reduce beside
    compute, "interference_bytes": its size} of this rank (see the module docstring). `step` runs one
    forward and backward of the model on a communicator of its own; this rank's `comm`, shared with the
    other busy ranks, carries the communication thread's all-reduces of `nbytes` meanwhile (and nothing
    else until they are done)."""

    def off_cpu(seconds: list[float]) -> float:
        """Run one step; append its wall time minus this thread's CPU time in it (the time it did not
        run) to `seconds`, and return its wall time."""
        t0, c0 = time.perf_counter(), time.thread_time()
        step()
        wall = time.perf_counter() - t0
        seconds.append(wall - (time.thread_time() - c0))
        return wall

    def alone() -> tuple[float, float]:
        """(median off-CPU seconds, median wall seconds) of STEPS steps."""
        off: list[float] = []
        walls = [off_cpu(off) for _ in range(STEPS)]
        return statistics.median(off), statistics.median(walls)

    comm.barrier()
    before, step_s = alone()
    buf = np.zeros(max(1, nbytes // 4), np.float32)  # sums of zeros: no overflow however many rounds
    comm.barrier()  # time one all-reduce itself, not the wait for a rank still stepping
    t0 = time.perf_counter()
    all_reduce(comm, buf)
    slowest = np.array([step_s, time.perf_counter() - t0], np.float64)
    all_reduce(comm, slowest, op="max")  # so that every rank runs the same number of all-reduces
    rounds = math.ceil((STEPS + 2) * float(slowest[0]) / (GAP_S + float(slowest[1])))
    spent = [0.0]  # the communication thread's CPU seconds in its collectives so far
    each: list[float] = []  # the CPU seconds of each of them

    def communicate() -> None:
        for _ in range(rounds):
            c0 = time.thread_time()
            all_reduce(comm, buf)
            each.append(time.thread_time() - c0)
            spent[0] += each[-1]
            time.sleep(GAP_S)

    worker = threading.Thread(target=communicate, name="interference-comm", daemon=True)
    worker.start()
    offs: list[float] = []
    cpus: list[float] = []
    while worker.is_alive():
        c0 = spent[0]
        off_cpu(offs)
        if worker.is_alive():  # a step the communication ran beside from start to end
            cpus.append(spent[0] - c0)
        else:
            offs.pop()
    worker.join()
    after, _ = alone()
    comm.barrier()
    cpu_each = statistics.median(each)
    if len(offs) < 3:
        return {"interference": 1.0, "interference_cpu_s": cpu_each, "interference_bytes": buf.nbytes}
    offs, cpus = offs[1:], cpus[1:]  # the first step saw the thread start
    return {"interference": kappa((before + after) / 2, statistics.median(offs), statistics.mean(cpus)),
            "interference_cpu_s": cpu_each, "interference_bytes": buf.nbytes}
