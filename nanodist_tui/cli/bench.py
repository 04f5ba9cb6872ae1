"""`nanodist-tui bench ...`: step (ours vs PyTorch eager), allreduce (ours vs gloo), techniques (the
step-time cost of each memory technique) and pruning (the training steps a pruner saves a sweep). The
measuring is engine.bench's; this module parses and prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nanodist_tui.cli.errors import fail, user_errors
from nanodist_tui.cli.options import BackendOpt, JsonOpt, PresetOpt, SetOpt, WorldOpt
from nanodist_tui.cli.running import load_config

app = typer.Typer(help="Benchmarks: our step vs PyTorch eager, our all-reduce vs gloo.", no_args_is_help=True)


@app.command("step")
def step(preset: PresetOpt = "gpt-mini", sets: SetOpt = None, world_size: WorldOpt = None,
         backend: BackendOpt = None,
         steps: Annotated[int, typer.Option(help="timed steps (median reported)", min=1)] = 20,
         warmup: Annotated[int, typer.Option(help="untimed warm-up steps", min=0)] = 5,
         compare_checkpointing: Annotated[bool, typer.Option(
             "--compare-checkpointing", help="also time without/with activation checkpointing (its recompute "
             "cost); on whenever the preset checkpoints")] = False,
         as_json: JsonOpt = False) -> None:
    """Median training-step time: ours, and PyTorch eager on the same shapes (when installed)."""
    from engine.bench.step import race_torch, time_ours
    from engine.config import replace
    with user_errors():
        cfg, _, _ = load_config(preset, sets, world_size, backend)
    ours = time_ours(cfg, warmup, steps)
    report = {"preset": cfg.name, "world_size": cfg.parallel.world_size, "ours": ours}
    if cfg.parallel.world_size > 1:
        other = replace(cfg, "parallel.overlap", not cfg.parallel.overlap)
        report["overlap_" + ("off" if cfg.parallel.overlap else "on")] = time_ours(other, warmup, steps)
    if compare_checkpointing or cfg.memory.checkpointing != "none":
        spec = cfg.memory.checkpointing if cfg.memory.checkpointing != "none" else "blocks"
        with user_errors():
            variants = {s: replace(cfg, "memory.checkpointing", s) for s in ("none", spec)}
        times = {s: (ours if s == cfg.memory.checkpointing else time_ours(c, warmup, steps))["step_s"]
                 for s, c in variants.items()}
        report["checkpointing"] = {"spec": spec, "off_s": times["none"], "on_s": times[spec],
                                   "extra": times[spec] / times["none"] - 1}
    if cfg.parallel.world_size == 1:
        peer = race_torch(cfg, warmup, steps)  # ours again, taking turns with PyTorch: a fair ratio
        report["torch"] = peer
        if peer:
            report["ratio"] = peer["ratio"]
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
    if "checkpointing" in report:
        c = report["checkpointing"]
        print(f"  checkpointing {c['spec']}: {c['on_s'] * 1e3:.1f} ms/step vs {c['off_s'] * 1e3:.1f} without "
              f"({c['extra']:+.0%}: the recompute)")
    if report.get("torch"):
        t = report["torch"]
        print(f"  PyTorch    {t['step_s'] * 1e3:8.1f} ms/step   (torch {t['torch']}, {t['threads']} threads)")
        print(f"  ratio ours/PyTorch = {report['ratio']:.2f}  (ours {t['ours_s'] * 1e3:.1f} ms, timed "
              "taking turns with PyTorch in blocks of steps)")
    elif cfg.parallel.world_size == 1:
        print("  PyTorch not installed: no peer figure (pip install torch==2.13.0)")


def _parse_size(text: str) -> int:
    units = {"k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30, "b": 1, "": 1}
    t = text.strip().lower()
    digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(digits):]
    try:
        size = float(digits) * units[unit]
    except (ValueError, KeyError):
        raise ValueError(f'size "{text}" is not a number with an optional unit; write e.g. 16MiB, 4KiB, '
                         '1024') from None
    if size <= 0 or size % 4:  # the buffers are float32: whole elements only, or algbw would lie
        raise ValueError(f'size "{text}" must be a positive whole number of float32 elements (a multiple '
                         'of 4 bytes)')
    return int(size)


def _fmt_size(n: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor:
            return f"{n / factor:g} {unit}"
    return f"{n} B"


@app.command("allreduce")
def allreduce(
    backend: Annotated[str, typer.Option("--backend", "-b", help="threads | processes | mpi")] = "processes",
    world_size: Annotated[int, typer.Option("--world-size", "-n", min=1, help="ranks")] = 2,
    sizes: Annotated[str, typer.Option(help="comma-separated message sizes, e.g. 1MiB,16MiB,64MiB")]
    = "1MiB,16MiB,64MiB",
    iters: Annotated[int, typer.Option(min=1, help="timed iterations per size (median reported)")] = 20,
    warmup: Annotated[int, typer.Option(min=0, help="untimed iterations per size")] = 3,
    algorithm: Annotated[str, typer.Option(help='"ring" (ours) or "mpi-native" (MPI Allreduce, mpi only)')]
    = "ring",
    vs_gloo: Annotated[bool, typer.Option("--vs-gloo", help="also time torch.distributed gloo, same run")]
    = False,
    as_json: JsonOpt = False,
) -> None:
    """All-reduce bandwidth in the NCCL-tests manner (algbw = S/t, busbw = algbw·2(N-1)/N)."""
    from engine.bench.allreduce import bench_allreduce, bench_gloo
    try:
        size_list = [_parse_size(s) for s in sizes.split(",") if s.strip()]
    except ValueError as e:
        fail(f"--sizes: {e}")
    if backend not in ("threads", "processes", "mpi"):
        fail(f'--backend: unknown backend "{backend}"; use threads, processes or mpi')
    ours = bench_allreduce(backend, world_size, size_list, iters, warmup, algorithm=algorithm)
    gloo = bench_gloo(world_size, size_list, iters, warmup) if vs_gloo else None
    report = {"backend": backend, "world_size": world_size, "algorithm": algorithm,
              "ours": ours, "gloo": gloo}
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"all-reduce, {backend} backend, {world_size} ranks, float32, median of {iters} iterations "
          f"(algbw = S/t, busbw = algbw*2(N-1)/N, GB/s = 1e9 B/s)")
    head = f"{'size':>10} {'time ms':>9} {'algbw':>7} {'busbw':>7} {'ok':>3}"
    if gloo:
        head += f"   {'gloo ms':>9} {'busbw':>7}  {'ours/gloo':>9}"
    print(head)
    for i, row in enumerate(ours):
        line = (f"{_fmt_size(row['size']):>10} {row['time_s'] * 1e3:9.2f} {row['algbw'] / 1e9:7.2f} "
                f"{row['busbw'] / 1e9:7.2f} {'yes' if row['correct'] else 'NO':>3}")
        if gloo:
            g = gloo[i]
            line += f"   {g['time_s'] * 1e3:9.2f} {g['busbw'] / 1e9:7.2f}  {row['busbw'] / g['busbw']:9.2f}x"
        print(line)
    if vs_gloo and gloo is None:
        print("PyTorch not installed: no gloo figures (pip install torch==2.13.0)")


@app.command("techniques")
def techniques(preset: PresetOpt = "gpt-mini", sets: SetOpt = None, world_size: WorldOpt = 4,
               backend: BackendOpt = None,
               steps: Annotated[int, typer.Option(help="timed steps per variant (median)", min=1)] = 10,
               warmup: Annotated[int, typer.Option(help="untimed warm-up steps", min=0)] = 3,
               as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Median step time of the preset with each technique switched on, and its cost vs the baseline."""
    from engine.bench.techniques import time_techniques, variants
    with user_errors():
        base, _, _ = load_config(preset, sets, world_size, backend)
        configs = variants(base)
    rows = time_techniques(configs, warmup, steps)
    if as_json:
        report = {"preset": base.name, "world_size": base.parallel.world_size, "rows": rows}
        print(json.dumps(report, indent=2))
        return
    print(f"preset {base.name}, {base.parallel.world_size} rank(s) on {base.parallel.backend}, "
          f"median of {steps} steps after {warmup} warm-up")
    print(f"{'technique':32} {'ms/step':>8} {'vs baseline':>12} {'comm wait':>10}")
    for row in rows:
        print(f"{row['technique']:32} {row['step_s'] * 1e3:8.1f} {row['vs_baseline']:11.2f}x "
              f"{row['comm_share']:10.0%}")


