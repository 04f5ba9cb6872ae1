"""The projection's expert-parallel term against figures worked out here by hand, on the fixture cluster
(100 TFLOP/s × 0.5 × T/(T + 1024) at T tokens; 5 µs and 100 GB/s inside a node, 20 µs and 10 GB/s between;
the engine's ring): SMALL (2 blocks, h = 64, s = 32, V = 65) with 4 experts in every block, top-2, dropless,
8 rows per rank (N = 256 tokens).

Per MoE layer a rank dispatches S = N·k·h·4 = 256·2·64·4 = 131,072 bytes: S/e to each member. Every
all-to-all sends its row counts first, 8 bytes to every peer in one round (α + (e − 1)·8·β on the group's
slowest link), then its payload pairwise, e − 1 shifts of one message each (α + mβ on the shift's link);
forward runs the expert counts' all-to-all (E/e int64 a peer), dispatch and combine, backward their two
mirrors: per layer 5 rounds of sizes, 1 all-to-all of counts and 4 of rows.

FLOPs per token of an MoE block: its attention and LayerNorms' parameters (16,640 + 256), the router's 256
and top-2 of the 4 experts (each 33,088 parameters: 66,176), twice each, plus attention's 4·s·h = 8,192."""

from __future__ import annotations

import numpy as np
import pytest
from projection_helpers import SMALL, fixture_calibration
from projection_helpers import fixture_cluster as cluster

from engine.config import from_dict
from engine.projection.clusters import load_cluster
from engine.projection.flops import model_flops
from engine.projection.project import predict
from engine.projection.routing import imbalance_by_degree, routing_imbalance

VOCAB = 65
MOE = {**SMALL["model"], "n_experts": 4, "top_k": 2}


def config(expert: int = 4, world: int = 4, capacity: float = 0.0, **parallel):
    return from_dict({**SMALL, "model": {**MOE, "capacity_factor": capacity},
                      "train": {"global_batch": 8 * world},
                      "parallel": {"world_size": world, "expert": expert, **parallel}})


def step_of(cfg, c, imbalance: float | None = None):
    return predict(cfg, c, None, VOCAB, expert_imbalance=imbalance)[0]


def p2p(n: float, inter: bool = False) -> float:
    return (20e-6 + n / 10e9) if inter else (5e-6 + n / 100e9)


def test_an_moe_block_counts_the_experts_a_token_reaches():
    """Forward per token: 2 blocks × (2 × (16,640 + 256 + 256 + 66,176) + 8,192) + the head's 2·V·h."""
    flops = model_flops(config(1, 1), VOCAB, 1)
    assert flops.unit_forward == pytest.approx((2 * 83_328 * 32 + 8_192 * 32,) * 2, rel=1e-12)
    assert flops.forward == pytest.approx(32 * (2 * (2 * 83_328 + 8_192) + 8_320), rel=1e-12)


