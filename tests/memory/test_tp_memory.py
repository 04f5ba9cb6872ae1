"""Under tensor and sequence parallelism the estimator predicts every rank's ledger to the byte: model states
at rest, and every category's peak over the step (activations included), over a grid of tensor degree,
sequence parallelism, ZeRO stage, activation checkpointing and precision; the model states are the
ZeRO formulas over the rank's own shard (sharded matrices 1/t, the vocabulary padded to ceil(V/t));
sequence parallelism's activations are the LayerNorm region's 1/t; no rank keeps b·s·V logits."""

from __future__ import annotations

import math

import pytest

from engine.config.build import param_shapes
from engine.memory.estimator import estimate
from engine.memory.ledger import CATEGORIES, MODEL_STATES
from tests.tp_memory_helpers import VOCAB, measured, tiny

MESHES = [(2, 2), (4, 2), (4, 4)]  # (world, tensor): TP 2, DP 2 x TP 2, TP 4
DTYPES = ("fp32", "fp16", "bf16", "fp64")
GRID = [(world, t, sp, stage, (stage + world + t + sp) % 2 == 1, DTYPES[(stage + sp) % 4])
        for world, t in MESHES for sp in (False, True) for stage in range(4)]


@pytest.mark.parametrize("world, t, sp, stage, checkpointing, dtype", GRID)
def test_estimate_equals_the_ledger_to_the_byte(world, t, sp, stage, checkpointing, dtype):
    cfg = tiny(parallel__world_size=world, parallel__tensor=t, parallel__sequence_parallel=sp,
               parallel__zero_stage=stage, precision__dtype=dtype, model__dropout=0.1 if sp else 0.0,
               memory__checkpointing="blocks" if checkpointing else "none")
    e = estimate(cfg)
    predicted = e.category_peaks()
    for r in measured(cfg):
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states, f"rank {r['rank']}"
        peaks = {c: max(m[c] for m in r["maxima"].values()) for c in CATEGORIES}
        assert peaks == predicted, f"rank {r['rank']}"
        for phase in ("forward", "backward"):
            assert r["maxima"][phase]["activations"] == e.maxima[phase]["activations"], phase


def test_an_mlp_split_in_pairs():
    cfg = tiny(model__kind="mlp", model__vocab_size=0, model__n_layer=2, model__n_head=4, model__n_embd=64,
               model__block_size=32, model__widths=[12, 20, 8, 16, 7], data__kind="synthetic-classification",
               parallel__world_size=4, parallel__tensor=2, parallel__zero_stage=1, train__global_batch=8)
    e = estimate(cfg)
    for r in measured(cfg):
        assert {k: r["at_rest"][k] for k in MODEL_STATES} == e.states
        assert {c: max(m[c] for m in r["maxima"].values()) for c in CATEGORIES} == e.category_peaks()


def _local_params(t: int) -> int:
    """Ψ on one rank of TP t: the sharded matrices' 1/t (the vocabulary padded), the rest whole."""
    c, blocks = 16, 3
    shapes = param_shapes(tiny(), VOCAB)
    whole = sum(math.prod(s) for n, s, _ in shapes if n == "wpe.weight" or "ln" in n or n.endswith(
        ("c_proj.bias", "layers.1.bias")))
    sharded = blocks * (3 * c * c + 3 * c + c * c + 4 * c * c + 4 * c + 4 * c * c) // t
    return whole + sharded + math.ceil(VOCAB / t) * c


@pytest.mark.parametrize("t", [2, 4])
def test_model_states_are_the_zero_formulas_over_the_shard(t):
    """16Ψ' for 2-byte training without ZeRO, 4Ψ' + 12Ψ'/N with ZeRO-1 over the N data-parallel ranks,
    Ψ' the rank's own parameters (sharded ones by 1/t, padded)."""
    psi = _local_params(t)
    ddp = estimate(tiny(parallel__world_size=t, parallel__tensor=t, precision__dtype="bf16"))
    assert sum(ddp.states.values()) == 16 * psi
    zero1 = estimate(tiny(parallel__world_size=2 * t, parallel__tensor=t, parallel__zero_stage=1,
                          precision__dtype="bf16"))
    padded = math.ceil(psi / 2) * 2
    assert sum(zero1.states.values()) == 4 * padded + 12 * padded // 2
    assert ddp.n_params == estimate(tiny()).n_params  # the whole model's count, whatever the split


def test_sequence_parallelism_divides_the_layernorm_region_and_no_rank_keeps_the_whole_logits():
    b, s, h, v = 4, 8, 16, VOCAB  # one rank of TP 4 sees the whole batch
    tp, sp = (estimate(tiny(parallel__world_size=4, parallel__tensor=4, parallel__sequence_parallel=on,
                            model__dropout=0.1, precision__dtype="fp64")) for on in (False, True))
    region = 3 * (2 * (b * s * h * 8 + 2 * b * s * 8) + 2 * b * s * h)  # 3 blocks: LN inputs, stats, masks
    region += b * s * h * 8 + 2 * b * s * 8 + b * s * h  # ln_f's input and stats, the embedding's mask
    assert tp.maxima["forward"]["activations"] - sp.maxima["forward"]["activations"] == region * 3 // 4
    one = estimate(tiny(precision__dtype="fp64", model__dropout=0.1))
    logits = b * s * (v - math.ceil(v / 4)) * 8  # what one device keeps of the logits beyond a TP 4 rank
    assert one.maxima["forward"]["activations"] - tp.maxima["forward"]["activations"] >= logits
