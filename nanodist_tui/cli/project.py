"""`nanodist-tui project`: a run projected onto a cluster over world sizes; `--validate` holds the projection
to runs measured here; `--calibrate` measures this machine; `--clusters` lists the cluster files;
`--nccl-tests FILE` fits a link's latency and bandwidth to pasted all_reduce_perf output. The work is
engine.projection's; this module parses and prints."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from nanodist_tui.cli.errors import fail, user_errors
from nanodist_tui.cli.options import JsonOpt, PresetOpt, SetOpt, WorldOpt
from nanodist_tui.cli.project_lines import context_parallel_lines, expert_parallel_lines
from nanodist_tui.cli.running import load_config

MB = 1e6
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c",
                                         help="cluster name (presets/clusters/) or a .toml path")]


def _world_sizes(text: str | None) -> tuple[int, ...]:
    from engine.projection.project import DEFAULT_WORLD_SIZES
    if not text:
        return DEFAULT_WORLD_SIZES
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        fail(f'--world-sizes: "{text}" is not a comma-separated list of whole numbers; write e.g. 8,64,512')
    if not sizes or min(sizes) < 1:
        fail("--world-sizes: every world size must be at least 1")
    return sizes


def project(preset: PresetOpt = "gpt-mini", cluster: ClusterOpt = "this-machine", sets: SetOpt = None,
            world_size: WorldOpt = None,
            world_sizes: Annotated[str | None, typer.Option(help="comma-separated, e.g. 8,64,512 "
                                                            "(default 1,2,4,...,4096)")] = None,
            scaling: Annotated[str, typer.Option(help="weak: rows per rank fixed; strong: global batch "
                                                 "fixed")] = "weak",
            out: Annotated[Path | None, typer.Option(help="write the JSON report here (default: "
                                                     "<run.out_dir>/projections/<preset>-on-<cluster>.json)")]
            = None,
            validate: Annotated[bool, typer.Option("--validate", help="calibrate here, then predict and run "
                                                   "held-out configurations, and compare")] = False,
            quick: Annotated[bool, typer.Option("--quick", help="--validate on 4 cases, not 20 (--layouts: "
                                                "one layout of each dimension)")] = False,
            layouts: Annotated[bool, typer.Option("--layouts", help="--validate every parallel layout the "
                                                  "engine trains (DP, ZeRO, TP, SP, PP, CP, EP; --quick: "
                                                  "one of each)")] = False,
            repeats: Annotated[int, typer.Option(min=1, help="--validate: rounds, each calibrating afresh "
                                                 "then running every case (medians)")] = 2,
            calibrate: Annotated[bool, typer.Option("--calibrate", help="measure this machine for the preset "
                                                    "(compute, copies, transport) and save it")] = False,
            calibration: Annotated[Path | None, typer.Option(help="calibration file (default "
                                                             "~/.cache/nanodist/calibration.json)")] = None,
            clusters: Annotated[bool, typer.Option("--clusters", help="list the cluster files")] = False,
            nccl_tests: Annotated[Path | None, typer.Option(
                "--nccl-tests", help="fit latency and bandwidth to all_reduce_perf output (a file; - for "
                "stdin)")] = None,
            ranks: Annotated[int | None, typer.Option(min=2, help="--nccl-tests: ranks, when the output does "
                                                      "not say")] = None,
            expert_imbalance: Annotated[float | None, typer.Option(
                min=1.0, help="expert parallelism: the busiest rank's expert rows over the mean "
                "(default 1.0, balanced; a capacity factor bounds it)")] = None,
            as_json: JsonOpt = False) -> None:
    """Predict a run on a cluster you do not have, per world size: step split, tokens/s, scaling, MFU and
    memory."""
    from engine.projection.calibrate import CalibrationError, default_path
    from engine.projection.clusters import load_cluster
    from engine.projection.fit import FitError
    from engine.projection.project import SCALINGS
    if scaling not in SCALINGS:
        fail(f'--scaling: "{scaling}" is not one of {", ".join(SCALINGS)}')
    path = calibration or default_path()
    for option, given in (("--out", out), ("--calibration", calibration)):
        _check_output(option, given)  # before any work: a wrong --out would only be found after it
    try:
        if clusters:
            return _list_clusters(as_json)
        if nccl_tests is not None:
            return _fit_nccl(nccl_tests, ranks, as_json)
        with user_errors():
            cfg = load_config(preset, sets, world_size)[0]
            target = load_cluster(cluster)
            target.require_peak(cfg.precision.dtype)
        if validate:
            return _validate(cfg, quick, repeats, as_json, out, layouts)
        if calibrate:
            return _calibrate(cfg, path, as_json)
        _project(cfg, target, _world_sizes(world_sizes), scaling, path, out, as_json, expert_imbalance)
    except (CalibrationError, FitError) as e:
        fail(str(e))


# ---------------------------------------------------------------------- the projection

def _calibration_for(cfg, target, path: Path, quiet: bool):
    """The calibration a calibrated cluster needs for cfg, measured now if it is missing."""
    from engine.config.build import vocab_size
    from engine.projection.calibrate import Calibration, calibrate
    from engine.projection.flops import model_signature
    if not target.calibrated:
        return None
    vocab = vocab_size(cfg) if cfg.model.kind == "gpt" else 0
    existing = Calibration.load(path)
    if existing is not None and not existing.missing(model_signature(cfg, vocab), [cfg.precision.dtype]):
        return existing
    if not quiet:
        print(f"calibrating this machine for {cfg.name} ({cfg.precision.dtype}); about a minute, saved to "
              f"{path}", file=sys.stderr)
    return calibrate(cfg, vocab, [cfg.precision.dtype], path=path)


def _project(cfg, target, world_sizes, scaling: str, path: Path, out: Path | None, as_json: bool,
             expert_imbalance: float | None = None) -> None:
    from engine.projection.project import project
    report = project(cfg, target, world_sizes, _calibration_for(cfg, target, path, as_json), scaling,
                     expert_imbalance)
    data = {**report, "rows": [row.as_dict() for row in report["rows"]]}
    default = Path(cfg.run.out_dir) / "projections" / f"{cfg.name}-on-{target.path.stem}.json"
    out = _write_json(data, out or default)
    if as_json:
        print(json.dumps(data, indent=1))
        return
    print_projection(data, cfg, target)
    print(f"JSON written to {out}")


def _check_output(option: str, path: Path | None) -> None:
    from engine import paths
    try:
        if path is not None:
            paths.check_output(path)
    except paths.PathError as e:
        fail(f"{option} {e}")


def _write_json(data: dict, out: Path) -> Path:
    """Write the report atomically; an unwritable place is one line, exit code 2."""
    from engine.run.atomic_file import atomic_write_text
    _check_output("--out", out)  # the default path too: a folder or device may sit there
    try:
        atomic_write_text(out, json.dumps(data, indent=1) + "\n")
    except OSError as e:
        fail(f"--out: cannot write {out} ({e.strerror}); choose another file with --out PATH")
    return out


def print_projection(data: dict, cfg, target) -> None:
    p = cfg.parallel
    tp = f", tensor {p.tensor}" + (" with sequence parallelism" if p.sequence_parallel else "") \
        if p.tensor > 1 else ""
    tp += f", context {p.context} ({p.context_layout})" if p.context > 1 else ""
    tp += f", expert {p.expert}" if p.expert > 1 else ""
    print(f"{cfg.name} on {target.name}: ZeRO-{p.zero_stage}, {cfg.precision.dtype}, checkpointing "
          f"{cfg.memory.checkpointing}{tp}, {data['scaling']} scaling, buckets of {p.bucket_cap_mb:g} MiB")
    tp_column = p.tensor > 1  # "tp": the part of "exposed" that is tensor parallelism's collectives
    head = (f"{'ranks':>6} {'batch':>6} {'step ms':>9} {'compute':>9} {'overlap':>9} {'exposed':>9} "
            + (f"{'of it tp':>9} " if tp_column else "")
            + f"{'contend':>8} {'comm':>5} {'tokens/s':>10} {'scaling':>7} {'MFU':>6} {'MB/rank':>8} "
            f"{'fits':>4}")
    print(head)
    for r in data["rows"]:
        fits = "-" if r["fits"] is None else ("yes" if r["fits"] else "NO")
        ms = " ".join(f"{r[k] * 1e3:9.2f}" for k in ("step_s", "compute_s", "overlapped_s", "exposed_s"))
        ms += f" {r['tp_s'] * 1e3:9.2f}" if tp_column else ""
        print(f"{r['world_size']:>6} {r['global_batch']:>6} {ms} {r['interference_s'] * 1e3:8.2f} "
              f"{r['comm_share']:5.0%} {r['tokens_per_s']:10.3g} {r['scaling_efficiency']:7.0%} "
              f"{r['mfu']:6.1%} {r['peak_bytes'] / MB:8.1f} {fits:>4}")
    for s in data["skipped"]:
        print(f"  {s['world_size']} ranks left out: {s['why']}")
    if tp_column and data["rows"]:
        print("\n".join(tensor_parallel_lines(data["rows"][0])))
    if p.pipeline > 1 and data["rows"]:
        print("\n".join(pipeline_lines(data["rows"][0])))
    if p.context > 1 and data["rows"]:
        print("\n".join(context_parallel_lines(data["rows"][0])))
    if data["rows"] and data["rows"][0]["ep"]:
        print("\n".join(expert_parallel_lines(data["rows"][0])))
    _print_memory(data["rows"])
    if len(data["rows"]) > 1:
        print(scaling_plot(data["rows"]))


def pipeline_lines(row: dict) -> list[str]:
    """A row's pipeline term in words: the schedule simulated, its bubble beside the formula's, the
    messages and their link, the stages' balance."""
    pp = row["pp"]
    chunks = f", {pp['chunks']} chunks per rank" if pp["chunks"] > 1 else ""
    return [f"pipeline {pp['degree']} at {row['world_size']} ranks: {pp['schedule']}{chunks}, "
            f"{pp['micro_batches']} micro-batches, blocks per stage {pp['blocks_per_stage']}",
            f"  bubble {pp['bubble']:.1%} of the schedule simulated ({row['bubble_s'] * 1e3:.2f} ms), "
            f"{pp['bubble_published']:.1%} by {pp['bubble_formula']} with equal stages",
            f"  {pp['messages_per_rank']} messages per rank of {pp['message_bytes'] / MB:.3g} MB on the "
            f"{pp['link']} link, {pp['message_s'] * 1e3:.3f} ms each, adding {row['p2p_s'] * 1e3:.2f} ms; "
            f"stage imbalance {pp['stage_imbalance']:.2f}x"]


