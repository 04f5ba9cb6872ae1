"""PyTorch's pipeline twin (engine/bench/pp_peer.py: torch.distributed.pipelining on gloo), the peer `bench
step` races our pipeline against, computes what our dense model computes: its losses over the first steps,
on rank processes, equal one device's (our Trainer, one rank) within float32 rounding — under each of the
four schedules, and DP 2 x PP 2 with an untied head."""

from __future__ import annotations

import numpy as np
import pytest
from extras import needs

from engine.comm.base import Signals
from engine.comm.threads import ThreadGroup
from engine.config import from_dict, to_dict
from engine.config.presets import load_preset
from engine.trainer import Trainer

torch = needs("torch", "torch", "PyTorch's pipelining is the peer under test")
from engine.bench.pp_peer import twin_losses  # noqa: E402 - needs torch

STEPS = 3
SMALL = ["model.n_layer=4", "model.n_embd=64", "model.block_size=32", "train.global_batch=8",
         "train.micro_batches=4", "train.steps=100", "optim.warmup_steps=2", 'parallel.backend="processes"']


def layout(*sets: str):
    """gpt-mini made small, on a pipeline layout."""
    return load_preset("gpt-mini", [*SMALL, *sets])[0]


def dense_losses(cfg) -> list[float]:
    """Our Trainer's losses on one rank: the same model, batches, schedule, clipping and AdamW."""
    d = to_dict(cfg)
    d["parallel"].update(world_size=1, pipeline=1, chunks=1, schedule="1f1b", backend="threads")
    trainer = Trainer(from_dict(d), ThreadGroup(1, 30.0, Signals()).communicator(0))
    try:
        return [trainer.train_step()["loss"] for _ in range(STEPS)]
    finally:
        trainer.replica.close()


@pytest.mark.slow
@pytest.mark.parametrize("schedule,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_torch_pp_twin_trains_what_one_device_trains(schedule, chunks):
    cfg = layout("parallel.world_size=2", "parallel.pipeline=2", f'parallel.schedule="{schedule}"',
                 f"parallel.chunks={chunks}")
    first, last = twin_losses(cfg, STEPS)
    assert first == [0.0] * STEPS  # the loss is the last stage's
    np.testing.assert_allclose(last, dense_losses(cfg), rtol=1e-5)


@pytest.mark.slow
def test_torch_dp_x_pp_twin_trains_what_one_device_trains():
    cfg = layout("parallel.world_size=4", "parallel.pipeline=2", "model.tie_weights=false")
    ranks = twin_losses(cfg, STEPS)  # order tp-cp-ep-dp-pp: ranks 2 and 3 hold the last stage
    assert ranks[2] != ranks[3]  # the two DP ranks see different rows
    np.testing.assert_allclose(np.mean([ranks[2], ranks[3]], axis=0), dense_losses(cfg), rtol=1e-5)
