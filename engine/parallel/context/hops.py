"""The ring's hops in flight: a hop's exchange runs on a helper thread while the rank's own thread computes
the blocks of the chunk it holds, as Megatron's and picotron's rings post their isend/irecv before a block
and wait after it.

    with Hops(ring.group) as hops:            # one helper thread for one forward or one backward
        hop = hops.post([kv], [phase])        # receive buffers allocated, the exchange queued
        ... blocks on kv (only read: it is what is being sent) ...
        kv = hop.wait()[0]                    # the previous rank's pair, the next one to compute on

Why a thread: the transports offer blocking calls only (engine.comm.exchange: every send and receive of a
batch posted at once, returning when all are done), and NumPy's products and elementwise passes release the
GIL, so the exchange moves beside them. The data-parallel replica's communication thread
(engine.parallel.data.worker, reused here) works the same way.

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

from collections.abc import Callable, Sequence
from contextlib import ExitStack

import numpy as np

from engine.comm.base import Communicator
from engine.comm.exchange import exchange
from engine.comm.meter import DEFAULT_ALGORITHM, DEFAULT_PHASE
from engine.memory.ledger import rank_ledger
from engine.parallel.data.worker import CommTask, CommWorker


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
        self._worker = CommWorker(group.rank, inline=group.world_size == 1)

    def post(self, arrays: Sequence[np.ndarray], phases: Sequence[str]) -> Hop:
        """Queue the exchange of `arrays` (not to be written until the hop is waited for) with the
        previous rank's arrays of the same shapes, booked under `phases`."""
        c, r = self.group.world_size, self.group.rank
        received = [np.empty(a.shape, a.dtype) for a in arrays]
        sends = [((r + 1) % c, a) for a in arrays]
        recvs = [((r - 1) % c, a) for a in received]
        labelled = self._labels()

        def run() -> None:
            with labelled():
                exchange(self.group, sends, recvs, list(phases))

        nbytes = sum(a.nbytes for a in received)
        self.ledger.add("comm_buffers", nbytes)
        return Hop(self._worker.submit(run), received, lambda: self.ledger.sub("comm_buffers", nbytes))

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
        self._worker.close()