def tensor_parallel_lines(row: dict) -> list[str]:
    """A row's TP term in words: one layer's collectives, their bytes, the link they use, the time."""
    from collections import Counter
    tp = row["tp"]
    per = Counter((c["kind"], c["phase"].split("-")[1]) for c in tp["per_layer"])
    kinds = " + ".join(f"{n} {kind}{'s' if n > 1 else ''} {'forward' if way == 'fwd' else 'backward'}"
                       for (kind, way), n in per.items())
    size = tp["per_layer"][0]["bytes"] / MB if tp["per_layer"] else 0.0
    where = "inside a node" if tp["link"] == "intra-node" else f"across {tp['nodes']} nodes"
    sp = " with sequence parallelism" if tp["sequence_parallel"] else ""
    return [f"tensor parallel {tp['degree']}{sp} at {row['world_size']} ranks (dp "
            f"{row['world_size'] // tp['degree']}, {tp['rows']} row(s) per micro-batch): each group {where}, "
            f"on the {tp['link']} link",
            f"  per layer {kinds}, {size:.3g} MB each; {tp['layer_sent_bytes'] / MB:.3g} MB sent per rank, "
            f"{tp['layer_s'] * 1e3:.3f} ms",
            f"  per step {tp['collectives']} collectives, {tp['step_s'] * 1e3:.3f} ms, all exposed: the "
            "training thread runs them inside forward and backward"]


