"""`nanodist-tui plan`: which layout of N ranks trains a preset fastest on a cluster
(engine.projection.planner), the best ones with their step split and memory, and one reason each why the
rest lose; `--validate` runs the planner's choices here, scaled down, and says whether its first choice is
the measured best (engine.projection.planner_validate). The work is the engine's; this module parses and
prints."""

from __future__ import annotations

import json
import re
import sys
from typing import Annotated

import typer

from nanodist_tui.cli.errors import fail, user_errors
from nanodist_tui.cli.options import JsonOpt, PresetOpt, SetOpt
from nanodist_tui.cli.running import load_config

GB = 1e9
REASONS_SHOWN = 20  # the rest's reasons printed (the JSON holds every one)
UNITS = {"": 1e9, "gb": 1e9, "mb": 1e6, "tb": 1e12, "gib": 2**30, "mib": 2**20}
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c",
                                         help="cluster name (presets/clusters/) or a .toml path")]


def memory_bytes(text: str | None) -> float | None:
    """--memory-per-rank: a number of GB, or with a unit (80GB, 512MB, 40GiB); None when not given."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS or float(match.group(1)) <= 0:
        fail(f'--memory-per-rank: "{text}" is not a size; write e.g. 80 (GB), 80GB, 512MB or 40GiB')
    assert match is not None
    return float(match.group(1)) * UNITS[match.group(2).lower()]


def plan(preset: PresetOpt = "gpt-mini", cluster: ClusterOpt = "h100-ndr", sets: SetOpt = None,
         ranks: Annotated[int, typer.Option("--ranks", "-n", min=1, help="ranks to lay the model on")] = 8,
         memory_per_rank: Annotated[str | None, typer.Option(
             "--memory-per-rank", help="memory a rank has (80 = 80 GB; 512MB, 40GiB); default: the "
             "cluster's")] = None,
         top: Annotated[int, typer.Option("--top", "-k", min=1, max=100, help="layouts ranked")] = 5,
         budget: Annotated[float, typer.Option("--budget", min=0.1,
                                               help="seconds the search may take")] = 30.0,
         validate: Annotated[bool, typer.Option(
             "--validate", help="run the planner's choices here, scaled down, and check its first choice "
             "against the measured best")] = False,
         steps: Annotated[int, typer.Option(min=2, help="--validate: timed steps per run")] = 6,
         repeats: Annotated[int, typer.Option(min=1, help="--validate: rounds over the runs (each compared "
                                              "with the first choice round by round)")] = 2,
         as_json: JsonOpt = False) -> None:
    """Search the layouts of N ranks (degrees, axis order, ZeRO, micro-batches, schedule, checkpointing,
    buckets): the best ones predicted, and why the rest lose."""
    from engine.projection.calibrate import CalibrationError
    capacity = memory_bytes(memory_per_rank)
    with user_errors():
        cfg = load_config(preset, sets)[0]
        if validate:
            return _validate(cfg, ranks, top, steps, repeats, as_json)
        from engine.projection.clusters import load_cluster
        target = load_cluster(cluster)
        target.require_peak(cfg.precision.dtype)
    if ranks > target.max_ranks:
        fail(f"--ranks {ranks}: the cluster {target.name} has {target.max_ranks} ranks; use at most that, "
             "or another --cluster")
    try:
        report = _plan(cfg, target, ranks, capacity, top, budget, as_json)
    except CalibrationError as e:
        fail(str(e))
    data = report_json(report)
    if as_json:
        print(json.dumps(data, indent=1))
        return
    print("\n".join(plan_lines(data)))


def _plan(cfg, target, ranks: int, capacity: float | None, top: int, budget: float, quiet: bool) -> dict:
    from engine.projection.planner import plan as search
    calibration = None
    if target.calibrated:
        from pathlib import Path

        from engine.projection.calibrate import default_path
        from nanodist_tui.cli.project import _calibration_for
        calibration = _calibration_for(cfg, target, Path(default_path()), quiet)
    return search(cfg, target, ranks, capacity, top, calibration, budget)


def report_json(report: dict) -> dict:
    return {**report, "ranked": [c.as_dict() for c in report["ranked"]],
            "rest": [c.as_dict() for c in report["rest"]]}


def plan_lines(data: dict, reasons: int = REASONS_SHOWN) -> list[str]:
    """The report as text: the search, the ranking with the step's split, memory per rank, the reasons."""
    from engine.memory.ledger import CATEGORIES
    counts = data["counts"]
    capacity = f"{data['capacity_bytes'] / GB:.1f} GB a rank" if data["capacity_bytes"] else \
        "memory not judged"
    others = ", ".join(f"{n} {verdict}" for verdict, n in counts.items()
                       if verdict not in ("layouts", "ranked"))
    lines = [f"{data['preset']} on {data['cluster']}: {data['ranks']} ranks, global batch "
             f"{data['global_batch']}, {capacity}; {counts['layouts']} layouts: {counts['ranked']} ranked, "
             f"{others} "
             f"({data['projected']} projected, {data['search_s']:.1f} s)"]
    if not data["ranked"]:
        lines.append("no layout fits: see the reasons below")
    else:
        lines.append(f"{'#':>2} {'layout':34} {'step ms':>9} {'tokens/s':>9} {'MFU':>6} {'compute':>8} "
                     f"{'bubble':>7} {'dp':>7} {'tp':>7} {'pp':>7} {'cp':>7} {'ep':>7} {'GB/rank':>7}")
        for n, c in enumerate(data["ranked"], 1):
            s = c["split"]
            parts = " ".join(f"{s[k] * 1e3:{w}.4g}" for k, w in (("compute", 8), ("bubble", 7), ("dp", 7),
                                                                 ("tp", 7), ("pp", 7), ("cp", 7), ("ep", 7)))
            lines.append(f"{n:>2} {c['label'][:34]:34} {c['step_s'] * 1e3:9.4g} {c['tokens_per_s']:9.3g} "
                         f"{c['mfu']:6.1%} {parts} {c['peak_bytes'] / GB:7.2f}")
        lines.append("the step's split, ms: compute; the bubble; each group's exposed communication (dp: the "
                     "gradient reduce and ZeRO's gathers, pp: the stage-to-stage messages)")
        lines.append("memory per rank, GB (each category at its own peak; peak: the highest simultaneous "
                     "total)")
        lines.append(f"{'#':>2} " + " ".join(f"{c[:11]:>11}" for c in CATEGORIES) + f" {'peak':>7}")
        for n, c in enumerate(data["ranked"], 1):
            lines.append(f"{n:>2} " + " ".join(f"{c['memory'][k] / GB:11.3g}" for k in CATEGORIES)
                         + f" {c['peak_bytes'] / GB:7.3g}")
        first = data["ranked"][0]["layout"]
        lines.append("the first choice as overrides: " + " ".join(
            f"--set {o}" for o in _overrides(first)) + f" -n {data['ranks']}")
    rest = data["rest"]
    if rest:
        shown = _sample(rest, reasons)
        lines.append(f"why the rest lose ({len(shown)} of {len(rest)}, some of each kind; --json lists every "
                     "one):")
        lines += [f"  {c['verdict']:13} {c['label']}: {c['why']}" for c in shown]
    return lines


