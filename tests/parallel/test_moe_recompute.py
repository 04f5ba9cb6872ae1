"""Activation checkpointing of mixture-of-experts blocks: the recompute runs the block's routing, capacity and
load-balancing loss again, and under expert parallelism its dispatch and combine all-to-alls. Gradients are
bitwise those of training without checkpointing (float64, 4 thread ranks, EP 1 and EP 2; top-1 and top-2,
a capacity, dropout, two micro-batches, every block or every other); the all-to-alls' bytes grow by the
recomputed forwards' exactly; a recompute adds no routing figures to the step's ExpertLoad events. EP 2
beside TP 2, PP 2 and CP 2 too."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict
from engine.recompute import CheckpointedForward
from engine.trainer import Trainer

STEPS = 2


def moe_config(expert: int, checkpointing: str, top_k: int = 2, capacity_factor: float = 0.0,
               micro_batches: int = 1, dropout: float = 0.0) -> dict:
    d = {
        "name": "moe-recompute", "seed": 5,
        "model": {"kind": "gpt", "n_layer": 3, "n_head": 2, "n_embd": 8, "block_size": 8, "vocab_size": 11,
                  "n_experts": 4, "top_k": top_k, "moe_every": 1, "capacity_factor": capacity_factor,
                  "aux_loss_coef": 0.1, "dropout": dropout},
        "data": {"kind": "synthetic-lm", "n_samples": 256},
        "train": {"steps": STEPS, "global_batch": 8, "micro_batches": micro_batches, "eval_every": 0,
                  "eval_batches": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "grad_clip": 0.05},
        "parallel": {"world_size": 4, "expert": expert, "bucket_cap_mb": 0.002},
        "memory": {"checkpointing": checkpointing},
        "precision": {"dtype": "fp64"},
    }
    return to_dict(from_dict(d))


def train_rank(comm, emit, cfg_dict: dict) -> dict:
    events: list = []
    trainer = Trainer(from_dict(cfg_dict), comm, emit=events.append)
    try:
        steps = []
        for _ in range(STEPS):
            s = trainer.train_step()
            steps.append({"loss": s["loss"], "norm": s["grad_norm"],
                          "grads": {p.name: p.grad.tobytes() for p in trainer.model.parameters()}})
        return {"steps": steps, "loads": [e for e in events if e.get("kind") == "expert_load"],
                "bytes": {(r["group"], r["phase"]): r["bytes"] for r in comm.meter.totals()}}
    finally:
        trainer.replica.close()


def _train(cfg: dict) -> list[dict]:
    return run_ranks(4, "threads", train_rank, args=(cfg,), timeout_s=120)


CASES = {"top2-blocks": (dict(), "blocks"),
         "top1-capacity-dropout-every2": (dict(top_k=1, capacity_factor=1.0, dropout=0.1), "every:2"),
         "top2-micro2-every2": (dict(micro_batches=2), "every:2")}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("expert", [1, 2])
def test_gradients_equal_training_without_checkpointing_bitwise(expert, case, monkeypatch):
    over, spec = CASES[case]
    recomputed = []
    real = CheckpointedForward._recompute_backward

    def counted(self, *args):
        recomputed.append(self.block)
        return real(self, *args)
    plain = _train(moe_config(expert, "none", **over))
    monkeypatch.setattr(CheckpointedForward, "_recompute_backward", counted)
    ckpt = _train(moe_config(expert, spec, **over))
    blocks = 3 if spec == "blocks" else 2
    assert len(recomputed) == 4 * STEPS * blocks * over.get("micro_batches", 1)  # every rank, block, micro
    for a, b in zip(plain, ckpt):
        for sa, sb in zip(a["steps"], b["steps"]):
            assert (sa["loss"], sa["norm"]) == (sb["loss"], sb["norm"])
            assert sa["grads"].keys() == sb["grads"].keys()
            for name, grad in sa["grads"].items():
                assert grad == sb["grads"][name], name  # bitwise
        assert a["loads"] == b["loads"]  # the routing figures of each forward, counted once


def test_the_recompute_issues_the_all_to_alls_again():
    """EP 2, every block recomputed: the dispatch and the combine run once more per block (forward without
    a tape, its recompute, backward's mirror: 3 where there were 2), their row counts twice (forward only);
    the other groups' traffic is unchanged."""
    plain = _train(moe_config(2, "none"))
    ckpt = _train(moe_config(2, "blocks"))
    for a, b in zip(plain, ckpt):
        moved = {key for key in a["bytes"] if key[1].startswith("ep-")}
        assert {key[1] for key in moved} >= {"ep-dispatch", "ep-combine", "ep-dispatch-counts"}
        for key in moved:  # each all-to-all's payload and the sizes sent ahead of it alike
            times = 2 if key[1].startswith("ep-dispatch-counts") else 3 / 2
            assert b["bytes"][key] == a["bytes"][key] * times > 0, key
        assert {k: v for k, v in a["bytes"].items() if k not in moved} == {
            k: v for k, v in b["bytes"].items() if k not in moved}


@pytest.mark.parametrize("beside", [dict(tensor=2), dict(pipeline=2), dict(context=2)],
                         ids=["tp2", "pp2", "cp2"])
def test_beside_tensor_pipeline_and_context_parallelism(beside):
    """EP 2 on 4 ranks beside TP 2, PP 2 (1F1B, two micro-batches; a stage carries its terms on its output)
    or CP 2: with every block recomputed, the gradients are those without checkpointing, bitwise."""
    runs = []
    for spec in ("none", "blocks"):
        cfg = moe_config(2, spec, micro_batches=2 if "pipeline" in beside else 1)
        cfg["parallel"].update(beside)
        runs.append(_train(cfg))
    for a, b in zip(*runs):
        for sa, sb in zip(a["steps"], b["steps"]):
            assert (sa["loss"], sa["norm"]) == (sb["loss"], sb["norm"])
            assert sa["grads"] == sb["grads"]  # bitwise, every parameter this rank holds
