"""The Trainer with pipeline parallelism trains what one device trains (float64, dropout on, tied embeddings):
p in {2, 3, 4} stages with every schedule and m in {1, p−1, p, 2p, 3p+1} micro-batches against one device
accumulating the same m micro-batches — the loss, the gradient norm and the first validation loss of every
step, every gradient after the data-parallel reduce, and every parameter after 3 clipped AdamW steps; with
data parallelism (DDP and ZeRO-1), tensor parallelism, activation checkpointing; on processes. A shape a
schedule cannot run is one line before any rank starts."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from engine.config import ConfigError, from_dict
from tests.pp_train_helpers import assert_trains_like, pp_config, train_rank

STEPS = 3


def _one_device(m: int, **over) -> dict:
    cfg = pp_config(1, 1, m, **over)
    return run_ranks(1, "threads", train_rank, args=(cfg, STEPS), timeout_s=60)[0]


# every schedule runs every m (interleaved too, when p does not divide m): none of these is left out
CASES = [(name, v, p, m) for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1))
         for p in (2, 3, 4) for m in sorted({1, p - 1, p, 2 * p, 3 * p + 1})]


@pytest.mark.parametrize("name, v, p, m", CASES, ids=[f"{n}-p{p}-m{m}" for n, _, p, m in CASES])
def test_pipeline_equals_one_device(name, v, p, m):
    n_layer = max(4, p * v)
    cfg = pp_config(p, p, m, name, v, model__n_layer=n_layer)
    ranks = run_ranks(p, "threads", train_rank, args=(cfg, STEPS), timeout_s=120)
    assert_trains_like(ranks, _one_device(m, model__n_layer=n_layer))


@pytest.mark.parametrize("zero", [0, 1])
def test_pipeline_times_data_parallel(zero):
    """DP 2 × PP 2: each stage's gradients averaged over its data-parallel pair once per step."""
    ranks = run_ranks(4, "threads", train_rank, args=(pp_config(4, 2, 3, zero=zero), STEPS), timeout_s=120)
    assert_trains_like(ranks, _one_device(3, rows=4), grads=zero == 0)  # the same global batch


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_pipeline_times_tensor_times_data_parallel(sp):
    """DP 2 × PP 2 × TP 2 on 8 threads: the tensor-parallel shards of each stage, joined by name; with
    sequence parallelism the stages hand on s/t of each sequence."""
    cfg = pp_config(8, 2, 2, tensor=2, parallel__sequence_parallel=sp)
    ranks = run_ranks(8, "threads", train_rank, args=(cfg, STEPS), timeout_s=180)
    assert_trains_like(ranks, _one_device(2, rows=4), rtol=1e-10)
    # each stage's blocks ran a tensor-parallel block's collectives (counted over its own blocks)
    sp_counts = {"sp-fwd-all-gather": 2.0, "sp-fwd-reduce-scatter": 2.0, "sp-bwd-all-gather": 2.0,
                 "sp-bwd-reduce-scatter": 2.0}
    per_layer = sp_counts if sp else {"tp-fwd-all-reduce": 2.0, "tp-bwd-all-reduce": 2.0}
    assert all(r["per_layer"] == per_layer for r in ranks)


def test_activation_checkpointing_composes():
    over = {"memory__checkpointing": "blocks"}
    ranks = run_ranks(2, "threads", train_rank, args=(pp_config(2, 2, 4, **over), STEPS), timeout_s=120)
    assert_trains_like(ranks, _one_device(4, **over))


@pytest.mark.slow
def test_on_processes():
    ranks = run_ranks(4, "processes", train_rank, args=(pp_config(4, 2, 4, zero=1), STEPS), timeout_s=180)
    assert_trains_like(ranks, _one_device(4, rows=4), grads=False)


