"""A step's routing figures as an event: each MoE layer's training forwards since the last report, summed
(tokens per expert, rows received, drops) or averaged (router entropy, load-balancing loss) over the step's
micro-batches, as one ExpertLoad per rank (engine.events). The trainer reports it with the rank's other
figures; the workbench's expert pane sums the ranks."""

from __future__ import annotations

import numpy as np

from engine import events as ev
from engine.moe import moe_layers
from engine.nn import Module

FIELDS = ("tokens_per_expert", "received", "dropped", "entropy", "aux_loss")  # ExpertLoad's, per layer


def expert_load(model: Module, step: int, rank: int) -> list[ev.ExpertLoad]:
    """This rank's ExpertLoad of the step (none for a model without experts, or before any training
    forward); takes the layers' figures, so the next step starts from none."""
    layers = moe_layers(model) if hasattr(model, "modules") else []  # a pipeline rank's: its stages'
    if not layers or not all(layer.step_stats for layer in layers):
        return []
    fields: dict[str, list] = {k: [] for k in FIELDS}
    for layer in layers:
        forwards, layer.step_stats = layer.step_stats, []
        per_expert = np.sum([f["tokens_per_expert"] for f in forwards], axis=0)
        fields["tokens_per_expert"].append(per_expert.tolist())
        for key in ("received", "dropped"):
            fields[key].append(int(sum(f[key] for f in forwards)))
        for key in ("entropy", "aux_loss"):
            fields[key].append(float(np.mean([f[key] for f in forwards])))
    return [ev.ExpertLoad(step=step, rank=rank, **fields, blocks=moe_blocks(model, layers))]


def moe_blocks(model: Module, layers: list) -> list[int]:
    """The block each of `layers` sits in (a pipeline rank holds some of the model's MoE layers: its
    PipelineModel keeps the whole GPT as `dense`)."""
    gpt = getattr(model, "dense", model)
    where = {id(block.mlp): i for i, block in enumerate(getattr(gpt, "blocks", []))}
    return [where[id(layer)] for layer in layers]
