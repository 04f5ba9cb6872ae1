"""`nanodist-tui bench ...`: step (ours vs PyTorch eager, or DDP or tensor parallelism on process ranks),
traffic (bytes per step by group), techniques (the step-time cost of each memory technique), scaling
(strong and weak, ours and DDP), profile (where a step's milliseconds go) and pruning (the training steps a
pruner saves a sweep).
The measuring is engine.bench's; this module parses and prints. `bench allreduce` is bench_allreduce.py,
`bench alltoall` bench_alltoall.py, `bench ui` and `bench ui-events` bench_ui.py (registered on this group
by nanodist_tui.cli)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nanodist_tui.cli.errors import fail, user_errors
from nanodist_tui.cli.options import BackendOpt, JsonOpt, PresetOpt, SetOpt, WorldOpt, node_grid
from nanodist_tui.cli.running import load_config

app = typer.Typer(help="Benchmarks: our step vs PyTorch (eager, DDP, TP), our all-reduce algorithms vs each "
                  "other and gloo, our all-to-all vs gloo's, bytes per step by group, scaling, techniques, a "
                  "per-op profile, sweep pruning.",
                  no_args_is_help=True)


# the PyTorch peer of each parallel axis on processes, by precedence: (module, race function); each module's
# unraced(cfg) names a layout its twin cannot race
PEERS = {"ep": ("engine.bench.moe_peer", "race_moe"), "pp": ("engine.bench.pp_peer", "race_pp"),
         "cp": ("engine.bench.cp_peer", "race_cp"), "tp": ("engine.bench.tp_peer", "race_tp")}


@app.command("step")
def step(preset: PresetOpt = "gpt-mini", sets: SetOpt = None, world_size: WorldOpt = None,
         backend: BackendOpt = None,
         steps: Annotated[int, typer.Option(help="timed steps (median reported)", min=1)] = 20,
         warmup: Annotated[int, typer.Option(help="untimed warm-up steps", min=0)] = 5,
         compare_checkpointing: Annotated[bool, typer.Option(
             "--compare-checkpointing", help="also time without/with activation checkpointing (its recompute "
             "cost); on whenever the preset checkpoints")] = False,
         compare_precision: Annotated[bool, typer.Option(
             "--compare-precision", help="also time one rank at fp32, fp16 and bf16, taking turns (the "
             "16-bit cost against fp32)")] = False,
         cpu_time: Annotated[bool, typer.Option(
             "--cpu-time", help="also report CPU seconds per step on one thread: ours at fp32, fp16 and bf16 "
             "and PyTorch at fp32, taking turns (ratios that hold on a loaded machine)")] = False,
         as_json: JsonOpt = False) -> None:
    """Median training-step time: ours, and PyTorch on the same shapes (when installed): eager on one
    rank (a GPT twice: hand-written attention and scaled_dot_product_attention), DDP (gloo) on
    --world-size N --backend processes, its tensor parallelism (DeviceMesh, parallelize_module, gloo) when
    parallel.tensor > 1 on processes, its pipelining when parallel.pipeline > 1, and twins written in torch
    of context parallelism (ring attention) and expert parallelism (all-to-all dispatch) on processes.
    Also what it ran on (CPU, BLAS), the step's FLOPs, and GFLOP/s
    against the measured float32 matmul peak of this machine."""
    from engine.bench import machine
    from engine.bench.step import FLOPS_CONVENTION, moe_unraced, race_torch, rate, step_flops, time_ours
    from engine.comm.cores import usable_cores
    from engine.config import replace
    from engine.memory.capacity import check_fits
    with user_errors():
        cfg, _, _ = load_config(preset, sets, world_size, backend)
        check_fits(cfg)
    host = machine.describe(len(usable_cores()))  # before any step: the peak on an idle BLAS
    peak = host["peak"]["gflops"]
    ours = time_ours(cfg, warmup, steps)
    flops = step_flops(cfg, ours["vocab"])
    ours.update(rate(flops, ours["step_s"], peak))
    report = {"preset": cfg.name, "world_size": cfg.parallel.world_size, "machine": host,
              "flops": {"per_step": flops, "convention": FLOPS_CONVENTION}, "ours": ours}
    # under TP or PP the DP reduce runs on the rank's thread, so nothing overlaps: no overlap variant to time
    if cfg.parallel.world_size > 1 and cfg.parallel.tensor == 1 and cfg.parallel.pipeline == 1:
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
    if compare_precision:
        from engine.bench.precision import race_precisions
        report["precision"] = race_precisions(cfg, warmup, steps)
    if cpu_time:
        from engine.bench.cpu_time import cpu_time_race
        report["cpu_time"] = cpu_time_race(cfg, warmup, steps)
    # a layout with several ranks on processes: ours again, taking turns with a PyTorch peer in the same ranks
    par = cfg.parallel
    degrees = {"ep": par.expert, "pp": par.pipeline, "cp": par.context, "tp": par.tensor}
    axis = next((a for a in PEERS if degrees[a] > 1), None) if par.backend == "processes" else None
    if axis:
        import importlib
        peer_module = importlib.import_module(PEERS[axis][0])
        if why := peer_module.unraced(cfg):
            report[f"{axis}_unraced"] = why
        else:
            report[axis] = raced = getattr(peer_module, PEERS[axis][1])(cfg, warmup, steps)
            if raced:
                report["ratio"] = raced["ratio"]
                raced.update(rate(flops, raced["torch_s"], peak))
    elif why := moe_unraced(cfg):
        report["moe_unraced"] = why
    elif cfg.parallel.world_size == 1:
        peer = race_torch(cfg, warmup, steps)  # ours again, taking turns with PyTorch: a fair ratio
        report["torch"] = peer
        if peer:
            report["ratio"] = peer["ratio"]
            peer.update(rate(flops, peer["step_s"], peak))
            if peer["sdpa"]:
                peer["sdpa"].update(rate(flops, peer["sdpa"]["step_s"], peak))
    elif cfg.parallel.backend == "processes":
        from engine.bench.ddp_peer import race_ddp
        ddp = race_ddp(cfg, warmup, steps)  # ours again, taking turns with PyTorch DDP in the same ranks
        report["ddp"] = ddp
        if ddp:
            report["ratio"] = ddp["ratio"]
            ddp.update(rate(flops, ddp["torch_s"], peak))
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"preset {cfg.name}: {ours['n_params']:,} parameters, {cfg.parallel.world_size} rank(s), "
          f"{ours['tokens']} tokens/step, median of {steps} steps after {warmup} warm-up")
    pk = host["peak"]
    print(f"  CPU        {host['cpu']}, {len(usable_cores())} core(s) usable")
    for lib in host["blas"] or [None]:
        print("  BLAS       " + (_blas_words(lib) if lib else "none found by threadpoolctl"))
    print(f"  peak       {pk['gflops']:.1f} GFLOP/s: best of {pk['repeats']} float32 matmuls of "
          f"{pk['n']}x{pk['n']} by {pk['n']}x{pk['n']} (np.matmul), {pk['threads']} thread(s)")
    print(f"  FLOPs      {flops:,.0f} per step ({FLOPS_CONVENTION})")
    print(f"  nanoDist   {ours['step_s'] * 1e3:8.1f} ms/step   {_rate_words(ours)}   "
          f"comm wait {ours['comm_share']:.0%}")
    for key in ("overlap_on", "overlap_off"):
        if key in report:
            o = report[key]
            label = key.replace("_", " ")
            print(f"  {label:10} {o['step_s'] * 1e3:8.1f} ms/step   comm wait {o['comm_share']:.0%}")
    if "checkpointing" in report:
        c = report["checkpointing"]
        print(f"  checkpointing {c['spec']}: {c['on_s'] * 1e3:.1f} ms/step vs {c['off_s'] * 1e3:.1f} without "
              f"({c['extra']:+.0%}: the recompute)")
    if "precision" in report:
        p = report["precision"]
        print(f"  one rank, {p['threads']} thread(s), taking turns: " + ", ".join(
            f"{d} {p[d]['step_s'] * 1e3:.1f} ms ({p[d]['vs_fp32']:.2f}x)" for d in ("fp32", "fp16", "bf16"))
            + (f"; fp16 skipped {p['fp16']['skipped']} step(s) on overflow" if p["fp16"]["skipped"] else ""))
        if tp := p["torch"]:
            print(f"  PyTorch eager, {tp['threads']} thread(s), taking turns: "
                  f"fp32 {tp['fp32']['step_s'] * 1e3:.1f} ms, "
                  f"bf16 autocast {tp['bf16']['step_s'] * 1e3:.1f} ms ({tp['bf16']['vs_fp32']:.2f}x); "
                  "the CPU's bf16 arithmetic: "
                  f"{', '.join(host['bf16_arithmetic']) or 'none'}")
    if "cpu_time" in report:
        c = report["cpu_time"]
        print("  one thread, CPU time per step, taking turns: " + ", ".join(
            f"{d} {c[d]['cpu_s'] * 1e3:.1f} ms ({c[d]['vs_fp32']:.2f}x)" for d in ("fp32", "fp16", "bf16"))
            + (f"; PyTorch fp32 {c['torch']['cpu_s'] * 1e3:.1f} ms, ratio ours/PyTorch = {c['ratio']:.2f}"
               if c["torch"] else "; PyTorch not installed"))
    if report.get("torch"):
        t = report["torch"]
        attention = ", hand-written attention" if t["sdpa"] else ""
        print(f"  PyTorch    {t['step_s'] * 1e3:8.1f} ms/step   {_rate_words(t)}   (torch {t['torch']}, "
              f"{t['threads']} threads{attention})")
        print(f"  ratio ours/PyTorch = {report['ratio']:.2f}  (ours {t['ours_s'] * 1e3:.1f} ms, timed "
              "taking turns with PyTorch in blocks of steps)")
        if t["sdpa"]:
            f = t["sdpa"]
            print(f"  PyTorch    {f['step_s'] * 1e3:8.1f} ms/step   {_rate_words(f)}   (torch {t['torch']}, "
                  f"{t['threads']} threads, scaled_dot_product_attention)")
            print(f"  ratio ours/PyTorch SDPA = {f['ratio']:.2f}  (the same turns)")
    if report.get("ddp"):
        d = report["ddp"]
        print(f"  PyTorch DDP {d['torch_s'] * 1e3:7.1f} ms/step   {_rate_words(d)}   (torch {d['torch']}, "
              f"gloo, {d['world_size']} processes x {d['threads_per_rank']} thread(s))")
        print(f"  ratio ours/PyTorch DDP = {report['ratio']:.2f}  (ours {d['ours_s'] * 1e3:.1f} ms, comm "
              f"wait {d['comm_share']:.0%}, timed taking turns with PyTorch DDP in the same ranks)")
    elif report.get("tp"):
        d = report["tp"]
        sp = "with" if d["sequence_parallel"] else "without"
        print(f"  PyTorch TP {d['torch_s'] * 1e3:8.1f} ms/step   {_rate_words(d)}   (torch {d['torch']}, "
              f"gloo, DeviceMesh dp {d['dp']} x tp {d['tp']} {sp} sequence parallelism, {d['world_size']} "
              f"processes x {d['threads_per_rank']} thread(s))")
        wait = f"DP comm wait {d['comm_share']:.0%}, " if d["dp"] > 1 else ""  # TP's collectives are inline
        print(f"  ratio ours/PyTorch TP = {report['ratio']:.2f}  (ours {d['ours_s'] * 1e3:.1f} ms, {wait}"
              "timed taking turns with PyTorch TP in the same ranks)")
    elif report.get("pp"):
        d = report["pp"]
        print(f"  PyTorch PP {d['torch_s'] * 1e3:8.1f} ms/step   {_rate_words(d)}   (torch {d['torch']}, "
              f"gloo, torch.distributed.pipelining {d['schedule']}, pp {d['pp']}, {d['micro_batches']} "
              f"micro-batches, {d['world_size']} processes x {d['threads_per_rank']} thread(s))")
        print(f"  ratio ours/PyTorch PP = {report['ratio']:.2f}  (ours {d['ours_s'] * 1e3:.1f} ms, timed "
              "taking turns with PyTorch's pipelining in the same ranks)")
    elif report.get("cp"):
        d = report["cp"]
        print(f"  PyTorch CP {d['torch_s'] * 1e3:8.1f} ms/step   {_rate_words(d)}   (torch {d['torch']}, "
              f"gloo, {d['twin']}: ring attention written in torch, {d['layout']} dp {d['dp']} x cp "
              f"{d['cp']}, "
              f"{d['world_size']} processes x {d['threads_per_rank']} thread(s))")
        print(f"  ratio ours/PyTorch CP = {report['ratio']:.2f}  (ours {d['ours_s'] * 1e3:.1f} ms, timed "
              "taking turns with the PyTorch twin in the same ranks)")
    elif report.get("ep"):
        d = report["ep"]
        print(f"  PyTorch EP {d['torch_s'] * 1e3:8.1f} ms/step   {_rate_words(d)}   (torch {d['torch']}, "
              f"gloo, {d['twin']}: all_to_all_single dispatch, {d['n_experts']} experts top-{d['top_k']}, "
              f"ep {d['ep']}, {d['world_size']} processes x {d['threads_per_rank']} thread(s))")
        print(f"  ratio ours/PyTorch EP = {report['ratio']:.2f}  (ours {d['ours_s'] * 1e3:.1f} ms, timed "
              "taking turns with the PyTorch twin in the same ranks)")
    elif {"tp_unraced", "pp_unraced", "cp_unraced", "ep_unraced", "moe_unraced"} & report.keys():
        names = {"tp": "TP", "pp": "pipeline", "cp": "CP", "ep": "EP", "moe": "peer"}
        kind = next(k for k in names if f"{k}_unraced" in report)
        print(f"  no PyTorch {names[kind]} figure: {report[f'{kind}_unraced']}")
    elif {"ddp", "tp", "pp", "cp", "ep"} & report.keys() or (cfg.parallel.world_size == 1
                                                         and not report.get("torch")):
        print("  PyTorch not installed: no peer figure (pip install torch==2.13.0)")


def _blas_words(lib: dict) -> str:
    """One BLAS as words: "openblas 0.3.31, kernel SkylakeX, 2 thread(s) (pthreads)"."""
    layer = f" ({lib['threading_layer']})" if lib.get("threading_layer") else ""
    return (f"{lib['internal_api']} {lib['version']}, kernel {lib['architecture'] or 'unknown'}, "
            f"{lib['num_threads']} thread(s){layer}")


def _rate_words(r: dict) -> str:
    return f"{r['gflops']:8.2f} GFLOP/s = {r['of_peak']:6.1%} of peak"


@app.command("traffic")
def traffic(preset: PresetOpt = "hybrid-4", sets: SetOpt = None, world_size: WorldOpt = None,
            steps: Annotated[int, typer.Option(help="train this many steps, report the last", min=1)] = 2,
            as_json: JsonOpt = False) -> None:
    """Bytes each rank sends in a training step, by group (world, node, cross-node), and across nodes."""
    from engine.bench.traffic import traffic_per_step
    with user_errors():
        cfg, _, _ = load_config(preset, sets, world_size)
    rows = traffic_per_step(cfg, steps)
    p = cfg.parallel
    if as_json:
        print(json.dumps({"preset": cfg.name, "world_size": p.world_size, "ranks_per_node": p.ranks_per_node,
                          "zero_stage": p.zero_stage, "hybrid": p.hybrid, "algorithm": p.algorithm,
                          "step": steps, "ranks": rows}, indent=2))
        return
    layout = "hybrid-sharded" if p.hybrid else "flat"
    print(f"preset {cfg.name}: {p.world_size} ranks{node_grid(p.world_size, p.ranks_per_node)}, "
          f"ZeRO-{p.zero_stage} {layout}, all-reduce {p.algorithm}; bytes sent in step {steps} "
          "(MB = 1e6 bytes)")
    seen = {g for r in rows for g in r["by_group"]}
    groups = [g for g in ("world", "node", "cross") if g in seen] + sorted(seen - {"world", "node", "cross"})
    print(f"{'rank':>4} " + " ".join(f"{g:>10}" for g in groups) + f" {'total':>10} {'across nodes':>13}")
    total = {"rank": "all", "by_group": {g: sum(r["by_group"].get(g, 0) for r in rows) for g in groups},
             "total": sum(r["total"] for r in rows), "across_nodes": sum(r["across_nodes"] for r in rows)}
    for r in [*rows, total]:
        print(f"{r['rank']:>4} " + " ".join(f"{r['by_group'].get(g, 0) / 1e6:10.3f}" for g in groups)
              + f" {r['total'] / 1e6:10.3f} {r['across_nodes'] / 1e6:13.3f}")


@app.command("techniques")
def techniques(preset: PresetOpt = "gpt-mini", sets: SetOpt = None, world_size: WorldOpt = 4,
               backend: BackendOpt = None,
               steps: Annotated[int, typer.Option(help="timed steps per variant (median)", min=1)] = 10,
               warmup: Annotated[int, typer.Option(help="untimed warm-up steps", min=0)] = 3,
               as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Median step time of the preset with each technique switched on, and its cost vs the baseline."""
    from engine.bench.techniques import time_techniques, variants
    from engine.memory.capacity import check_fits
    with user_errors():
        base, _, _ = load_config(preset, sets, world_size, backend)
        configs = variants(base)
        for variant in configs.values():
            check_fits(variant)
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


