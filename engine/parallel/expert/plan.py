"""The plan: expert parallelism applied to a finished model, in place, as the tensor-parallel plan does
(engine.parallel.tensor.plan): every rank builds the same whole model from one seed, then each MoE layer's
experts (engine.moe.Experts) are swapped for this rank's share of them and the all-to-alls that reach the
rest (layer.ExpertParallelExperts). The router, the capacity and the combine stay the model's own code.

The experts' parameters then differ between the ranks of an EP group and are replicated over the
expert-data-parallel (edp) group, the ranks holding the same experts: their gradients are reduced there
(replica.py); everything else is reduced over the data-parallel group as before.
"""

from __future__ import annotations

from engine.comm.base import Communicator
from engine.moe import moe_layers
from engine.nn import Module
from engine.parallel.expert.layer import ExpertParallelExperts, owned_experts
from engine.tensor import Parameter


def split_experts(model: Module, group: Communicator) -> Module:
    """`model` as this rank trains it on its EP `group`: with one rank (or no experts) as built, else
    parallelize_experts."""
    if group.world_size == 1 or not moe_layers(model):
        return model
    return parallelize_experts(model, group)


def parallelize_experts(model: Module, group: Communicator) -> Module:
    """Make every MoE layer of `model` hold only this rank's experts of the EP `group`; returns it."""
    layers = moe_layers(model)
    if not layers:
        raise ValueError("expert parallelism splits the experts of MoE layers, and this model has none")
    for layer in layers:
        experts = layer.experts
        if isinstance(experts, ExpertParallelExperts):
            raise ValueError("this model's experts are split already")
        n = len(experts.mlps)
        if n % group.world_size:
            raise ValueError(f"{n} experts do not split evenly over {group.world_size} expert-parallel ranks")
        mine = owned_experts(n, group.world_size, group.rank)
        layer.experts = ExpertParallelExperts([m if i in mine else None for i, m in enumerate(experts.mlps)],
                                              group)
    return model


def expert_parameters(model: Module) -> list[Parameter]:
    """The parameters of this rank's split experts (none for a model without expert parallelism); of a
    pipeline rank's stages (engine.parallel.pipeline.rank_model.PipelineModel, not a Module but with its
    stages' modules), those of its stages."""
    modules = getattr(model, "modules", None)
    if modules is None:
        return []
    return [p for m in modules() if isinstance(m, ExpertParallelExperts) for p in m.parameters()]


def replicated_parameters(model: Module) -> list[Parameter]:
    """The parameters every data-parallel rank holds alike: all of them but the split experts'."""
    split = {id(p) for p in expert_parameters(model)}
    return [p for p in model.parameters() if id(p) not in split]
