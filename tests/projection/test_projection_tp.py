"""The projection's tensor- and sequence-parallel term against figures worked out here by hand: the
collectives of one layer and of a step on a small cluster file (every number written out below), inside a
node and across two (slower by the links' ratio), sequence parallelism sending TP's bytes, the whole term
exposed, the compute split, the data-parallel group over world / t ranks of one rank's shard, the ranking
of layouts on a slow inter-node link, and what the projection refuses."""

from __future__ import annotations

import pytest
from projection_helpers import SMALL

from engine.config import from_dict, to_dict
from engine.config.rules_layout import describing_layout
from engine.memory.tensor_parallel import rank_shapes
from engine.projection.clusters import load_cluster
from engine.projection.compute_calibration import one_rank_config
from engine.projection.flops import FlopsOf
from engine.projection.group_comm import group_members
from engine.projection.machine import make_machine
from engine.projection.project import predict, project
from engine.projection.step_parts import GroupPlan
from engine.projection.timeline import Timeline
from engine.projection.validate import case_configs

VOCAB = 65
# the SMALL GPT (2 blocks, h = 64, s = 32) with 8 rows per micro-batch on one TP group of 4, fp32:
# every activation collective carries b·s·h·4 = 8·32·64·4 = 65,536 bytes
CLUSTER = """
name = "tp test"
nodes = 2
ranks_per_node = {per_node}
[compute]
peak_tflops_fp32 = 100
memory_bandwidth_gbs = 1000
efficiency_max = 0.5
efficiency_half_tokens = 1024
[intra]
bandwidth_gbs = 100
latency_us = {intra_us}
[inter]
bandwidth_gbs = 10
latency_us = {inter_us}
[collectives]
algorithm = "engine"
"""


def cluster(tmp_path, per_node: int = 4, intra_us: float = 5, inter_us: float = 20, name: str = "c"):
    path = tmp_path / f"{name}.toml"
    path.write_text(CLUSTER.format(per_node=per_node, intra_us=intra_us, inter_us=inter_us))
    return load_cluster(path)


