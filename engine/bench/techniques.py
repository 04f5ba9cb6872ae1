"""`bench techniques`: the step-time cost of each memory technique (and of dropout, whose masks are drawn
row by row, engine.dropout_rng), in one run.

Every variant is the same preset with one setting changed, timed back to back on the same machine,
so the ratios to the baseline (the preset as written, typically fp32 DDP) are comparable.
"""

from __future__ import annotations

from typing import Any

from engine.bench.step import time_ours
from engine.config import Config, replace

# label -> overrides applied on top of the preset
TECHNIQUES: dict[str, dict[str, Any]] = {
    "baseline (fp32, DDP)": {},
    "no overlap": {"parallel.overlap": False},
    "fp16 + dynamic scaling": {"precision.dtype": "fp16"},
    "bf16": {"precision.dtype": "bf16"},
    "ZeRO-1": {"parallel.zero_stage": 1},
    "ZeRO-2": {"parallel.zero_stage": 2},
    "ZeRO-3": {"parallel.zero_stage": 3},
    "checkpointing (blocks)": {"memory.checkpointing": "blocks"},
    "fp16 + ZeRO-2 + checkpointing": {"precision.dtype": "fp16", "parallel.zero_stage": 2,
                                      "memory.checkpointing": "blocks"},
    "dropout 0.1": {"model.dropout": 0.1},
}


def variants(base: Config) -> dict[str, Config]:
    """Every technique's config (ConfigError when the preset cannot take one, e.g. checkpointing an MLP)."""
    out = {}
    for label, overrides in TECHNIQUES.items():
        cfg = base
        for key, value in overrides.items():
            cfg = replace(cfg, key, value)
        out[label] = cfg
    return out


def time_techniques(configs: dict[str, Config], warmup: int, steps: int) -> list[dict]:
    """Rows {technique, step_s, comm_share, vs_baseline}; the first config is the baseline."""
    rows = []
    for label, cfg in configs.items():
        t = time_ours(cfg, warmup, steps)
        rows.append({"technique": label, "step_s": t["step_s"], "comm_share": t["comm_share"]})
    for row in rows:
        row["vs_baseline"] = row["step_s"] / rows[0]["step_s"]
    return rows
