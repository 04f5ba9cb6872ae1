"""The ring's hops in flight: a hop's exchange runs on a helper thread while the rank's own thread computes
the blocks of the chunk it holds, as Megatron's and picotron's rings post their isend/irecv before a block
and wait after it.

    with Hops(ring.group) as hops:            # one forward or backward pass, on the rank's helper
        hop = hops.post([kv], [phase])        # receive buffers allocated, the exchange queued
        ... blocks on kv (only read: it is what is being sent) ...
        kv = hop.wait()[0]                    # the previous rank's pair, the next one to compute on

Why a thread: the transports offer blocking calls only (engine.comm.exchange: every send and receive of a
batch posted at once, returning when all are done), and NumPy's products and elementwise passes release the
GIL, so the exchange moves beside them. The data-parallel replica's communication thread
(engine.parallel.data.worker) works the same way.

The helper is the rank thread's, kept between passes: starting a thread for every forward and backward pass
cost more than the overlap won on a host where hops are in-process copies (docs/context-parallel.md). It
ends after IDLE_S without a hop, so a finished run leaves none behind. The exchanges of one pass run in the
order posted; after one fails the rest of that pass are skipped (each wait re-raises the first error), and
a pass waits for all it posted before it returns, even on an error, so no hop outlives its pass.

One thread drives a communicator at a time (engine.comm.base): while a hop is in flight the rank's thread
only computes, and every hop is waited for before a forward or backward returns. Nothing else drives the
transport meanwhile: with a context-parallel model the replica runs its collectives on the rank's thread
(engine.parallel.data.replica), and tensor parallelism's run outside the ring. Exchanges run in the order
they were posted, the same on every rank, so their messages match up (one FIFO per pair of ranks).

Double buffering: a hop receives into new arrays while the blocks read the ones it sends. The ledger counts
the received ones as communication buffers from post to wait; the caller's own count covers the arrays it
holds, which the received ones then replace. The ledger and the meter's labels belong to the rank's thread
(both are thread-local): the ledger is captured here, the caller's labels are carried onto the helper.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack

import numpy as np

from engine.comm.base import Communicator
from engine.comm.exchange import exchange
from engine.comm.meter import DEFAULT_ALGORITHM, DEFAULT_PHASE
from engine.memory.ledger import rank_ledger
from engine.parallel.data.worker import CommTask

IDLE_S = 1.0  # a rank's helper thread ends after this long without a hop


class _Helper:
    """One rank thread's hop thread: runs tasks in order, started by the first and ended when idle."""

    def __init__(self, name: str):
        self._name = name
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._running = False

    def submit(self, fn: Callable[[], None]) -> CommTask:
        task = CommTask(fn)
        with self._lock:
            self._queue.put(task)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=self._name, daemon=True).start()
        return task

    def _run(self) -> None:
        while True:
            try:
                task = self._queue.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:  # a task submitted meanwhile is seen here, or starts a new thread
                    if self._queue.empty():
                        self._running = False
                        return
                continue
            try:
                task.fn()
            except BaseException as e:  # handed to the rank's thread by wait()
                task.error = e
            finally:
                task.done.set()


_rank_thread = threading.local()


def _helper(rank: int) -> _Helper:
    """The calling rank thread's helper (ranks are threads of one process on the threads backend)."""
    if not hasattr(_rank_thread, "helper"):
        _rank_thread.helper = _Helper(f"cp-hops-rank{rank}")
    return _rank_thread.helper


class Hop:
    """One exchange in flight; `wait()` returns the arrays it received (and re-raises its error)."""

    def __init__(self, task: CommTask, received: list[np.ndarray], release: Callable[[], None]):
        self._task, self._received, self._release = task, received, release

    def wait(self) -> list[np.ndarray]:
        self._task.wait()
        self._release()  # the caller holds them from here on, in place of what it sent
        return self._received


class Hops:
    """The hops of one ring pass over `group`: each sends to the next rank and receives from the previous."""

    def __init__(self, group: Communicator):
        self.group = group
        self.ledger = rank_ledger()
        self._posted: list[CommTask] = []
        self._error: BaseException | None = None

    def post(self, arrays: Sequence[np.ndarray], phases: Sequence[str]) -> Hop:
        """Queue the exchange of `arrays` (not to be written until the hop is waited for) with the
        previous rank's arrays of the same shapes, booked under `phases`."""
        c, r = self.group.world_size, self.group.rank
        received = [np.empty(a.shape, a.dtype) for a in arrays]
        sends = [((r + 1) % c, a) for a in arrays]
        recvs = [((r - 1) % c, a) for a in received]
        labelled = self._labels()

        def run() -> None:
            if self._error is not None:  # an earlier hop of this pass failed: its error, not a new wait
                raise self._error
            try:
                with labelled():
                    exchange(self.group, sends, recvs, list(phases))
            except BaseException as e:
                self._error = e
                raise

        nbytes = sum(a.nbytes for a in received)
        self.ledger.add("comm_buffers", nbytes)
        self._posted.append(_helper(self.group.rank).submit(run))
        return Hop(self._posted[-1], received, lambda: self.ledger.sub("comm_buffers", nbytes))

    def _labels(self) -> Callable[[], ExitStack]:
        """The caller's outer meter labels, to enter on the helper thread (an outer label wins there as on
        the rank's thread)."""
        meter = self.group.meter
        phase = DEFAULT_PHASE if meter is None else meter.current_phase
        algorithm = DEFAULT_ALGORITHM if meter is None else meter.current_algorithm

        def enter() -> ExitStack:
            stack = ExitStack()
            if meter is not None and phase != DEFAULT_PHASE:
                stack.enter_context(meter.phase(phase))
            if meter is not None and algorithm != DEFAULT_ALGORITHM:
                stack.enter_context(meter.algorithm(algorithm))
            return stack
        return enter

    def __enter__(self) -> Hops:
        return self

    def __exit__(self, *exc) -> None:
        for task in self._posted:  # only after an error can one still be running
            task.done.wait()
