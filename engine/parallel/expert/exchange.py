"""The all-to-all as a differentiable op: rows of one Tensor cut into per-member blocks, each sent to its
member (engine.comm.alltoall, uneven: the row counts travel first, then the payload); what arrives, from
member 0 first, is the output. Its backward is the mirror: the output's gradient cut into the blocks that
arrived, each sent back to the member it came from.

    forward   x [sum(send_rows), C]  --all-to-all (phase)-->         y [sum(recv_rows), C]
    backward  dy cut by recv_rows    --all-to-all (backward_phase)--> dx cut by send_rows

Dispatch runs it forward under "ep-dispatch" and backward under "ep-combine" (gradients go back the way a
combine goes), combine the other way round, so the meter books every byte moving towards the experts
under "ep-dispatch" and every byte moving back under "ep-combine".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.comm.alltoall import all_to_all
from engine.comm.base import Communicator
from engine.memory.ledger import rank_ledger
from engine.tensor import Tensor, make

DISPATCH, COMBINE = "ep-dispatch", "ep-combine"


def _blocks(a: np.ndarray, rows: Sequence[int]) -> list[np.ndarray]:
    return np.split(a, np.cumsum(rows)[:-1])


def exchange_rows(x: Tensor, send_rows: Sequence[int], group: Communicator, phase: str,
                  backward_phase: str) -> tuple[Tensor, list[int]]:
    """x's consecutive blocks of send_rows[j] rows go to member j; returns the rows received (member 0's
    first) and how many came from each member."""
    received = all_to_all(group, _blocks(x.data, send_rows), phase)
    _book(x.data, received)
    recv_rows = [len(r) for r in received]

    def backward(g):
        back = all_to_all(group, _blocks(g, recv_rows), backward_phase)
        _book(g, back)
        return (np.concatenate(back),)
    return make(np.concatenate(received), (x,), backward), recv_rows


def _book(sent: np.ndarray, received: list[np.ndarray]) -> None:
    """The memory ledger's comm_buffers: the all-to-all's send buffer (the rows in expert order) and its
    receive buffers, held together as it returns (engine.memory.expert predicts them)."""
    with rank_ledger().transient("comm_buffers", sent.nbytes + sum(r.nbytes for r in received)):
        pass


def exchange_counts(counts: np.ndarray, group: Communicator) -> np.ndarray:
    """counts [members, k]: row j (how many rows of each of member j's k experts this rank sends) goes to
    member j; returns [members, k], row i what member i sends here. Integers: no gradient."""
    got = all_to_all(group, list(counts.reshape(group.world_size, 1, -1)), DISPATCH + "-counts")
    return np.concatenate(got)
