"""Context parallelism inside pipeline stages: the estimator predicts every rank's ledger to the byte, per
pipeline rank (model states at rest, per phase each category's own maximum and the total at the peak): the
activations over each rank's s/c tokens in flight as the schedule has them (the token ids and targets a
CP rank's own slices, held with each micro-batch), the stage boundaries' b × s/c × h messages, and each
block's ring buffers inside F, B, I or W beside what the running micro-batch holds then
(engine.memory.pipeline_rings) — every schedule, both layouts, with data, tensor (and sequence)
parallelism, ZeRO-1, checkpointing, dropout and 16-bit training beside it."""

from __future__ import annotations

import pytest

from tests.pp_memory_helpers import estimate_of_rank, measured, mismatches, pp_memory_config

CASES = [  # (schedule, p, m, dtype, world, overrides); CP 2 in all
    ("1f1b", 2, 2, "fp64", 4, {}), ("gpipe", 2, 3, "fp32", 4, {"parallel__context_layout": "contiguous"}),
    ("interleaved", 2, 4, "fp64", 4, {}), ("zb-h1", 2, 3, "fp64", 4, {}), ("zb-h1", 3, 4, "fp16", 6, {}),
    ("1f1b", 3, 3, "bf16", 6, {"model__dropout": 0.0}),
    ("1f1b", 2, 2, "fp64", 8, {"tensor": 2}),  # PP 2 x CP 2 x TP 2
    ("gpipe", 2, 3, "bf16", 8, {"tensor": 2, "parallel__sequence_parallel": True}),
    ("zb-h1", 2, 2, "fp32", 8, {"tensor": 2, "parallel__sequence_parallel": True}),
    ("1f1b", 2, 4, "fp64", 8, {"parallel__zero_stage": 1}),  # DP 2 x PP 2 x CP 2
    ("1f1b", 2, 2, "fp64", 4, {"memory__checkpointing": "blocks"}),
    ("zb-h1", 2, 3, "fp64", 4, {"memory__checkpointing": "blocks"}),
    ("zb-h1", 3, 3, "fp32", 6, {"memory__checkpointing": "every:2"}),
]


@pytest.mark.parametrize("name, p, m, dtype, world, over", CASES, ids=[
    f"{n}-p{p}-m{m}-{d}-w{w}" + "".join(f"-{k.rpartition('__')[2]}={v}" for k, v in o.items())
    for n, p, m, d, w, o in CASES])
def test_estimate_equals_the_ledger_per_stage_under_context_parallelism(name, p, m, dtype, world, over):
    over = dict(over)
    dp = world // (p * 2 * over.get("tensor", 1))
    cfg = pp_memory_config(p, m, name, dtype, world, parallel__context=2, train__global_batch=2 * m * dp,
                           **over)
    predicted = estimate_of_rank(cfg)
    assert all(e.maxima["forward"]["comm_buffers"] > 0 for e in predicted.values())
    problems = [line for r in measured(cfg) for line in mismatches(r, predicted[r["rank"]])]
    assert not problems, "\n".join(problems)
