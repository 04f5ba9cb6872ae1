"""Tiny float64 GPT configs and rank functions for the tests that train through the Trainer with pipeline
parallelism (tests/parallel/test_pp_train*.py). JSON arguments and results, so the processes backend runs
them too.

Shapes: vocabulary 11, 4 heads of width 4, context 8, dropout on (each stage draws one device's masks),
biases on, tied embeddings (the first and last stage share wte); n_layer blocks, enough for every stage.
"""

from __future__ import annotations

import numpy as np

from engine.comm.objects import all_gather_json
from engine.config import from_dict, to_dict
from engine.trainer import Trainer


def pp_config(world: int = 1, pipeline: int = 1, m: int = 1, schedule: str = "1f1b", chunks: int = 1,
              tensor: int = 1, zero: int = 0, rows: int = 2, **over) -> dict:
    """A float64 GPT run whose global batch is `rows` rows per micro-batch per data-parallel rank."""
    dp = world // (pipeline * tensor)
    d = {
        "name": "pp-tiny", "seed": 3,
        "model": {"kind": "gpt", "n_layer": max(4, pipeline * chunks), "n_head": 4, "n_embd": 16,
                  "block_size": 8, "dropout": 0.1, "bias": True, "vocab_size": 11, "tie_weights": True},
        "data": {"kind": "synthetic-lm", "n_samples": 256},
        "train": {"steps": 3, "global_batch": rows * m * dp, "micro_batches": m, "eval_every": 0,
                  "eval_batches": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "grad_clip": 0.05},
        "parallel": {"world_size": world, "pipeline": pipeline, "tensor": tensor, "zero_stage": zero,
                     "schedule": schedule, "chunks": chunks, "bucket_cap_mb": 0.002},
        "precision": {"dtype": "fp64"},
    }
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return to_dict(from_dict(d))


def train_rank(comm, emit, cfg_dict: dict, steps: int) -> dict:
    """Rank function: `steps` training steps. Losses and gradient norms of every step, the first step's
    gradients of this rank's parameters after the data-parallel reduce (DDP: whole, averaged), the first
    validation loss, and the whole model's parameters after the steps (every rank's, joined by name)."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    grads: dict[str, list] = {}
    step = trainer.replica.step

    def capturing(lr, clip, at):
        if not grads and trainer.cfg.parallel.zero_stage == 0:
            grads.update({name: p.grad.tolist() for name, p in trainer.model.named_parameters()})
        return step(lr, clip, at)

    trainer.replica.step = capturing
    try:
        val = trainer.evaluate()
        out = [trainer.train_step() for _ in range(steps)]
        params = {name: p.data for name, p in trainer.model.named_parameters()}
        return {"losses": [s["loss"] for s in out], "norms": [s["grad_norm"] for s in out],
                "skipped": [s["skipped"] for s in out], "val": val, "grads": whole(trainer, grads),
                "per_layer": trainer.layer_collectives,
                "params": whole(trainer, params)}
    finally:
        trainer.replica.close()


def whole(trainer: Trainer, arrays: dict) -> dict[str, list]:
    """Every rank's `arrays` (by dense name) on every rank, tensor-parallel shards joined by their specs
    (collective)."""
    layout, comm = trainer.layout, trainer.comm
    mine = {"tp": layout.rank, "arrays": {k: np.asarray(v).tolist() for k, v in arrays.items()}}
    everyone = all_gather_json(comm, mine) if comm.world_size > 1 else [mine]
    by_name: dict[str, dict[int, np.ndarray]] = {}
    for rank in everyone:
        for name, value in rank["arrays"].items():
            by_name.setdefault(name, {})[rank["tp"]] = np.asarray(value)
    out = {}
    for name, shards in by_name.items():
        spec = layout.specs.get(name)
        parts = [shards[t] for t in sorted(shards)]
        out[name] = (spec.unshard(parts) if spec is not None else parts[0]).tolist()
    return out


def assert_trains_like(ranks: list[dict], one: dict, rtol: float = 1e-12, param_rtol: float = 1e-10,
                       grads: bool = True) -> None:
    """Every rank: the losses, norms and first validation loss of one device; every gradient a rank holds
    equal to one device's of that parameter (`grads`: every parameter's held by some rank — DDP; ZeRO-1
    holds only its reduced part); every parameter after the steps equal to one device's."""
    for r in ranks:
        np.testing.assert_allclose(r["losses"], one["losses"], rtol=rtol)
        np.testing.assert_allclose(r["norms"], one["norms"], rtol=rtol)
        np.testing.assert_allclose(r["val"], one["val"], rtol=rtol)
        for name, grad in r["grads"].items():
            want = np.asarray(one["grads"][name])
            np.testing.assert_allclose(grad, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=name)
        assert r["params"].keys() == one["params"].keys()
        for name, value in one["params"].items():
            value = np.asarray(value)
            np.testing.assert_allclose(r["params"][name], value, rtol=param_rtol,
                                       atol=param_rtol * np.abs(value).max(), err_msg=name)
    held = {name for r in ranks for name in r["grads"]}
    assert held == (set(one["grads"]) if grads else set())  # every parameter's gradient compared somewhere
    assert one["norms"][0] > 0.05  # clipping acts (grad_clip 0.05): the norm's agreement matters


def overflow_rank(comm, emit, cfg_dict: dict, steps: int, poisoned_rank: int) -> dict:
    """Rank function: train with an inf put into one rank's gradient (its stage's first parameter) after the
    first step's reduce; which steps each rank skipped, and its loss scale after them."""
    from engine.parallel.data import make_replica

    def poisoning(cfg, model, dp_comm):
        replica = make_replica(cfg, model, dp_comm)
        finish = replica.finish_backward

        def finish_and_poison():
            finish()
            if comm.rank == poisoned_rank and not getattr(replica, "poisoned", False):
                replica.poisoned = True
                replica.optimizer.pieces[0].grad[0] = np.inf
        replica.finish_backward = finish_and_poison
        return replica
    trainer = Trainer(from_dict(cfg_dict), comm, replica_factory=poisoning)
    try:
        out, named = [], []
        for _ in range(steps):
            out.append(trainer.train_step())
            named += [e.first_param for e in trainer.replica.drain_events() if e.first_param]
        return {"skipped": [s["skipped"] for s in out], "scale": trainer.replica.loss_scale,
                "finite": bool(all(np.isfinite(s["loss"]) for s in out)), "named": named,
                "held": [n for n, _ in trainer.model.named_parameters()]}
    finally:
        trainer.replica.close()
