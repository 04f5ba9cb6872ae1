"""Stopping a multi-rank run: every rank leaves after the same step, whatever moment each one notices."""

from __future__ import annotations

import threading

import pytest

from engine.job import run_training
from engine.presets import load_preset


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_stop_request_ends_every_rank_cleanly(backend):
    cfg, _, _ = load_preset("mlp", ["train.steps=200", "optim.warmup_steps=0", "data.n_samples=2048",
                                    "train.eval_every=0", "parallel.world_size=2", "parallel.bucket_cap_mb=1",
                                    f'parallel.backend="{backend}"'])
    for _ in range(3):  # the race this guards against (one rank evaluating, one sending) is timing-bound
        stop = threading.Event()
        steps = []

        def on_event(e, stop=stop, steps=steps):
            if e.kind == "step_end":
                steps.append(e.step)
                if e.step == 3:
                    stop.set()

        summary = run_training(cfg, on_event=on_event, stop_event=stop, record=False)
        assert summary["stopped"]
        assert 3 <= summary["steps"] < 200
        assert steps == list(range(1, summary["steps"] + 1))