def _sample(rest: list[dict], n: int) -> list[dict]:
    """Up to n of the rest, in their order: half to the projected losers, the others shared by verdict."""
    projected = [c for c in rest if "step_s" in c and c["verdict"] == "slower"][:max(1, n // 2)]
    others = [c for c in rest if c not in projected]
    kinds = list(dict.fromkeys(c["verdict"] for c in others))
    each = max(1, (n - len(projected)) // max(1, len(kinds)))
    picked = [c for kind in kinds for c in [o for o in others if o["verdict"] == kind][:each]]
    return projected + picked


def _overrides(layout: dict) -> list[str]:
    from engine.projection.planner_space import Layout
    return Layout(**layout).overrides()


# ---------------------------------------------------------------------- --validate

def _validate(cfg, ranks: int, top: int, steps: int, repeats: int, as_json: bool) -> None:
    from engine.comm.base import RankFailure
    from engine.projection.planner_validate import validate_plan
    progress = (lambda text: None) if as_json else (lambda text: print(f"  {text}", file=sys.stderr))
    try:
        report = validate_plan(cfg, ranks, top, steps, repeats, on_progress=progress)
    except RankFailure as e:
        fail(f"a validation run failed: {e}", code=1)
    if as_json:
        print(json.dumps(report, indent=1))
        return
    print("\n".join(validation_lines(report)))


def validation_lines(r: dict) -> list[str]:
    lines = [f"{r['preset']} scaled down to {r['ranks']} ranks here ({r['backend']}, model {r['model']}), "
             f"{r['steps']} steps x {r['repeats']} round(s); load average {r['load_before']} before, "
             f"{r['load_after']} after",
             f"{'#':>2} {'layout':34} {'predicted':>10} {'measured':>10} {'/ first':>8} "
             f"{'measured rank':>13}"]
    for c in r["runs"]:
        lines.append(f"{c['planned_rank']:>2} {c['label'][:34]:34} {c['predicted_s'] * 1e3:8.1f}ms "
                     f"{c['measured_s'] * 1e3:8.1f}ms {c['over_first']:8.2f} {c['measured_rank']:>13}")
    lines.append("measured: the median step over rounds; / first: the median over rounds of its step over "
                 "the first choice's in the same round (ranks by it)")
    verdict = "the measured best" if r["first_is_best"] else (
        f"{r['first_over_best']:.1%} slower than the measured best ({r['best_label']})")
    ok = "within" if r["within_10pct"] else "NOT within"
    lines.append(f"the planner's first choice ({r['first_label']}) is {verdict}: {ok} 10%")
    return lines