@pytest.mark.parametrize("over, key", [
    (dict(parallel__schedule="interleaved", parallel__chunks=1), "parallel.chunks"),
    (dict(parallel__chunks=2), "parallel.chunks"),
    (dict(parallel__zero_stage=2), "parallel.zero_stage"),
    (dict(model__kind="mlp"), "parallel.pipeline"),
    (dict(parallel__schedule="pipedream"), "parallel.schedule"),
])
def test_what_cannot_run_is_one_line(over, key):
    cfg = pp_config(2, 2, 2)
    for dotted, value in over.items():
        section, name = dotted.split("__")
        cfg[section][name] = value
    if cfg["model"]["kind"] == "mlp":
        cfg["model"] = {"kind": "mlp", "widths": [4, 8, 8, 3]}
        cfg["data"] = {"kind": "synthetic-classification", "n_samples": 256}
    with pytest.raises(ConfigError) as err:
        from_dict(cfg)
    assert err.value.key == key and "\n" not in str(err.value)


def test_a_cut_by_measured_time_is_rank_0s_on_every_rank():
    """stage_balance = "time": each rank measures its own times, and every rank cuts as rank 0 did (else
    stages of one pipeline would disagree on their boundaries); training is still one device's."""
    cfg = pp_config(4, 2, 2, parallel__stage_balance="time", model__n_layer=6)
    ranks = run_ranks(4, "threads", train_rank, args=(cfg, STEPS), timeout_s=120)
    assert_trains_like(ranks, _one_device(2, rows=4, model__n_layer=6))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_mixed_precision_trains_within_its_rounding(dtype):
    """fp16 (loss scaled: the last stage seeds every backward with scale / m) and bf16: DP 2 × PP 2 ZeRO-1
    against one device of the same precision, within the rounding of the 16-bit activations."""
    over = {"precision__dtype": dtype}
    cfg = pp_config(4, 2, 2, zero=1, **over)
    ranks = run_ranks(4, "threads", train_rank, args=(cfg, STEPS), timeout_s=120)
    one = _one_device(2, rows=4, **over)
    for r in ranks:
        assert not any(r["skipped"])
        assert r["losses"] == pytest.approx(one["losses"], rel=1e-3)
        assert r["norms"] == pytest.approx(one["norms"], rel=1e-2)


def test_untied_head_needs_no_copy():
    """tie_weights = false: the head is the last stage's own parameter; nothing crosses between the first
    and last stage but the schedule's messages."""
    over = {"model__tie_weights": False}
    ranks = run_ranks(3, "threads", train_rank, args=(pp_config(3, 3, 4, **over), STEPS), timeout_s=120)
    assert_trains_like(ranks, _one_device(4, **over))


def _held_parameter_bytes(comm, emit, cfg_dict: dict) -> dict:
    from engine.config import from_dict as load
    from engine.trainer import Trainer
    trainer = Trainer(load(cfg_dict), comm)
    try:
        dense = trainer.model.dense
        stages = {id(p): p for p in trainer.model.runner.parameters()}
        held = sum(p.data.nbytes for _, p in dense.named_parameters() if id(p) not in stages)
        mine = sum(p.data.nbytes for p in stages.values())
        return {"others": held, "mine": mine, "whole": 8 * trainer.n_params}
    finally:
        trainer.replica.close()


def test_a_rank_keeps_only_its_stages_parameters():
    """Every rank builds the whole model (each stage starts from one device's initialisation), then drops
    the other stages' parameters: none of their bytes stay, and the stages together hold the whole model
    (plus the last stage's copy of the tied embedding)."""
    cfg = pp_config(world=2, pipeline=2, m=2)
    ranks = run_ranks(2, "threads", _held_parameter_bytes, (cfg,))
    assert [r["others"] for r in ranks] == [0, 0]
    vocab, width = 11, 16  # pp_config's tied embedding: its copy on the last stage
    assert ranks[0]["mine"] + ranks[1]["mine"] == ranks[0]["whole"] + 8 * vocab * width
