"""The load-balancing loss of a pipeline stage's mixture-of-experts layers (engine.moe).

Without a pipeline the trainer adds every MoE layer's term to the loss it backpropagates
(engine.moe.add_aux_losses), so each term's gradient is the loss's seed (the loss scale / micro-batches).
In a pipeline only the last stage holds the loss, and a stage's forward is run again by nothing: the terms of
a micro-batch's forward are taken right after it (the layers keep only their last forward's term, and 1F1B
runs other micro-batches' forwards before this one's backward), and

    last stage     loss + the stage's terms             the root its backward is seeded at
    other stages   the output, carrying the terms        its backward passes the output's gradient on and
                                                         gives each term the loss's seed

as Megatron's MoEAuxLossAutoScaler carries the term on the activation. So every stage's terms are in the
objective each micro-batch backpropagates, summed across the stages, and the router and expert gradients stay
on their stage; the reported loss stays the language-model loss, as without a pipeline (the terms are
reported in each rank's ExpertLoad events).
"""

from __future__ import annotations

import numpy as np

from engine.moe import moe_layers
from engine.nn import Module
from engine.tensor import Tensor, make


def stage_aux_loss(stage: Module) -> Tensor | None:
    """The sum of the load-balancing terms of `stage`'s MoE layers from their last forward (None when the
    stage has none, or their coefficient is 0)."""
    total = None
    for layer in moe_layers(stage):
        if layer.aux_loss is not None and layer.aux_loss_coef:
            total = layer.aux_loss if total is None else total + layer.aux_loss
    return total


def carry_aux(out: Tensor, aux: Tensor, seed: float) -> Tensor:
    """`out` itself, its backward giving out the gradient it receives and `aux` the loss's `seed`."""
    return make(out.data, (out, aux), lambda g: (g, np.asarray(seed, dtype=aux.dtype)))