@app.command("scaling")
def scaling(preset: PresetOpt = "gpt-mini", sets: SetOpt = None,
            worlds: Annotated[str, typer.Option(help="comma-separated world sizes")] = "1,2,4",
            steps: Annotated[int, typer.Option(help="timed steps per point (median)", min=1)] = 10,
            warmup: Annotated[int, typer.Option(help="untimed warm-up steps", min=0)] = 3,
            as_json: JsonOpt = False) -> None:
    """Strong (fixed global batch) and weak (fixed batch per rank) scaling on the processes backend:
    step time, tokens/s, efficiency and comm share, ours and PyTorch DDP side by side."""
    from engine.bench.scaling import scaling as measure
    try:
        sizes = tuple(int(w) for w in worlds.split(",") if w.strip())
    except ValueError:
        fail(f'--worlds: "{worlds}" is not a list of whole numbers; write e.g. 1,2,4')
    if not sizes or min(sizes) < 1:
        fail(f'--worlds: "{worlds}" needs world sizes of at least 1; write e.g. 1,2,4')
    with user_errors():
        cfg, _, _ = load_config(preset, sets, None, None)
        report = measure(cfg, sizes, warmup, steps)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"preset {cfg.name}, processes backend, median of {steps} steps after {warmup} warm-up; efficiency "
          "strong T(1)/(N*T(N)), weak T(1)/T(N); comm wait: ours")

    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)
    print(f"{'mode':7}{'N':>3}{'batch':>7}{'ours ms':>9}{'torch ms':>10}{'ours tok/s':>12}{'torch tok/s':>13}"
          f"{'ours eff':>10}{'torch eff':>11}{'comm wait':>11}{'ours/torch':>12}")
    for r in report["rows"]:
        print(f"{r['mode']:7}{r['world_size']:3d}{r['global_batch']:7d}{r['ours_s'] * 1e3:9.1f}"
              f"{cell(r['torch_s'] and r['torch_s'] * 1e3, '10.1f'):>10}{r['ours_tokens_per_s']:12,.0f}"
              f"{cell(r['torch_tokens_per_s'], '13,.0f'):>13}{cell(r['ours_efficiency'], '10.2f'):>10}"
              f"{cell(r['torch_efficiency'], '11.2f'):>11}{r['comm_share']:11.0%}"
              f"{cell(r['ratio'], '12.2f'):>12}")
    if report["rows"] and report["rows"][0]["torch_s"] is None:
        print("PyTorch not installed: no DDP figures (pip install torch==2.13.0)")


