"""The pipeline schedule as data: one list of actions per pipeline rank.

Four readers share it and none rewrites it: the executor runs it, the projection simulates it, the
workbench draws it and the checker validates it.

Stages. The model is cut into ``ranks * chunks`` contiguous virtual stages, numbered from the
embedding (stage 0) to the head (the last). Stage ``s`` lives on pipeline rank ``s % ranks``: with one
chunk per rank, stage r is rank r; interleaved (v chunks), rank r holds stages r, r + p, r + 2p, ...

Actions. Compute actions name a micro-batch and a stage:
  F  forward of that micro-batch through that stage (the last stage also computes the loss);
  B  backward of that stage, input and weight gradients together;
  I  the input-gradient half of B (zero-bubble schedules), which the previous stage waits for;
  W  the weight-gradient half, after that micro-batch's I on the same stage.
Communication actions name the micro-batch and the stage whose tensor moves, and the peer rank:
  SEND_ACT  the output of `stage` to the rank of stage + 1;   RECV_ACT  the input of `stage` from the
  rank of stage - 1;  SEND_GRAD  the input gradient of `stage` to the rank of stage - 1;
  RECV_GRAD  the output gradient of `stage` from the rank of stage + 1.
A hand-off between two stages on the same rank (only when ranks == 1) has no communication action.

Semantics the checker holds and the executor implements: a maximal run of consecutive communication
actions in one rank's list is one batch, posted together (sends and receives at once, as Megatron's
batched isend/irecv); the batch completes once every send in it has met its receive on the peer and
every receive its send. Compute actions run one at a time, in list order.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Op(StrEnum):
    FORWARD = "F"
    BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"
    SEND_ACT = "SEND_ACT"
    RECV_ACT = "RECV_ACT"
    SEND_GRAD = "SEND_GRAD"
    RECV_GRAD = "RECV_GRAD"

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE_OPS


COMPUTE_OPS = frozenset({Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT})


@dataclass(frozen=True)
class Action:
    op: Op
    micro_batch: int
    stage: int  # the virtual stage it concerns (for communication: the stage whose tensor moves)
    peer: int | None = None  # communication only: the pipeline rank on the other end

    def __str__(self) -> str:
        arrow = "->" if self.op.name.startswith("SEND") else "<-"
        peer = "" if self.peer is None else f"{arrow}{self.peer}"
        return f"{self.op.value}{self.micro_batch}s{self.stage}{peer}"


@dataclass(frozen=True)
class Schedule:
    """Which schedule (a name from SCHEDULES), its shape, and every pipeline rank's actions in order."""

    name: str
    ranks: int  # p: pipeline ranks
    micro_batches: int  # m
    chunks: int  # v: model chunks (virtual stages) per rank; 1 except interleaved
    actions: tuple[tuple[Action, ...], ...]  # actions[r]: rank r's list

    @property
    def stages(self) -> int:
        return self.ranks * self.chunks

    def rank_of(self, stage: int) -> int:
        return stage % self.ranks

    def stages_of(self, rank: int) -> list[int]:
        return list(range(rank, self.stages, self.ranks))
