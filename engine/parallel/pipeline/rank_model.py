"""A pipeline rank's stages seen as one model, for what wraps a model: the data-parallel replica (its
parameters, in one flat buffer per rank), checkpoints (named parameters, the dense model's spec) and the
trainer (train/eval, activation checkpointing, the layout it asks for the loss and the gradient norm).

`PipelineLayout` is the model's layout (engine.parallel.tensor.model_layout) with the pipeline added: the
replica completes the gradient norm's sum of squares and the fp16 overflow flag over its layout (the
tensor-parallel group, or nothing for a whole model); this one then completes them over the pipeline group
too, so every rank of the mesh agrees on the norm and skips the same steps. Everything else is the inner
layout's.

A tied weight's second copy (the last stage's lm_head.weight) is not one of the model's parameters here: the
replica neither reduces, counts, updates nor checkpoints it. Its gradient goes to the first stage, whose
wte.weight is the one device's weight, and it takes that weight's values before every step (step.py).
"""

from __future__ import annotations

import numpy as np

from engine.comm.collectives import all_reduce
from engine.comm.meter import metered_phase
from engine.comm.objects import broadcast_json
from engine.nn import GPT, Module
from engine.parallel.context.view import context_of
from engine.parallel.pipeline.split import describe, split_model
from engine.parallel.pipeline.stage import StageRunner
from engine.parallel.tensor import model_layout
from engine.tensor import Parameter


class PipelineLayout:
    """`inner` (a TensorParallelLayout or WholeModel) with the norm and the overflow flag completed over
    `group`, the pipeline group. The overflow's parameter is agreed as an index into the whole model's
    `parameter_names` (the stages hold different ones), translated from `local_names`, the replica's."""

    def __init__(self, inner, group, local_names: list[str], parameter_names: list[str], blocks: int):
        self.inner, self.group, self.blocks = inner, group, blocks
        self.parameter_names = parameter_names
        self._global = [parameter_names.index(name) for name in local_names]

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def combine_sum_of_squares(self, sharded: float, replicated: float) -> float:
        total = np.array([self.inner.combine_sum_of_squares(sharded, replicated)], np.float64)
        with metered_phase(self.group.meter, "pp-norm-all-reduce"):
            all_reduce(self.group, total, op="sum")
        return float(total[0])

    def collectives_per_layer(self, passes: int = 1) -> dict[str, float]:
        """Per block, as the inner layout counts them, over the `blocks` this rank's stages run (the inner
        layout divides by every block of the model)."""
        counted = self.inner.collectives_per_layer(passes)
        return {phase: n * getattr(self.inner, "units", 1) / self.blocks for phase, n in counted.items()}

    def agree_max(self, flags: np.ndarray) -> None:
        """[kind code, parameter index + 1]: the index in this rank's parameters becomes the whole model's."""
        self.inner.agree_max(flags)
        if flags[1] > 0:
            flags[1] = self._global[int(flags[1]) - 1] + 1
        with metered_phase(self.group.meter, "pp-flag-all-reduce"):
            all_reduce(self.group, flags, op="max")


class PipelineModel:
    """The stages `runner` holds, cut from `model` (a GPT, tensor-parallel or whole), as one model."""

    def __init__(self, model: GPT, runner: StageRunner, group):
        self.dense, self.runner, self.group = model, runner, group
        self.config, self.rng = model.config, model.rng
        # a context-parallel plan (engine.parallel.context.view), as the replica and the trainer ask a model
        self.context_parallel = getattr(model, "context_parallel", None)
        mine, everything = [n for n, _ in self.named_parameters()], [n for n, _ in model.named_parameters()]
        blocks = sum(runner.split.stages[s].n_blocks for s in runner.stages)
        self.tensor_parallel = PipelineLayout(model_layout(model), group, mine, everything, blocks)
        self._sizes = {name: p.data.size for name, p in model.named_parameters()}
        _release_other_stages(model, runner)

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """The stages' parameters by dense name, less the tied copies."""
        copies = {id(tie.params[1]) for tie in self.runner.tied_parameters() if tie.params[1] is not None}
        return [(name, p) for name, p in self.runner.named_parameters() if id(p) not in copies]

    def modules(self) -> list[Module]:
        """Every module of this rank's stages (what a plan looks for in a model: MoE layers, experts)."""
        return [m for stage in self.runner.stages.values() for m in stage.modules()]

    def train(self, mode: bool = True) -> PipelineModel:
        self.dense.train(mode)  # the stages are the dense model's layers (and a head's copy)
        for stage in self.runner.stages.values():
            stage.train(mode)
        return self

    def eval(self) -> PipelineModel:
        return self.train(False)

    def checkpoint_units(self) -> list[Module]:
        """Every block of the dense model, so a `memory.checkpointing` spec picks the blocks one device's
        would (the stages share them)."""
        return self.dense.checkpoint_units()

    def state_windows(self, rank: int | None = None) -> list[tuple[int, int]]:
        """(offset, numel) of each of pipeline rank `rank`'s stages (default: this rank's) in the whole
        model's flat state, in the dense parameter order (tensor-parallel shapes under TP): where a
        checkpoint puts them. A stage's parameters are one run of the model's (the stages cut the blocks in
        order; the tied copy is left out): one window per chunk, and with one chunk the rank's whole state."""
        split, ranks = self.runner.split, self.group.world_size
        rank = self.group.rank if rank is None else rank
        sizes = self._sizes
        order = list(sizes)
        windows = []
        for s in range(rank, len(split), ranks):
            names = [n for n in split.stages[s].parameter_names if n in sizes]  # the tied copy is not
            first = order.index(names[0])
            assert order[first:first + len(names)] == names, "a stage's parameters are one run of the model's"
            windows.append((sum(sizes[n] for n in order[:first]), sum(sizes[n] for n in names)))
        return windows

    def units(self) -> list[Module]:
        return [u for i in sorted(self.runner.stages) for u in self.runner.stages[i].units()]


def _release_other_stages(model: GPT, runner: StageRunner) -> None:
    """Every rank built the whole model (so each stage starts from the one device's initialisation); the
    other stages' parameters are dropped here, so a rank holds its stages' bytes only, as the ledger and
    the estimator count them. Their modules stay: the blocks' indices are what checkpointing specs name."""
    kept = {id(p) for p in runner.parameters()}
    for _, p in model.named_parameters():
        if id(p) not in kept:
            p.data, p.grad = np.empty(0, p.data.dtype), None


def pipeline_model(model, cfg, groups, comm, dataset):
    """`model` as this rank trains it under cfg.parallel: itself with one pipeline stage, else the
    PipelineModel of its stages (parallel.pipeline × parallel.chunks virtual stages, cut by
    parallel.stage_balance; a cut by measured time is rank 0's, so every rank cuts alike: the "time"
    balance measures the forward on a row of the first batch)."""
    p = cfg.parallel
    if p.pipeline == 1:
        return model
    sample = dataset.global_batch(0, "train")[0][:1] if p.stage_balance == "time" else None
    if sample is not None:  # under context parallelism the rank's tokens of it (every CP rank measures)
        sample = context_of(model).local(sample)
    split = split_model(model, p.pipeline * p.chunks, p.stage_balance, sample)
    if p.stage_balance == "time" and comm.world_size > 1:
        split = describe(model, broadcast_json(comm, split.block_counts), "time")
    runner = StageRunner.for_rank(model, split, groups.pp.rank, p.pipeline, loss_fn=model_layout(model).loss)
    return PipelineModel(model, runner, groups.pp)