def _print_memory(rows: list[dict]) -> None:
    from engine.memory.ledger import CATEGORIES
    print("per-rank memory, MB (each category at its own peak; peak = highest simultaneous total)")
    print(f"{'ranks':>6} " + " ".join(f"{c[:11]:>11}" for c in CATEGORIES) + f" {'peak':>9}")
    for r in rows:
        print(f"{r['world_size']:>6} " + " ".join(f"{r['memory'][c] / MB:11.1f}" for c in CATEGORIES)
              + f" {r['peak_bytes'] / MB:9.1f}")


def scaling_plot(rows: list[dict], width: int = 78, height: int = 16) -> str:
    import plotext as plt

    from nanodist_tui.widgets.projection_pane import draw_scaling
    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("clear")
    draw_scaling(plt, rows)
    text = plt.build()
    return text if sys.stdout.isatty() and not os.environ.get("NO_COLOR") else plt.uncolorize(text)


# ---------------------------------------------------------------------- validation and calibration

def _validate(cfg, quick: bool, repeats: int, as_json: bool, out: Path | None, layouts: bool = False) -> None:
    from engine.comm.base import RankFailure
    from engine.projection.clusters import load_cluster
    from engine.projection.validate import validate
    from engine.projection.validate_layouts import validate_layouts
    here = load_cluster("this-machine")
    progress = (lambda text: None) if as_json else (lambda text: print(f"  {text}", file=sys.stderr))
    try:
        report = (validate_layouts if layouts else validate)(cfg, here, quick=quick, repeats=repeats,
                                                             on_progress=progress)
    except RankFailure as e:
        fail(f"a validation run failed: {e}", code=1)
    name = f"validation-{'layouts-' if layouts else ''}{cfg.name}.json"
    out = _write_json(report, out or Path(cfg.run.out_dir) / "projections" / name)
    if as_json:
        print(json.dumps(report, indent=1))
        return
    print_validation(report, cfg.name)
    print(f"JSON written to {out}")


