"""Expert parallelism beside ZeRO (float64, 4 thread ranks): the replicated parameters sharded over the
data-parallel group as without experts, the experts' gradients reduce-scattered and their AdamW state sharded
over the expert-data-parallel group. EP 2 (edp groups of 2) and EP 4 (edp groups of 1), top-1 and top-2,
ZeRO-1 and ZeRO-2, against EP 1 under DDP: the loss and gradient norm of every step and every parameter
after 3 clipped AdamW steps within 1e-10; each rank's model states at rest are what the estimator says.
Beside tensor and pipeline parallelism too."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict
from engine.memory.estimator import estimate
from engine.memory.ledger import MODEL_STATES
from engine.trainer import Trainer
from tests.ep_train_helpers import RTOL, STEPS, moe_config
from tests.moe_mesh_helpers import moe_config as moe_config_mesh
from tests.moe_mesh_helpers import one_device_config
from tests.pp_train_helpers import assert_trains_like
from tests.pp_train_helpers import train_rank as pp_train_rank


def train_rank(comm, emit, cfg_dict: dict) -> dict:
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        at_rest = {k: trainer.ledger.current[k] for k in MODEL_STATES}
        out = [trainer.train_step() for _ in range(STEPS)]
        return {"losses": [s["loss"] for s in out], "norms": [s["grad_norm"] for s in out],
                "params": {n: p.data.copy() for n, p in trainer.model.named_parameters()},
                "at_rest": at_rest}
    finally:
        trainer.replica.close()


def _train(expert: int, top_k: int, stage: int) -> tuple[list[dict], dict]:
    cfg = moe_config(expert, top_k)
    cfg["parallel"]["zero_stage"] = stage
    return run_ranks(4, "threads", train_rank, args=(cfg,), timeout_s=120), cfg


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("expert, top_k", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_expert_parallel_zero_equals_ep_1(expert, top_k, stage):
    one, _ = _train(1, top_k, 0)
    split, cfg = _train(expert, top_k, stage)
    for r in split:
        np.testing.assert_allclose(r["losses"], one[0]["losses"], rtol=RTOL)
        np.testing.assert_allclose(r["norms"], one[0]["norms"], rtol=RTOL)
    assert one[0]["norms"][0] > 0.05  # clipping acts: the norm's sharded, experts-once sums matter
    held: dict = {}
    for r in split:
        for name, value in r["params"].items():
            held.setdefault(name, value)
            np.testing.assert_array_equal(value, held[name])  # every copy of a parameter stays equal
    whole = one[0]["params"]
    assert held.keys() == whole.keys()
    for name, value in whole.items():
        scale = np.abs(value).max()
        np.testing.assert_allclose(held[name], value, rtol=RTOL, atol=RTOL * scale, err_msg=name)
    states = estimate(from_dict(cfg)).states
    for r in split:
        assert r["at_rest"] == states, r["at_rest"]


@pytest.mark.parametrize("world, tensor, pipeline, stage", [(8, 2, 1, 2), (4, 2, 1, 1), (4, 1, 2, 1)],
                         ids=["dp4-tp2-ep2-zero2", "dp2-tp2-ep2-zero1", "dp2-pp2-ep2-zero1"])
def test_beside_tensor_and_pipeline_parallelism(world, tensor, pipeline, stage):
    """ZeRO beside experts inside a mesh (float64, against one device running the same micro-batches): the
    experts' state sharded over edp (DP 4 x TP 2: edp groups of 2, each expert tensor-split too), the
    replicated parameters over dp; every parameter after 3 steps within 1e-10."""
    over = {"model__n_layer": 4} if pipeline > 1 else {}
    one = run_ranks(1, "threads", pp_train_rank, args=(one_device_config(world, pipeline, 2, tensor=tensor,
                                                                          **over), STEPS), timeout_s=120)[0]
    cfg = moe_config_mesh(world, pipeline, 2, tensor=tensor, expert=2, parallel__zero_stage=stage, **over)
    ranks = run_ranks(world, "threads", pp_train_rank, args=(cfg, STEPS), timeout_s=300)
    assert_trains_like(ranks, one, grads=False)  # ZeRO keeps a part of each gradient: the parameters tell
