"""The by-hand tensor parallelism (engine/parallel/tensor/by_hand_tp.py): one transformer block on t ranks
in plain NumPy gives one device's output and input gradient, and each rank the same gradients of its
slices as the real tensor-parallel block (plan.py through the autograd), float64 within 1e-12; it stays
under 150 lines; its entry point prints t ranks against one device."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.parallel.tensor import by_hand_tp
from engine.tensor import Tensor
from tests.parallel_helpers import by_hand_main
from tests.tp_helpers import BLOCK, HEADS, WIDTH, assert_close, tiny_gpt, tp_model

PREFIX = "blocks.0."


def _block_inputs():
    rng = np.random.default_rng(3)
    return rng.standard_normal((2, BLOCK, WIDTH)), rng.standard_normal((2, BLOCK, WIDTH))


def _dense_block():
    """Block 0 of a one-layer GPT, its biases made nonzero so adding one twice would show."""
    model = tiny_gpt(n_layer=1)
    rng = np.random.default_rng(4)
    for p in model.blocks[0].parameters():
        p.data[...] += rng.standard_normal(p.shape) * 0.05
    return model


def _both_rank(comm, emit, x, dout):
    """The real tensor-parallel block and the by-hand one on the same rank: (by hand, real)."""
    model = tp_model(comm, comm.world_size, _dense_block, False)
    inp = Tensor(x.copy(), requires_grad=True)
    out = model.blocks[0](inp)
    out.backward(dout)
    real = {"out": out.data, "dx": inp.grad,
            "grads": {n: p.grad for n, p in model.blocks[0].named_parameters()}}
    dense = {n[len(PREFIX):]: p.data for n, p in _dense_block().named_parameters() if n.startswith(PREFIX)}
    return by_hand_tp.block_on_rank(comm, emit, dense, x, dout, HEADS), real


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_by_hand_equals_the_real_block_and_one_device(t):
    x, dout = _block_inputs()
    block = _dense_block().blocks[0]
    inp = Tensor(x.copy(), requires_grad=True)
    out = block(inp)
    out.backward(dout)
    for by_hand, real in run_ranks(t, "threads", _both_rank, args=(x, dout), timeout_s=60):
        for result in (by_hand, real):
            assert_close(result["out"], out.data, 1e-12)
            assert_close(result["dx"], inp.grad, 1e-12)
        assert by_hand["grads"].keys() == real["grads"].keys()
        for name, grad in real["grads"].items():
            assert_close(by_hand["grads"][name], grad, 1e-12)


def test_it_stays_under_150_lines():
    with open(by_hand_tp.__file__, encoding="utf-8") as f:
        assert len(f.read().splitlines()) < 150


def test_the_entry_point_prints_t_ranks_against_one_device():
    printed = by_hand_main(by_hand_tp.__file__, "within ")
    assert [ranks for ranks, _ in printed] == ["1", "2", "3", "4"]
    assert all(error < 1e-12 for _, error in printed), printed
