"""Ring attention's traffic, metered per group and phase, is what the ring should send: per block and
micro-batch, c-1 forward hops of this rank's keys and values (2·b·(s/c)·(h/t) elements of the training dtype,
"cp-fwd-kv"), c-1 backward hops of them again ("cp-bwd-kv") and c hops of their gradients in the compute dtype
("cp-bwd-kv-grad"), all in the context-parallel group; a recomputed block sends its forward hops again. The
gradient reduce goes over the data x context group. The blocks each rank computes are counted."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from engine.parallel.context.layout import SequenceLayout
from engine.parallel.mesh import Mesh
from tests.cp_train_helpers import cp_config, traffic_rank, work_rank

B, S, H, LAYERS = 4, 8, 16, 2  # cp_config(): global batch 4, context 8, width 16, 2 blocks


@pytest.mark.parametrize("world, c, t, dtype, ckpt", [(2, 2, 1, "fp64", False), (4, 4, 1, "bf16", True),
                                                       (8, 2, 2, "fp32", False)])
def test_ring_bytes_per_group_and_phase(world, c, t, dtype, ckpt):
    cfg = cp_config(world, c, "zigzag", t, precision__dtype=dtype,
                    memory__checkpointing="blocks" if ckpt else "none")
    dp = world // (c * t)
    size, compute = {"fp64": (8, 8), "bf16": (2, 4), "fp32": (4, 4)}[dtype]
    elements = 2 * (B // dp) * (S // c) * (H // t)
    expected = {"cp-fwd-kv": LAYERS * (c - 1) * elements * size * (2 if ckpt else 1),
                "cp-bwd-kv": LAYERS * (c - 1) * elements * size,
                "cp-bwd-kv-grad": LAYERS * c * elements * compute}
    mesh = Mesh(world, tp=t, cp=c)
    for rank, r in enumerate(run_ranks(world, "threads", traffic_rank, args=(cfg,), timeout_s=120)):
        ring = {key: sent for key, sent in r["sent"].items() if key.split()[1].startswith("cp-")}
        assert ring == {f"{mesh.group_name('cp', rank)} {phase}": n for phase, n in expected.items()}, rank
        # the gradients are reduced over the ranks that hold the same weights: data x context
        reduce_group = "world" if t == 1 else mesh.group_name("dpcp", rank)
        assert any(key.startswith(reduce_group + " ") and "reduce" in key for key in r["sent"]), r["sent"]
        assert r["blocks"] == (2 * c + 1) * LAYERS * (2 if ckpt else 1)  # zigzag: the same on every rank


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_each_rank_reports_its_attention_work_each_step(layout):
    """One ContextWork per rank and step: the blocks its ring computed in that step's training forwards (two
    micro-batches; the evaluations left out), and their scores, a diagonal block's whole square."""
    c, steps, micro = 2, 3, 2
    cfg = cp_config(c, c, layout, train__steps=steps, train__micro_batches=micro, train__eval_every=1)
    n = S // (2 * c) if layout == "zigzag" else S // c  # chunk length
    rows = B // micro  # per micro-batch (one data-parallel rank)
    for rank, events in enumerate(run_ranks(c, "threads", work_rank, args=(cfg,), timeout_s=120)):
        blocks = SequenceLayout(layout, c).causal_blocks(rank) * LAYERS * micro
        assert [(e["step"], e["blocks"], e["layout"], e["degree"]) for e in events] == \
            [(step, blocks, layout, c) for step in range(1, steps + 1)]
        assert {e["scores"] for e in events} == {blocks * rows * 4 * n * n}  # 4 heads