def config(tensor: int = 4, world: int = 4, sp: bool = False, **sections):
    d = {**SMALL, "train": {"global_batch": 8 * world // tensor},
         "parallel": {"world_size": world, "tensor": tensor, "sequence_parallel": sp}}
    for section, values in sections.items():
        d[section] = {**d.get(section, {}), **values}
    with describing_layout():  # degrees this release does not train yet: the projection only describes
        return from_dict(d)


def test_one_layer_and_one_step_inside_a_node(tmp_path):
    step, _, _ = predict(config(), cluster(tmp_path), None, VOCAB)
    tp = step.tp
    assert tp["degree"] == 4 and tp["link"] == "intra-node" and tp["nodes"] == 1 and tp["rows"] == 8
    assert [(c["kind"], c["bytes"]) for c in tp["per_layer"]] == [("all-reduce", 65536)] * 4
    # ring all-reduce on 4 ranks: 2(t-1)(alpha + n/t beta) = 6 (5 us + 16,384 B / 100 GB/s) = 30.98304 us
    assert tp["layer_s"] == pytest.approx(4 * 30.98304e-6)
    assert tp["layer_sent_bytes"] == 4 * 2 * 3 / 4 * 65536 == 393216
    # a step: the embedding's all-reduce, 2 blocks x 4, the head's f backward: 10 of 65,536 B; the loss's
    # 3 of b·s·4 = 1,024 B: 6 (5 us + 256 B / 100 GB/s) = 30.01536 us each; the norm's one fp64 value on the
    # engine's ring: one shard, 3 hops each half, 6 (5 us + 8 B / 100 GB/s) = 30.00048 us
    assert tp["collectives"] == 14
    assert tp["step_s"] == pytest.approx(10 * 30.98304e-6 + 3 * 30.01536e-6 + 30.00048e-6)
    assert step.tp_s == tp["step_s"] == tp["exposed_s"]


def test_sequence_parallelism_sends_the_same_bytes_in_the_same_time(tmp_path):
    c = cluster(tmp_path)
    tp = predict(config(), c, None, VOCAB)[0].tp
    sp = predict(config(sp=True), c, None, VOCAB)[0].tp
    assert sorted((x["kind"], x["phase"]) for x in sp["per_layer"]) == sorted(
        [("all-gather", "sp-fwd-all-gather")] * 2 + [("reduce-scatter", "sp-fwd-reduce-scatter")] * 2
        + [("all-gather", "sp-bwd-all-gather")] * 2 + [("reduce-scatter", "sp-bwd-reduce-scatter")] * 2)
    # each: (t-1)(alpha + n/t beta) = 3 (5 us + 0.16384 us) = 15.49152 us; 8 of them = 4 all-reduces
    assert sp["layer_s"] == pytest.approx(8 * 15.49152e-6) == pytest.approx(tp["layer_s"])
    assert sp["layer_sent_bytes"] == tp["layer_sent_bytes"] == 393216
    # the step adds the embedding's scatter (an all-gather backward) and the LayerNorms' and row biases'
    # gradient sum: per block 2 LayerNorms (2 x 128) + 2 biases (2 x 64), ln_f 128 = 896 values, 3,584 B
    per_step = {(x["kind"], x["phase"], x["bytes"]): x["count"] for x in sp["per_step"]}
    assert per_step[("all-reduce", "sp-grad-all-reduce", 3584)] == 1
    assert per_step[("all-gather", "sp-bwd-all-gather", 65536)] == 2 * 2 + 1
    assert sp["sent_bytes"] == pytest.approx(tp["sent_bytes"] + 3 / 4 * 65536 + 2 * 3 / 4 * 3584)


def test_across_two_nodes_the_layer_waits_for_the_inter_node_link(tmp_path):
    inside = predict(config(), cluster(tmp_path, 4, name="inside"), None, VOCAB)[0].tp
    across = predict(config(), cluster(tmp_path, 2, name="across"), None, VOCAB)[0].tp
    assert across["link"] == "inter-node" and across["nodes"] == 2
    # each ring step waits for the slower link: 6 (20 us + 16,384 B / 10 GB/s) = 129.8304 us
    assert across["layer_s"] == pytest.approx(4 * 129.8304e-6)
    assert across["layer_sent_bytes"] == inside["layer_sent_bytes"]  # the same bytes, on a slower link
    # without latency, slower by exactly the bandwidths' ratio, 100 / 10
    free = [predict(config(), cluster(tmp_path, n, 0, 0, name=f"free{n}"), None, VOCAB)[0].tp for n in (4, 2)]
    assert free[0]["layer_s"] == pytest.approx(4 * 6 * 16384 / 100e9)
    assert free[1]["layer_s"] / free[0]["layer_s"] == pytest.approx(10.0)


def test_every_tensor_parallel_second_is_exposed():
    tl = Timeline()
    gradients = tl.submit(10.0)  # a data-parallel bucket on the communication thread
    tl.inline(2.0)  # a TP all-reduce on the training thread: it does not wait for the bucket, nor hide
    assert (tl.now, tl.exposed_s) == (2.0, 2.0)
    tl.compute(5.0)
    tl.wait(gradients)
    assert (tl.now, tl.exposed_s, tl.comm_s, tl.overlapped_s) == (10.0, 5.0, 12.0, 7.0)


def test_the_step_is_compute_and_exposed_communication(tmp_path):
    c = cluster(tmp_path)
    step = predict(config(tensor=2, world=4), c, None, VOCAB)[0]  # DP 2 x TP 2 on one node
    assert step.step_s == pytest.approx(step.compute_s + step.exposed_s + step.interference_s)
    # the replica's buckets run on the training thread beside a tensor-parallel model: nothing overlaps
    assert step.overlapped_s == pytest.approx(0.0, abs=1e-15)
    assert step.exposed_s == pytest.approx(step.comm_s) and step.tp_s < step.exposed_s


def test_compute_splits_but_for_what_tensor_parallelism_does_not_split(tmp_path):
    c = cluster(tmp_path)
    one = predict(config(tensor=1, world=1, train={"global_batch": 8}), c, None, VOCAB)[0]
    tp, sp = (predict(config(sp=sp), c, None, VOCAB)[0] for sp in (False, True))
    # a rank's share at t = 4 is the whole model's work on 256 / 4 = 64 tokens (8 rows of 32 at t = 1), at
    # efficiency 0.5 x / (x + 1024): the FLOPs go as x, so the time as x + 1024
    assert one.forward_s / sp.forward_s == pytest.approx((256 + 1024) / (64 + 1024))
    # without SP each rank also runs the LayerNorms, adds and ln_f on all b·s·h = 16,384 values: 2 blocks x 4
    # + 2 passes forward, each a copy of 65,536 B at 1,000 GB/s (read and write: 131.072 ns); 3/4 of them more
    assert tp.forward_s - sp.forward_s == pytest.approx(3 / 4 * 10 * 2 * 65536 / 1000e9)
    assert tp.backward_s - sp.backward_s == pytest.approx(3 / 4 * 20 * 2 * 65536 / 1000e9)


def test_the_gradient_reduce_goes_over_world_over_t_ranks_of_one_shard(tmp_path):
    cfg = config(tensor=2, world=8, parallel={"ranks_per_node": 0})
    shapes = {name: shape for name, shape, _ in rank_shapes(cfg, VOCAB)}
    assert shapes["wte.weight"] == (33, 64)  # 65 rows padded to 66, 33 each
    assert shapes["blocks.0.attn.c_attn.weight"] == (96, 64) and shapes["blocks.0.attn.c_attn.bias"] == (96,)
    assert shapes["blocks.0.attn.c_proj.weight"] == (64, 32) and shapes["blocks.0.attn.c_proj.bias"] == (64,)
    assert shapes["blocks.0.mlp.layers.0.weight"] == (128, 64)
    assert shapes["blocks.0.mlp.layers.1.weight"] == (64, 128)
    assert shapes["wpe.weight"] == (32, 64) and shapes["blocks.1.ln_2.weight"] == (64,)
    # one bucket of a rank's 2,112 + 2,048 (embeddings) + 2 x 25,184 (blocks: LayerNorms 2 x 128, QKV 6,240,
    # c_proj 2,112, MLP 8,320 + 8,256) + 128 (ln_f) = 54,656 fp32 values
    assert GroupPlan(cfg, VOCAB, 4).sizes == [54656 * 4]
    c = cluster(tmp_path)
    machine = make_machine(c, cfg, 8, None, FlopsOf(cfg, VOCAB))
    assert group_members(cfg.parallel, "tp", 4) == [0, 1]
    assert group_members(cfg.parallel, "dpcp", 4) == [0, 2, 4, 6]  # 2 per node, across both nodes
    assert machine.topology.subgroup([0, 2, 4, 6]).per_node == 2


def test_with_a_slow_inter_node_link_tp_across_nodes_ranks_below_tp_in_a_node(tmp_path):
    c = cluster(tmp_path)  # 2 nodes of 4; NVLink-like 100 GB/s inside, 10 GB/s between
    model = {"n_layer": 2, "n_embd": 256, "n_head": 8, "block_size": 64}
    across = project(config(tensor=8, world=8, model=model, train={"global_batch": 16}), c, [8])["rows"][0]
    inside = project(config(tensor=4, world=8, model=model, train={"global_batch": 16}), c, [8])["rows"][0]
    assert across.step.tp["link"] == "inter-node" and inside.step.tp["link"] == "intra-node"
    assert across.global_batch == inside.global_batch == 16
    assert across.step.step_s > inside.step.step_s
    assert across.tokens_per_s < inside.tokens_per_s


def test_world_sizes_that_are_not_multiples_of_t_are_left_out(tmp_path):
    report = project(config(tensor=4, world=4), cluster(tmp_path), [2, 4, 6, 8])
    assert [r.world_size for r in report["rows"]] == [4, 8]
    assert [s["world_size"] for s in report["skipped"]] == [2, 6]
    assert all("not a multiple of tensor 4" in s["why"] for s in report["skipped"])
    assert [r.global_batch for r in report["rows"]] == [8, 16]  # 8 rows per data-parallel rank


def test_one_rank_of_tensor_one_has_no_term(tmp_path):
    step = predict(config(tensor=1, world=4, train={"global_batch": 32}), cluster(tmp_path), None, VOCAB)[0]
    assert step.tp_s == 0.0 and step.tp == {}


def test_this_machine_is_calibrated_on_the_whole_model():
    """A tensor-parallel rank's compute is projected from the whole model's curves, so calibrating for a
    tensor-parallel config times the whole model on one rank."""
    one = one_rank_config(to_dict(config(tensor=2, world=4, sp=True)), "bf16", 4)
    assert (one["parallel"]["tensor"], one["parallel"]["sequence_parallel"], one["parallel"]["world_size"]) \
        == (1, False, 1)
    assert from_dict(one).model == config(tensor=2, world=4).model


def test_validation_cases_stay_data_parallel_whatever_the_preset():
    # 4 blocks: the pipeline cases cut up to 4 stages (interleaved, 2 x 2)
    cases = case_configs(config(tensor=2, world=2, sp=True, model={"n_layer": 4}))
    assert len(cases) == 20
    assert all((c.parallel.tensor, c.parallel.sequence_parallel) == (1, False) for _, c in cases)
    assert [c.parallel.pipeline for _, c in cases].count(2) == 5
    assert [c.parallel.pipeline for _, c in cases].count(4) == 3


def test_fp16_agrees_its_overflow_flag_over_the_group(tmp_path):
    c = cluster(tmp_path)
    per_step = {x["phase"]: (x["bytes"], x["count"])
                for x in predict(config(precision={"dtype": "fp16"}), c, None, VOCAB)[0].tp["per_step"]}
    assert per_step["tp-flag-all-reduce"] == (16, 1) and per_step["tp-norm-all-reduce"] == (8, 1)
    fp32 = predict(config(), c, None, VOCAB)[0].tp["per_step"]
    assert "tp-flag-all-reduce" not in {x["phase"] for x in fp32}
