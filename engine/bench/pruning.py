"""What pruning saves: the same sweep (same space, sampler and seed) run twice, without a pruner and with
one, counting the optimizer steps every trial trained and comparing the best values found.

Steps, not seconds: the count does not depend on how loaded the machine is (a pruned trial stops one step
after the evaluation that condemned it, see engine.sweep.objective), so one run of each sweep is the
figure; the timings are reported beside it for information only.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from engine.config import presets
from engine.sweep.results import best_trials
from engine.sweep.runner import run_sweep
from engine.sweep.study import load_study, prepare_sweep


def run_variant(preset: str, overrides: list[str], pruner: str, out_dir: Path) -> dict:
    """One sweep of the preset with `pruner`, in its own study under out_dir: steps trained and the best."""
    sets = [*overrides, f'sweep.pruner="{pruner}"', f'sweep.study="pruning-{pruner}"',
            f"run.out_dir={out_dir}"]
    cfg, doc, _ = presets.load_preset(preset, sets)
    sweep = prepare_sweep(cfg, doc)
    t0 = time.perf_counter()
    result = run_sweep(sweep, lambda event: None)
    wall = time.perf_counter() - t0
    trials = load_study(sweep).get_trials(deepcopy=False)
    best = best_trials(load_study(sweep))
    return {"pruner": pruner, "trials": len(trials), "counts": result["counts"],
            "steps": sum(t.user_attrs.get("steps", 0) for t in trials),
            "full_steps": cfg.train.steps * len(trials), "best_value": best[0].values[0] if best else None,
            "best_trial": best[0].number if best else None, "wall_s": wall, "metric": sweep.metrics[0],
            "direction": sweep.directions[0]}


def bench_pruning(preset: str, overrides: list[str], pruner: str = "median",
                  out_dir: Path | None = None) -> dict:
    """Both sweeps and the two figures: the share of training steps the pruner saved, and how far its
    best value is from the unpruned sweep's (relative; positive = worse)."""
    with tempfile.TemporaryDirectory(prefix="nanodist-pruning-") as tmp:
        folder = Path(out_dir) if out_dir is not None else Path(tmp)
        full = run_variant(preset, overrides, "none", folder)
        pruned = run_variant(preset, overrides, pruner, folder)
    report = {"preset": preset, "full": full, "pruned": pruned, "saved": 1 - pruned["steps"] / full["steps"]}
    if full["best_value"] is not None and pruned["best_value"] is not None:
        sign = 1 if full["direction"] == "minimize" else -1
        report["best_gap"] = sign * (pruned["best_value"] - full["best_value"]) / abs(full["best_value"])
    return report
