"""The experts of one MoE layer split over an expert-parallel (EP) group: the form engine.parallel.expert.plan
swaps in for engine.moe.Experts, answering the same call (per-expert inputs in, per-expert outputs out), so
the MoE layer around it, its router, capacity and combine, runs unchanged.

e ranks, E experts: rank r holds experts r*E/e ... (r+1)*E/e - 1 (consecutive, as Megatron and torchtitan
place them). Each rank routes its own tokens; then, per MoE layer:

    counts    how many rows of each expert go to each rank: an all-to-all of E/e integers per peer
    dispatch  the rows, in expert order (so rank j's block is consecutive): an all-to-all
              (split sizes first, then the payload; a rank owed nothing gets no payload)
    experts   expert l runs on the rows every rank sent it, in rank order
    combine   each row's output goes back to the rank it came from: the mirror all-to-all
    backward  the same two all-to-alls in reverse: gradients of the outputs out, of the inputs back

Each row's output is its expert's MLP of that row alone, so a rank gets back exactly what running every
expert locally gives (engine.moe.Experts); the expert's weight gradient sums the rows of every rank of the
group, so after the reduce over the expert-data-parallel group (replica.py) it is what data parallelism
over all those ranks gives. `sent` and `received` count the last forward's rows (tokens conserved: the
sums over the group agree).
"""

from __future__ import annotations

import numpy as np

from engine import ops
from engine.comm.base import Communicator
from engine.moe import Experts
from engine.nn import MLP
from engine.parallel.expert.exchange import COMBINE, DISPATCH, exchange_counts, exchange_rows
from engine.tensor import Tensor


def owned_experts(n_experts: int, group_size: int, rank: int) -> range:
    """The experts rank `rank` of an EP group of `group_size` holds."""
    per = n_experts // group_size
    return range(rank * per, (rank + 1) * per)


class ExpertParallelExperts(Experts):
    """This rank's E/e experts of a layer (`mlps[i]` None for an expert held elsewhere: parameter names stay
    the one-device names) and the all-to-alls that bring each expert its rows from every rank."""

    def __init__(self, mlps: list[MLP | None], group: Communicator):
        super().__init__(mlps)
        self.group = group
        self.local = owned_experts(len(mlps), group.world_size, group.rank)
        self.sent = 0

    def forward(self, inputs: list[Tensor]) -> list[Tensor]:
        members, per = self.group.world_size, len(self.local)
        counts = np.array([len(x.data) for x in inputs], np.int64).reshape(members, per)
        arrived = exchange_counts(counts, self.group)  # [source rank, local expert]
        rows, recv_rows = exchange_rows(ops.concat(inputs, axis=0), counts.sum(1), self.group, DISPATCH,
                                        COMBINE)
        # rows: source 0's rows of local experts 0..per-1, then source 1's, ...; regroup by expert
        pieces = ops.split(rows, list(arrived.reshape(-1)), axis=0)
        mine = [mlp for mlp in self.mlps if mlp is not None]  # this rank's experts, in order
        outputs = [mlp(ops.concat(pieces[l::per], axis=0)) for l, mlp in enumerate(mine)]
        by_source = [ops.split(out, list(arrived[:, l]), axis=0) for l, out in enumerate(outputs)]
        back = ops.concat([by_source[l][s] for s in range(members) for l in range(per)], axis=0)
        returned, _ = exchange_rows(back, recv_rows, self.group, COMBINE, DISPATCH)
        self.sent, self.received = int(counts.sum()), int(arrived.sum())
        return ops.split(returned, list(counts.reshape(-1)), axis=0)
