"""Tiny float64 configs and rank functions shared by the tests that train a tensor-parallel model through
the Trainer (tests/parallel/test_tp_train*.py, checkpoints, memory). Rank functions take only JSON
arguments, so the processes backend runs them too.

Shapes: vocabulary 11 (a prime: every t > 1 pads it), 4 heads of width 16 (t in {2, 4} splits them),
context 8 (sequence parallelism splits it 2 or 4 ways), dropout on (each rank draws its part of one
device's masks), biases on (the row-parallel bias added once, after the reduce).
"""

from __future__ import annotations

import numpy as np

from engine.config import from_dict, to_dict
from engine.trainer import Trainer


def tp_config(world: int = 1, tensor: int = 1, sp: bool = False, zero: int = 0, **over) -> dict:
    """A float64 GPT run of 3 steps, clipped in every step (grad_clip below the tiny model's norm)."""
    d = {
        "name": "tp-tiny", "seed": 5,
        "model": {"kind": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 16, "block_size": 8, "dropout": 0.1,
                  "bias": True, "vocab_size": 11},
        "data": {"kind": "synthetic-lm", "n_samples": 256},
        "train": {"steps": 3, "global_batch": 4, "micro_batches": 1, "eval_every": 0, "eval_batches": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "grad_clip": 0.05},
        "parallel": {"world_size": world, "tensor": tensor, "sequence_parallel": sp, "zero_stage": zero,
                     "bucket_cap_mb": 0.002},
        "precision": {"dtype": "fp64"},
    }
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return to_dict(from_dict(d))


def dense_params(trainer: Trainer) -> dict[str, np.ndarray]:
    """Every parameter of the whole model, from the replica's state (ZeRO-3 holds no parameters between
    steps): each rank's owned range of the flat state gathered over the world, the tensor-parallel shards
    joined by their ShardSpecs. Collective (every rank calls it); the same dict on every rank."""
    from engine.comm.objects import all_gather_json
    rep, layout = trainer.replica, trainer.layout
    lo, hi = rep.owned_range()
    master = rep.optimizer_state()["master"]
    mine = {"tp": layout.rank, "range": [lo, hi], "master": master.tolist()}
    everyone = all_gather_json(trainer.comm, mine) if trainer.world > 1 else [mine]
    local: dict[int, np.ndarray] = {}
    for r in everyone:
        flat = local.setdefault(r["tp"], np.zeros(max(e["range"][1] for e in everyone)))
        flat[r["range"][0]:r["range"][1]] = r["master"]
    out = {}
    for slot in rep.flat.slots:
        shards = [local[c][slot.start:slot.end].reshape(slot.shape) for c in sorted(local)]
        spec = layout.specs.get(slot.name)
        out[slot.name] = shards[0] if spec is None else spec.unshard(shards)
    return out


def train_rank(comm, emit, cfg_dict: dict, steps: int) -> dict:
    """Rank function: `steps` training steps; the losses, gradient norms and whether each step was skipped,
    the whole model's parameters after them (JSON lists), and this rank's replicated parameters."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        out = [trainer.train_step() for _ in range(steps)]
        params = dense_params(trainer)
        return {"losses": [s["loss"] for s in out], "norms": [s["grad_norm"] for s in out],
                "skipped": [s["skipped"] for s in out], "scale": trainer.replica.loss_scale,
                "params": {k: v.tolist() for k, v in params.items()}}
    finally:
        trainer.replica.close()


def replicated_digest(trainer: Trainer) -> str:
    """sha256 of this rank's replicated parameters (DDP: the whole flat state is the rank's): equal on
    every rank of a tensor-parallel group when their LayerNorms stayed in step."""
    import hashlib
    rep, layout = trainer.replica, trainer.layout
    master = rep.optimizer_state()["master"]
    parts = [master[s.start:s.end] for s in rep.flat.slots if not layout.is_sharded(s.name)]
    return hashlib.sha256(np.concatenate(parts).tobytes()).hexdigest()


def digest_rank(comm, emit, cfg_dict: dict, steps: int) -> dict:
    """Rank function: this rank's tensor-parallel coordinate and replicated parameters' digest after steps."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        for _ in range(steps):
            trainer.train_step()
        return {"tp": trainer.layout.rank, "digest": replicated_digest(trainer)}
    finally:
        trainer.replica.close()


def overflow_rank(comm, emit, cfg_dict: dict, steps: int, poisoned_rank: int) -> dict:
    """Rank function: train with one rank's gradient shard poisoned (an inf in its first sharded parameter)
    in the first step only; which steps each rank skipped, and its loss scale after them."""
    from engine.parallel.data import make_replica

    def poisoning(cfg, model, dp_comm):
        replica = make_replica(cfg, model, dp_comm)
        finish = replica.finish_backward

        def finish_and_poison():
            finish()
            if comm.rank == poisoned_rank and not getattr(replica, "poisoned", False):
                replica.poisoned = True
                replica.optimizer.pieces[0].grad[replica.optimizer.split.sharded[0][0][0]] = np.inf
        replica.finish_backward = finish_and_poison
        return replica
    trainer = Trainer(from_dict(cfg_dict), comm, replica_factory=poisoning)
    try:
        out = [trainer.train_step() for _ in range(steps)]
        return {"skipped": [s["skipped"] for s in out], "scale": trainer.replica.loss_scale,
                "finite": bool(all(np.isfinite(s["loss"]) for s in out))}
    finally:
        trainer.replica.close()


def assert_trains_like(ranks: list[dict], one: dict, rtol: float = 1e-10) -> None:
    """Every rank's losses, norms and parameters (float64) equal one device's within `rtol`, clipping having
    acted (grad_clip 0.05: the norm's combination matters)."""
    for r in ranks:
        np.testing.assert_allclose(r["losses"], one["losses"], rtol=rtol)
        np.testing.assert_allclose(r["norms"], one["norms"], rtol=rtol)
        assert r["params"].keys() == one["params"].keys()
        for name, value in one["params"].items():
            value = np.asarray(value)
            np.testing.assert_allclose(r["params"][name], value, rtol=rtol, atol=rtol * np.abs(value).max())
    assert one["norms"][0] > 0.05  # clipping acts (grad_clip 0.05): the norm's combination matters
