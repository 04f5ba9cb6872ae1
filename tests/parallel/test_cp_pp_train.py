"""Context parallelism inside pipeline stages trains what one device trains (float64, dropout 0.1 on, tied
embeddings): each stage's blocks run ring attention over their CP group, the stages hand on each rank's
b × s/c × h slice, and each stage's gradients are averaged over its data x context ranks. Against one device
accumulating the same micro-batches: the loss, gradient norm and first validation loss of every step, every
gradient after the reduce within 1e-12, every parameter after 3 clipped AdamW steps within 1e-10 — PP 2 x CP 2
(1f1b, gpipe, interleaved, zb-h1; both layouts), PP 2 x CP 2 x TP 2 (1f1b, gpipe; with sequence
parallelism), DP 2 x PP 2 x CP 2 with ZeRO-1, and with activation checkpointing; PP 2 x CP 2 on processes."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from tests.pp_train_helpers import assert_trains_like, pp_config, train_rank

STEPS = 3


def _cp_pp(world: int, m: int, schedule: str, layout: str, tensor: int = 1, **over) -> dict:
    """PP 2 x CP 2 (x TP `tensor`, x DP what remains): 2 rows per micro-batch per data-parallel rank."""
    dp = world // (2 * 2 * tensor)
    return pp_config(world, 2, m, schedule, 2 if schedule == "interleaved" else 1, tensor=tensor,
                     parallel__context=2, parallel__context_layout=layout, train__global_batch=2 * m * dp,
                     **over)


CASES = [  # (world, m, schedule, layout, tensor, overrides)
    (4, 2, "1f1b", "zigzag", 1, {}), (4, 3, "gpipe", "contiguous", 1, {}),
    (4, 3, "1f1b", "contiguous", 1, {}), (4, 2, "gpipe", "zigzag", 1, {}),
    (4, 4, "interleaved", "zigzag", 1, {}), (4, 3, "zb-h1", "zigzag", 1, {}),
    (8, 2, "1f1b", "zigzag", 2, {}), (8, 3, "gpipe", "contiguous", 2, {}),
    (8, 2, "1f1b", "zigzag", 2, {"parallel__sequence_parallel": True}),
    (8, 2, "1f1b", "zigzag", 1, {"parallel__zero_stage": 1}),  # DP 2 x PP 2 x CP 2
    (4, 2, "1f1b", "zigzag", 1, {"memory__checkpointing": "blocks"}),
]


@pytest.mark.parametrize("world, m, schedule, layout, tensor, over", CASES, ids=[
    f"w{w}-{s}-m{m}-{k}-tp{t}" + "".join(f"-{key.split('__')[1]}" for key in o)
    for w, m, s, k, t, o in CASES])
def test_context_inside_pipeline_stages_equals_one_device(world, m, schedule, layout, tensor, over):
    ranks = run_ranks(world, "threads", train_rank, args=(_cp_pp(world, m, schedule, layout, tensor, **over),
                                                          STEPS), timeout_s=240)
    dp = world // (4 * tensor)
    zero = over.get("parallel__zero_stage", 0)
    one_over = {k: v for k, v in over.items() if k.startswith("memory__")}
    one = run_ranks(1, "threads", train_rank, args=(pp_config(1, 1, m, rows=2 * dp, **one_over), STEPS),
                    timeout_s=60)[0]
    assert_trains_like(ranks, one, grads=zero == 0)


@pytest.mark.slow
def test_on_processes():
    """PP 2 x CP 2 on rank processes: the ring's hops and the stages' messages cross process boundaries."""
    ranks = run_ranks(4, "processes", train_rank, args=(_cp_pp(4, 2, "1f1b", "zigzag"), STEPS), timeout_s=300)
    one = run_ranks(1, "threads", train_rank, args=(pp_config(1, 1, 2, rows=2), STEPS), timeout_s=60)[0]
    assert_trains_like(ranks, one)