def print_validation(r: dict, preset: str) -> None:
    print(f"held-out runs of {preset} on this machine (processes backend): predicted from a calibration at "
          "1 and 2 ranks, then measured")
    print(f"{'case':48} {'predicted':>10} {'measured':>10} {'error':>7} {'comm pred':>10} {'comm meas':>10} "
          f"{'memory':>7} {'activations':>11}")
    for c in r["cases"]:
        print(f"{c['label']:48} {c['predicted_s'] * 1e3:8.1f}ms {c['measured_s'] * 1e3:8.1f}ms "
              f"{c['error']:+7.1%} {c['predicted_comm_share']:10.1%} {c['measured_comm_share']:10.1%} "
              f"{'exact' if c['memory_exact'] else 'DIFFERS':>7} {c.get('activations_error', 0.0):+11.1%}")
    ranking = "preserved" if r["ranking_preserved"] else "NOT preserved: " + "; ".join(
        f"{a} vs {b}" for a, b in r["discordant"])
    memory = "exact" if r["memory_exact"] else "DIFFERS"
    paired = (f" (paired by round: MAPE {r['paired_mape']:.1%}, max {r['paired_max_error']:.1%})"
              if "paired_mape" in r else "")
    print(f"step time: MAPE {r['mape']:.1%}, max {r['max_error']:.1%}, bias {r['bias']:+.1%}{paired}; "
          f"comm share within {r['comm_share_points']:.1f} points; model-state memory {memory}, "
          f"activations within {r.get('activations_max_error', 0.0):.1%}; ranking {ranking} "
          f"over the {r['pairs_told_apart']} pairs the measurements tell apart (Kendall tau over all pairs "
          f"{r['kendall_tau']:.2f})")


