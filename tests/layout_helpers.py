"""Layouts of the five parallelism axes and ZeRO, as the layout-invariance and cross-layout checkpoint tests
name them (tests/parallel/test_layout_invariance.py, tests/checkpoint/test_cross_layout.py), a float64 GPT
that every one of them can split, and a rank function that trains it and reads the whole model back.

Shapes: 4 blocks (2 pipeline stages of 2, or 4 of 1), 4 heads of width 8 (tensor 2 or 4 splits them),
context 16 (zigzag over 2 context ranks cuts 4 chunks of 4 tokens; sequence parallelism splits each 2 ways),
vocabulary 11 (a prime: every tensor degree pads it), tied embeddings (the first and last stage share wte),
biases on, dropout on (every layout draws its part of one device's masks: keyed by the step and position).
The MoE variant puts 8 top-2 experts in every other block, dropless and without the load-balancing loss:
that loss is a product of the batch's means, so a rank's share of the batch has its own, and only without
it does a data-parallel MoE run train what one device trains.

A global batch of 16 rows in 2 micro-batches: 1 row per micro-batch on each rank of DP 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.config import from_dict, to_dict
from engine.config.wording import toml_repr
from engine.parallel.mesh import DEFAULT_ORDER
from engine.trainer import Trainer
from tests.pp_train_helpers import whole
from tests.tp_train_helpers import dense_params

STEPS = 5


@dataclass(frozen=True)
class Layout:
    """One layout of `world` ranks: the degrees of the axes (dp is what remains), the ZeRO stage, and
    whether the model is a mixture of experts."""
    world: int = 1
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    expert: int = 1
    zero: int = 0
    moe: bool = False
    sp: bool = False  # sequence parallelism inside the tensor group
    chunks: int = 1  # > 1: the interleaved schedule, this many chunks per pipeline rank (else 1F1B)
    order: str = DEFAULT_ORDER  # the mesh's axes, innermost first

    @property
    def data(self) -> int:
        return self.world // (self.tensor * self.pipeline * self.context)

    @property
    def name(self) -> str:
        """"dp2-pp2-tp2", "dp8-zero3", "moe-dp8-ep4": the degrees above 1, outermost axis first."""
        parts = [f"{axis}{d}" for axis, d in (("dp", self.data), ("pp", self.pipeline), ("cp", self.context),
                                              ("tp", self.tensor), ("ep", self.expert)) if d > 1]
        parts += [f"zero{self.zero}"] if self.zero else []
        parts += ["sp"] if self.sp else []
        parts += [f"interleaved{self.chunks}"] if self.chunks > 1 else []
        parts += [self.order] if self.order != DEFAULT_ORDER else []
        return "-".join((["moe"] if self.moe else []) + (parts or ["one"]))

    def sets(self) -> list[str]:
        """The overrides (`--set KEY=VALUE`) of this layout's [parallel] section, and of the experts'
        [model] settings for an MoE."""
        experts = [f"model.{key}={toml_repr(value)}" for key, value in MOE.items()] if self.moe else []
        return [f"parallel.{key}={toml_repr(value)}" for key, value in self.parallel().items()] + experts

    def parallel(self) -> dict:
        """This layout's [parallel] settings."""
        return {"world_size": self.world, "tensor": self.tensor, "pipeline": self.pipeline,
                "context": self.context, "expert": self.expert, "zero_stage": self.zero,
                "sequence_parallel": self.sp, "chunks": self.chunks,
                "schedule": "interleaved" if self.chunks > 1 else "1f1b", "order": self.order}

    def one_device(self) -> Layout:
        """The same model on one device."""
        return Layout(moe=self.moe)


MOE = {"n_experts": 8, "top_k": 2, "moe_every": 2, "capacity_factor": 0.0, "aux_loss_coef": 0.0}


def layout_config(layout: Layout, steps: int = STEPS, **over) -> dict:
    """A float64 GPT run of `steps` AdamW steps, clipped in every one (grad_clip below the model's norm)."""
    d = {
        "name": "layout-tiny", "seed": 7,
        "model": {"kind": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 32, "block_size": 16, "dropout": 0.1,
                  "bias": True, "vocab_size": 11, "tie_weights": True, **(MOE if layout.moe else {})},
        "data": {"kind": "synthetic-lm", "n_samples": 512},
        "train": {"steps": steps, "global_batch": 16, "micro_batches": 2, "eval_every": 0, "eval_batches": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "grad_clip": 0.05},
        "parallel": {**layout.parallel(), "bucket_cap_mb": 0.002},
        "precision": {"dtype": "fp64"},
    }
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return to_dict(from_dict(d))


def model_params(trainer: Trainer) -> dict[str, list]:
    """Every parameter of the whole model on every rank (collective), by its one-device name: pipeline
    stages' parameters joined by name, tensor-parallel shards by their specs, each expert from a rank that
    holds it. ZeRO-3 holds no parameters between steps: its ranks' master shards are gathered instead."""
    if trainer.cfg.parallel.zero_stage == 3:
        return {name: value.tolist() for name, value in dense_params(trainer).items()}
    return whole(trainer, {name: p.data for name, p in trainer.model.named_parameters()})


def train_rank(comm, emit, cfg_dict: dict) -> dict:
    """Rank function: the run's steps; every step's loss, gradient norm and whether it was skipped, and the
    whole model's parameters after them."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    try:
        out = [trainer.train_step() for _ in range(trainer.cfg.train.steps)]
        return {"losses": [s["loss"] for s in out], "norms": [s["grad_norm"] for s in out],
                "skipped": [s["skipped"] for s in out], "params": model_params(trainer)}
    finally:
        trainer.replica.close()


def assert_same_training(ranks: list[dict], one: dict, rtol: float = 1e-10) -> None:
    """Every rank's losses, gradient norms and whole-model parameters equal one device's within `rtol`
    (float64); no step skipped, and clipping acted in every step (the norm's combination matters)."""
    for r in ranks:
        assert not any(r["skipped"])
        np.testing.assert_allclose(r["losses"], one["losses"], rtol=rtol)
        np.testing.assert_allclose(r["norms"], one["norms"], rtol=rtol)
        assert r["params"].keys() == one["params"].keys()
        for name, value in one["params"].items():
            value = np.asarray(value)
            np.testing.assert_allclose(r["params"][name], value, rtol=rtol, atol=rtol * np.abs(value).max(),
                                       err_msg=name)
    assert min(one["norms"]) > 0.05  # grad_clip 0.05: every step clipped
