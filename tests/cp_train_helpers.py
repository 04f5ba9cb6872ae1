"""Tiny float64 configs and a rank function shared by the tests that train a context-parallel GPT through
the Trainer (tests/parallel/test_cp_train.py). Rank functions take only JSON arguments.

Shapes: tests/tp_train_helpers.py's (context 8: zigzag over 2 ranks cuts 4 chunks of 2 tokens, contiguous 2
of 4; 4 heads of width 4; vocabulary 11); no dropout unless asked (each rank then draws its part of one
device's masks).
"""

from __future__ import annotations

import numpy as np

from engine.comm.objects import all_gather_json
from engine.config import from_dict
from engine.trainer import Trainer
from tests.tp_train_helpers import tp_config


def cp_config(world: int = 1, context: int = 1, layout: str = "zigzag", tensor: int = 1, zero: int = 0,
              dropout: float = 0.0, **over) -> dict:
    """tp_config's float64 GPT run of 3 clipped steps, with `dropout`, at context degree `context`."""
    return tp_config(world, tensor, zero=zero, model__dropout=dropout, parallel__context=context,
                     parallel__context_layout=layout, **over)


def grad_rank(comm, emit, cfg_dict: dict) -> dict:
    """Rank function: the first step's loss on this rank and every parameter's whole gradient once the
    replica has reduced it (DDP), before any update: tensor-parallel shards gathered over the world and joined
    by their ShardSpecs, as dense_params joins the parameters."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        batch = trainer.dataset.global_batch(0, "train")
        trainer.replica.zero_grad()
        loss = trainer._accumulate(batch)
        trainer.replica.finish_backward()
        layout, params = trainer.layout, trainer.model.parameters()
        mine = {"tp": layout.rank, "grads": {p.name: np.array(p.grad).tolist() for p in params}}
        everyone = all_gather_json(comm, mine) if comm.world_size > 1 else [mine]
        by_tp = {e["tp"]: e["grads"] for e in everyone}
        grads = {}
        for name in mine["grads"]:
            shards = [np.asarray(by_tp[t][name]) for t in sorted(by_tp)]
            spec = layout.specs.get(name)
            grads[name] = (shards[0] if spec is None else spec.unshard(shards)).tolist()
        return {"loss": trainer._mean_over_ranks(loss)[0], "grads": grads}
    finally:
        trainer.replica.close()


def traffic_rank(comm, emit, cfg_dict: dict) -> dict:
    """Rank function: one training step; the bytes this rank sent by (group, phase); its blocks computed."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        trainer.train_step()
        sent = {f"{row['group']} {row['phase']}": row["bytes_per_step"] for row in trainer.traffic.per_step()}
        return {"sent": sent, "blocks": trainer.context.ring.work["blocks"]}
    finally:
        trainer.replica.close()


def work_rank(comm, emit, cfg_dict: dict) -> list[dict]:
    """Rank function: a whole run (evaluations at its start and end included); its ContextWork events."""
    events: list[dict] = []
    trainer = Trainer(from_dict(cfg_dict), comm, emit=events.append)
    try:
        trainer.fit()
        return [e for e in events if e["kind"] == "context_work" and e["rank"] == comm.rank]
    finally:
        trainer.replica.close()
