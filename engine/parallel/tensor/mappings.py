"""The conjugate ops that carry activations into and out of a tensor-parallel region (Megatron-LM's
mappings), as autograd ops on the tensor-parallel group passed in.

    op                        forward                        backward
    copy_to_tensor_parallel   identity                 (f)   all-reduce
    reduce_from_tensor_parallel  all-reduce            (g)   identity
    gather_sequence           all-gather the sequence        reduce-scatter the sequence
    reduce_scatter_sequence   reduce-scatter the sequence    all-gather the sequence
    scatter_sequence          this rank's slice of it        all-gather the sequence

f stands before a column-parallel product: every rank needs the whole input, and the input's gradient is
the sum of every rank's partial one. g stands after a row-parallel product: each rank holds a partial sum
of the output. With sequence parallelism the region outside the products holds s/t of the sequence
(axis 1 of [b, s, h]): f becomes an all-gather of the sequence (its backward a reduce-scatter) and g a
reduce-scatter (its backward an all-gather): the same bytes, as an all-reduce is a reduce-scatter and an
all-gather. scatter_sequence enters that region from a replicated tensor (after the embedding).

Every collective of this package goes through `collective`, labelled with its PHASE for the traffic
meter: "tp-fwd-all-reduce", "sp-bwd-reduce-scatter", ... (what each was for, per direction). An op given a
`tally` (a Counter; the plan gives the blocks' layers the layout's) adds one under that phase each time it
runs a collective, forward or backward, a recomputed block's too: the collectives per layer, counted.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from engine.comm.base import Communicator
from engine.comm.collectives import all_gather, all_reduce, reduce_scatter
from engine.comm.meter import metered_phase
from engine.tensor import Tensor, make

SEQUENCE_AXIS = 1  # activations are [batch, sequence, features]


def collective(group: Communicator, kind: str, buf: np.ndarray, phase: str, op: str = "sum") -> None:
    """Run one collective in place on the flat buffer, booked under `phase` (the meter's outer label wins
    over the algorithm's own phase names)."""
    with metered_phase(group.meter, phase):
        if kind == "all-reduce":
            all_reduce(group, buf, op)
        elif kind == "all-gather":
            all_gather(group, buf)
        elif kind == "reduce-scatter":
            reduce_scatter(group, buf, op)
        else:
            raise ValueError(f"unknown collective {kind!r}")


# ---- the collectives on arrays (copies: an incoming gradient is read-only) -------------------------

def all_reduced(group: Communicator, a: np.ndarray, phase: str, op: str = "sum") -> np.ndarray:
    buf = np.array(a, order="C")
    collective(group, "all-reduce", buf.reshape(-1), phase, op)
    return buf


def _sequence_share(group: Communicator, length: int) -> int:
    if length % group.world_size:
        raise ValueError(f"sequence parallelism splits the sequence {group.world_size} ways: a sequence of "
                         f"{length} tokens does not divide")
    return length // group.world_size


def gathered(group: Communicator, a: np.ndarray, phase: str) -> np.ndarray:
    """Every rank's slice of the sequence, joined in rank order along axis 1."""
    mine = np.moveaxis(a, SEQUENCE_AXIS, 0)  # the sequence first: each rank's slice is one contiguous run
    n, r = mine.shape[0], group.rank
    buf = np.empty((group.world_size * n,) + mine.shape[1:], a.dtype)
    buf[r * n:(r + 1) * n] = mine
    collective(group, "all-gather", buf.reshape(-1), phase)
    return np.ascontiguousarray(np.moveaxis(buf, 0, SEQUENCE_AXIS))


def reduce_scattered(group: Communicator, a: np.ndarray, phase: str) -> np.ndarray:
    """The sum over ranks of this rank's slice of the sequence (axis 1)."""
    n, r = _sequence_share(group, a.shape[SEQUENCE_AXIS]), group.rank
    buf = np.ascontiguousarray(np.moveaxis(a, SEQUENCE_AXIS, 0))
    collective(group, "reduce-scatter", buf.reshape(-1), phase)
    return np.ascontiguousarray(np.moveaxis(buf[r * n:(r + 1) * n], 0, SEQUENCE_AXIS))


def sequence_slice(group: Communicator, a: np.ndarray) -> np.ndarray:
    n, r = _sequence_share(group, a.shape[SEQUENCE_AXIS]), group.rank
    return np.ascontiguousarray(a[:, r * n:(r + 1) * n])


# ---- the autograd ops ------------------------------------------------------------------------------

Tally = Counter  # phase -> collectives run (None: not counted)


def _counted(tally: Tally | None, phase: str, result: np.ndarray) -> np.ndarray:
    if tally is not None:
        tally[phase] += 1
    return result


def copy_to_tensor_parallel(x: Tensor, group: Communicator, tally: Tally | None = None) -> Tensor:
    """f: identity forward; backward, the sum of every rank's partial input gradient."""
    phase = "tp-bwd-all-reduce"
    return make(x.data, (x,), lambda g: (_counted(tally, phase, all_reduced(group, g, phase)),))


def reduce_from_tensor_parallel(x: Tensor, group: Communicator, tally: Tally | None = None) -> Tensor:
    """g: the sum of every rank's partial output; backward, identity."""
    phase = "tp-fwd-all-reduce"
    return make(_counted(tally, phase, all_reduced(group, x.data, phase)), (x,), lambda g: (g,))


def gather_sequence(x: Tensor, group: Communicator, tally: Tally | None = None) -> Tensor:
    """f under sequence parallelism: the whole sequence from every rank's slice."""
    fwd, bwd = "sp-fwd-all-gather", "sp-bwd-reduce-scatter"
    return make(_counted(tally, fwd, gathered(group, x.data, fwd)), (x,),
                lambda g: (_counted(tally, bwd, reduce_scattered(group, g, bwd)),))


def reduce_scatter_sequence(x: Tensor, group: Communicator, tally: Tally | None = None) -> Tensor:
    """g under sequence parallelism: this rank's slice of the sum of every rank's partial output."""
    fwd, bwd = "sp-fwd-reduce-scatter", "sp-bwd-all-gather"
    return make(_counted(tally, fwd, reduce_scattered(group, x.data, fwd)), (x,),
                lambda g: (_counted(tally, bwd, gathered(group, g, bwd)),))


def scatter_sequence(x: Tensor, group: Communicator) -> Tensor:
    """Enter the sequence-parallel region from a tensor every rank holds whole: keep this rank's slice."""
    return make(sequence_slice(group, x.data), (x,), lambda g: (gathered(group, g, "sp-bwd-all-gather"),))
