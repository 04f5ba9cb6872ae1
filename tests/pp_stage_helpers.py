"""Shared by the pipeline stage tests (tests/parallel/test_pp_*.py): one device's step with m micro-batches of
accumulation, the same step run stage by stage through StageRunners in one process, and the comparison.

Models are tests.tp_helpers.tiny_gpt (float64) with 4 or 6 blocks.
"""

from __future__ import annotations

import numpy as np

from engine import ops
from engine.parallel.pipeline.split import split_model
from engine.parallel.pipeline.stage import StageRunner
from engine.recompute import apply_checkpointing
from tests.tp_helpers import assert_close, random_batches, tiny_gpt

STEP = 7  # a step other than 0: dropout masks are keyed by it
RTOL = 1e-12


def model_fn(n_layer: int = 4, dropout: float = 0.0, tie_weights: bool = True, checkpointing: str = "none",
             dtype=np.float64):
    def build():
        model = tiny_gpt(n_layer=n_layer, dropout=dropout, tie_weights=tie_weights, dtype=dtype)
        apply_checkpointing(model, checkpointing)
        return model
    return build


def micro_batches(m: int, rows: int = 2, seed: int = 1) -> list:
    """m micro-batches (x, y), each its own arrays (not views of one), as a data loader's slices would
    count in the memory ledger."""
    return [(x.copy(), y.copy()) for x, y in random_batches(m, rows=rows, seed=seed)]


def one_device(build, batches) -> dict:
    """Each micro-batch's loss and every gradient (by name) of one device accumulating over the micro-batches
    with the mean loss, dropout keyed as the trainer keys it (the step, the micro-batch's first row)."""
    model, m, row = build(), len(batches), 0
    losses = []
    for x, y in batches:
        model.rng.begin(STEP, row)
        row += len(x)
        loss = ops.cross_entropy(model(x), y)
        losses.append(float(loss.data))
        (loss * (1.0 / m)).backward()
    return {"losses": losses, "grads": {n: p.grad for n, p in model.named_parameters()}}


def runners(build, stages: int, ranks: int = 1, balance="params") -> list[StageRunner]:
    """One dense model cut into `stages`, held by `ranks` runners (rank r: stages r, r + ranks, ...)."""
    model = build()
    split = split_model(model, stages, balance)
    return [StageRunner.for_rank(model, split, r, ranks) for r in range(ranks)]


def run_step(held: list[StageRunner], batches, order: str = "gpipe") -> dict:
    """Run one step's forwards and backwards through the runners in one process.

    order: "gpipe" (every forward, then every backward), "1f1b" (micro-batch j's backward right after
    micro-batch j + 1's forward), "split" (gpipe's, with backward_input then, after all of them,
    backward_weight) or "split-1f1b" (1f1b with each backward_input's backward_weight one micro-batch late).
    Returns the losses by micro-batch."""
    n_stages = len(held[0].split)
    owner = {s: r for r in held for s in r.stages}
    m = len(batches)
    for r in held:
        r.begin_step(batches, 1.0 / m, step=STEP)
    split = order.startswith("split")

    def forward(j: int) -> None:
        a = None
        for s in range(n_stages):
            a = owner[s].forward(s, j, a)

    def backward(j: int) -> None:
        g = None
        for s in reversed(range(n_stages)):
            g = owner[s].backward_input(s, j, g) if split else owner[s].backward(s, j, g)

    def weights(j: int) -> None:
        for s in range(n_stages):
            owner[s].backward_weight(s, j)

    if order in ("gpipe", "split"):
        for j in range(m):
            forward(j)
        for j in range(m):
            backward(j)
        for j in range(m if split else 0):
            weights(j)
    else:  # one forward ahead, then alternate (1F1B's steady state); W one micro-batch behind its I
        forward(0)
        for j in range(m):
            if j + 1 < m:
                forward(j + 1)
            backward(j)
            if split and j >= 1:
                weights(j - 1)
        if split:
            weights(m - 1)
    assert all(r.in_flight() == 0 for r in held)
    losses = {}
    for r in held:
        losses.update(r.losses)
    return {"losses": [losses[j] for j in range(m)], "grads": pipeline_grads(held)}


def pipeline_grads(held: list[StageRunner]) -> dict[str, np.ndarray]:
    """Every gradient by dense name; a tied weight's copies summed (what the executor's reduce gives)."""
    grads = {n: p.grad for r in held for n, p in r.named_parameters()}
    if any(r.tied_parameters() for r in held):
        grads["wte.weight"] = grads["wte.weight"] + grads.pop("lm_head.weight")
    return grads


def assert_matches(got: dict, expected: dict) -> None:
    np.testing.assert_allclose(got["losses"], expected["losses"], rtol=RTOL, atol=0.0)
    assert sorted(got["grads"]) == sorted(expected["grads"])
    for name, g in expected["grads"].items():
        assert_close(got["grads"][name], g, RTOL)
