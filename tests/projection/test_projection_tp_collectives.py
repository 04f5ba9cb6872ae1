"""The projection sends what the engine sends: the collectives the step model replays for one tensor-parallel
step (kind, traffic-meter phase, bytes, how many) against those the real plan (engine.parallel.tensor) runs,
counted on a threads world — TP and TP+SP, with and without activation checkpointing, and an MLP."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict
from engine.config.rules_layout import describing_layout
from engine.nn import MLP
from engine.parallel.tensor import parallelize
from engine.projection.clusters import load_cluster
from engine.projection.project import predict
from engine.recompute import apply_checkpointing
from tests.tp_helpers import BLOCK, HEADS, VOCAB, WIDTH, count_collectives, random_batches, tiny_gpt, tp_group

ROWS, LAYERS, MLP_WIDTHS = 2, 2, [6, 12, 8, 12, 5]


@pytest.fixture
def calls(monkeypatch):
    """Every collective of the tensor-parallel package, as (global rank, kind, phase, elements)."""
    return count_collectives(monkeypatch)


def _gpt_rank(comm, emit, t, sp, checkpointing, x, y):
    model = parallelize(tiny_gpt(n_layer=LAYERS), tp_group(comm, t), sp)
    apply_checkpointing(model, checkpointing)
    tp = model.tensor_parallel
    model.rng.begin(0, 0)
    tp.loss(model(x), y).backward()
    tp.reduce_sequence_parallel_grads()
    tp.grad_sum_of_squares()  # the gradient norm's share over the group


def _mlp_rank(comm, emit, t, x, y):
    model = parallelize(MLP(MLP_WIDTHS, dtype=np.float64), tp_group(comm, t))
    tp = model.tensor_parallel
    tp.loss(model(x), y).backward()
    tp.grad_sum_of_squares()


def _engine(calls, t, fn, *args):
    """Per rank, the collectives: (kind, phase, bytes of float64) counted."""
    calls.clear()
    run_ranks(t, "threads", fn, args=(t, *args), timeout_s=60)
    return [Counter((kind, phase, 8 * n) for rank, kind, phase, n in calls if rank == r) for r in range(t)]


def _projected(cfg, tmp_path, vocab: int):
    path = tmp_path / "cluster.toml"
    path.write_text('nodes = 1\nranks_per_node = 8\n[compute]\npeak_tflops_fp64 = 1\n'
                    '[intra]\nbandwidth_gbs = 10\nlatency_us = 1\n')
    step, _, _ = predict(cfg, load_cluster(path), None, vocab)
    return Counter({(c["kind"], c["phase"], c["bytes"]): c["count"] for c in step.tp["per_step"]})


def _config(model: dict, data: dict, t: int, sp: bool = False, checkpointing: str = "none"):
    with describing_layout():
        return from_dict({"model": model, "data": data, "precision": {"dtype": "fp64"},
                          "memory": {"checkpointing": checkpointing}, "train": {"global_batch": ROWS},
                          "parallel": {"world_size": t, "tensor": t, "sequence_parallel": sp}})


GPT = {"n_layer": LAYERS, "n_embd": WIDTH, "n_head": HEADS, "block_size": BLOCK, "vocab_size": VOCAB,
       "bias": True, "tie_weights": True}


@pytest.mark.parametrize("t", [2, 3])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("checkpointing", ["none", "blocks"])
def test_a_gpt_step_sends_what_the_plan_sends(calls, tmp_path, t, sp, checkpointing):
    x, y = random_batches(1, rows=ROWS)[0]
    counted = _engine(calls, t, _gpt_rank, sp, checkpointing, x, y)
    cfg = _config(GPT, {"kind": "synthetic-lm", "n_samples": 64}, t, sp, checkpointing)
    projected = _projected(cfg, tmp_path, VOCAB)
    assert all(c == projected for c in counted), (projected, counted[0])


def test_an_mlp_step_sends_what_the_plan_sends(calls, tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((ROWS, MLP_WIDTHS[0])), rng.integers(0, MLP_WIDTHS[-1], ROWS)
    counted = _engine(calls, 2, _mlp_rank, x, y)
    cfg = _config({"kind": "mlp", "widths": MLP_WIDTHS}, {"kind": "synthetic-classification"}, 2)
    projected = _projected(cfg, tmp_path, 0)
    assert all(c == projected for c in counted), (projected, counted[0])
