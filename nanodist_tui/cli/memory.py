"""`nanodist-tui memory`: where a rank's memory goes, estimated from the config and (with --measure)
measured by the ledger over a few real training steps (threads backend).

Figures are per rank in MB (10^6 bytes). Each category row is that category's own peak over a step;
the "peak total" row is the highest simultaneous total (the phase where it happens in brackets). Under
pipeline parallelism the ranks differ by stage: each figure is the largest of any pipeline rank's (as
--measure takes the largest of any rank's), and a table of every pipeline rank's follows, in bytes
(nanodist_tui/cli/memory_stages.py).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from nanodist_tui.cli.errors import fail, user_errors
from nanodist_tui.cli.memory_stages import print_stages, stages_report
from nanodist_tui.cli.options import PresetOpt, SetOpt, WorldOpt
from nanodist_tui.cli.running import load_config

MB = 1e6
ROWS = (("parameters", ("parameters",)), ("gradients", ("gradients",)), ("master (fp32)", ("master",)),
        ("adam m", ("adam_m",)), ("adam v", ("adam_v",)), ("activations", ("activations",)),
        ("comm buffers", ("comm_buffers",)), ("temporaries", ("temporaries",)))
COMPONENTS = (("parameters", ("parameters",)), ("gradients", ("gradients",)),
              ("optimizer (master+m+v)", ("master", "adam_m", "adam_v")), ("activations", ("activations",)),
              ("comm buffers", ("comm_buffers",)), ("temporaries", ("temporaries",)))
STAGES, PRECISIONS = (0, 1, 2, 3), ("fp32", "fp16", "bf16")


ZeroOpt = Annotated[int | None, typer.Option("--zero", "-z", help="ZeRO stage 0-3 (parallel.zero_stage)")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="fp32 | fp16 | bf16 | fp64")]
MeasureOpt = Annotated[bool, typer.Option("--measure", help="also train a few steps and show the ledger")]
StepsOpt = Annotated[int, typer.Option(help="steps that update the parameters, to measure (--measure); "
                                      "steps skipped on fp16 overflow do not count", min=1)]
CompareOpt = Annotated[bool, typer.Option("--compare", help="stages 0-3 x precisions, and baseline (fp32, "
                                          "stage 0) vs optimized (fp16, ZeRO-2, checkpointing, the bucket "
                                          "size with the lowest peak)")]


def memory(preset: PresetOpt = "seed-table", sets: SetOpt = None, world_size: WorldOpt = None,
           zero: ZeroOpt = None, precision: PrecisionOpt = None, measure: MeasureOpt = False,
           steps: StepsOpt = 2, compare: CompareOpt = False,
           as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False) -> None:
    """Per-rank memory by category: estimated from the config, measured with --measure."""
    from engine.config.presets import Override
    extra: list[str] = list(sets or [])
    if zero is not None:  # an error it causes names --zero (engine.config.presets.Override)
        extra.append(Override(f"parallel.zero_stage={zero}", f"--zero {zero}"))
    if precision is not None:
        extra.append(Override(f'precision.dtype="{precision}"', f"--precision {precision}"))
    with user_errors():
        cfg, _, _ = load_config(preset, extra, world_size)
        report = _compare(cfg, measure, steps) if compare else _breakdown(cfg, measure, steps)
    if as_json:
        print(json.dumps(report, indent=2))
    elif compare:
        _print_compare(report)
    else:
        _print_breakdown(report)


# ---------------------------------------------------------------------- gathering figures

def _estimated(cfg) -> dict:
    """Per rank; under pipeline parallelism, as --measure summarises the ledgers, each figure the largest of
    any pipeline rank's (the peak total and its phase: the heaviest rank's, as estimate() gives it)."""
    from engine.memory.estimator import estimate
    from engine.memory.pipeline import estimate_ranks
    e = estimate(cfg)
    phase, cats = e.peak()
    ranks = estimate_ranks(cfg) if cfg.parallel.pipeline > 1 else [e]
    return {"n_params": e.n_params, "states": {k: max(r.states[k] for r in ranks) for k in e.states},
            "category_peaks": {k: max(r.category_peaks()[k] for r in ranks) for k in e.category_peaks()},
            "peak_total": sum(cats.values()), "peak_phase": phase}


def _measured(cfg, steps: int) -> tuple[dict, list[dict]]:
    """The ledger's figures (the largest of any rank's), and every rank's (bench.memory.measure_rank)."""
    from engine.bench.memory import measure
    from engine.comm.base import RankFailure
    from engine.memory.capacity import check_fits
    from engine.memory.ledger import MODEL_STATES
    check_fits(cfg)  # measuring trains: only what fits here
    try:
        m = measure(cfg, steps)
    except RankFailure as e:
        fail(f"measuring failed: {e}", code=1)
    return {"states": {k: m["at_rest"][k] for k in MODEL_STATES}, "category_peaks": m["category_peaks"],
            "peak_total": m["peak_total"], "peak_phase": m["peak_phase"], "steps": m["steps"],
            "skipped_steps": m["skipped"]}, m["ranks"]


