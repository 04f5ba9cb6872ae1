"""The rules of mixture of experts and expert parallelism (model.n_experts ... and parallel.expert), kept
out of engine.config.rules, which registers them: MOE_RULES (one setting each) join its RULES, and
moe_problem (across settings) runs in its combination_problem.

Pure, like rules.py: a rule returns None or (problem, fix); moe_problem returns (key, problem, fix).
What this release builds: MoE blocks in a GPT on every layout of the mesh (data, tensor with or without
sequence parallelism, pipeline, context), experts split over parallel.expert ranks under ZeRO stages 0-2 in
any precision. Each refusal below names what is missing.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config.schema import Config

# the [model] keys that shape the experts; set without n_experts they would be ignored
MOE_KEYS = ("top_k", "moe_every", "capacity_factor", "aux_loss_coef")


def _whole_at_least(n: int):
    def check(v):
        return None if v >= n else (f"{v!r} is out of range", f"use a whole number >= {n}")
    return check


def _non_negative(v):
    return None if math.isfinite(v) and v >= 0 else (f"{v!r} is out of range", "use a number >= 0")


MOE_RULES: dict[str, Any] = {
    "model.n_experts": _whole_at_least(0), "model.top_k": _whole_at_least(1),
    "model.moe_every": _whole_at_least(1), "model.capacity_factor": _non_negative,
    "model.aux_loss_coef": _non_negative,
}


def moe_problem(cfg: Config, describing: bool = False) -> tuple[str, str, str] | None:
    """The first rule across settings that the experts break, as (key, problem, fix), or None.
    `describing`: the layout is only described (engine.config.rules_layout.describing_layout), so the mesh's
    degrees are not checked against the model."""
    m, p = cfg.model, cfg.parallel
    e = m.n_experts
    if e == 0:
        if p.expert > 1 and not describing:
            return ("parallel.expert", f"{p.expert} splits the experts, and model.n_experts = 0 (dense)",
                    "set model.n_experts to a multiple of parallel.expert, or parallel.expert = 1")
        defaults = type(m)()
        for key in MOE_KEYS:
            if getattr(m, key) != getattr(defaults, key):
                return (f"model.{key}", "shapes the experts, and model.n_experts = 0 (dense)",
                        f"remove model.{key}, or set model.n_experts >= 1")
        return None
    if m.top_k > e:
        return ("model.top_k", f"{m.top_k} experts per token, of model.n_experts {e}", f"use at most {e}")
    if describing:
        return None
    return expert_parallel_problem(cfg) if p.expert > 1 else None


def expert_parallel_problem(cfg: Config) -> tuple[str, str, str] | None:
    """What expert parallelism (parallel.expert > 1) cannot fold or run beside."""
    m, p = cfg.model, cfg.parallel
    if m.n_experts % p.expert:
        return ("parallel.expert", f"{p.expert} ranks cannot share model.n_experts {m.n_experts} evenly",
                f"use a divisor of {m.n_experts}, or a multiple of {p.expert} experts")
    if p.zero_stage == 3:
        return ("parallel.zero_stage", "ZeRO-3 gathers a block's parameters over the data-parallel group, "
                "and its split experts live on the expert-data-parallel one: gathering them there is not "
                "built yet",
                "use parallel.zero_stage 0, 1 or 2 with parallel.expert > 1")
    return None
