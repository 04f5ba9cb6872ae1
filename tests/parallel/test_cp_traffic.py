"""Ring attention's traffic, metered per group and phase, is what the ring should send: per block and
micro-batch, c-1 forward hops of this rank's keys and values (2·b·(s/c)·(h/t) elements of the training dtype,
"cp-fwd-kv"), c-1 backward hops of them again ("cp-bwd-kv") and c hops of their gradients in the compute dtype
("cp-bwd-kv-grad"), all in the context-parallel group; a recomputed block sends its forward hops again. The
gradient reduce goes over the data x context group. The blocks each rank computes are counted."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from engine.parallel.mesh import Mesh
from tests.cp_train_helpers import cp_config, traffic_rank

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
