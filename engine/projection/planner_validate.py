"""`plan --validate`: the planner held to runs on this machine. The preset is scaled down to what runs here
(as many ranks as this machine has cores, at most the ranks asked for and at least 2; a model small enough to
train in seconds: gpt-mini's when the preset's has more than SMALL_PARAMS parameters), the planner searches
its layouts on this machine's calibrated cluster (this-machine, calibrated just before, into a temporary
file: the user's calibration is left alone), and the layouts it ranks are run on the processes backend for a
few steps: its first choice, and the best it predicts for each other split of the ranks (data, tensor,
pipeline, context), up to `top` runs. The verdict: is its first choice the measured best, or within 10%
of it.

Each run is projection.validate's measure_case (the slowest rank's lower-quartile step over `steps` steps
after a warm-up); `repeats` rounds over the runs, forward then backward in turn (validate.round_order). The
runs are compared with the first choice round by round (paired_ratio: the median over rounds of a run's
step over the first choice's in the same round), so a drift in the machine's load between rounds cancels;
each run's median step is reported beside it. The load average before and after is part of the report:
this is a shared machine.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
from pathlib import Path

from engine.comm.cores import usable_cores
from engine.config import Config, from_dict, to_dict
from engine.config.build import count_params, param_shapes, vocab_size
from engine.config.presets import load_preset
from engine.memory.capacity import available_memory
from engine.projection.calibrate import calibrate
from engine.projection.clusters import load_cluster
from engine.projection.planner import plan
from engine.projection.planner_space import apply
from engine.projection.validate import measure_case, round_order

SMALL_PARAMS = 2_000_000
WITHIN = 0.10  # the first choice passes when it measures within this of the best


def scaled_down(cfg: Config) -> tuple[Config, str]:
    """cfg on the processes backend, with gpt-mini's model and data in place of one too big to run here."""
    vocab = vocab_size(cfg) if cfg.model.kind == "gpt" else 0
    if count_params(param_shapes(cfg, vocab)) > SMALL_PARAMS:
        small = load_preset("gpt-mini")[0]
        cfg = dataclasses.replace(cfg, model=small.model, data=small.data, train=small.train,
                                  precision=small.precision)
        model = "gpt-mini's (the preset's is too large to run here)"
    else:
        model = "the preset's"
    d = to_dict(cfg)
    d["parallel"].update(backend="processes", world_size=1, tensor=1, pipeline=1, context=1, expert=1)
    d["train"].update(micro_batches=1)
    d["memory"] = {"checkpointing": "none"}
    return from_dict(d, source="plan --validate"), model


def context_degrees(cfg: Config, ranks: int) -> list[int]:
    """The context-parallel degrees the planner may choose at `ranks` (both layouts' chunks whole), whose
    ring attention the calibration then times: the scaled-down base has none of its own."""
    if cfg.model.kind != "gpt":
        return []
    return [c for c in range(2, ranks + 1) if ranks % c == 0 and cfg.model.block_size % (2 * c) == 0]


def validate_plan(cfg: Config, ranks: int, top: int = 5, steps: int = 6, repeats: int = 2, warmup: int = 2,
                  on_progress=lambda text: None) -> dict:
    load_before = _load()
    base, model = scaled_down(cfg)
    n = max(2, min(ranks, len(usable_cores())))
    vocab = vocab_size(base) if base.model.kind == "gpt" else 0
    here = load_cluster("this-machine")
    with tempfile.TemporaryDirectory() as folder:
        on_progress(f"calibrating this machine for {base.name} ({base.precision.dtype}, 1 and 2 busy ranks)")
        calibration = calibrate(base, vocab, [base.precision.dtype], path=Path(folder) / "calibration.json",
                                measure_transport=True, context_degrees=context_degrees(base, n))
    available = available_memory()
    capacity = available / n if available else None
    on_progress(f"planning {n} ranks on this machine")
    report = plan(base, here, n, capacity, top=100, calibration=calibration)
    chosen: list = []
    seen: set = set()
    for cand in report["ranked"]:
        degrees = cand.layout.degrees
        if not chosen or degrees not in seen:
            chosen.append(cand)
            seen.add(degrees)
        if len(chosen) >= top:
            break
    configs = [(c, _runnable(apply(base, c.layout, n))) for c in chosen]
    measured: dict[int, list[float]] = {i: [] for i in range(len(configs))}
    for r in range(repeats):
        for i, (cand, run_cfg) in round_order(list(enumerate(configs)), r):
            on_progress(f"round {r + 1}/{repeats}: running {cand.layout.label()}")
            measured[i].append(measure_case(run_cfg, steps, warmup)["step_s"])
    times = [statistics.median(measured[i]) for i in range(len(configs))]
    ratios = [paired_ratio(measured[i], measured[0]) for i in range(len(configs))]
    order = sorted(range(len(ratios)), key=ratios.__getitem__)
    best = order[0]
    runs = [{"label": c.layout.label(), "layout": c.layout.as_dict(),
             "planned_rank": report["ranked"].index(c) + 1,
             "predicted_s": c.step.step_s if c.step else 0.0, "measured_s": times[i],
             "measured_rounds": measured[i], "over_first": ratios[i], "measured_rank": order.index(i) + 1}
            for i, (c, _) in enumerate(configs)]
    over = 1 / ratios[best] - 1
    return {"preset": cfg.name, "model": model, "ranks": n, "backend": "processes", "steps": steps,
            "repeats": repeats, "runs": runs, "first_label": runs[0]["label"],
            "best_label": runs[best]["label"],
            "first_is_best": best == 0, "first_over_best": over, "within_10pct": over <= WITHIN,
            "load_before": load_before, "load_after": _load()}


def paired_ratio(times: list[float], first: list[float]) -> float:
    """A run against the first choice measured in the same rounds: the median over rounds of their ratio.
    The load on a shared machine drifts over the minutes a round takes; two runs of one round meet nearly the
    same load, so their ratio cancels most of it where each run's own median does not."""
    return statistics.median(t / f for t, f in zip(times, first))


def _runnable(cfg: Config) -> Config:
    """A laid-out config as a run takes it (validated like a preset)."""
    return from_dict(to_dict(cfg), source="plan --validate")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"
