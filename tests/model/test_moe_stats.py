"""A training run's ExpertLoad events (engine/moe_stats.py through the Trainer): one per rank per step,
every MoE layer's figures summed over the step's micro-batches: the choices each expert kept of the rank's
tokens and the rows its experts received add up, over the ranks, to every token's top-k (dropless); under a
capacity the drops are counted and missing from both; the router's entropy lies in (0, ln E]; the events
survive their JSON form (what a recording and a replay hold)."""

from __future__ import annotations

import math

import pytest

from engine import events as ev
from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict
from engine.trainer import Trainer

BATCH, BLOCK, K, EXPERTS = 8, 8, 2, 4


def _config(expert: int, capacity_factor: float) -> dict:
    return to_dict(from_dict({
        "model": {"n_layer": 3, "n_head": 2, "n_embd": 8, "block_size": BLOCK, "vocab_size": 11,
                  "n_experts": EXPERTS, "top_k": K, "moe_every": 2, "capacity_factor": capacity_factor},
        "data": {"kind": "synthetic-lm", "n_samples": 128},
        "train": {"steps": 2, "global_batch": BATCH, "micro_batches": 2, "eval_every": 0, "eval_batches": 1},
        "parallel": {"world_size": 2, "expert": expert}, "precision": {"dtype": "fp64"}}))


def _events_rank(comm, emit, cfg: dict) -> list[dict]:
    got: list[dict] = []
    trainer = Trainer(from_dict(cfg), comm, emit=got.append)
    try:
        trainer.fit()
    finally:
        trainer.replica.close()
    return [e for e in got if e["kind"] == "expert_load"]


@pytest.mark.parametrize("expert, capacity_factor", [(1, 0.0), (2, 0.0), (2, 0.5)])
def test_expert_load_events_count_every_routed_token(expert, capacity_factor):
    ranks = run_ranks(2, "threads", _events_rank, args=(_config(expert, capacity_factor),), timeout_s=60)
    loads = [ev.from_json(d) for events in ranks for d in events]
    assert sorted((e.step, e.rank) for e in loads) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for step in (1, 2):
        mine = [e for e in loads if e.step == step]
        for layer in range(2):  # blocks 0 and 2
            dropped = sum(e.dropped[layer] for e in mine)
            kept = sum(sum(e.tokens_per_expert[layer]) for e in mine)
            assert kept == sum(e.received[layer] for e in mine) == BATCH * BLOCK * K - dropped
            assert (dropped > 0) == (capacity_factor > 0)
            for e in mine:
                assert len(e.tokens_per_expert[layer]) == EXPERTS
                assert 0 < e.entropy[layer] <= math.log(EXPERTS) and e.aux_loss[layer] > 0
    assert all(ev.from_json(ev.to_json(e)) == e for e in loads)