def _describe(cfg) -> dict:
    from engine.memory.estimator import shard_count
    from engine.parallel.mesh import Mesh
    p = cfg.parallel
    dp = Mesh.of(p).dp  # the ranks a global batch's rows are split over (tensor-parallel ranks share theirs)
    return {"preset": cfg.name, "world_size": p.world_size, "zero_stage": p.zero_stage,
            "bucket_cap_mb": p.bucket_cap_mb, "tensor": p.tensor, "sequence_parallel": p.sequence_parallel,
            "pipeline": p.pipeline, "schedule": p.schedule, "micro_batches": cfg.train.micro_batches,
            "sharded_over": shard_count(cfg) if p.zero_stage else 1,
            "dtype": cfg.precision.dtype, "checkpointing": cfg.memory.checkpointing,
            "micro_batch_rows": cfg.train.global_batch // (dp * cfg.train.micro_batches)}


def _breakdown(cfg, measure: bool, steps: int) -> dict:
    report = {**_describe(cfg), "estimate": _estimated(cfg)}
    report["measured"], ranks = _measured(cfg, steps) if measure else (None, None)
    report["pipeline_ranks"] = stages_report(cfg, ranks)  # None without a pipeline
    return report


def optimized(cfg):
    """The baseline's model trained with fp16, ZeRO-2, checkpointing (blocks, where it has any) and the
    bucket size a user would pick for the lowest peak (engine.memory.estimator.bucket_cap_for_memory)."""
    from engine.config import replace
    from engine.memory.estimator import bucket_cap_for_memory
    cfg = with_stage(replace(cfg, "precision.dtype", "fp16"), 2)
    cfg = replace(cfg, "memory.checkpointing", "blocks" if cfg.model.kind == "gpt" else "none")
    return replace(cfg, "parallel.bucket_cap_mb", bucket_cap_for_memory(cfg))


def with_stage(cfg, stage: int):
    """cfg at another ZeRO stage; at stage 0 (nothing to shard) hybrid sharding is off."""
    from engine.config import replace
    if stage == 0 and cfg.parallel.hybrid:
        cfg = replace(cfg, "parallel.hybrid", False)
    return replace(cfg, "parallel.zero_stage", stage)


def baseline(cfg):
    from engine.config import replace
    cfg = with_stage(replace(cfg, "precision.dtype", "fp32"), 0)
    return replace(cfg, "memory.checkpointing", "none")


def _compare(cfg, measure: bool, steps: int) -> dict:
    from engine.config import replace
    grid = []
    for stage in STAGES:
        for dtype in PRECISIONS:
            c = replace(with_stage(cfg, stage), "precision.dtype", dtype)
            grid.append({"zero_stage": stage, "dtype": dtype, "estimate": _estimated(c)})
    base, opt = baseline(cfg), optimized(cfg)
    pair = {name: _breakdown(c, measure, steps) for name, c in (("baseline", base), ("optimized", opt))}
    return {**_describe(cfg), "grid": grid, **pair}


# ---------------------------------------------------------------------- printing

def _mb(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / MB:.1f}"


def _sum(cats: dict | None, keys) -> int | None:
    return None if cats is None else sum(cats[k] for k in keys)


def _header(r: dict, n_params: int) -> str:
    hybrid = (f" (hybrid: sharded over a node's {r['sharded_over']} ranks)"
              if r["zero_stage"] and r["sharded_over"] != r["world_size"] else "")
    t, pp = r.get("tensor", 1), r.get("pipeline", 1)
    axes = f" = dp {r['world_size'] // (t * pp)}" + f" x pp {pp}" * (pp > 1) + f" x tp {t}" * (t > 1)
    layout = (axes + " with sequence parallelism" * bool(r["sequence_parallel"])) if t * pp > 1 else ""
    return (f"{r['preset']}: {n_params:,} parameters, {r['world_size']} rank(s){layout}, "
            f"ZeRO-{r['zero_stage']}{hybrid}, "
            f"{r['dtype']}, checkpointing {r['checkpointing']}, micro-batch {r['micro_batch_rows']} row(s)")


def _print_breakdown(r: dict) -> None:
    est, meas = r["estimate"], r["measured"]
    print(_header(r, est["n_params"]))
    title = f"{'per rank, MB (each category at its own peak)':52}{'estimated':>10}"
    print(title + (f"{'measured':>10}" if meas else ""))
    for label, keys in ROWS:
        row = f"  {label:50}{_mb(_sum(est['category_peaks'], keys)):>10}"
        print(row + (f"{_mb(_sum(meas['category_peaks'], keys)):>10}" if meas else ""))
    total = f"  {'peak total (' + est['peak_phase'] + ')':50}{_mb(est['peak_total']):>10}"
    print(total + (f"{_mb(meas['peak_total']):>10}  ({meas['peak_phase']})" if meas else ""))
    states = sum(est["states"].values())
    print(f"  model states at rest: {_mb(states)} MB estimated"
          + (f", {_mb(sum(meas['states'].values()))} MB measured" if meas else ""))
    if meas:
        print(_steps_line(meas, "measured"))
    if r.get("pipeline_ranks"):
        print("  (under pipeline parallelism: the largest of any pipeline rank's; each one's below)")
        print_stages(r["pipeline_ranks"], r["schedule"], r["micro_batches"])


def _steps_line(meas: dict, what: str) -> str:
    """How many steps the measurement covers: a skipped step never runs the optimizer's update."""
    line = f"  {what} over {meas['steps']} updating step(s); {meas['skipped_steps']} skipped on fp16 overflow"
    if meas["steps"] == 0:
        line += ": no step updated, so the optimizer's update was not measured"
    return line


def _print_compare(r: dict) -> None:
    print(_header(r, r["grid"][0]["estimate"]["n_params"]).replace(
        f"ZeRO-{r['zero_stage']}, {r['dtype']}, ", ""))
    print("\nestimated per rank, MB: model states at rest / peak total")
    print(f"  {'':8}" + "".join(f"{d:>18}" for d in PRECISIONS))
    for stage in STAGES:
        cells = [g["estimate"] for g in r["grid"] if g["zero_stage"] == stage]
        print(f"  ZeRO-{stage:<3}" + "".join(
            f"{_mb(sum(e['states'].values())) + ' / ' + _mb(e['peak_total']):>18}" for e in cells))
    b, o = r["baseline"], r["optimized"]
    measured = b["measured"] is not None
    print(f"\nbaseline (fp32, ZeRO-0, no checkpointing) vs optimized (fp16, ZeRO-2, checkpointing "
          f"{o['checkpointing']}, {o['bucket_cap_mb']:g} MiB buckets), per rank, MB")
    cols = ("baseline est", "baseline meas", "optimized est", "optimized meas") if measured else (
        "baseline", "optimized")
    print(f"  {'component':24}" + "".join(f"{c:>16}" for c in cols) + f"{'reduction':>11}")
    for label, keys in COMPONENTS + (("peak total", None),):
        figures = []
        for side in (b, o):
            for kind in ("estimate", "measured") if measured else ("estimate",):
                src = side[kind]
                figures.append(src["peak_total"] if keys is None else _sum(src["category_peaks"], keys))
        before, after = (figures[1], figures[3]) if measured else (figures[0], figures[1])
        cut = f"{1 - after / before:.0%}" if before and after is not None else "-"
        print(f"  {label:24}" + "".join(f"{_mb(x):>16}" for x in figures) + f"{cut:>11}")
    if measured:
        print("  reduction: measured optimized vs measured baseline")
        print(_steps_line(o["measured"], "optimized measured"))
