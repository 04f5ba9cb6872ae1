"""What a rank's split experts put into a checkpoint, and take back from one (engine.checkpoint.sharded calls
these; the replicated parameters go through the data-parallel replica as without experts).

    held_experts(replica)          [lo, hi): the global experts this rank's split experts are (None: no split)
    expert_state(replica)          master, m, v of every held expert (unpadded) and the optimizer step;
                                   collective over the edp group when ZeRO shards the experts' state there
    load_expert_state(replica, s)  the same arrays back: this rank's part into the experts' optimizer, and
                                   every held expert's parameters

An ExpertReplica (replica.py) keeps its experts' parameters in one flat buffer (`experts`, the dense order
restricted to the held experts) and AdamW over its `part` of it (the whole buffer unless ZeRO shards it over
edp, padded to a multiple of edp); the parameter names say which global experts they are.
"""

from __future__ import annotations

import numpy as np

from engine.checkpoint.experts import expert_of
from engine.comm.collectives import all_gather

STATE = ("master", "m", "v")


def held_experts(replica) -> tuple[int, int] | None:
    """[lo, hi) of the global experts this replica's split experts are; None for a replica without any."""
    flat = getattr(replica, "experts", None)
    if flat is None or not getattr(flat, "params", None):
        return None
    held = [e for p in flat.params if (e := expert_of(str(p.name))) is not None]
    return min(held), max(held) + 1


def _part(replica) -> tuple[int, int]:
    return getattr(replica, "part", (0, replica.experts.size))


def expert_state(replica) -> dict:
    """Every held expert's master (its parameters outside mixed precision), m and v, unpadded, and the step:
    the optimizer's part, completed over edp when it is a part."""
    local = replica.optimizer.local_state()
    flat, (lo, hi) = replica.experts, _part(replica)
    out: dict = {"step": local["step"]}
    for key in STATE:
        if hi - lo == flat.size:
            out[key] = local[key][:flat.numel]
            continue
        whole = np.zeros(flat.size, local[key].dtype)
        whole[lo:hi] = local[key]
        all_gather(replica.edp, whole)
        out[key] = whole[:flat.numel]
    return out


def load_expert_state(replica, state: dict) -> None:
    """Set the held experts' parameters, and the optimizer's part of master, m, v and its step, from
    unpadded arrays over every held expert (what expert_state gives)."""
    flat, (lo, hi) = replica.experts, _part(replica)
    padded = {}
    for key in STATE:
        padded[key] = np.zeros(flat.size, state[key].dtype)
        padded[key][:flat.numel] = state[key]
    np.copyto(flat.data, padded["master"], casting="unsafe")
    replica.optimizer.load_local(padded["master"][lo:hi], padded["m"][lo:hi], padded["v"][lo:hi],
                                 state["step"])
