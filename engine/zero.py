"""Choosing a replica for a ZeRO stage: how gradients are synchronised and where optimizer state lives.

Stage 0 is plain DDP (engine.ddp). Stages 1-3 shard optimizer state, gradients and parameters.
"""

from __future__ import annotations

from engine.ddp import DataParallel


def make_replica(cfg, model, comm):
    """The replica object the trainer drives (see engine.ddp.DataParallel for the interface)."""
    stage = cfg.parallel.zero_stage
    if stage == 0:
        return DataParallel(cfg, model, comm)
    raise NotImplementedError(f"parallel.zero_stage = {stage} is not implemented yet")