@app.command("pruning")
def pruning(preset: PresetOpt = "sweep-lr", sets: SetOpt = None,
            trials: Annotated[int, typer.Option("--trials", min=1, help="trials in each sweep")] = 20,
            pruner: Annotated[str, typer.Option(help='the pruner to measure against none: "median", '
                                                    '"successive-halving" or "hyperband"')] = "median",
            keep: Annotated[Path | None, typer.Option("--keep", help="keep both sweeps' folders here")]
            = None,
            as_json: JsonOpt = False) -> None:
    """The same sweep twice, without and with a pruner: training steps saved, and the best values."""
    from engine.bench.pruning import bench_pruning
    from engine.sweep.settings import PRUNERS
    if pruner not in PRUNERS or pruner == "none":
        fail(f'--pruner: "{pruner}" is not a pruner to measure; use one of '
             + ", ".join(f'"{p}"' for p in PRUNERS if p != "none"))
    with user_errors():
        load_config(preset, sets)  # one line for a bad preset before anything trains
        report = bench_pruning(preset, [*(sets or []), f"sweep.n_trials={trials}"], pruner, keep)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    full, pruned = report["full"], report["pruned"]
    print(f"preset {preset}: {trials} trials each, same sampler and seed, {full['metric']} "
          f"({full['direction']}); steps counted, not seconds")
    for row in (full, pruned):
        counts = ", ".join(f"{n} {state}" for state, n in row["counts"].items() if n)
        print(f"  pruner {row['pruner']:<20} {row['steps']:>7,} of {row['full_steps']:,} steps   best "
              f"{row['best_value']:.4f} (trial {row['best_trial']})   {counts}   {row['wall_s']:.0f} s")
    print(f"  {pruner} saved {report['saved']:.1%} of the training steps; its best is "
          f"{report.get('best_gap', float('nan')):+.2%} from the unpruned best")
