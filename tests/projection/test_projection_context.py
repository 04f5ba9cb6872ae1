"""The projection's context-parallel term against figures worked out here by hand, on the fixture cluster of
the pipeline tests (100 TFLOP/s × 0.5 × T/(T + 1024) at T tokens; 5 µs and 100 GB/s inside a node, 20 µs
and 10 GB/s between nodes; the engine's ring): SMALL (2 blocks, h = 64, s = 32, V = 65), 8 rows per
data-parallel rank.

A rank of a CP group of c holds 8 rows × 32/c tokens. Ring attention sends, per block, c − 1 hops of K and
V forward (one message of n_kv = 2·8·(32/c)·64·itemsize bytes each), and backward c − 1 hops of K, V and c of
the dK, dV accumulator (n_g in the compute dtype): a message costs α + nβ. The engine posts each hop before
the blocks of the chunk in hand and waits after them, so the blocks hide what they can; the accumulator's
last hop home has nothing beside it.

At c = 1 nothing changes: the existing projection tests pass as they were."""

from __future__ import annotations

import pytest
from projection_helpers import SMALL
from projection_helpers import fixture_cluster as cluster

from engine.config import from_dict
from engine.projection.project import predict

VOCAB = 65


def config(context: int = 2, world: int = 2, layout: str = "zigzag", dtype: str = "fp32", ckpt: str = "none",
           **parallel):
    dp = world // (context * parallel.get("tensor", 1))
    return from_dict({**SMALL, "precision": {"dtype": dtype}, "memory": {"checkpointing": ckpt},
                      "train": {"global_batch": 8 * dp},
                      "parallel": {"world_size": world, "context": context, "context_layout": layout,
                                   **parallel}})


def step_of(cfg, c):
    return predict(cfg, c, None, VOCAB)[0]


def hop(n: float, inter: bool = False) -> float:
    return (20e-6 + n / 10e9) if inter else (5e-6 + n / 100e9)


@pytest.mark.parametrize("context, dtype, ckpt, expected", [
    # c = 2, fp32: n_kv = n_g = 2·8·16·64·4 = 65,536; per block 1 forward hop, backward 1 of K, V, 2 of dK, dV
    (2, "fp32", "none", 2 * (hop(65_536) + 2 * hop(65_536) + hop(65_536))),
    # c = 4: n = 32,768; per block 3 forward, backward 3 of K, V and 4 of dK, dV = 10 messages
    (4, "fp32", "none", 2 * 10 * hop(32_768)),
    # bf16: K and V travel in bf16 (32,768 bytes), dK and dV in fp32 (65,536)
    (2, "bf16", "none", 2 * (2 * hop(32_768) + 2 * hop(65_536))),
    # every block recomputed: its forward hop again in backward
    (2, "fp32", "blocks", 2 * 5 * hop(65_536)),
])
def test_the_ring_hops_are_alpha_plus_n_beta_per_message(tmp_path, context, dtype, ckpt, expected):
    step = step_of(config(context, context, dtype=dtype, ckpt=ckpt), cluster(tmp_path))
    assert step.cp["step_s"] == pytest.approx(expected, rel=1e-12)  # every hop, hidden or not
    assert step.cp["link"] == "intra-node" and step.cp["rows"] == 8  # the group shares its rows
    assert step.cp["hidden_s"] == pytest.approx(expected - step.cp_s, rel=1e-9)


def test_the_blocks_hide_what_they_outlast(tmp_path):
    """c = 2, zigzag, fp32, 128 tokens a rank at 100e12 × 0.5 × 128/1152 FLOP/s. Attention's forward is
    4·h·b = 2,048 FLOPs per score; hop 0's blocks (3 of 8² scores on every rank: 192) and hop 1's (2: 128)
    take B_f = 2,048·192/rate and 2,048·128/rate forward, twice that backward, well under a hop
    (K = G = 5 µs + 65,536 B / 100 GB/s). A block then exposes forward K − B_f0, backward
    (K − B_b0) + (G − B_b1) + G, the last hop home alone."""
    rate = 100e12 * 0.5 * 128 / (128 + 1024)
    k = hop(65_536)
    f0, f1 = 2_048 * 192 / rate, 2_048 * 128 / rate
    per_block = (k - f0) + (k - 2 * f0) + (k - 2 * f1) + k
    step = step_of(config(2, 2), cluster(tmp_path))
    assert step.cp_s == pytest.approx(2 * per_block, rel=1e-12)
    assert step.cp["hop_blocks_forward_s"] == pytest.approx([f0, f1], rel=1e-12)


