"""Batched point-to-point: post several sends and receives at once, return when every one is done.

    exchange(comm, sends=[(dst, array), ...], recvs=[(src, out), ...], phases=[...])

A pipeline stage sends its output forward and its input gradient back while it waits for the next
micro-batch's input and output gradient; done one blocking call at a time, two stages that send to each
other at once deadlock as soon as the messages are larger than what the transport buffers (TCP). So the
whole batch is handed to the transport in one call, as Megatron's batched isend/irecv does:

  threads    every send is a copy posted to its mailbox (never blocks), then the receives are taken
  tcp        one event loop (TcpCommunicator._run) over every send and receive of the batch
  mpi        an Isend or Irecv per message, then one wait on all of them
  groups     the ranks translated to the parent's, then the parent's batch

Several messages between the same two ranks in the same direction keep their order (the transport's FIFO
rule holds inside a batch as across batches).

Non-blocking: `post(comm, sends, recvs, phases)` starts the same batch and returns at once; `done()` tests it,
`wait()` returns once it is complete; `progress(comm)` moves every posted batch as far as it can without
waiting. What may not be touched meanwhile: the sent arrays (the socket transport sends from them) and the
receive buffers, until the batch is complete. Per transport:

  threads    the sends are copied into the mailboxes at once; the receives are taken, in order per source,
             by whichever call finds their message there (progress, done) or waits for it (wait)
  tcp        the batch's messages join a chain per link and direction that stays posted between calls; every
             call steps every chain, and wait runs the event loop over all of them until the batch is done
  mpi        an Isend or Irecv per message; done asks MPI, wait polls them to completion
  groups     the ranks translated, then the parent's
  (others)   the blocking exchange at post: complete at once

A wait moves every batch posted, not only its own, so two ranks whose batches each wait on the other's
posted messages never deadlock; one thread posts and waits for a communicator's batches (the pipeline
executor, on its rank's thread). Each send is metered as `send` meters one: under `phases[i]`
when given (the meter's outermost label still wins), with the batch's time as its seconds, since the
messages of a batch move together and none has a time of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from engine.comm.base import Communicator
from engine.comm.meter import DEFAULT_PHASE

Sends = Sequence[tuple[int, np.ndarray]]
Recvs = Sequence[tuple[int, np.ndarray]]


def exchange(comm: Communicator, sends: Sends, recvs: Recvs, phases: Sequence[str] | None = None) -> None:
    """Send every (dst, array) of `sends` and receive every (src, out) of `recvs` at once; returns when all
    have completed. `out` arrays are preallocated, writeable and C-contiguous, as for `recv`."""
    sends, recvs = _checked(comm, sends, recvs, phases)
    if not sends and not recvs:
        return
    start = time.perf_counter()
    comm._exchange(sends, recvs)
    _meter(comm, sends, phases, time.perf_counter() - start)


class Posted:
    """A batch `post` started: `done()` says whether it is complete, `wait()` returns once it is and meters
    its sends (each under its phase, with the seconds from its post to its completion as seen here)."""

    def __init__(self, comm: Communicator, sends: list, recvs: list, phases: Sequence[str] | None):
        self.comm, self.sends, self.phases = comm, sends, phases
        self._start = time.perf_counter()
        self._handle = comm._post(sends, recvs) if sends or recvs else None
        self._complete = not sends and not recvs

    def done(self) -> bool:
        if not self._complete and self.comm._test(self._handle):
            self._finish()
        return self._complete

    def wait(self) -> None:
        if not self._complete:
            self.comm._complete(self._handle)
            self._finish()

    def _finish(self) -> None:
        self._complete = True
        _meter(self.comm, self.sends, self.phases, time.perf_counter() - self._start)
        self.sends, self._handle = [], None  # nothing here keeps a sent array once it is complete


def post(comm: Communicator, sends: Sends, recvs: Recvs, phases: Sequence[str] | None = None) -> Posted:
    """Start the batch `exchange` would run, and return at once (the module's docstring)."""
    sends, recvs = _checked(comm, sends, recvs, phases)
    return Posted(comm, sends, recvs, phases)


def progress(comm: Communicator) -> None:
    """Move every batch posted on `comm` as far as it can go without waiting."""
    comm._progress()


def _checked(comm: Communicator, sends: Sends, recvs: Recvs,
             phases: Sequence[str] | None) -> tuple[list, list]:
    sends = [(int(dst), np.ascontiguousarray(arr)) for dst, arr in sends]
    recvs = [(int(src), out) for src, out in recvs]
    if phases is not None and len(phases) != len(sends):
        raise ValueError(f"{len(phases)} phases for {len(sends)} sends")
    for peer, _ in (*sends, *recvs):
        comm._check_peer(peer)
    for _, out in recvs:
        if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("exchange receives into preallocated, writeable, C-contiguous numpy arrays")
    return sends, recvs


def _meter(comm: Communicator, sends: list, phases: Sequence[str] | None, seconds: float) -> None:
    meter = comm.meter
    if meter is None:
        return
    me = comm.global_rank(comm.rank)
    outer = meter.current_phase  # a label around the call wins, as everywhere (none: DEFAULT_PHASE)
    for i, (dst, arr) in enumerate(sends):
        phase = phases[i] if phases is not None and outer == DEFAULT_PHASE else outer
        meter.record(phase, me, comm.global_rank(dst), arr.nbytes, seconds, comm.name)
