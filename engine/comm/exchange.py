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
rule holds inside a batch as across batches). Each send is metered as `send` meters one: under `phases[i]`
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
    sends = [(int(dst), np.ascontiguousarray(arr)) for dst, arr in sends]
    recvs = [(int(src), out) for src, out in recvs]
    if phases is not None and len(phases) != len(sends):
        raise ValueError(f"{len(phases)} phases for {len(sends)} sends")
    for peer, _ in (*sends, *recvs):
        comm._check_peer(peer)
    for _, out in recvs:
        if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("exchange receives into preallocated, writeable, C-contiguous numpy arrays")
    if not sends and not recvs:
        return
    start = time.perf_counter()
    comm._exchange(sends, recvs)
    meter = comm.meter
    if meter is None:
        return
    seconds, me = time.perf_counter() - start, comm.global_rank(comm.rank)
    outer = meter.current_phase  # a label around the call wins, as everywhere (none: DEFAULT_PHASE)
    for i, (dst, arr) in enumerate(sends):
        phase = phases[i] if phases is not None and outer == DEFAULT_PHASE else outer
        meter.record(phase, me, comm.global_rank(dst), arr.nbytes, seconds, comm.name)