@pytest.mark.parametrize("context", [2, 4])
def test_slow_blocks_hide_every_hop_but_the_last_home(tmp_path, context):
    """At 1 GFLOP/s peak the blocks take milliseconds, the hops microseconds: each block exposes only the
    accumulator's hop home, G = α + n_g·β (n_g = 2·8·(32/c)·64·4)."""
    step = step_of(config(context, context), cluster(tmp_path, peak=0.001, name="slow"))
    assert step.cp["block_forward_s"] == 0.0
    assert step.cp_s == pytest.approx(2 * hop(2 * 8 * (32 // context) * 64 * 4), rel=1e-12)


def test_the_ring_takes_the_link_the_mesh_gives_the_context_group(tmp_path):
    """cp next to tp: a group of 2 adjacent ranks, in a node of 4; with cp outside dp (order tp-ep-dp-cp-pp,
    dp 4) its two ranks are 4 apart, on two nodes: n = 65,536 at 20 µs and 10 GB/s."""
    inside = step_of(config(2, 8), cluster(tmp_path))
    assert inside.cp["link"] == "intra-node" and inside.cp["kv_s"] == pytest.approx(hop(65_536), rel=1e-12)
    apart = step_of(config(2, 8, order="tp-ep-dp-cp-pp"), cluster(tmp_path))
    assert apart.cp["link"] == "inter-node"
    assert apart.cp["step_s"] == pytest.approx(2 * 4 * hop(65_536, inter=True), rel=1e-12)


@pytest.mark.parametrize("context, contiguous_ratio", [(2, 4 / 3), (4, 8 / 5)])
def test_the_busiest_rank_under_contiguous_and_zigzag(tmp_path, context, contiguous_ratio):
    """Causal blocks per rank: contiguous r + 1 of (s/c)² (busiest/mean 2c/(c + 1)), zigzag 2c + 1 of (s/2c)²
    on every rank (1.0)."""
    contiguous = step_of(config(context, context, "contiguous"), cluster(tmp_path)).cp
    zigzag = step_of(config(context, context, "zigzag"), cluster(tmp_path)).cp
    assert (contiguous["blocks_busiest"], zigzag["blocks_busiest"]) == (context, 2 * context + 1)
    assert contiguous["busiest_over_mean"] == pytest.approx(contiguous_ratio, rel=1e-12)
    assert zigzag["busiest_over_mean"] == 1.0


def test_the_busiest_rank_sets_the_compute(tmp_path):
    """c = 2, 128 tokens a rank: the rate is 100e12 × 0.5 × 128/1152 FLOP/s. Per token a block's Linear and
    LayerNorm parameters take 2 × 49,984 FLOPs, the head 2·V·h = 8,320. Attention: the contiguous layout's
    busiest rank computes 2 blocks of 16² scores = s²/c, the full square of its queries: 4·s·h = 8,192 per
    token; zigzag's 5 blocks of 8² = 320 scores, 5/8 of it: 5,120. Backward is twice forward."""
    rate = 100e12 * 0.5 * 128 / (128 + 1024)
    for layout, attention in (("contiguous", 8_192), ("zigzag", 5_120)):
        step = step_of(config(2, 2, layout), cluster(tmp_path))
        forward = 128 * (2 * (2 * 49_984 + attention) + 8_320) / rate
        assert step.forward_s == pytest.approx(forward, rel=1e-12)
        assert step.backward_s == pytest.approx(2 * forward, rel=1e-12)


def test_the_gradient_reduce_goes_over_data_times_context(tmp_path):
    """DP 2 × CP 2 on 4 ranks reduces its gradients over the 4 ranks of the data × context group, on the
    training thread (the replica runs inline beside ring attention): what DP 4 without overlap waits for,
    plus the hops' exposed part; only hops are hidden."""
    both = step_of(config(2, 4), cluster(tmp_path))
    dp4 = step_of(from_dict({**SMALL, "train": {"global_batch": 32},
                             "parallel": {"world_size": 4, "overlap": False}}), cluster(tmp_path))
    assert both.overlapped_s == pytest.approx(both.cp["hidden_s"], rel=1e-9)
    assert both.exposed_s - both.cp_s == pytest.approx(dp4.exposed_s, rel=1e-9)


def test_context_one_has_no_term(tmp_path):
    step = step_of(config(1, 2), cluster(tmp_path))
    assert (step.cp_s, step.cp) == (0.0, {})


def test_beside_tensor_parallelism_both_terms_take_the_ranks_tokens(tmp_path):
    """TP 2 × CP 2 on 4 ranks, 8 rows: a rank holds 16 tokens of each row and 2 of the 4 heads. TP's
    activations are b·(s/c)·h·4 = 8·16·64·4 = 32,768 bytes; a CP hop's K and V 2·8·16·(64/2)·4 = 32,768."""
    step = step_of(config(2, 4, tensor=2), cluster(tmp_path))
    assert {c["bytes"] for c in step.tp["per_layer"]} == {32_768}
    assert step.cp["kv_bytes"] == 32_768
