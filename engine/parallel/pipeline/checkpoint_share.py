"""What a rank writes into a checkpoint, and takes back from one, in the coordinates of its tensor-parallel
shard of the whole model (the dense parameter order): engine.checkpoint.sharded calls these for every model.

    share(trainer)               (start, end, state): the run of the whole model's flat state this rank
                                 writes, master, m, v over it and the optimizer step (collective)
    mine(trainer, flat)          this rank's flat state (its replica's layout, unpadded) from the whole one

Without a pipeline a rank's flat state is the whole model's (its ZeRO share of it: owned_range). With one
chunk per pipeline rank it is its stage's run of the model's parameters: the owned range is offset by the
run's start (its ZeRO padding clipped off), so the stages' shares tile the model as one rank's would.
Interleaved, a rank's chunks are several runs: its flat state is completed over its data-parallel group
(ZeRO-1 shares) and gathered over its pipeline group, and the first pipeline rank of each (dp, tp) cell
writes the whole model's state — the stage's memory for a moment, only while a checkpoint is written.
"""

from __future__ import annotations

import numpy as np

from engine.checkpoint.schema import STATE_KEYS
from engine.comm.collectives import all_gather


def windows(trainer, rank: int | None = None) -> list[tuple[int, int]]:
    """(offset, numel) of each run of the whole model's flat state that pipeline rank `rank` holds."""
    of = getattr(trainer.model, "state_windows", None)
    return of(rank) if of is not None else [(0, trainer.replica.flat.numel)]


def share(trainer) -> tuple[int, int, dict]:
    replica = trainer.replica
    state = replica.optimizer_state()  # collective under ZeRO
    lo, hi = replica.owned_range()
    runs = windows(trainer)
    if len(runs) == 1:
        (offset, numel), = runs
        lo, hi = min(lo, numel), min(hi, numel)  # a stage's padding is not the next stage's state
        kept = {k: state[k][:hi - lo] for k in STATE_KEYS}
        return lo + offset, hi + offset, {"step": state["step"], **kept}
    return _joined(trainer, state, lo, hi, runs)


def _joined(trainer, state: dict, lo: int, hi: int, runs: list[tuple[int, int]]
            ) -> tuple[int, int, dict]:
    flat, dp, pp = trainer.replica.flat, trainer.dp_comm, trainer.groups.pp
    numel = flat.numel
    sizes = [sum(n for _, n in windows(trainer, r)) for r in range(pp.world_size)]
    total = sum(sizes)
    out: dict = {"step": state["step"]}
    for key in STATE_KEYS:
        local = np.zeros(flat.size, state[key].dtype)
        local[lo:hi] = state[key]
        if hi - lo < numel:  # ZeRO-1: each data-parallel rank holds an equal share
            all_gather(dp, local)
        every = np.zeros((pp.world_size, max(sizes)), local.dtype)
        every[pp.rank, :numel] = local[:numel]
        all_gather(pp, every.reshape(-1))
        whole = np.zeros(total, local.dtype)
        for r in range(pp.world_size):
            at = 0
            for offset, n in windows(trainer, r):
                whole[offset:offset + n] = every[r, at:at + n]
                at += n
        out[key] = whole
    return (0, total, out) if pp.rank == 0 else (0, 0, {"step": state["step"]})


def mine(trainer, flat: np.ndarray) -> np.ndarray:
    return np.concatenate([flat[offset:offset + n] for offset, n in windows(trainer)])
