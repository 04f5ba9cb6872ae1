"""Ring collectives, written once over Communicator point-to-point calls; transports only move bytes.

All work in place on a flat, C-contiguous 1-D buffer. The buffer of n elements is cut into N
shards with ``shard_bounds`` (sizes differ by at most one; some are empty when n < N). Nothing is
padded: only real elements travel, so the meter counts exactly what moves. When N divides n,
every rank sends exactly (N−1)/N·S bytes in reduce-scatter and again in all-gather: 2(N−1)/N·S
for all-reduce. Otherwise rank r sends S − |shard r| in reduce-scatter and S − |shard r+1| in
all-gather.

Overlap: each ring step moves its shard in segments of ``segment_bytes``, and every segment is
received with reduce-on-receive: the transport reduces each piece as it lands, while the peer is
still writing the next one (shared-memory slots, socket buffers).

Reduction: sum, avg, max. float16 and bfloat16 are reduced pairwise in float32 and rounded back
after each addition — the same values as native float16/bfloat16 arithmetic (float32 has more than
twice their precision, so the double rounding is harmless) at float32 speed. avg divides the
reduced shard by N once, before the all-gather; it is defined for floating dtypes only. Each
shard is reduced by exactly one rank and then copied, so all ranks end bitwise identical.
"""

from __future__ import annotations

import numpy as np

from engine.comm.base import Communicator, Reduce
from engine.comm.meter import metered_phase
from engine.dtypes import LOW_PRECISION
from engine.flat import shard_bounds

SEGMENT_BYTES = 4 << 20
OPS = ("sum", "avg", "max")
ALGORITHMS = ("ring", "mpi-native")


def reduce_scatter(comm: Communicator, buf: np.ndarray, op: str = "sum", *,
                   segment_bytes: int = SEGMENT_BYTES) -> tuple[int, int]:
    """Leave this rank's shard of ``buf`` reduced over all ranks; returns its (start, end).
    The rest of ``buf`` holds partial sums afterwards."""
    reduce = _reducer(op, _check(buf))
    n, size, rank = buf.size, comm.world_size, comm.rank
    shard = [shard_bounds(n, size, r) for r in range(size)]
    with metered_phase(comm.meter, "reduce-scatter"):
        # Step s: send shard r−s−1 (holding s+1 contributions), fold the incoming shard r−s−2 into
        # ours; after N−1 steps shard r has all N contributions.
        for step in range(size - 1):
            out, inc = shard[(rank - step - 1) % size], shard[(rank - step - 2) % size]
            _exchange(comm, buf[out[0]:out[1]], buf[inc[0]:inc[1]], reduce, segment_bytes)
    start, end = shard[rank]
    if op == "avg":
        _divide(buf[start:end], size)
    return start, end


def all_gather(comm: Communicator, buf: np.ndarray, *, segment_bytes: int = SEGMENT_BYTES) -> None:
    """Every rank contributes its shard (``shard_bounds``) of ``buf``; all end with the whole buffer."""
    _check(buf)
    n, size, rank = buf.size, comm.world_size, comm.rank
    shard = [shard_bounds(n, size, r) for r in range(size)]
    with metered_phase(comm.meter, "all-gather"):
        for step in range(size - 1):
            out, inc = shard[(rank - step) % size], shard[(rank - step - 1) % size]
            _exchange(comm, buf[out[0]:out[1]], buf[inc[0]:inc[1]], None, segment_bytes)


def all_reduce(comm: Communicator, buf: np.ndarray, op: str = "sum", algorithm: str = "ring", *,
               segment_bytes: int = SEGMENT_BYTES) -> None:
    """In place: ``buf`` ends as the reduction over all ranks, bitwise identical everywhere.
    ``algorithm="mpi-native"`` hands the buffer to MPI's own Allreduce (mpi backend only)."""
    if algorithm == "mpi-native":
        native = getattr(comm, "native_all_reduce", None)
        if native is None:
            raise ValueError("algorithm 'mpi-native' needs the mpi backend; use algorithm='ring'")
        native(buf, op)
        return
    if algorithm != "ring":
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    reduce_scatter(comm, buf, op, segment_bytes=segment_bytes)
    all_gather(comm, buf, segment_bytes=segment_bytes)


def broadcast(comm: Communicator, buf: np.ndarray, root: int = 0, *,
              segment_bytes: int = SEGMENT_BYTES) -> None:
    """Copy ``root``'s buffer to every rank through a pipelined chain root → root+1 → …, segment by
    segment, so every link carries S bytes once (busbw factor 1)."""
    _check(buf)
    size = comm.world_size
    position = (comm.rank - root) % size
    nxt, prv = (comm.rank + 1) % size, (comm.rank - 1) % size
    with metered_phase(comm.meter, "broadcast"):
        for segment in _segments(buf, segment_bytes):
            if position > 0:
                comm.recv(prv, segment)
            if position < size - 1:
                comm.send(nxt, segment)


def _exchange(comm: Communicator, outgoing: np.ndarray, incoming: np.ndarray, reduce: Reduce | None,
              segment_bytes: int) -> None:
    """One ring step: outgoing to the next rank while incoming arrives from the previous one.
    Both sides cut a shard at the same offsets, so segment j of a send meets segment j of a recv;
    shards may differ in size by one element, hence the one-sided tail."""
    nxt, prv = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    outs, ins = _segments(outgoing, segment_bytes), _segments(incoming, segment_bytes)
    for j in range(max(len(outs), len(ins))):
        if j < len(outs) and j < len(ins):
            comm.sendrecv(nxt, outs[j], prv, ins[j], reduce)
        elif j < len(outs):
            comm.send(nxt, outs[j])
        else:
            comm.recv(prv, ins[j], reduce)


def _segments(view: np.ndarray, segment_bytes: int) -> list[np.ndarray]:
    step = max(1, segment_bytes // view.itemsize)
    return [view[i:i + step] for i in range(0, view.size, step)]


def _reducer(op: str, dtype: np.dtype) -> Reduce:
    if op not in OPS:
        raise ValueError(f"unknown reduction {op!r}; expected one of {OPS}")
    if op == "avg" and dtype.kind != "f" and dtype not in LOW_PRECISION:
        raise TypeError(f"op 'avg' needs a floating dtype, got {dtype}; use 'sum' and divide yourself")
    ufunc = np.maximum if op == "max" else np.add
    if dtype in LOW_PRECISION:
        def reduce_low(acc: np.ndarray, inc: np.ndarray) -> None:
            # inf (and inf - inf = nan) are legitimate fp16 results: the loss scaler skips them
            with np.errstate(over="ignore", invalid="ignore"):
                acc[...] = ufunc(acc.astype(np.float32), inc.astype(np.float32)).astype(dtype)
        return reduce_low

    def reduce_native(acc: np.ndarray, inc: np.ndarray) -> None:
        ufunc(acc, inc, out=acc)
    return reduce_native


def _divide(shard: np.ndarray, world_size: int) -> None:
    if shard.dtype in LOW_PRECISION:
        shard[...] = (shard.astype(np.float32) / world_size).astype(shard.dtype)
    else:
        shard /= world_size


def _check(buf: np.ndarray) -> np.dtype:
    if not isinstance(buf, np.ndarray) or buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError("collectives work in place on a flat, C-contiguous 1-D numpy array")
    return buf.dtype
