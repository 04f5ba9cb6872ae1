"""The by-hand expert exchange (engine/parallel/expert/by_hand_exchange.py): two ranks, one expert each,
top-1, in plain NumPy, give each rank the output and input gradient of one device holding both experts, and
the same router and expert gradients as the real expert-parallel layer (layer.py through the autograd),
float64 within 1e-12 — with the tokens split between the ranks, and with every token on one rank's expert
(the other rank receives nothing); it stays under 150 lines; its entry point prints two ranks against one
device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.comm.group import Group
from engine.comm.launch import run_ranks
from engine.parallel.expert import by_hand_exchange
from engine.parallel.expert.plan import parallelize_experts
from engine.tensor import Tensor
from tests.moe_helpers import make_moe, tokens
from tests.parallel_helpers import by_hand_main


def _inputs(routing: str):
    moe = make_moe(2, 1, aux=0.0)
    xs = [tokens(9, seed=s, routing=routing, moe=moe) for s in range(2)]
    dys = list(np.random.default_rng(8).standard_normal((2, 9, xs[0].shape[1])))
    return moe, xs, dys


def _real_rank(comm, emit, routing):
    """The real expert-parallel layer on this rank's tokens."""
    moe, xs, dys = _inputs(routing)
    parallelize_experts(moe, Group(comm, [0, 1], "ep0"))
    x = Tensor(xs[comm.rank].copy(), requires_grad=True)
    out = moe(x)
    out.backward(dys[comm.rank])
    return {"out": out.data, "dx": x.grad, "received": moe.experts.received,
            "grads": {n: p.grad for n, p in moe.named_parameters()}}


@pytest.mark.parametrize("routing", ["random", "one"])
def test_by_hand_exchange_matches_the_real_layer(routing):
    moe, xs, dys = _inputs(routing)
    dense = {n: p.data.copy() for n, p in moe.named_parameters()}
    hand = run_ranks(2, "threads", by_hand_exchange.moe_on_rank, args=(dense, xs, dys), timeout_s=60)
    real = run_ranks(2, "threads", _real_rank, args=(routing,), timeout_s=60)
    for h, r in zip(hand, real):
        for key in ("out", "dx"):
            np.testing.assert_allclose(h[key], r[key], rtol=1e-12, atol=1e-12 * np.abs(r[key]).max())
        assert h["grads"].keys() == r["grads"].keys()
        for name, g in r["grads"].items():
            want = np.zeros_like(h["grads"][name]) if g is None else g  # an expert no token reached
            scale = np.abs(want).max() + 1e-300
            np.testing.assert_allclose(h["grads"][name], want, rtol=1e-12, atol=1e-12 * scale)
    if routing == "one":
        assert real[1]["received"] == 0


def test_it_stays_short_and_its_entry_point_agrees_with_one_device():
    path = Path(by_hand_exchange.__file__)
    assert len(path.read_text().splitlines()) < 150
    [(ranks, worst)] = by_hand_main(str(path), "within")
    assert ranks == "2" and worst < 1e-12
