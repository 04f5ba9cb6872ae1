"""What a rank of an expert-parallel run writes into a checkpoint, and takes back from one (sharded.py calls
these when `parallel.expert` > 1, on every rank, whatever its layout: data, tensor and pipeline degrees,
ZeRO stage).

A rank's state is its replicated parameters' (the part its replica owns: all of it at ZeRO 0) and its split
experts' (all of them, completed over edp where ZeRO shards them), each mapped onto runs of its
tensor-parallel coordinate's flat state by the parameters' names (experts.py). Of the ranks holding the
same runs (data-parallel and expert-data-parallel replicas) only the lowest writes them; the runs every rank
writes tile its coordinate's flat state. Restoring cuts the rank's coordinate out of the dense arrays
(reshard.cut) and gathers each of its parameters back by name.

    share(trainer, spec)      (runs, master/m/v over them, optimizer step) of what this rank writes
                              (collective)
    load(trainer, dense)      the rank's replicated parameters and experts from the dense arrays
"""

from __future__ import annotations

import numpy as np

from engine.checkpoint.experts import gather, offsets, runs
from engine.checkpoint.reshard import cut
from engine.checkpoint.schema import STATE_KEYS, spec_layout
from engine.comm.objects import all_gather_json
from engine.parallel.expert.checkpoint_state import expert_state, held_experts, load_expert_state


def _params(flat) -> list[tuple[str, int]]:
    return [(str(p.name), p.size) for p in flat.params]


def _where(trainer, layout: list[dict]) -> dict[str, tuple[int, int]]:
    return offsets(trainer.cfg.model.kind, layout, trainer.layout.degree)


def share(trainer, spec: dict) -> tuple[list[list[int]], dict, int]:
    """This rank's written runs of its coordinate's flat state (the model `spec`'s dense order), the master,
    m and v over them (in the runs' order) and the optimizer step. Collective: every rank calls it."""
    replica, where = trainer.replica, _where(trainer, spec_layout(spec))
    state = replica.optimizer_state()  # collective under ZeRO
    flat = replica.flat
    lo, hi = replica.owned_range()
    hi = min(hi, flat.numel)  # ZeRO's padding is nobody's state
    lo = min(lo, hi)
    parts = [(runs(_params(flat), where, lo, hi), {k: state[k][:hi - lo] for k in STATE_KEYS})]
    if held_experts(replica) is not None:
        own = expert_state(replica)  # collective over edp when ZeRO shards the experts' state
        parts.append((runs(_params(replica.experts), where, 0, replica.experts.numel),
                      {k: own[k] for k in STATE_KEYS}))
    claims = all_gather_json(trainer.comm, [trainer.layout.rank, [p[0] for p in parts]])
    mine: list[list[int]] = []
    arrays: dict[str, list] = {k: [] for k in STATE_KEYS}
    claimed = [[tp, r] for tp, held in claims[:trainer.comm.rank] for r in held]
    for part_runs, values in parts:
        if not part_runs or [trainer.layout.rank, part_runs] in claimed:
            continue  # nothing here, or a lower rank writes the same runs (a replica of this state)
        mine += part_runs
        for k in STATE_KEYS:
            arrays[k].append(values[k])
    out = {k: np.concatenate(v) for k, v in arrays.items() if v}
    return mine, out, int(state["step"])


def load(trainer, ckpt_layout: list[dict], dense: dict) -> None:
    """Set this rank's replicated parameters' state and its experts' from the dense arrays (master, m, v of
    the whole model and the step)."""
    replica, layout = trainer.replica, trainer.layout
    where = _where(trainer, ckpt_layout)
    coordinate = {k: cut(layout.specs, layout.rank, ckpt_layout, dense[k]) for k in STATE_KEYS}
    params = _params(replica.flat)
    replica.load_optimizer_state({k: gather(v, params, where) for k, v in coordinate.items()}
                                 | {"step": dense["step"]})
    if held_experts(replica) is not None:
        params = _params(replica.experts)
        load_expert_state(replica, {k: gather(v, params, where) for k, v in coordinate.items()}
                          | {"step": dense["step"]})
