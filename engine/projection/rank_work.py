"""What one rank computes in a step, before any schedule: its rows, the tensor- and context-parallel terms
that split its work, its share of the tokens, the busiest rank's FLOPs and the rates it computes them at,
and the ring's blocks timed at those rates. The same for a step without a pipeline (step.py) and for each
stage of one (pipeline_step.py)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.parallel.mesh import Mesh
from engine.projection.context import ContextParallel
from engine.projection.flops import FlopsOf, ModelFlops
from engine.projection.machine import Machine
from engine.projection.tensor_parallel import TensorParallel


@dataclass
class RankWork:
    rows: int  # per micro-batch: a context group's ranks share their rows, b = global batch / (dp · m)
    tp: TensorParallel
    cp: ContextParallel
    tokens: float  # a TP and CP rank's share of the micro-batch's work
    flops: ModelFlops  # the busiest rank's
    forward_rate: float  # FLOP/s at `tokens`
    backward_rate: float


def rank_work(cfg, machine: Machine, flops_of: FlopsOf) -> RankWork:
    """cfg's rank on `machine` (its experts' imbalance, where it has them, is step.py's to add)."""
    dtype, k = cfg.precision.dtype, machine.ranks_on_host
    rows = cfg.train.global_batch // (Mesh.of(cfg.parallel).dp * cfg.train.micro_batches)
    tp = TensorParallel(cfg, flops_of.vocab, rows, machine)
    cp = ContextParallel(cfg, rows, machine)
    tokens = tp.tokens(cp.tokens(rows * flops_of.tokens_per_row))
    flops = cp.flops(flops_of(tokens), cfg.model.block_size, cfg.model.n_embd)
    forward_rate, backward_rate = (machine.compute.rate(phase, dtype, tokens, k)
                                   for phase in ("forward", "backward"))
    cp.time_blocks(forward_rate, backward_rate)  # the ring's blocks, which its hops move beside
    return RankWork(rows, tp, cp, tokens, flops, forward_rate, backward_rate)
