"""ZeRO stages 1-3 equal DDP (stage 0); shards are views; stage 2 never holds the full gradient; model-state
bytes equal the ZeRO paper's formulas and per-rank traffic equals the ring formulas exactly. Hybrid sharding
(inside a node, replicated across nodes) likewise: equal to DDP, the formulas over the node, exact bytes per
group."""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict
from engine.memory.ledger import MODEL_STATES
from engine.trainer import Trainer
from tests.parallel_helpers import gradient_group_lengths, ring_bytes, tiny_gpt, with_parallel


def _train(comm, emit, cfg_dict, steps):
    trainer = Trainer(from_dict(cfg_dict), comm)
    at_rest = {c: trainer.ledger.current[c] for c in MODEL_STATES}
    steps_out = [trainer.train_step() for _ in range(steps)]
    out = {"losses": [s["loss"] for s in steps_out], "norms": [s["grad_norm"] for s in steps_out],
           "bytes": trainer.comm.meter.bytes_sent(), "at_rest": at_rest,
           "after": {c: trainer.ledger.current[c] for c in MODEL_STATES},
           "range": trainer.replica.owned_range(), "state": trainer.replica.optimizer_state(),
           "numel": trainer.replica.flat.numel}
    trainer.replica.close()
    return out


def run(cfg: dict, world: int, stage: int, steps: int = 10, **extra) -> list[dict]:
    cfg = with_parallel(cfg, world, stage, **extra)
    return run_ranks(world, "threads", _train, args=(cfg, steps), timeout_s=60)


def consolidated(results: list[dict]) -> dict:
    """Full master, m, v from every rank's owned range (what a checkpoint consolidates)."""
    numel, size = results[0]["numel"], max(r["range"][1] for r in results)
    full = {}
    for key in ("master", "m", "v"):
        buf = np.zeros(size, dtype=results[0]["state"][key].dtype)
        for r in results:
            start, end = r["range"]
            buf[start:end] = r["state"][key]
        full[key] = buf[:numel]
    return full


FLAVOURS = {  # name: (config overrides, relative tolerance)
    "fp64": (dict(precision__dtype="fp64"), 1e-12),
    "fp64-accumulate-clip": (dict(precision__dtype="fp64", train__micro_batches=2, train__global_batch=16,
                                  optim__grad_clip=0.3), 1e-12),
    "fp32": (dict(precision__dtype="fp32"), 1e-6),
}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_stages_equal_ddp(world, flavour):
    over, rtol = FLAVOURS[flavour]
    cfg = tiny_gpt(**over)
    ddp = run(cfg, world, 0)
    reference = consolidated(ddp)
    if "clip" in flavour:
        assert max(ddp[0]["norms"]) > 0.3  # clipping is really exercised
    for stage in (1, 2, 3):
        zero = run(cfg, world, stage)
        assert_equals_ddp(zero, ddp, reference, rtol, f"stage {stage}")
        assert zero[0]["state"]["step"] == ddp[0]["state"]["step"] == 10


def assert_equals_ddp(zero: list[dict], ddp: list[dict], reference: dict, rtol: float, label: str) -> None:
    """Every rank's losses and gradient norms (formed from shards, when sharded) equal DDP's, and so do
    the consolidated master, m and v."""
    for r in zero:
        np.testing.assert_allclose(r["losses"], ddp[0]["losses"], rtol=rtol)
        np.testing.assert_allclose(r["norms"], ddp[0]["norms"], rtol=rtol)
    state = consolidated(zero)
    for key in ("master", "m", "v"):
        scale = np.abs(reference[key]).max()
        np.testing.assert_allclose(state[key], reference[key], rtol=rtol, atol=rtol * scale,
                                   err_msg=f"{label} {key}")


def test_stage3_with_untied_weights_and_no_prefetch_equals_ddp():
    cfg = tiny_gpt(precision__dtype="fp64", model__tie_weights=False)
    reference = consolidated(run(cfg, 2, 0, steps=4))
    for extra in ({"prefetch": False}, {"prefetch": True, "overlap": False}):
        state = consolidated(run(cfg, 2, 3, steps=4, **extra))
        np.testing.assert_allclose(state["master"], reference["master"], rtol=1e-12, atol=1e-14)


