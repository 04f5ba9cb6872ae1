"""All-to-all, even and uneven, written once over the batched point-to-point exchange (exchange.py).

    all_to_all(group, sends)        sends[j] goes to member j; returns recvs[j], the rows member j sent
    all_to_all_even(group, buf)     buf cut into N equal blocks along axis 0, block j to member j

Each member's arrays share one dtype and trailing shape on every member; their lengths along axis 0 are
free (the uneven form expert parallelism needs: how many tokens go to each expert is decided by the
router, step by step). So the uneven form first moves the row counts (an all-to-all of one int64 per
peer, metered under phase + "-sizes", always all at once), then the payload into arrays allocated from
those counts, on the schedule asked for. A peer owed zero rows gets no payload message at all (both ends
know the count), and the block a member keeps for itself is copied, not sent. The even form skips the
counts: every block is len(buf) / N rows.
A label around the call (meter.phase) wins over both phases, as everywhere: name the traffic with `phase`.

Schedules of the payload (ALGORITHMS), the meter's algorithm label:
  pairwise     N−1 steps; at step k send to rank+k and receive from rank−k, one exchange per step, so
               every rank sends to exactly one peer and receives from exactly one peer at a time. The
               default: each step's cost is one link's (what engine/projection/expert.py models)
  all-at-once  every send and receive posted in one exchange; the transport orders them. On 4 ranks on
               this machine it was ahead at 64 KiB and 1 MiB, a tie above (docs/benchmarks.md)
  mpi-native   MPI's own Alltoallv (mpi backend, world communicator only), for comparison; its traffic
               is opaque, so the meter records what was handed to MPI under the phase with dst = −1

Cost (α per message, β per byte) for S bytes per rank spread evenly: (N−1)/N·Sβ in N−1 messages for
either schedule, (N−1)α for pairwise's rounds, less where all-at-once's messages overlap. busbw =
algbw × (N−1)/N (NCCL-tests' definition for all-to-all). Which schedule is faster is measured, not
derived (docs/benchmarks.md, "All-to-all against gloo").
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np

from engine.comm.base import Communicator
from engine.comm.exchange import exchange

ALGORITHMS = ("pairwise", "all-at-once", "mpi-native")
SIZES = "-sizes"  # suffix of the phase the row counts travel under


def all_to_all(group: Communicator, sends: Sequence[np.ndarray], phase: str = "all-to-all",
               algorithm: str = "pairwise") -> list[np.ndarray]:
    """sends[j] goes to member j of `group` (sends[group.rank] stays here, copied); every array has the same
    dtype and trailing shape on every rank, any length along axis 0 (uneven). First the row counts travel
    (a small all-to-all of integers, metered under phase + "-sizes"), then the payload; returns recvs[j],
    the rows member j sent here."""
    sends = _checked(group, sends, algorithm)
    if algorithm == "mpi-native":
        return _native(group, sends, phase)
    # the counts, 8 bytes to each peer, in one round whatever the payload's schedule: at that size only
    # the number of rounds costs, and pairwise would take N-1 of them
    counts = [np.array([len(arr)], np.int64) for arr in sends]
    got = _move(group, counts, [np.empty(1, np.int64) for _ in sends], phase + SIZES, "all-at-once")
    recvs = [np.empty((int(n[0]), *sends[0].shape[1:]), sends[0].dtype) for n in got]
    return _move(group, sends, recvs, phase, algorithm)


def all_to_all_even(group: Communicator, buf: np.ndarray, phase: str = "all-to-all",
                    algorithm: str = "pairwise") -> np.ndarray:
    """buf's N equal blocks along axis 0 (N = group size), block j to member j; returns the blocks
    received, block j from member j, in one array shaped like buf. No counts travel: every block has
    len(buf) / N rows."""
    size = group.world_size
    buf = np.asarray(buf)
    if buf.ndim == 0 or len(buf) % size:
        raise ValueError(f"all_to_all_even needs an array whose length along axis 0 divides into {size} "
                         f"equal blocks, got shape {buf.shape}")
    sends = _checked(group, np.split(buf, size), algorithm)
    if algorithm == "mpi-native":
        return np.concatenate(_native(group, sends, phase))
    out = np.empty_like(buf)
    _move(group, sends, np.split(out, size), phase, algorithm)
    return out


def _move(group: Communicator, sends: list[np.ndarray], recvs: list[np.ndarray], phase: str,
          algorithm: str) -> list[np.ndarray]:
    """Move sends[j] into recvs[j] (preallocated, the right size) on the schedule; empty blocks never
    travel."""
    size, rank = group.world_size, group.rank
    recvs[rank][...] = sends[rank]
    steps = [range(1, size)] if algorithm == "all-at-once" else [[k] for k in range(1, size)]
    meter = group.meter
    with contextlib.nullcontext() if meter is None else meter.algorithm(algorithm):
        for ks in steps:
            out = [((rank + k) % size, sends[(rank + k) % size]) for k in ks]
            inc = [((rank - k) % size, recvs[(rank - k) % size]) for k in ks]
            out = [(dst, arr) for dst, arr in out if arr.size]
            inc = [(src, arr) for src, arr in inc if arr.size]
            exchange(group, out, inc, [phase] * len(out))
    return recvs


def _native(group: Communicator, sends: list[np.ndarray], phase: str) -> list[np.ndarray]:
    native = getattr(group, "native_all_to_all", None)
    if native is None:
        raise ValueError("algorithm 'mpi-native' needs the mpi backend's world communicator; "
                         "use algorithm='pairwise'")
    return native(sends, phase)


def _checked(group: Communicator, sends: Sequence[np.ndarray], algorithm: str) -> list[np.ndarray]:
    """A known algorithm, and one C-contiguous array per member, all of one dtype and trailing shape
    (checked here for this rank, before anything is sent; across ranks the transport's size check catches
    a mismatch)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-to-all algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    if len(sends) != group.world_size:
        raise ValueError(f"all-to-all needs one array per member of the group ({group.world_size}), "
                         f"got {len(sends)}")
    sends = [np.ascontiguousarray(arr) for arr in sends]
    first = sends[0]
    for j, arr in enumerate(sends):
        if arr.ndim == 0 or arr.dtype != first.dtype or arr.shape[1:] != first.shape[1:]:
            raise ValueError(f"all-to-all: sends[{j}] is {arr.dtype}{list(arr.shape)} but sends[0] is "
                             f"{first.dtype}{list(first.shape)}; every array needs one dtype and trailing "
                             "shape")
    return sends
