"""Choosing a replica for a ZeRO stage: how gradients are synchronised and where optimizer state lives.

Stage 0 is plain DDP (engine.ddp). Stages 1-2 shard optimizer state and gradients over buckets
(engine.zero_optimizer); stage 3 shards parameters too, layer by layer (engine.zero3). All implement
the replica interface of CONTRACTS.md, including the checkpoint state API.
"""

from __future__ import annotations

from engine.ddp import DataParallel
from engine.zero3 import Zero3Replica
from engine.zero_optimizer import ZeroReplica


def make_replica(cfg, model, comm):
    """The replica object the trainer drives (see engine.ddp.DataParallel for the interface)."""
    stage = cfg.parallel.zero_stage
    if stage == 0:
        return DataParallel(cfg, model, comm)
    if stage in (1, 2):
        return ZeroReplica(cfg, model, comm, stage)
    if stage == 3:
        return Zero3Replica(cfg, model, comm)
    raise ValueError(f"parallel.zero_stage must be 0-3, got {stage}")
