"""The projection's pipeline term against figures worked out here by hand: the published bubbles with equal
stages and free messages, a message's α + nβ on the link the mesh puts the pipeline group on, each stage's
share of the compute from the FLOPs of what it holds, and a slower link between nodes raising the step by
what its messages and agreements add. At p = 1 the existing projection tests pass untouched."""

from __future__ import annotations

import pytest
from projection_helpers import SMALL
from projection_helpers import fixture_cluster as cluster

from engine.config import from_dict
from engine.projection.flops import FlopsOf
from engine.projection.machine import make_machine
from engine.projection.pipeline_step import pipeline_of
from engine.projection.project import predict

VOCAB = 65
def config(pipeline: int = 2, world: int = 2, schedule: str = "1f1b", micro: int = 4, chunks: int = 1,
           layers: int = 4, **parallel):
    """SMALL (h = 64, s = 32, V = 65) with `layers` blocks, 8 rows per micro-batch per data-parallel rank."""
    dp = world // pipeline
    return from_dict({**SMALL, "model": {**SMALL["model"], "n_layer": layers},
                      "train": {"global_batch": 8 * micro * dp, "micro_batches": micro},
                      "parallel": {"world_size": world, "pipeline": pipeline, "schedule": schedule,
                                   "chunks": chunks, **parallel}})


def pipeline(cfg, c):
    flops_of = FlopsOf(cfg, VOCAB)
    return pipeline_of(cfg, make_machine(c, cfg, cfg.parallel.world_size, None, flops_of), flops_of)[0]


@pytest.mark.parametrize("schedule, chunks, f, i, w, published", [
    ("gpipe", 1, 1.0, 1.0, 1.0, 3 / 11),  # (p−1)/(m+p−1), p = 4, m = 8; B = I + W = 2F
    ("1f1b", 1, 1.0, 1.0, 1.0, 3 / 11),
    ("interleaved", 2, 1.0, 1.0, 1.0, 3 / 19),  # (p−1)/(v·m+p−1), v = 2
    ("zb-h1", 1, 1.0, 1.0, 1.0, 3 / 27),  # (p−1)/(3m+p−1) with F = I = W
])
def test_equal_stages_and_free_messages_give_the_published_bubble(tmp_path, schedule, chunks, f, i, w,
                                                                  published):
    pipe = pipeline(config(4, 4, schedule, 8, chunks, layers=8), cluster(tmp_path))
    stages = 4 * chunks
    pipe.forward, pipe.input, pipe.weight = [f] * stages, [i] * stages, [w] * stages
    pipe.recompute = pipe.tp_forward = pipe.tp_backward = [0.0] * stages
    pipe.message_s = 0.0
    pipe.play()
    assert pipe.timeline.bubble == pytest.approx(published, abs=1e-12)
    assert pipe.p2p_s == 0.0


def test_a_message_is_alpha_plus_n_beta_on_the_link_the_mesh_gives_the_pipeline(tmp_path):
    # n = b·s·h·4 = 8·32·64·4 = 65,536 bytes; 2 stages on nodes of 4 sit in one node (5 us, 100 GB/s)
    pipe = pipeline(config(2, 2), cluster(tmp_path, per_node=4))
    assert pipe.message_bytes == 65_536
    assert (pipe.link_name, pipe.message_s) == ("intra-node", pytest.approx(5e-6 + 65_536 / 100e9, rel=1e-12))
    # 8 ranks, dp 4: pp outermost puts stage 1 four ranks on, on the next node (20 us, 10 GB/s)
    pipe = pipeline(config(2, 8), cluster(tmp_path, per_node=4))
    assert (pipe.link_name, pipe.message_s) == ("inter-node", pytest.approx(20e-6 + 65_536 / 10e9, rel=1e-12))
    # pp innermost: the two stages are adjacent ranks again
    pipe = pipeline(config(2, 8, order="pp-tp-cp-ep-dp"), cluster(tmp_path, per_node=4))
    assert pipe.link_name == "intra-node"
    # every hop is counted: 4 stages on nodes of 2 cross between stages 1 and 2
    assert pipeline(config(4, 4, micro=4), cluster(tmp_path, per_node=2)).link_name == "inter-node"


