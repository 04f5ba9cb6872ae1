"""Expert parallelism of one MoE layer (engine/parallel/expert/layer.py), float64 on thread ranks: e in
{2, 4} ranks, top-1 and top-2, each rank routing its own tokens, against EP 1 (the same layer with every
expert local, run on each rank's tokens): outputs, input, router and expert gradients within 1e-12
relative, for balanced routing, random routing, and every token to one expert (ranks that receive no
tokens); tokens conserved; capacity drops the same tokens at every EP degree."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.group import Group
from engine.comm.launch import run_ranks
from engine.comm.meter import TrafficMeter
from engine.parallel.expert.plan import parallelize_experts
from engine.tensor import Tensor
from tests.moe_helpers import make_moe, tokens

N_EXPERTS, TOKENS = 4, 12


def _layer_step(moe, x: np.ndarray, seed: int) -> dict:
    """Forward and backward of sum(y * u) + aux on one rank's tokens; every figure the tests compare."""
    xt = Tensor(x.copy(), requires_grad=True)
    y = moe(xt)
    upstream = np.random.default_rng(seed + 50).standard_normal(x.shape)
    ((y * Tensor(upstream)).sum() + moe.aux_loss).backward()
    return {"y": y.data, "x_grad": xt.grad, "dropped": moe.stats["dropped"],
            "grads": {n: p.grad for n, p in moe.named_parameters()}}


def _setup(seed: int, top_k: int, routing: str, capacity_factor: float):
    moe = make_moe(N_EXPERTS, top_k, capacity_factor)
    return moe, tokens(TOKENS, seed=seed, routing=routing, moe=moe)


def _ep_rank(comm, emit, top_k, routing, capacity_factor) -> dict:
    comm.meter = TrafficMeter(comm.rank)
    moe, x = _setup(comm.rank, top_k, routing, capacity_factor)
    parallelize_experts(moe, Group(comm, list(range(comm.world_size)), "ep0"))
    out = _layer_step(moe, x, comm.rank)
    out["sent"], out["received"] = moe.experts.sent, moe.experts.received
    out["phases"] = {row["phase"] for row in comm.meter.totals()}
    out["bytes"] = {(row["group"], row["phase"]): 0 for row in comm.meter.totals()}
    for row in comm.meter.totals():
        out["bytes"][row["group"], row["phase"]] += row["bytes"]
    out["rows_to"] = _rows_to(moe, x, comm.world_size)
    return out


def _rows_to(moe, x: np.ndarray, members: int) -> list[int]:
    """Rows this rank's routing sends to each member (its experts' kept choices), from the router alone."""
    routing = moe.router(Tensor(x))
    per = N_EXPERTS // members
    rows = [len(routing.rows_of(e)[0]) for e in range(N_EXPERTS)]
    return [sum(rows[j * per:(j + 1) * per]) for j in range(members)]


def _reference(e: int, top_k: int, routing: str, capacity_factor: float) -> list[dict]:
    steps = []
    for rank in range(e):
        moe, x = _setup(rank, top_k, routing, capacity_factor)
        steps.append(_layer_step(moe, x, rank))
    return steps


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12 * max(np.abs(expected).max(), 1e-300))


@pytest.mark.parametrize("e", [2, 4])
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("routing", ["balanced", "random", "one"])
def test_expert_parallel_layer_matches_all_experts_local(e, top_k, routing):
    ranks = run_ranks(e, "threads", _ep_rank, args=(top_k, routing, 0.0), timeout_s=60)
    ref = _reference(e, top_k, routing, 0.0)
    for got, want in zip(ranks, ref):
        _close(got["y"], want["y"])
        _close(got["x_grad"], want["x_grad"])
        _close(got["grads"]["router.gate.weight"], want["grads"]["router.gate.weight"])
        assert got["dropped"] == 0
    for name in ref[0]["grads"]:
        if ".mlps." not in name:
            continue
        holders = [r for r in ranks if name in r["grads"]]
        assert len(holders) == 1, name  # each expert on exactly one rank of the group
        summed = sum(w["grads"][name] if w["grads"][name] is not None else 0 for w in ref)
        if holders[0]["grads"][name] is None:  # an expert no token reached on any rank
            assert all(w["grads"][name] is None for w in ref), name
        else:
            _close(holders[0]["grads"][name], summed)
    assert sum(r["sent"] for r in ranks) == sum(r["received"] for r in ranks) == e * TOKENS * top_k
    if routing == "one":  # experts 0 (and 1) take everything: the last ranks receive nothing
        assert ranks[-1]["received"] == 0
    assert {"ep-dispatch", "ep-combine"} <= set().union(*(r["phases"] for r in ranks))


@pytest.mark.parametrize("e", [2, 4])
def test_a_capacity_drops_the_same_tokens_at_every_degree(e):
    ranks = run_ranks(e, "threads", _ep_rank, args=(2, "random", 0.5), timeout_s=60)
    ref = _reference(e, 2, "random", 0.5)
    assert sum(w["dropped"] for w in ref) > 0
    for got, want in zip(ranks, ref):
        assert got["dropped"] == want["dropped"]
        _close(got["y"], want["y"])
        _close(got["x_grad"], want["x_grad"])
    assert sum(r["received"] for r in ranks) == e * TOKENS * 2 - sum(w["dropped"] for w in ref)


@pytest.mark.parametrize("e", [2, 4])
def test_bytes_per_phase_are_the_rows_that_leave_the_rank(e):
    """Forward dispatch and backward combine-mirror move each row sent to another rank (C float64 each)
    under "ep-dispatch"; the outputs coming back and the rows' gradients under "ep-combine"; the per-expert
    counts go first, E/e int64 to each other member, under "ep-dispatch-counts"."""
    ranks = run_ranks(e, "threads", _ep_rank, args=(2, "random", 0.0), timeout_s=60)
    width = 8 * ranks[0]["y"].shape[1]
    for r, got in enumerate(ranks):
        away = sum(n for j, n in enumerate(got["rows_to"]) if j != r)
        back = sum(other["rows_to"][r] for j, other in enumerate(ranks) if j != r)
        assert got["bytes"][("ep0", "ep-dispatch")] == 2 * away * width
        assert got["bytes"][("ep0", "ep-combine")] == 2 * back * width
        assert got["bytes"][("ep0", "ep-dispatch-counts")] == (e - 1) * 8 * (N_EXPERTS // e)
