"""The rules of context parallelism (parallel.context, parallel.context_layout), kept out of
engine.config.rules, which registers them: CONTEXT_RULES (one setting each) join its RULES, and
context_problem (across settings) runs in its combination_problem.

Pure, like rules.py: a rule returns None or (problem, fix); context_problem returns (key, problem, fix).
What this release builds: a GPT's sequences split over parallel.context ranks (ring attention), beside
data parallelism and ZeRO, tensor (and sequence) parallelism, pipeline parallelism (each stage's blocks run
the ring over their CP group), dropout (each rank draws its positions' part of the one-device masks),
activation checkpointing and 16-bit precision. Each refusal below names what is missing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.config.vocabulary import CONTEXT_LAYOUTS

if TYPE_CHECKING:
    from engine.config.schema import Config


def _layout(v) -> tuple[str, str] | None:
    if v in CONTEXT_LAYOUTS:
        return None
    return f"{v!r} is not a context layout", "use one of " + " or ".join(f'"{k}"' for k in CONTEXT_LAYOUTS)


CONTEXT_RULES: dict[str, Any] = {"parallel.context_layout": _layout}


def context_problem(cfg: Config) -> tuple[str, str, str] | None:
    """What context parallelism (parallel.context > 1) cannot split, or cannot run beside."""
    m, p = cfg.model, cfg.parallel
    c = p.context
    if c == 1:
        return None
    if m.kind != "gpt":
        return ("parallel.context", f"{c} splits a GPT's sequences, and the {m.kind} model has none",
                'set parallel.context = 1, or model.kind = "gpt"')
    chunks = 2 * c if p.context_layout == "zigzag" else c
    if m.block_size % chunks:
        return ("model.block_size", f"{m.block_size} tokens do not cut into the {chunks} equal chunks the "
                f'"{p.context_layout}" layout over {c} ranks needs',
                f"use a multiple of {chunks}, e.g. {max(chunks, m.block_size // chunks * chunks)}")
    if p.sequence_parallel and (m.block_size // c) % p.tensor:
        return ("parallel.sequence_parallel", f"splits each rank's {m.block_size // c} tokens (block_size "
                f"{m.block_size} / context {c}) {p.tensor} ways, and {p.tensor} does not divide them",
                f"use a block_size that is a multiple of {c * p.tensor}, or sequence_parallel = false")
    return None
