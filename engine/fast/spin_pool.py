"""Workers that wait for the rank's next share polling with the GIL released, and run a product's share with
no Python at all: engine.fast.thread_pool's workers where numba is installed.

Why: a gpt-mini step is ~50 matrix products of 0.2-1.5 ms and ~30 shared elementwise kernels. MKL keeps
products of these sizes on the calling thread (its heuristics; measured: the same time with 1 or 2 MKL
threads), and a share handed to a sleeping thread waits for its wake-up (42-82 us on the 2-core virtual
machines, twice per hand-off). PyTorch's OpenMP team spins between ops, so it runs every op on both
cores. Here each worker, after a share, polls for the next one for SPIN_S before it sleeps
(engine.fast.spin_jit.serve, compiled, no GIL); a product is cut into row blocks, one single-threaded MKL
call each, the worker's started from its compiled loop.

Never slower than one thread by more than the bookkeeping: a share no worker has started when the caller
has finished its own is taken back and run by the caller (a worker that sleeps, or that the OS has not given
a core, costs no wait). A sleeping worker is woken for the next shares, not waited for.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from types import ModuleType

import numpy as np

from engine.fast.compiled import load

SPIN_S = 2e-3  # a worker polls this long after its last share before it sleeps
# A worker that finds two of its polls more than PREEMPTED_S apart (the OS ran other work on its core) does
# not poll for CALM_S after: on a machine with more work than cores, polling takes cores from work that needs
# them (measured at load 12: steps ~2x slower polling than sleeping). Meanwhile it serves as a sleeping pool's
# worker (woken by each post) and products are not split for it (Worker.calm).
PREEMPTED_S = 1e-3
CALM_S = 0.02
_POLL_TRIALS = 1 << 16  # polls timed to size SPIN_S in polls


def _cycles_per_second(jit: ModuleType) -> float:
    t0, c0 = time.perf_counter(), jit.cycles()
    time.sleep(0.002)
    return (jit.cycles() - c0) / (time.perf_counter() - t0)


def _polls_per_second(jit: ModuleType) -> float:
    ctl = np.zeros(jit.CTL_WORDS, np.int64)
    jit.idle_polls(ctl, 16)  # compiled already (cache), but warm
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        jit.idle_polls(ctl, _POLL_TRIALS)
        best = min(best, time.perf_counter() - t0)
    return _POLL_TRIALS / max(best, 1e-9)


class Worker:
    """One thread serving shares posted to it one at a time (`post`, then `finish`)."""

    def __init__(self, jit: ModuleType, name: str, polls: int, gap: int):
        self.jit, self.polls, self.gap = jit, polls, gap
        self.calm_until = 0.0  # no polling before this time (perf_counter): it was preempted
        self.ctl = np.zeros(jit.CTL_WORDS, np.int64)
        self.job = np.zeros(jit.JOB_WORDS, np.int64)
        self.seq = 0
        self.task: Callable[[], None] | None = None
        self.error: BaseException | None = None
        self.sleeping = False
        self._wake = threading.Event()
        # held by the rank thread whose share the worker has: thread ranks of one process share the pool,
        # and a worker takes one share at a time (a caller that finds it held runs its share itself)
        self.owner = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        jit, ctl = self.jit, self.ctl
        seen = done = 0
        while True:
            calm = time.perf_counter() < self.calm_until
            answer, seen = jit.serve(ctl, self.job, seen, 1 if calm else self.polls, self.gap, done)
            done = 0
            if answer == jit.RUN_PYTHON:
                try:
                    self.task()  # type: ignore[misc]
                except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
                    self.error = e
                done = seen  # marked done by the next serve(), which polls on with the GIL let go
            elif answer == jit.STOPPED:
                return
            else:  # nothing for SPIN_S (or preempted): sleep until the next post wakes it
                if answer == jit.PREEMPTED:
                    self.calm_until = time.perf_counter() + CALM_S
                self.sleeping = True
                calm_s = self.calm_until - time.perf_counter()
                if calm_s > 0:  # a sleeping worker's, woken by each post, till the calm ends
                    self._wake.wait(calm_s)
                elif ctl[jit.POSTED] == seen and not ctl[jit.STOP_FLAG]:
                    self._wake.wait()
                self._wake.clear()
                self.sleeping = False

    def calm(self) -> bool:
        """Whether the worker polls for no shares now (it was preempted, CALM_S ago at most): it takes the
        kernels' shares after a wake-up, as a sleeping pool's worker, and no product's blocks."""
        return time.perf_counter() < self.calm_until

    def post(self) -> int:
        """Post the job whose words (self.job, self.task) the caller, holding `owner`, has written: its
        sequence number."""
        self.seq += 1
        self.jit.post(self.ctl, self.seq)
        if self.sleeping:
            self._wake.set()
        return self.seq

    def take_back(self, seq: int) -> Callable[[], None] | None:
        """The posted Python share seq, for the caller to run, if no worker started it (else None)."""
        if not self.jit.take_back(self.ctl, seq):
            return None
        task, self.task = self.task, None
        return task

    def wait_python(self, seq: int) -> None:
        """Wait for the Python share seq a worker took; its exception, if any, is raised here."""
        self._wait(seq)
        self.task = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def finish_gemm(self, seq: int) -> None:
        """After the caller's own block: the worker's product block, run here if it had not started it."""
        if self.jit.finish_gemm(self.ctl, self.job, seq, self.polls) == self.jit.STILL_RUNNING:
            self._wait(seq)

    def _wait(self, seq: int) -> None:
        jit, ctl = self.jit, self.ctl
        while not jit.wait_done(ctl, seq, self.polls):
            time.sleep(0)  # the worker has its share but no core: let it have this one

    def stop(self) -> None:
        self.ctl[self.jit.STOP_FLAG] = 1
        self._wake.set()
        self.thread.join()


def start(n: int, name: str) -> list[Worker] | None:
    """n workers, or None where numba is missing."""
    jit = load("spin_jit")
    if jit is None:
        return None
    polls = max(1, int(SPIN_S * _polls_per_second(jit)))
    gap = int(PREEMPTED_S * _cycles_per_second(jit))
    return [Worker(jit, f"{name}-{i}", polls, gap) for i in range(n)]
