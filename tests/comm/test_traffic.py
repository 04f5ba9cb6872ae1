"""Per-step Traffic events of a real training job (engine.run.job.run_training on threads): one per rank per
step, links along the ring (rank -> rank+1), and per phase exactly the bytes the ring formulas give for the
run's buckets (units), plus the trainer's fp64 scalar all-reduces."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict
from engine.run.job import run_training
from tests.parallel_helpers import gradient_group_lengths, ring_bytes, tiny_gpt, with_parallel

STEPS = 3
# fp64 scalars all-reduced every step besides the gradients: the trainer agrees on [mean loss, stop, pause]
# (Trainer._agree); sharded stages also all-reduce the gradient norm's sum of squares (ShardOptimizer).
AGREE, NORM = 3, 1


def traced_run(world: int, stage: int) -> tuple[list, list, dict]:
    cfg = with_parallel(tiny_gpt(train__steps=STEPS), world, stage, backend="threads")
    events: list = []
    summary = run_training(from_dict(cfg), on_event=events.append, record=False)
    lengths = run_ranks(world, "threads", gradient_group_lengths, args=(cfg,))[0]
    return events, lengths, summary


def expected_phase_bytes(lengths: list[int], world: int, rank: int, stage: int) -> dict[str, int]:
    """Payload bytes rank sends per step in each phase: fp32 buckets (units) by the ring formulas, fp64
    scalars likewise (a ring all-reduce of n elements is a reduce-scatter then an all-gather of n)."""
    rs = sum(ring_bytes(n, world, rank)[0] for n in lengths)
    ag = sum(ring_bytes(n, world, rank)[1] for n in lengths)
    scalars = [AGREE] + ([NORM] if stage > 0 else [])
    s_rs = sum(ring_bytes(n, world, rank)[0] for n in scalars)
    s_ag = sum(ring_bytes(n, world, rank)[1] for n in scalars)
    if stage < 3:  # DDP: all-reduce of every bucket; ZeRO-1/2: reduce-scatter, update, all-gather
        return {"reduce-scatter": 4 * rs + 8 * s_rs, "all-gather": 4 * ag + 8 * s_ag}
    # ZeRO-3: every unit gathered twice (forward, backward) under its own phase, reduce-scattered once
    return {"reduce-scatter": 4 * rs + 8 * s_rs, "param-gather": 2 * 4 * ag, "all-gather": 8 * s_ag}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_traffic_event_per_rank_per_step_withring_bytes(world, stage):
    events, lengths, summary = traced_run(world, stage)
    assert summary["steps"] == STEPS
    assert len(lengths) >= 2  # several buckets (units): the per-bucket formula is really exercised
    traffic = [e for e in events if e.kind == "traffic"]
    assert Counter((e.step, e.rank) for e in traffic) == {(s, r): 1 for s in range(1, STEPS + 1)
                                                          for r in range(world)}
    sent = {(e.step, e.rank): e.bytes_sent for e in events if e.kind == "rank_stats"}
    for e in traffic:
        by_phase: dict[str, int] = defaultdict(int)
        for link in e.links:
            assert (link["src"], link["dst"]) == (e.rank, (e.rank + 1) % world), link
            assert link["seconds"] >= 0
            by_phase[link["phase"]] += link["bytes"]
        assert dict(by_phase) == expected_phase_bytes(lengths, world, e.rank, stage), (e.step, e.rank)
        assert sum(by_phase.values()) == sent[(e.step, e.rank)]  # the RankStats figure is the same count


def test_single_rank_emits_no_traffic():
    cfg = tiny_gpt(train__steps=2)
    events: list = []
    run_training(from_dict(cfg), on_event=events.append, record=False)
    assert [e for e in events if e.kind == "traffic"] == []
    assert [e.bytes_sent for e in events if e.kind == "rank_stats"] == [0, 0]


def test_traffic_events_name_the_group_and_algorithm_of_every_link():
    """DDP with the hierarchical all-reduce on 2 nodes × 2: gradient buckets go reduce-scatter and
    all-gather inside the node (node<m>, booked as "hierarchical"), all-reduce across (cross<j>, booked as
    the ring that runs there); the
    trainer's scalars go around the world ring. Fewer bytes cross the nodes than with the flat ring."""
    crossing = {}
    for algorithm in ("ring", "hierarchical"):
        cfg = with_parallel(tiny_gpt(train__steps=2), 4, 0, ranks_per_node=2, algorithm=algorithm)
        events: list = []
        run_training(from_dict(cfg), on_event=events.append, record=False)
        links = [link for e in events if e.kind == "traffic" and e.step == 2 for link in e.links]
        kinds = {(link["group"], link["phase"], link["algorithm"]) for link in links}
        if algorithm == "hierarchical":
            assert {(f"node{m}", phase, "hierarchical") for m in (0, 1) for phase in
                    ("reduce-scatter", "all-gather")} | {(f"cross{j}", "all-reduce", "ring")
                                                         for j in (0, 1)} <= kinds
            for link in links:  # node links stay inside a node, cross links join the same local rank
                if link["group"].startswith("node"):
                    assert link["dst"] // 2 == link["src"] // 2, link
                if link["group"].startswith("cross"):
                    assert link["dst"] % 2 == link["src"] % 2, link
        assert ("world", "reduce-scatter", "ring") in kinds  # the scalars
        crossing[algorithm] = sum(link["bytes"] for link in links if link["src"] // 2 != link["dst"] // 2)
    assert crossing["hierarchical"] < crossing["ring"]
