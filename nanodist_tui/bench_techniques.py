"""`nanodist-tui bench techniques`: the step-time cost of each memory technique, in one run.

Every variant is the same preset with one setting changed, timed back to back on the same machine,
so the ratios to the baseline (the preset as written, typically fp32 DDP) are comparable.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from nanodist_tui.common import BackendOpt, PresetOpt, SetOpt, WorldOpt, load_config, user_errors

# label -> overrides applied on top of the preset
TECHNIQUES = {
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
}


def register(app: typer.Typer) -> None:
    @app.command("techniques")
    def techniques(preset: PresetOpt = "gpt-mini", sets: SetOpt = None, world_size: WorldOpt = 4,
                   backend: BackendOpt = None,
                   steps: Annotated[int, typer.Option(help="timed steps per variant (median)", min=1)] = 10,
                   warmup: Annotated[int, typer.Option(help="untimed warm-up steps", min=0)] = 3,
                   as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
        """Median step time of the preset with each technique switched on, and its cost vs the baseline."""
        from engine.bench.step import time_ours
        from engine.config import replace
        with user_errors():
            base, _, _ = load_config(preset, sets, world_size, backend)
            variants = {}
            for label, overrides in TECHNIQUES.items():
                cfg = base
                for key, value in overrides.items():
                    cfg = replace(cfg, key, value)
                variants[label] = cfg
        rows = []
        for label, cfg in variants.items():
            t = time_ours(cfg, warmup, steps)
            rows.append({"technique": label, "step_s": t["step_s"], "comm_share": t["comm_share"]})
        baseline = rows[0]["step_s"]
        for row in rows:
            row["vs_baseline"] = row["step_s"] / baseline
        if as_json:
            print(json.dumps({"preset": base.name, "world_size": base.parallel.world_size, "rows": rows},
                             indent=2))
            return
        print(f"preset {base.name}, {base.parallel.world_size} rank(s) on {base.parallel.backend}, "
              f"median of {steps} steps after {warmup} warm-up")
        print(f"{'technique':32} {'ms/step':>8} {'vs baseline':>12} {'comm wait':>10}")
        for row in rows:
            print(f"{row['technique']:32} {row['step_s'] * 1e3:8.1f} {row['vs_baseline']:11.2f}x "
                  f"{row['comm_share']:10.0%}")
