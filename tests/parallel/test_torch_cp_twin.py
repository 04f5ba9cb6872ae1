"""The PyTorch twin of our context parallelism (engine/bench/cp_peer.py: ring attention written by hand in
torch, hops over gloo, since PyTorch's own context_parallel has no CPU attention kernel), the peer `bench
step` races our CP against, computes what our dense model computes: the mean of its ranks' losses over the
first steps, on rank processes, equals one device's (our Trainer, one rank) within float32 rounding — CP 2
zigzag, CP 2 contiguous, and DP 2 x CP 2 with micro-batches. A layout it cannot race is refused in words."""

from __future__ import annotations

import numpy as np
import pytest
from extras import needs

from engine.comm.base import Signals
from engine.comm.threads import ThreadGroup
from engine.config import from_dict, to_dict
from engine.config.presets import load_preset
from engine.trainer import Trainer

torch = needs("torch", "torch", "the PyTorch ring-attention twin is the peer under test")
from engine.bench.cp_peer import twin_losses, unraced  # noqa: E402 - needs torch

STEPS = 3
SMALL = ["model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=32", "model.dropout=0.0",
         "train.global_batch=4", "train.steps=100", "optim.warmup_steps=2", 'parallel.backend="processes"']


def layout(*sets: str):
    """gpt-mini made small, on a context-parallel layout."""
    return load_preset("gpt-mini", [*SMALL, *sets])[0]


def dense_losses(cfg) -> list[float]:
    """Our Trainer's losses on one rank: the same model, batches, schedule, clipping and AdamW."""
    d = to_dict(cfg)
    d["parallel"].update(world_size=1, context=1, backend="threads")
    trainer = Trainer(from_dict(d), ThreadGroup(1, 30.0, Signals()).communicator(0))
    try:
        return [trainer.train_step()["loss"] for _ in range(STEPS)]
    finally:
        trainer.replica.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["zigzag", "contiguous"])
def test_torch_ring_twin_trains_what_one_device_trains(kind):
    cfg = layout("parallel.world_size=2", "parallel.context=2", f'parallel.context_layout="{kind}"')
    ranks = twin_losses(cfg, STEPS)
    assert ranks[0] != ranks[1]  # each rank's loss is over its own tokens
    np.testing.assert_allclose(np.mean(ranks, axis=0), dense_losses(cfg), rtol=1e-5)


@pytest.mark.slow
def test_torch_dp_x_cp_twin_trains_what_one_device_trains():
    cfg = layout("parallel.world_size=4", "parallel.context=2", "train.micro_batches=2")
    ranks = twin_losses(cfg, STEPS)
    np.testing.assert_allclose(np.mean(ranks, axis=0), dense_losses(cfg), rtol=1e-5)


def test_a_layout_the_ring_twin_cannot_race_is_named():
    cfg = layout("parallel.world_size=4", "parallel.context=2", "parallel.tensor=2")
    assert "data x context layouts only" in unraced(cfg)
    assert unraced(layout("parallel.world_size=2", "parallel.context=2")) is None
