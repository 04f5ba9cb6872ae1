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

A capacity would keep the first C of the whole sequence's tokens: refused beside context parallelism
(engine.config.rules_moe).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from engine.comm.base import Communicator
from engine.comm.collectives import all_reduce
from engine.comm.meter import metered_phase
from engine.moe import moe_layers

PHASE = "moe-aux-counts"


def count_over_context(model, group: Communicator):
    """Make every MoE layer of `model` count its load-balancing shares over the context-parallel `group`
    (nothing with one rank); returns the model."""
    if group.world_size > 1:
        for layer in moe_layers(model):
            layer.count_choices = partial(_counts_over, group)  # type: ignore[method-assign]
    return model


def _counts_over(group: Communicator, counts: np.ndarray, choices: int) -> tuple[np.ndarray, int]:
    """The group's choices per expert, and of how many (every rank of it holds as many tokens)."""
    total = np.array(counts, dtype=np.int64)
    with metered_phase(group.meter, PHASE):
        all_reduce(group, total, op="sum")
    return total, choices * group.world_size
