"""The plan's cut read from parameter names and shapes alone (engine.parallel.tensor.specs, what the
estimator and checkpoints use) is the cut parallelize makes on a live model: the same ShardSpec for every
parameter it shards, none for the others, and each rank's parameter shapes as the shards have them."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from engine.nn import MLP
from engine.parallel.tensor import local_shapes, shard_specs
from tests.tp_helpers import tiny_gpt, tp_model


def _specs_rank(comm, emit, t, kind, tie):
    make = (lambda: tiny_gpt(tie_weights=tie)) if kind == "gpt" else (lambda: MLP([6, 8, 5, 12, 3]))
    dense = [(n, tuple(p.shape)) for n, p in make().named_parameters()]
    model = tp_model(comm, t, make, False)
    local = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    return {"dense": dense, "specs": model.tensor_parallel.specs, "local": local}


@pytest.mark.parametrize("kind, tie", [("gpt", True), ("gpt", False), ("mlp", True)],
                         ids=["gpt", "gpt-untied", "mlp"])
@pytest.mark.parametrize("t", [2, 4])
def test_the_table_is_the_plan(t, kind, tie):
    for r in run_ranks(t, "threads", _specs_rank, args=(t, kind, tie), timeout_s=60):
        assert shard_specs(kind, r["dense"], t) == r["specs"]
        assert local_shapes(kind, r["dense"], t) == r["local"]


def test_one_rank_cuts_nothing():
    shapes = [(n, tuple(p.shape)) for n, p in tiny_gpt().named_parameters()]
    assert shard_specs("gpt", shapes, 1) == {} and local_shapes("gpt", shapes, 1) == shapes