def _calibrate(cfg, path: Path, as_json: bool) -> None:
    from engine.config.build import vocab_size
    from engine.projection.calibrate import calibrate
    vocab = vocab_size(cfg) if cfg.model.kind == "gpt" else 0
    cal = calibrate(cfg, vocab, [cfg.precision.dtype], path=path, measure_transport=True)
    t = cal.transport
    if as_json:
        print(json.dumps(cal.data, indent=1))
        return
    print(f"calibration saved to {path}")
    print(f"  host: {cal.cores} cores, best fp32 matmul {cal.peak_flops / 1e9:.0f} GFLOP/s")
    print(f"  transport (processes backend, 2 ranks): {_alpha_beta_gamma(t)}")
    if "cpu" in t:
        print(f"  its CPU time per collective: {_alpha_beta_gamma(t['cpu'])}")
    from engine.projection.flops import model_signature
    for dtype, levels in (cal.model(model_signature(cfg, vocab)) or {}).items():
        for level, curve in sorted(levels.items(), key=lambda item: int(item[0])):
            step_ms = (curve["forward_s"][-1] + curve["backward_s"][-1]) * 1e3
            line = (f"  {cfg.name}, {dtype}, {level} rank(s) busy: forward + backward {step_ms:.1f} ms at "
                    f"{curve['tokens'][-1]:,} tokens")
            if int(level) > 1:
                line += f"; imbalance {curve.get('imbalance', 0.0):.1%} of compute"
            if "interference" in curve:
                line += (f"; kappa {curve['interference']:.2f} (an all-reduce of "
                         f"{curve['interference_bytes'] / 2**20:.2f} MiB beside compute took "
                         f"{curve['interference_cpu_s'] * 1e3:.2f} ms of CPU)")
            if "slicing_overhead" in curve:
                line += f"; time-sliced 2 per core, {curve['slicing_overhead']:.2f}x its share of a core"
            print(line)
    if "meeting_lag_s" in cal.data:
        print(f"  ranks time-sliced 2 per core reach each collective {cal.meeting_lag_s * 1e3:.1f} ms late")


def _alpha_beta_gamma(t: dict) -> str:
    """alpha in microseconds, beta and gamma as the bandwidths they stand for."""
    def rate(seconds_per_byte: float) -> str:
        return f"{1 / seconds_per_byte / 1e9:.2f}" if seconds_per_byte else "inf"
    return f"alpha {t['alpha'] * 1e6:.1f} us, beta {rate(t['beta'])} GB/s, gamma {rate(t['gamma'])} GB/s"


def _list_clusters(as_json: bool) -> None:
    from engine.config import ConfigError
    from engine.projection.clusters import list_clusters, load_cluster
    rows = []
    for path in list_clusters():
        try:
            c = load_cluster(path)
            rows.append({"name": path.stem, "path": str(path), "what": c.name, "ranks": c.max_ranks,
                         "error": None})
        except ConfigError as e:
            rows.append({"name": path.stem, "path": str(path), "what": "", "ranks": 0, "error": str(e)})
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        what = r["error"] or f"{r['what']} (up to {r['ranks']} ranks)"
        print(f"{r['name']:16} {what}")


def _fit_nccl(source: Path, ranks: int | None, as_json: bool) -> None:
    from engine import paths
    from engine.projection.fit import fit_nccl_all_reduce
    try:
        text = sys.stdin.read() if str(source) == "-" else paths.read_small(source).decode("utf-8")
    except paths.PathError as e:
        fail(f"--nccl-tests {e}")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--nccl-tests: cannot read {source} ({e}); give the file all_reduce_perf's output was saved to")
    fit = fit_nccl_all_reduce(text, ranks)
    if as_json:
        print(json.dumps(fit, indent=1))
        return
    print(f"nccl-tests all-reduce, {fit['ranks']} ranks, {fit['rows']} sizes: alpha "
          f"{fit['alpha'] * 1e6:.1f} us, bus bandwidth {fit['busbw'] / 1e9:.1f} GB/s")
    print("for a cluster file (the link these ranks used):")
    print(f"  bandwidth_gbs = {fit['busbw'] / 1e9:.1f}  # fitted to nccl-tests all_reduce_perf")
    print(f"  latency_us = {fit['alpha'] * 1e6:.1f}  # fitted to nccl-tests all_reduce_perf")