def test_stage3_composes_with_activation_checkpointing():
    """Recompute re-runs each block through its hooks inside backward: same result, no extra gather."""
    cfg = tiny_gpt(precision__dtype="fp64")
    reference = run(cfg, 2, 3, steps=3)
    ckpt = tiny_gpt(precision__dtype="fp64")
    ckpt["memory"] = dict(ckpt["memory"], checkpointing="blocks")
    recomputed = run(ckpt, 2, 3, steps=3)
    assert recomputed[0]["losses"] == reference[0]["losses"]
    np.testing.assert_array_equal(consolidated(recomputed)["master"], consolidated(reference)["master"])
    assert [r["bytes"] for r in recomputed] == [r["bytes"] for r in reference]


# ---------------------------------------------------------------------------------------- views

def _views(comm, emit, cfg_dict):
    trainer = Trainer(from_dict(cfg_dict), comm)
    rep, opt = trainer.replica, trainer.replica.optimizer
    checks = {"m": all(np.shares_memory(o.m, opt.m) for o in opt.parts),
              "v": all(np.shares_memory(o.v, opt.v) for o in opt.parts)}
    if hasattr(rep, "buckets"):  # stages 1-2: owned parts and buckets are slices of the flat buffers
        checks["params"] = all(np.shares_memory(p.param, rep.flat.data) for p in opt.pieces)
        checks["buckets"] = all(np.shares_memory(rep.flat.data[b.start:b.end], rep.flat.data)
                                for b in rep.buckets)
        store = rep.flat.grad if rep.stage == 1 else rep.grad_shard
        checks["grads"] = all(np.shares_memory(p.grad, store) for p in opt.pieces)
    else:  # stage 3: every unit's part is a view of one local array per kind
        checks["params"] = all(np.shares_memory(u.shard, rep.param_shard) for u in rep.units)
        checks["grads"] = all(np.shares_memory(u.grad_shard, rep.grad_shard) for u in rep.units)
    # fp32: AdamW updates the parameters in place — no master copy
    checks["no_master"] = opt.master is None and all(
        np.shares_memory(o.params, p.param) for o, p in zip(opt.parts, opt.pieces))
    rep.close()
    return checks


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_shards_are_views_of_one_buffer(stage):
    cfg = with_parallel(tiny_gpt(), 2, stage)
    for checks in run_ranks(2, "threads", _views, args=(cfg,), timeout_s=60):
        assert all(checks.values()), checks


# ---------------------------------------------------------------------------------------- stage 2 memory

def _live_gradients(comm, emit, cfg_dict):
    trainer = Trainer(from_dict(cfg_dict), comm)
    params = trainer.model.parameters()
    peak = [0]

    def measure(_):
        peak[0] = max(peak[0], sum(p.grad.nbytes for p in params if p.grad is not None))
    removers = [p.register_grad_ready_hook(measure) for p in params]  # runs after the replica's hook
    for _ in range(2):
        trainer.train_step()
    maxima = trainer.ledger.maxima()["backward"]
    out = {"has_flat_grad": trainer.replica.flat.grad is not None, "peak_live": peak[0],
           "ledger_grads": maxima["gradients"], "ledger_comm": maxima["comm_buffers"],
           "full": trainer.replica.flat.data.nbytes, "shard": trainer.replica.grad_shard.nbytes,
           "left": [p.name for p in params if p.grad is not None]}
    for remove in removers:
        remove()
    trainer.replica.close()
    return out


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_stage2_never_holds_the_full_gradient(micro_batches):
    cfg = tiny_gpt(train__micro_batches=micro_batches, train__global_batch=8 * micro_batches)
    for r in run_ranks(2, "threads", _live_gradients, args=(with_parallel(cfg, 2, 2),), timeout_s=60):
        assert not r["has_flat_grad"] and r["left"] == []
        # tape gradients alive at once: those of unfinished buckets (the tied embedding waits for the end)
        assert r["peak_live"] < r["full"] / 2
        assert r["ledger_grads"] < r["full"] / 2 + r["shard"]
        assert 0 < r["ledger_comm"] < r["full"] / 2


# ---------------------------------------------------------------------------------------- bytes held