def test_each_stage_takes_the_flops_of_what_it_holds(tmp_path):
    """4 blocks over 2 stages: [2, 2] (the cut by parameters: 6,208 embedding + 2 × 49,984 against 4,288 head
    + 2 × 49,984; [1, 3] and [3, 1] are heavier). Per token, a block's forward is 2 × 49,984 + 4·s·h =
    108,160 FLOPs and the head's 2·V·h = 8,320; backward, a block's Linear weights take 4 × 49,152 and
    attention 8·s·h = 16,384 (212,992), the head 4 × 4,160 = 16,640. The nominal rate at 256 tokens is
    100 TFLOP/s × 0.5 × 256 / (256 + 1024) = 1e13 FLOP/s, forward and backward alike."""
    pipe = pipeline(config(2, 2), cluster(tmp_path))
    assert pipe.counts == [2, 2]
    t_f = 256 * (4 * 108_160 + 8_320) / 1e13
    t_b = 2 * t_f
    assert pipe.forward == pytest.approx([t_f * 216_320 / 440_960, t_f * 224_640 / 440_960], rel=1e-12)
    total_b = 4 * 212_992 + 16_640
    backward = [i + w for i, w in zip(pipe.input, pipe.weight)]
    assert backward == pytest.approx([t_b * 425_984 / total_b, t_b * 442_624 / total_b], rel=1e-12)
    # the weight gradient: half of every Linear's backward (dW = dYᵀ·X is one of its two products)
    assert pipe.weight == pytest.approx([t_b * 196_608 / total_b, t_b * (196_608 + 8_320) / total_b],
                                        rel=1e-12)


@pytest.mark.parametrize("tied", [False, True])
def test_a_slower_link_between_nodes_raises_the_step_by_its_messages(tmp_path, tied):
    """p = 2, m = 1, one rank a node: the critical path is F0, the activation, F1 B1, the gradient, B0 —
    two messages of n = 65,536 bytes; then the pipeline group's norm (1 fp64 value on 2 ranks: the engine's
    ring sends it one hop each half, 2 × (α + 8β)) and the loss and votes over every rank (3 values: the
    ring's 2 × (α + 12β)). A tied head adds its weight's copy before and its gradient after: 2 messages of
    V·h·4 = 16,640 bytes. So the step rises by 2Δ(α + nβ) + 2Δ(α + 8β) + 2Δ(α + 12β) (+ 2Δ(α + 16,640β))."""
    cfg = from_dict({**SMALL, "model": {**SMALL["model"], "n_layer": 4, "tie_weights": tied},
                     "train": {"global_batch": 8, "micro_batches": 1},
                     "parallel": {"world_size": 2, "pipeline": 2, "schedule": "gpipe"}})
    fast = predict(cfg, cluster(tmp_path, per_node=1, inter_gbs=10, inter_us=20, name="f"), None, VOCAB)[0]
    slow = predict(cfg, cluster(tmp_path, per_node=1, inter_gbs=1, inter_us=120, name="s"), None, VOCAB)[0]

    def cost(alpha: float, beta: float) -> float:
        tie = 2 * (alpha + 16_640 * beta) if tied else 0.0
        return 2 * (alpha + 65_536 * beta) + 2 * (alpha + 8 * beta) + 2 * (alpha + 12 * beta) + tie
    assert slow.step_s - fast.step_s == pytest.approx(cost(120e-6, 1 / 1e9) - cost(20e-6, 1 / 10e9), rel=1e-9)
    assert slow.pp["link"] == "inter-node" and slow.p2p_s > fast.p2p_s


def test_pipeline_fields_are_empty_at_one_stage_and_pp_is_projected(tmp_path):
    one = from_dict({**SMALL, "parallel": {"world_size": 2}})
    step = predict(one, cluster(tmp_path), None, VOCAB)[0]
    assert (step.bubble_s, step.p2p_s, step.pp) == (0.0, 0.0, {})
    two = predict(config(2, 4), cluster(tmp_path), None, VOCAB)[0]
    assert two.pp["degree"] == 2 and two.step_s > two.compute_s > 0


def test_compute_emulation_sleeps_the_same_on_every_stage(tmp_path):
    """pipeline_emulate_ms = 20: every F, I and W sleeps 20 ms, so 1F1B over p = 4, m = 8 with free
    messages takes (m + p − 1)·(F + B) = 11 × 60 ms, whatever the model."""
    pipe = pipeline(config(4, 4, "1f1b", 8, pipeline_emulate_ms=20.0), cluster(tmp_path))
    assert pipe.forward == pipe.input == pipe.weight == [0.02] * 4
    assert pipe.free.makespan == pytest.approx(11 * 0.06, rel=1e-12)


