"""`nanodist-tui bench ...`: benchmarks measured against a peer in the same run."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from nanodist_tui.common import BackendOpt, PresetOpt, SetOpt, WorldOpt, load_config, user_errors

app = typer.Typer(help="Benchmarks: our step vs PyTorch eager, our all-reduce vs gloo.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object instead of a table")]


@app.command("step")
def step(preset: PresetOpt = "gpt-mini", sets: SetOpt = None, world_size: WorldOpt = None,
         backend: BackendOpt = None,
         steps: Annotated[int, typer.Option(help="timed steps (median reported)", min=1)] = 20,
         warmup: Annotated[int, typer.Option(help="untimed warm-up steps", min=0)] = 5,
         as_json: JsonOpt = False) -> None:
    """Median training-step time: ours, and PyTorch eager on the same shapes (when installed)."""
    from engine.bench_step import time_ours, time_torch
    from engine.config import replace
    with user_errors():
        cfg, _, _ = load_config(preset, sets, world_size, backend)
    ours = time_ours(cfg, warmup, steps)
    report = {"preset": cfg.name, "world_size": cfg.parallel.world_size, "ours": ours}
    if cfg.parallel.world_size > 1:
        other = replace(cfg, "parallel.overlap", not cfg.parallel.overlap)
        report["overlap_" + ("off" if cfg.parallel.overlap else "on")] = time_ours(other, warmup, steps)
    if cfg.parallel.world_size == 1:
        peer = time_torch(cfg, warmup, steps)
        report["torch"] = peer
        if peer:
            report["ratio"] = ours["step_s"] / peer["step_s"]
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"preset {cfg.name}: {ours['n_params']:,} parameters, {cfg.parallel.world_size} rank(s), "
          f"{ours['tokens']} tokens/step, median of {steps} steps after {warmup} warm-up")
    print(f"  nanoDist   {ours['step_s'] * 1e3:8.1f} ms/step   comm wait {ours['comm_share']:.0%}")
    for key in ("overlap_on", "overlap_off"):
        if key in report:
            o = report[key]
            label = key.replace("_", " ")
            print(f"  {label:10} {o['step_s'] * 1e3:8.1f} ms/step   comm wait {o['comm_share']:.0%}")
    if report.get("torch"):
        t = report["torch"]
        print(f"  PyTorch    {t['step_s'] * 1e3:8.1f} ms/step   (torch {t['torch']}, {t['threads']} threads)")
        print(f"  ratio ours/PyTorch = {report['ratio']:.2f}")
    elif cfg.parallel.world_size == 1:
        print("  PyTorch not installed: no peer figure (pip install torch==2.13.0)")
