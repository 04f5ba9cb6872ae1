"""Experts beside context parallelism: each rank of a CP group routes its own slice of every sequence.

Routing is per token (the router's softmax and top-k read one token), so a rank's tokens go to the experts
one device sends them to, and expert parallelism (carved out of the data x context ranks:
engine.parallel.mesh) moves them as it moves any rank's. One term needs the whole sequence: the
load-balancing loss's f_e, the share of the choices that picked expert e. One device takes it over the
micro-batch's c·n tokens; here the CP group all-reduces the counts (E integers per MoE layer and forward,
booked under "moe-aux-counts"), and each rank's term is

    aux_r = coef · E · sum_e f_e(the group's tokens) · P_e(this rank's n tokens)

The gradients of the c ranks are averaged (over dp x cp, with everything else), and the mean over r of
P_e(rank r's tokens) is P_e over the group's tokens: the average of the terms is one device's term, its
gradient too. (Each rank's own term is not one device's; the expert pane averages the ranks' terms.)

A capacity keeps an expert's first C = ceil(capacity_factor · N · k / E) choices in one device's token
order, N the micro-batch's tokens: the CP group all-gathers its choices (N/c · k integers a rank, booked under
"moe-capacity-choices"), lays them out by the ranks' positions (engine.parallel.context.layout) as one device
holds them, [rows, sequence, k], decides the drops over all of them and keeps its own tokens' decisions.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from engine.comm.base import Communicator
from engine.comm.collectives import all_gather, all_reduce
from engine.comm.meter import metered_phase
from engine.moe import capacity, keep_within_capacity, moe_layers

PHASE = "moe-aux-counts"
CAPACITY_PHASE = "moe-capacity-choices"


def count_over_context(model, group: Communicator):
    """Make every MoE layer of `model` count its load-balancing shares, and decide its capacity's drops, over
    the context-parallel `group` (nothing with one rank); returns the model (planned by
    engine.parallel.context.plan: its `context_parallel` gives the layout)."""
    if group.world_size == 1 or not moe_layers(model):
        return model
    layout, seq_len = model.context_parallel.layout, model.config["block_size"]
    for layer in moe_layers(model):
        layer.count_choices = partial(_counts_over, group)  # type: ignore[method-assign]
        if layer.router.capacity_factor:
            layer.router.keep = partial(_keep_over, group, layout, seq_len, layer.router)  # type: ignore[method-assign]
    return model


def _counts_over(group: Communicator, counts: np.ndarray, choices: int) -> tuple[np.ndarray, int]:
    """The group's choices per expert, and of how many (every rank of it holds as many tokens)."""
    total = np.array(counts, dtype=np.int64)
    with metered_phase(group.meter, PHASE):
        all_reduce(group, total, op="sum")
    return total, choices * group.world_size


def _keep_over(group: Communicator, layout, seq_len: int, router, experts: np.ndarray) -> np.ndarray:
    """[n, k] bool: which of this rank's choices (its n tokens: rows x its positions) one device keeps."""
    c, k = group.world_size, experts.shape[1]
    local = len(layout.positions(seq_len, group.rank))
    rows = len(experts) // local
    gathered = np.empty((c, *experts.shape), np.int64)  # rank r's choices are part r (shard_bounds: even)
    gathered[group.rank] = experts
    with metered_phase(group.meter, CAPACITY_PHASE):
        all_gather(group, gathered.reshape(-1))
    whole = np.empty((rows, seq_len, k), np.int64)
    for r in range(c):
        whole[:, layout.positions(seq_len, r)] = gathered[r].reshape(rows, local, k)
    kept = keep_within_capacity(whole.reshape(-1, k), router.n_experts,
                                capacity(rows * seq_len, k, router.n_experts, router.capacity_factor))
    return kept.reshape(rows, seq_len, k)[:, layout.positions(seq_len, group.rank)].reshape(-1, k)