@pytest.mark.parametrize("tied", [False, True])
def test_each_stage_reduces_its_own_gradients_after_its_last_backward(tmp_path, tied):
    """p = 2, m = 1, GPipe, 3 blocks cut [1, 2] (embedding + a block is lighter than 2 blocks + the head's
    4,288, and [2, 1] heavier still), one node of 4: dp 2 against dp 1, the same rows per micro-batch. Each
    stage all-reduces its own parameters once its last backward is done, one bucket on a ring of 2: stage 0
    (wte, wpe, a block: 56,192 fp32 values) 2(α + 112,384β); stage 1 (2 blocks, ln_f and an untied
    lm_head: 104,256) 2(α + 208,512β), the longer one. Untied, stage 1 is done B0 earlier (rank 0 still
    runs its backward: a third of 2 × 8.5 us), which outlasts the 1.9 us difference, so the step waits for
    stage 0's reduce alone. Tied, the first stage's bucket holds wte, whose gradient is summed only after
    the schedule and the copy's message: it leaves then, while stage 1's (now 2(α + 200,192β) without
    lm_head) left at its last backward, before the first stage's ended, so the step waits for stage 0's
    reduce again, from later on (the tied messages are dp 1's too). The loss and votes go over 4 ranks
    instead of 2: 3 values on the engine's ring of 4 travel 3 one-hop steps each half, 6(α + 8β), against
    2(α + 12β)."""
    def cfg(world: int):
        return from_dict({**SMALL, "model": {**SMALL["model"], "n_layer": 3, "tie_weights": tied},
                          "train": {"global_batch": 8 * (world // 2), "micro_batches": 1},
                          "parallel": {"world_size": world, "pipeline": 2, "schedule": "gpipe"}})
    c = cluster(tmp_path, per_node=4)
    one, two = (predict(cfg(w), c, None, VOCAB)[0] for w in (2, 4))
    alpha, beta = 5e-6, 1 / 100e9
    reduce = [2 * (alpha + 112_384 * beta), 2 * (alpha + (200_192 if tied else 208_512) * beta)]
    assert two.pp["blocks_per_stage"] == [1, 2]
    assert two.pp["reduce_s"] == pytest.approx(reduce, rel=1e-12)
    loss = 6 * (alpha + 8 * beta) - 2 * (alpha + 12 * beta)
    assert two.step_s - one.step_s == pytest.approx(reduce[0] + loss, rel=1e-9)


def test_the_tp_term_under_a_pipeline_counts_what_each_rank_issues(tmp_path):
    """PP 2 x TP 2: the TP summary's step figures are the busiest rank's own collectives (not the empty
    replay of a step the pipeline never plays), and the two pipeline ranks' stages together issue what one
    rank of PP 1 x TP 2 issues in its micro-batches (the step's own agreements, issued once per rank by
    each, aside)."""
    c, cfg = cluster(tmp_path), config(2, 4, "1f1b", 4, tensor=2)
    two = predict(cfg, c, None, VOCAB)[0]
    assert two.tp["step_s"] == pytest.approx(two.tp_s, rel=1e-12) and two.tp["collectives"] > 0
    flops_of = FlopsOf(cfg, VOCAB)
    pipe, tp, _ = pipeline_of(cfg, make_machine(c, cfg, 4, None, flops_of), flops_of)
    in_micro_batches = sum(sum(pipe.tp_issued_by(r).values()) for r in range(2))
    one = predict(config(1, 2, "1f1b", 4, tensor=2), c, None, VOCAB)[0]
    assert in_micro_batches == one.tp["collectives"] - len(tp.per_step) > 0


def test_the_cp_term_under_a_pipeline_is_the_ring_of_each_stage_s_blocks(tmp_path):
    """PP 2 x CP 2 (4 blocks, 2 a stage): a context group's ranks share their rows, so a micro-batch has
    global batch / (dp · m) rows and a rank b·s/c tokens of them, which the stage-to-stage message carries;
    each stage's F and I carry the exposed ring hops of its blocks, the same per block as PP 1 x CP 2's
    (context.py's term, step.py's rows); one row per micro-batch (b < c) still projects."""
    c = cluster(tmp_path)
    cfg = config(2, 4, "1f1b", 4, context=2)  # global batch 64: dp 1, 16 rows a micro-batch
    flops_of = FlopsOf(cfg, VOCAB)
    pipe, _, cp = pipeline_of(cfg, make_machine(c, cfg, 4, None, flops_of), flops_of)
    assert cp.active and cp.rows == 16
    assert pipe.message_bytes == 16 * (32 // 2) * 64 * 4
    flat = predict(from_dict({**SMALL, "model": {**SMALL["model"], "n_layer": 4},
                              "train": {"global_batch": 64, "micro_batches": 4},
                              "parallel": {"world_size": 2, "context": 2}}), c, None, VOCAB)[0]
    assert cp.block_forward_s > 0
    assert cp.block_forward_s == pytest.approx(flat.cp["block_forward_s"], rel=1e-12)
    assert cp.block_backward_s == pytest.approx(flat.cp["block_backward_s"], rel=1e-12)
    assert pipe.cp_forward == pytest.approx([2 * cp.block_forward_s] * 2, rel=1e-12)
    assert pipe.cp_backward == pytest.approx([2 * cp.block_backward_s] * 2, rel=1e-12)
    step = predict(cfg, c, None, VOCAB)[0]
    me = step.pp["rank"]
    hops = pipe.per_rank(me, pipe.cp_forward) + pipe.per_rank(me, pipe.cp_backward)
    assert step.cp_s == pytest.approx(hops, rel=1e-12)
    assert step.cp["degree"] == 2 and step.exposed_s > step.cp_s > 0
    one_row = from_dict({**SMALL, "model": {**SMALL["model"], "n_layer": 4},
                         "train": {"global_batch": 4, "micro_batches": 4},
                         "parallel": {"world_size": 4, "pipeline": 2, "context": 2}})
    assert predict(one_row, c, None, VOCAB)[0].step_s > 0