@pytest.mark.parametrize("expert, per_node, inter", [
    (4, 4, False),  # 4 ranks in a node
    (4, 2, True),  # nodes of 2: every shift (1, 2, 3) has a pair on two nodes
    (2, 2, False),  # EP groups of 2 consecutive ranks: one node
])
def test_the_all_to_alls_are_pairwise_shifts_on_the_ep_group_link(tmp_path, expert, per_node, inter):
    e = expert
    step = step_of(config(e, 4), cluster(tmp_path, per_node=per_node))
    sizes = p2p((e - 1) * 8, inter)
    counts = (e - 1) * p2p(8 * 4 // e, inter)
    rows = (e - 1) * p2p(131_072 / e, inter)
    assert step.ep["layer_forward_s"] == pytest.approx(sizes + counts + 2 * (sizes + rows), rel=1e-12)
    assert step.ep["layer_backward_s"] == pytest.approx(2 * (sizes + rows), rel=1e-12)
    assert step.ep_s == pytest.approx(2 * (5 * sizes + counts + 4 * rows), rel=1e-12)  # 2 MoE layers
    assert step.ep["link"] == ("inter-node" if inter else "intra-node")
    assert step.ep["sent_bytes_per_all_to_all"] == 131_072 * (e - 1) / e
    assert step.ep["all_to_alls"] == 2 * 5  # counts, dispatch, combine, 2 mirrors, per layer


@pytest.mark.parametrize("checkpointing, recomputed", [("blocks", 2), ("every:2", 1)])
def test_a_recomputed_moe_block_runs_its_forward_all_to_alls_again(tmp_path, checkpointing, recomputed):
    """Activation checkpointing: each recomputed MoE block issues its counts, dispatch and combine once more
    in backward (engine.recompute), as the meter counts them."""
    c = cluster(tmp_path, per_node=4)
    plain = step_of(config(2, 4), c)
    cfg = from_dict({**SMALL, "model": MOE, "train": {"global_batch": 32},
                     "parallel": {"world_size": 4, "expert": 2}, "memory": {"checkpointing": checkpointing}})
    step = step_of(cfg, c)
    assert step.ep["all_to_alls"] == 2 * 5 + 3 * recomputed
    assert step.ep_s == pytest.approx(plain.ep_s + recomputed * plain.ep["layer_forward_s"], rel=1e-12)


def test_ep_outside_dp_strides_the_group_over_nodes(tmp_path):
    """Order tp-cp-dp-ep-pp: an EP group of 2 is every other member of the 4 data ranks, ranks 0 and 2,
    on two nodes of 2."""
    step = step_of(config(2, 4, order="tp-cp-dp-ep-pp"), cluster(tmp_path, per_node=2))
    assert step.ep["link"] == "inter-node"
    assert step.ep["layer_backward_s"] == pytest.approx(2 * (p2p(8, True) + p2p(65_536, True)), rel=1e-12)


def test_the_max_loaded_rank_sets_the_step(tmp_path):
    """λ = 1.5: the busiest rank's experts take 1.5 × N·k rows, so its received blocks are 1.5 × S/e and
    its experts' forward 0.5 × 2 × 66,176 FLOPs a token more per MoE layer (256 tokens at 1e13 FLOP/s)."""
    c = cluster(tmp_path)
    even, skewed = step_of(config(), c), step_of(config(), c, 1.5)
    assert skewed.ep["imbalance"] == 1.5 and skewed.ep["imbalance_chosen"] == "given"
    rows = 3 * p2p(1.5 * 32_768)  # 3 shifts of 1.5·S/e
    assert skewed.ep["layer_backward_s"] == pytest.approx(2 * (p2p(3 * 8) + rows), rel=1e-12)
    extra = 2 * 256 * 0.5 * 2 * 66_176 / 1e13
    assert skewed.forward_s - even.forward_s == pytest.approx(extra, rel=1e-9)
    assert skewed.backward_s - even.backward_s == pytest.approx(2 * extra, rel=1e-9)
    assert skewed.step_s > even.step_s


@pytest.mark.parametrize("capacity, given, used, bound", [
    (0.0, None, 1.0, 2.0),  # dropless: the default, balanced; e·min(k, E/e)/k = 4·1/2 = 2 at most
    (0.0, 3.0, 2.0, 2.0),  # more than every choice on one rank's experts: clipped
    (1.25, 1.5, 1.25, 1.25),  # a capacity keeps at most 1.25·N·k rows a rank
])
def test_how_the_imbalance_is_chosen(tmp_path, capacity, given, used, bound):
    ep = step_of(config(capacity=capacity), cluster(tmp_path), given).ep
    assert (ep["imbalance"], ep["imbalance_bound"]) == (used, bound)
    assert ep["imbalance_chosen"] == ("default" if given is None else "given")


def test_the_experts_are_reduced_over_edp_and_held_one_eth_a_rank(tmp_path):
    """8 ranks, EP 4: edp 2. A rank holds 1 expert of each of the 2 layers: 2 × 33,088 × 4 = 264,704 bytes,
    all-reduced after backward over its 2 edp ranks, 4 apart (EP groups are 4 consecutive ranks): on two
    nodes, the engine's ring 2(α + n/2·β) (the fixture reduces for free); then the experts' sum of squares
    over the EP group, as at 4 ranks, where edp is 1 and nothing else follows. The estimator holds 3/4 of the
    experts fewer a rank."""
    c = cluster(tmp_path)
    step, mem, _ = predict(config(4, 8), c, None, VOCAB)
    assert step.ep["edp"] == 2 and step.ep["expert_bytes"] == 264_704
    alone = step_of(config(4, 4), c)
    assert step.ep["reduce_s"] - alone.ep["reduce_s"] == pytest.approx(2 * p2p(132_352, inter=True), rel=1e-9)
    local = predict(config(1, 8), c, None, VOCAB)[1]
    assert local.states["parameters"] - mem.states["parameters"] == 3 * 264_704


def test_expert_one_has_no_term(tmp_path):
    step = step_of(config(1, 4), cluster(tmp_path))
    assert (step.ep_s, step.ep) == (0.0, {})


def test_a_calibrated_machine_takes_lambda_from_the_model_s_own_routing(tmp_path):
    """On this machine, calibrated with the model, λ is what its router did in the calibration's steps
    (one figure per EP degree): taken where none is given, clipped to the bound, and a given one wins."""
    cfg = config(expert=4, world=4, backend="processes")
    calibration = fixture_calibration(tmp_path / "calibration.json", cfg)
    for levels in calibration.data["models"].values():
        for by_level in levels.values():
            for figures in by_level.values():
                figures["expert_imbalance"] = {"2": 1.3, "4": 1.6}
    here = load_cluster("this-machine")
    ep = predict(cfg, here, calibration, VOCAB)[0].ep
    assert (ep["imbalance"], ep["imbalance_chosen"]) == (1.6, "calibrated")
    two = predict(config(expert=2, world=4, backend="processes"), here, calibration, VOCAB)[0].ep
    assert (two.get("imbalance"), two.get("imbalance_chosen")) == (1.3, "calibrated")
    ep = predict(cfg, here, calibration, VOCAB, expert_imbalance=1.1)[0].ep
    assert (ep["imbalance"], ep["imbalance_chosen"]) == (1.1, "given")
    del calibration.data["models"][next(iter(calibration.data["models"]))]["fp32"]["2"]["expert_imbalance"]
    del calibration.data["models"][next(iter(calibration.data["models"]))]["fp32"]["1"]["expert_imbalance"]
    assert predict(cfg, here, calibration, VOCAB)[0].ep["imbalance_chosen"] == "default"


def test_lambda_from_routed_counts_by_hand():
    """Rank j of e holds experts j·E/e .. (j+1)·E/e − 1; per forward the mean over layers of the busiest
    rank's rows over the mean, then the median over forwards."""
    counts = [[np.array([3, 1, 2, 2]), np.array([4, 0, 2, 2])],   # layer 0, forwards 0 and 1
              [np.array([2, 2, 2, 2]), np.array([1, 1, 3, 3])]]   # layer 1
    # e = 2: forward 0 (4, 4) and (4, 4): 1.0; forward 1 (4, 4): 1.0 and (2, 6): 1.5, mean 1.25
    assert routing_imbalance(counts, 2) == pytest.approx((1.0 + 1.25) / 2, rel=1e-15)
    # e = 4: forward 0: 3/2 and 1.0, mean 1.25; forward 1: 4/2 and 3/2, mean 1.75
    assert imbalance_by_degree(counts, 4) == {"2": pytest.approx(1.125), "4": pytest.approx(1.5)}
    assert routing_imbalance([[np.array([5, 5, 5, 5])]], 4) == 1.0


def test_a_calibration_of_an_moe_model_keeps_its_routing(tmp_path):
    """The calibration's compute steps of a model with experts return λ for every EP degree that divides
    the experts: the routing of the steps it trained, each at least 1 (balanced) and at most the bound."""
    from engine.comm.base import Signals
    from engine.comm.threads import ThreadGroup
    from engine.config import to_dict
    from engine.projection.compute_calibration import one_rank_config, time_phases
    cfg = from_dict(one_rank_config(to_dict(config(expert=1, world=1)), "fp32", 8), source="test")
    comm = ThreadGroup(1, 60.0, Signals()).communicator(0)
    figures = time_phases(comm, cfg, steps=2, warmup=1)
    assert set(figures["expert_imbalance"]) == {"2", "4"}
    for degree, bound in (("2", 2 * min(2, 2) / 2), ("4", 4 * min(2, 1) / 2)):
        assert 1.0 <= figures["expert_imbalance"][degree] <= bound
    assert figures["expert_imbalance"]["4"] >= figures["expert_imbalance"]["2"]  # finer groups spread more
    dense = from_dict(one_rank_config(to_dict(from_dict(SMALL)), "fp32", 8), source="test")
    assert "expert_imbalance" not in time_phases(comm, dense, steps=2, warmup=1)
