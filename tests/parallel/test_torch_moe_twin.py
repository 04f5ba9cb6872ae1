"""The PyTorch twin of our expert parallelism (engine/bench/moe_peer.py: torchtitan's dispatch written in
torch, all_to_all_single over gloo, split sizes first), the peer `bench step` races our EP against, trains
what we train: without the load-balancing term its ranks' mean loss over the first steps equals one device's
(our Trainer, one rank, every expert local) within float32 rounding; with it (a rank's term is over its own
tokens), the ranks' mean loss equals our own expert-parallel run's. EP 2 and EP 4, 4 experts top-2."""

from __future__ import annotations

import numpy as np
import pytest
from extras import needs

from engine.comm.base import Signals
from engine.comm.launch import run_ranks
from engine.comm.threads import ThreadGroup
from engine.config import from_dict, to_dict
from engine.config.presets import load_preset
from engine.trainer import Trainer

torch = needs("torch", "torch", "the PyTorch expert-parallel twin is the peer under test")
from engine.bench.moe_peer import twin_losses, unraced  # noqa: E402 - needs torch

STEPS = 3
SMALL = ["model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=16", "model.n_experts=4",
         "train.global_batch=8", "train.steps=100", "optim.warmup_steps=2", 'parallel.backend="processes"']


def layout(*sets: str):
    """moe-4 made small."""
    return load_preset("moe-4", [*SMALL, *sets])[0]


def one_device_losses(cfg) -> list[float]:
    d = to_dict(cfg)
    d["parallel"].update(world_size=1, expert=1, backend="threads")
    trainer = Trainer(from_dict(d), ThreadGroup(1, 30.0, Signals()).communicator(0))
    try:
        return [trainer.train_step()["loss"] for _ in range(STEPS)]
    finally:
        trainer.replica.close()


def _our_rank(comm, emit, cfg_dict):
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        return [trainer.train_step()["loss"] for _ in range(STEPS)]
    finally:
        trainer.replica.close()


def our_ep_losses(cfg) -> list[list[float]]:
    d = to_dict(cfg)
    d["parallel"]["backend"] = "threads"
    return run_ranks(cfg.parallel.world_size, "threads", _our_rank, args=(d,), timeout_s=60.0)


@pytest.mark.slow
@pytest.mark.parametrize("ep", [2, 4])
def test_torch_ep_twin_without_aux_trains_what_one_device_trains(ep):
    cfg = layout(f"parallel.world_size={ep}", f"parallel.expert={ep}", "model.aux_loss_coef=0.0")
    np.testing.assert_allclose(np.mean(twin_losses(cfg, STEPS), axis=0), one_device_losses(cfg), rtol=1e-5)


@pytest.mark.slow
def test_torch_ep_twin_with_aux_trains_what_our_ep_run_trains():
    cfg = layout("parallel.world_size=2", "parallel.expert=2")
    np.testing.assert_allclose(np.mean(twin_losses(cfg, STEPS), axis=0),
                               np.mean(our_ep_losses(cfg), axis=0), rtol=1e-5)


def test_a_layout_the_ep_twin_cannot_race_is_named():
    partial = layout("parallel.world_size=4", "parallel.expert=2")
    assert "parallel.expert = world_size only" in unraced(partial)
    assert "dropless" in unraced(layout("parallel.world_size=2", "parallel.expert=2",
                                        "model.capacity_factor=1.25"))
    assert unraced(layout("parallel.world_size=2", "parallel.expert=2")) is None
