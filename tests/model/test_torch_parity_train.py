"""Whole-model training parity: our trainer vs PyTorch eager on identical weights and batches.

gpt-mini and mlp (the presets themselves, shortened to 20 steps) are trained by our Trainer on one
rank and by a PyTorch twin with the same weights, batches, AdamW hyper-parameters (decay on
matrices only, like ours), LR schedule and global-norm clipping. Losses agree to 1e-5 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
from extras import needs

from engine.comm.base import Signals
from engine.comm.threads import ThreadGroup
from engine.config.presets import load_preset
from engine.optim import lr_at
from engine.trainer import Trainer

torch = needs("torch", "torch", "PyTorch is the reference for training parity")
from engine.bench import torch_peer  # noqa: E402 - needs torch, imported once it is known to be there

STEPS = 20


def _torch_losses(cfg, trainer) -> list[float]:
    twin = torch_peer.torch_model_from(trainer.model)
    o = cfg.optim
    opt = torch_peer.torch_adamw(twin, o)
    losses = []
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, o.schedule, o.lr, o.min_lr, o.warmup_steps, cfg.train.steps)
        x, y = trainer.dataset.global_batch(step, "train")
        losses.append(torch_peer.torch_train_step(twin, opt, x, y, o.grad_clip))
    return losses


@pytest.mark.parametrize("preset, extra", [
    ("gpt-mini", []),
    ("mlp", ["data.n_samples=4096"]),
])
def test_twenty_adamw_steps_match_pytorch(preset, extra):
    cfg, _, _ = load_preset(preset, [*extra, "parallel.world_size=1"])
    trainer = Trainer(cfg, ThreadGroup(1, 30.0, Signals()).communicator(0))
    theirs = _torch_losses(cfg, trainer)  # the twin copies the weights before we train ours
    ours = [trainer.train_step()["loss"] for _ in range(STEPS)]
    trainer.replica.close()
    assert ours[-1] < ours[0]  # it trains
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_the_bf16_autocast_step_runs_its_products_in_bfloat16():
    """bench step's PyTorch bf16 peer really is autocast: its first loss is bf16's rounding away from the
    float32 step's on the same weights and batch (more than float32 round-off, within bf16's 2^-8)."""
    cfg, _, _ = load_preset("gpt-mini", ["parallel.world_size=1"])
    trainer = Trainer(cfg, ThreadGroup(1, 30.0, Signals()).communicator(0))
    x, y = trainer.dataset.global_batch(0, "train")
    losses = {}
    for cast in (None, torch.bfloat16):
        twin = torch_peer.torch_model_from(trainer.model)
        losses[cast] = torch_peer.torch_train_step(twin, torch_peer.torch_adamw(twin, cfg.optim), x, y,
                                                   cfg.optim.grad_clip, cast)
    trainer.replica.close()
    assert 1e-6 < abs(losses[torch.bfloat16] / losses[None] - 1) < 2**-6
