"""A tensor-parallel run's traffic reaches its events and its summary: every rank's Traffic events carry
the TP group's phases (TP forward/backward all-reduces, SP all-gathers and reduce-scatters, the loss's and
the norm's) beside the data-parallel group's reduce; the summary gives this rank's bytes per step by group
and phase (exactly the ring's bytes for the collectives the plan issues) and the collectives each block ran,
counted: 2 + 2 all-reduces (TP), 2 all-gathers + 2 reduce-scatters each way (SP), the forward's again when
the block is recomputed."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict
from engine.trainer import Trainer
from tests.parallel_helpers import ring_bytes
from tests.tp_train_helpers import tp_config

TP = {"tp-fwd-all-reduce": 2.0, "tp-bwd-all-reduce": 2.0}
SP = {"sp-fwd-all-gather": 2.0, "sp-fwd-reduce-scatter": 2.0, "sp-bwd-all-gather": 2.0,
      "sp-bwd-reduce-scatter": 2.0}


def _fit_rank(comm, emit, cfg_dict):
    events: list = []
    trainer = Trainer(from_dict(cfg_dict), comm, emit=events.append)
    try:
        summary = trainer.fit()
    finally:
        trainer.replica.close()
    traffic = [e for e in events if e["kind"] == "traffic"]
    groups = {kind: trainer.groups.of(kind).name for kind in ("tp", "dp")}
    return {"summary": summary, "traffic": traffic, "groups": groups}


@pytest.mark.parametrize("sp, checkpointing, per_layer", [
    (False, "none", TP), (True, "none", SP),
    (False, "blocks", {"tp-fwd-all-reduce": 4.0, "tp-bwd-all-reduce": 2.0}),
    (True, "blocks", {**SP, "sp-fwd-all-gather": 4.0, "sp-fwd-reduce-scatter": 4.0}),
], ids=["tp", "tp+sp", "tp-recompute", "tp+sp-recompute"])
def test_collectives_per_layer_are_counted(sp, checkpointing, per_layer):
    cfg = tp_config(4, 2, sp, 1, memory__checkpointing=checkpointing, train__micro_batches=2,
                    train__global_batch=8)
    for r in run_ranks(4, "threads", _fit_rank, args=(cfg,), timeout_s=60):
        assert r["summary"]["collectives_per_layer"] == per_layer


def test_traffic_by_group_and_phase_reaches_the_events_and_the_summary():
    cfg = tp_config(4, 2, False, 1)
    c, b, s, layers = 16, 2, 8, 2  # width, rows per DP rank, context, blocks (tp_config's)
    for rank, r in enumerate(run_ranks(4, "threads", _fit_rank, args=(cfg,), timeout_s=60)):
        tp, dp = r["groups"]["tp"], r["groups"]["dp"]
        phases = {(link["group"], link["phase"]) for e in r["traffic"] for link in e["links"]}
        assert {(tp, "tp-fwd-all-reduce"), (tp, "tp-bwd-all-reduce"), (tp, "tp-loss-all-reduce"),
                (tp, "tp-norm-all-reduce"), (dp, "reduce-scatter"), (dp, "all-gather")} <= phases
        per_step = {(row["group"], row["phase"]): row["bytes_per_step"] for row in r["summary"]["traffic"]}
        # forward: 2 all-reduces per block and the embedding's, of b·s·c float64s each, on a ring of 2
        sent = sum(ring_bytes(b * s * c, 2, rank % 2)) * 8
        assert per_step[(tp, "tp-fwd-all-reduce")] == (2 * layers + 1) * sent
        assert per_step[(tp, "tp-bwd-all-reduce")] == (2 * layers + 1) * sent  # the head's f included
