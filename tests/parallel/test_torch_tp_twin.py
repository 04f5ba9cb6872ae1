"""PyTorch's tensor-parallel twin (engine/bench/tp_peer.py), the peer `bench step` races our TP against,
computes what our dense model computes: its losses over the first steps, on rank processes over gloo, equal
one device's (our Trainer, one rank) within float32 rounding — TP 2, with sequence parallelism, and DP 2 x
TP 2 with micro-batches and an untied head. gpt-mini's corpus has 95 characters: the vocabulary splits
48 + 47, unevenly. And the fused QKV's row order that gives every rank whole heads is our shard's."""

from __future__ import annotations

import numpy as np
import pytest
from extras import needs

from engine.comm.base import Signals
from engine.comm.threads import ThreadGroup
from engine.config import from_dict, to_dict
from engine.config.presets import load_preset
from engine.parallel.tensor import ShardSpec
from engine.trainer import Trainer

torch = needs("torch", "torch", "PyTorch's tensor parallelism is the peer under test")
from engine.bench.tp_peer import heads_first_qkv, twin_losses  # noqa: E402 - needs torch

STEPS = 4
SMALL = ["model.n_layer=2", "model.n_embd=64", "model.block_size=32", "train.global_batch=8",
         "train.steps=100", "optim.warmup_steps=2", 'parallel.backend="processes"']


def layout(*sets: str):
    """gpt-mini made small, on a tensor-parallel layout."""
    return load_preset("gpt-mini", [*SMALL, *sets])[0]


def dense_losses(cfg) -> list[float]:
    """Our Trainer's losses on one rank: the same model, batches, schedule, clipping and AdamW."""
    d = to_dict(cfg)
    d["parallel"].update(world_size=1, tensor=1, sequence_parallel=False, backend="threads")
    trainer = Trainer(from_dict(d), ThreadGroup(1, 30.0, Signals()).communicator(0))
    try:
        return [trainer.train_step()["loss"] for _ in range(STEPS)]
    finally:
        trainer.replica.close()


@pytest.mark.parametrize("t", [2, 4])
def test_fused_qkv_rows_give_each_rank_its_heads_as_our_shard_does(t):
    dense = torch.arange(3 * 8 * 2, dtype=torch.float64).reshape(3 * 8, 2)  # C = 8 rows per q, k, v
    parts = heads_first_qkv(dense, n_head=8, t=t).chunk(t, dim=0)  # ColwiseParallel's contiguous split
    spec = ShardSpec(axis=0, length=3 * 8, parts=t, sections=3)
    for rank, part in enumerate(parts):
        np.testing.assert_array_equal(part.numpy(), spec.shard(dense.numpy(), rank))
    with pytest.raises(ValueError, match="heads do not split"):
        heads_first_qkv(dense, n_head=6, t=4)


@pytest.mark.slow
@pytest.mark.parametrize("sets", [
    ["parallel.world_size=2", "parallel.tensor=2"],
    ["parallel.world_size=2", "parallel.tensor=2", "parallel.sequence_parallel=true"],
], ids=["tp2", "tp2-sp"])
def test_torch_tp_twin_trains_what_one_device_trains(sets):
    cfg = layout(*sets)
    ranks = twin_losses(cfg, STEPS)
    assert ranks[0] == ranks[1]  # one TP group: one loss, on every rank
    np.testing.assert_allclose(ranks[0], dense_losses(cfg), rtol=1e-5)


@pytest.mark.slow
def test_torch_dp_x_tp_twin_trains_what_one_device_trains():
    cfg = layout("parallel.world_size=4", "parallel.tensor=2", "parallel.sequence_parallel=true",
                 "train.micro_batches=2", "model.tie_weights=false")
    ranks = twin_losses(cfg, STEPS)
    assert ranks[0] == ranks[1] and ranks[2] == ranks[3]  # TP groups {0, 1} and {2, 3}
    assert ranks[0] != ranks[2]  # the two DP ranks see different rows
    np.testing.assert_allclose(np.mean([ranks[0], ranks[2]], axis=0), dense_losses(cfg), rtol=1e-5)