def _unit_sizes(comm, emit, cfg_dict):
    trainer = Trainer(from_dict(cfg_dict), comm)
    rep = trainer.replica
    sizes = [u.flat.size for u in rep.units] if hasattr(rep, "units") else None
    out = {"numel": rep.flat.numel, "size": rep.flat.size, "units": sizes}
    rep.close()
    return out


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("world", [2, 4])
def test_model_state_bytes_match_reference_formulas(dtype, world):
    """The ZeRO paper's table with padding: stage 0 16Ψ, 1 4Ψ + 12Ψ/N, 2 2Ψ + 14Ψ/N, 3 16Ψ/N (mixed
    precision); fp32 trains without a master copy: params 4Ψ, grads 4Ψ, Adam 8Ψ."""
    cfg = tiny_gpt(precision__dtype=dtype)
    e = 4 if dtype == "fp32" else 2
    adam = {"master": 0 if dtype == "fp32" else 4, "adam_m": 4, "adam_v": 4}
    for stage in range(4):
        results = run(cfg, world, stage, steps=2)
        layout = run_ranks(world, "threads", _unit_sizes, args=(with_parallel(cfg, world, stage),))[0]
        psi = layout["numel"]
        padded = psi if stage == 0 else layout["size"]
        if stage == 3:
            padded = sum(layout["units"])
        params, grads, opt = {0: (padded, padded, padded), 1: (padded, padded, padded // world),
                              2: (padded, padded // world, padded // world),
                              3: (padded // world,) * 3}[stage]
        expected = {"parameters": params * e, "gradients": grads * e,
                    **{k: opt * b for k, b in adam.items()}}
        ideal_total = {0: 16 * psi, 1: 2 * e * psi + (16 - 2 * e) * psi / world,
                       2: e * psi + (16 - e) * psi / world, 3: 16 * psi / world}[stage]
        n_buffers = len(layout["units"]) if stage == 3 else 1
        for r in results:
            assert r["at_rest"] == expected, (stage, r["at_rest"], expected)
            assert r["after"] == expected  # nothing leaked: transient gradients and gathers are gone
            assert 0 <= sum(expected.values()) - ideal_total <= 16 * n_buffers * (world - 1)


# ---------------------------------------------------------------------------------------- traffic

@pytest.mark.parametrize("world", [2, 4])
def test_bytes_sent_per_rank_match_ring_formulas(world):
    """Stages 0-2 send 2Ψ(N−1)/N elements per rank per step, stage 3 3Ψ(N−1)/N — exactly, given the
    buckets (units) and the scalar all-reduces of the loss (trainer) and, when sharded, the grad norm."""
    cfg = tiny_gpt()
    for stage in range(4):
        results = run(cfg, world, stage, steps=1)
        staged = with_parallel(cfg, world, stage)
        lengths = run_ranks(world, "threads", gradient_group_lengths, args=(staged,))[0]
        passes = {0: (1, 1), 1: (1, 1), 2: (1, 1), 3: (1, 2)}[stage]  # (reduce-scatters, all-gathers)
        for rank, r in enumerate(results):
            rs_ag = [ring_bytes(n, world, rank) for n in lengths]
            # fp64 all-reduces: [loss, stop, pause] from the trainer, and the grad norm when sharded
            scalars = 8 * sum(ring_bytes(3, world, rank))
            if stage:
                scalars += 8 * sum(ring_bytes(1, world, rank))
            model_bytes = 4 * sum(passes[0] * rs + passes[1] * ag for rs, ag in rs_ag)
            assert r["bytes"] == model_bytes + scalars, (stage, rank)
            ideal = 4 * sum(passes) * sum(lengths) * (world - 1) / world  # 2Ψ(N−1)/N or 3Ψ'(N−1)/N
            if stage > 0:  # buckets and units split evenly: exact
                assert model_bytes == ideal
            else:  # DDP buckets end on parameter boundaries: each may be off by under one element
                assert abs(model_bytes - ideal) < 4 * 2 * len(lengths)


def _phases(comm, emit, cfg_dict):
    trainer = Trainer(from_dict(cfg_dict), comm)
    trainer.train_step()
    phases = {row["phase"] for row in comm.meter.snapshot()}
    trainer.replica.close()
    return phases


def test_stage3_books_parameter_gathers_as_their_own_phase():
    cfg = with_parallel(tiny_gpt(), 2, 3)
    phases = run_ranks(2, "threads", _phases, args=(cfg,))[0]
    assert {"param-gather", "reduce-scatter"} <= phases
    stage2 = run_ranks(2, "threads", _phases, args=(with_parallel(tiny_gpt(), 2, 2),))[0]
    assert "param-gather" not in stage2 and "all-gather" in stage2


# ---------------------------------------------------------------------------------------- hybrid sharding
# 4 ranks as 2 nodes × 2 ranks: ZeRO state sharded inside each node, replicated across the nodes.
HYBRID = dict(ranks_per_node=2, hybrid=True)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_hybrid_sharding_equals_ddp(flavour):
    over, rtol = FLAVOURS[flavour]
    cfg = tiny_gpt(**over)
    ddp = run(cfg, 4, 0)
    reference = consolidated(ddp)
    for stage in (1, 2, 3):
        hybrid = run(cfg, 4, stage, **HYBRID)
        assert [r["range"] for r in hybrid[:2]] == [r["range"] for r in hybrid[2:]]  # nodes hold the same
        assert hybrid[1]["range"][1] == hybrid[1]["state"]["m"].size * 2  # each rank: half of the state
        assert_equals_ddp(hybrid, ddp, reference, rtol, f"hybrid stage {stage}")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_hybrid_model_state_bytes_are_the_zero_formulas_over_a_node(dtype):
    """The ZeRO paper's table with G = 2 (the node) in place of N = 4: stage 1 4Ψ + 12Ψ/G, 2 2Ψ + 14Ψ/G,
    3 16Ψ/G (mixed precision), each padded to multiples of G."""
    cfg = tiny_gpt(precision__dtype=dtype)
    e, g = (4 if dtype == "fp32" else 2), 2
    adam = {"master": 0 if dtype == "fp32" else 4, "adam_m": 4, "adam_v": 4}
    for stage in (1, 2, 3):
        layout = run_ranks(4, "threads", _unit_sizes, args=(with_parallel(cfg, 4, stage, **HYBRID),))[0]
        padded = sum(layout["units"]) if stage == 3 else layout["size"]
        assert padded % g == 0 and padded - layout["numel"] < g * (len(layout["units"] or [0]))
        params, grads, opt = {1: (padded, padded, padded // g), 2: (padded, padded // g, padded // g),
                              3: (padded // g,) * 3}[stage]
        expected = {"parameters": params * e, "gradients": grads * e, **{k: opt * b for k, b in adam.items()}}
        for r in run(cfg, 4, stage, steps=2, **HYBRID):
            assert r["at_rest"] == expected == r["after"], (stage, r["at_rest"], expected)


def _traffic_by_group(comm, emit, cfg_dict):
    trainer = Trainer(from_dict(cfg_dict), comm)
    trainer.train_step()
    rows = comm.meter.snapshot()
    trainer.replica.close()
    by: dict[str, int] = {}
    for row in rows:
        kind = row["group"].rstrip("0123456789")  # world, node<m>, cross<j>
        by[kind] = by.get(kind, 0) + row["bytes"]
    crossing = sum(row["bytes"] for row in rows if row["src"] // 2 != row["dst"] // 2)
    return {"by": by, "crossing": crossing, "labels": sorted({(row["group"].rstrip("0123456789"),
                                                               row["algorithm"]) for row in rows})}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_hybrid_traffic_per_group_is_exact(stage):
    """Per step: each bucket (unit) is reduce-scattered in the node (G = 2), its node shard all-reduced
    across the 2 nodes, and (stages 1-2 after the update, 3 twice for the gathers) all-gathered in the
    node; the world carries only the trainer's fp64 scalars. All by the ring formulas."""
    cfg = with_parallel(tiny_gpt(), 4, stage, **HYBRID)
    lengths = run_ranks(4, "threads", gradient_group_lengths, args=(cfg,))[0]
    results = run_ranks(4, "threads", _traffic_by_group, args=(cfg,))
    gathers = 2 if stage == 3 else 1
    for rank, r in enumerate(results):
        node, local = divmod(rank, 2)
        inside = sum(ring_bytes(n, 2, local)[0] + gathers * ring_bytes(n, 2, local)[1] for n in lengths)
        shards = [n // 2 for n in lengths]  # buckets are padded to multiples of G: equal node shards
        across = sum(sum(ring_bytes(k, 2, node)) for k in shards)
        # the trainer's agreement (loss, stop, pause) over the world; the grad norm in the node
        scalars = 8 * sum(ring_bytes(3, 4, rank)) + 8 * sum(ring_bytes(1, 2, local))
        assert r["by"] == {"node": 4 * inside + 8 * sum(ring_bytes(1, 2, local)), "cross": 4 * across,
                           "world": 8 * sum(ring_bytes(3, 4, rank))}, (stage, rank)
        assert sum(r["by"].values()) == 4 * inside + 4 * across + scalars
        assert across * 2 == sum(lengths)  # 2(M−1)/M · Ψ/G = Ψ/2 elements per rank cross the nodes
        assert {("node", "hierarchical"), ("cross", "ring"), ("node", "ring")} <= set(r["labels"])