@app.command("profile")
def profile(preset: PresetOpt = "gpt-mini", sets: SetOpt = None,
            steps: Annotated[int, typer.Option(help="profiled steps (the figures are per step)", min=1)] = 10,
            warmup: Annotated[int, typer.Option(help="untimed warm-up steps", min=0)] = 3,
            as_json: JsonOpt = False) -> None:
    """Where each millisecond of one rank's training step goes: per op (forward, backward, optimizer,
    each exclusive of the ops it calls) and per phase. A layout that needs several ranks (tensor, pipeline,
    context, expert) runs on the fewest it needs, as threads, and rank 0 is profiled."""
    from engine.bench.profile import profile_step
    with user_errors():
        cfg, _, _ = load_config(preset, sets, None, None)
    report = profile_step(cfg, warmup, steps)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    ph = report["phases"]
    who = "one rank" if report["ranks"] == 1 else f"rank 0 of {report['ranks']} (threads)"
    print(f"preset {report['preset']}: {who}, {report['threads']} thread(s), ms per step (mean of "
          f"{steps} steps after {warmup} warm-up)")
    print(f"  step {ph['step']:.1f} = forward {ph['forward']:.1f} + backward {ph['backward']:.1f} + "
          f"optimizer {ph['optimizer']:.1f} + outside phases {report['other']['outside phases']:.1f}; comm "
          f"wait {ph['comm_wait']:.1f}")
    print(f"  {'op':28}{'forward':>9}{'backward':>9}{'optimizer':>10}{'total':>8}{'share':>7}{'calls':>7}")
    for row in report["ops"]:
        total = row["forward_ms"] + row["backward_ms"] + row["optimizer_ms"]
        print(f"  {row['op']:28}{row['forward_ms']:9.2f}{row['backward_ms']:9.2f}{row['optimizer_ms']:10.2f}"
              f"{total:8.2f}{total / ph['step']:7.1%}{row['calls']:7d}")
    o = report["other"]
    print(f"  {'other (tape, model, replica)':28}{o['forward']:9.2f}{o['backward']:9.2f}"
          f"{o['optimizer']:10.2f}{o['forward'] + o['backward'] + o['optimizer']:8.2f}")


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
    from engine.config.vocabulary import PRUNERS
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
