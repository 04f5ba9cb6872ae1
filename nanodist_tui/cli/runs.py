"""`nanodist-tui runs` (the run folders and their key figures), `replay RUN_DIR` (a recorded run, played
back into the workbench at any speed, or printed with --no-ui) and `compare RUN_A RUN_B` (two runs side by
side)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import typer

from engine.run.printable import printable
from nanodist_tui.cli.errors import fail, user_errors
from nanodist_tui.cli.options import AsciiOpt, RunDirArg
from nanodist_tui.cli.running import require_run_dir, run_app, sink_names, workbench_config
from nanodist_tui.replay import ReplayPlayer


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def runs(out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="folder holding the run folders")]
         = Path("runs")) -> None:
    """List recorded runs, newest first, with their key figures, latest checkpoint and, for a resumed run,
    the run it continues (parent → child)."""
    from engine.checkpoint.files import scan_checkpoints
    from engine.checkpoint.sharded import CHECKPOINTS
    from engine.run.recorder import list_runs
    if not out_dir.is_dir():
        fail(f"{out_dir}: no such folder; train a run first (`nanodist-tui run`) or pass --out-dir")
    infos = list_runs(out_dir)
    if not infos:
        print(printable(f"no runs in {out_dir}"))
        return
    rows: list[tuple[str, ...]] = [
        ("RUN", "STATUS", "STEPS", "VAL LOSS", "BEST", "TOK/S", "WALL", "RESUMED FROM", "CHECKPOINT")]
    for r in infos:
        total = r.summary.get("total_steps")
        steps = _fmt(r.steps, "d") + (f"/{total}" if total else "")
        wall = "-" if r.wall_s is None else f"{r.wall_s:.1f}s"
        checkpoint = _checkpoint_cell(scan_checkpoints(r.run_dir / CHECKPOINTS))
        cells = (r.run_id, r.status, steps, _fmt(r.final_val_loss, ".4f"), _fmt(r.best_val_loss, ".4f"),
                 _fmt(r.tokens_per_s, ",.0f"), wall, _parent_cell(r.summary), checkpoint)
        rows.append(tuple(printable(cell) for cell in cells))  # a summary.json is anyone's text
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def _parent_cell(summary: dict) -> str:
    """A resumed run's parent → this run: the run folder it continues and the step it took over at
    (engine.run.lineage); its BEST and the improvement its summary gives are the whole lineage's."""
    parent = summary.get("parent")
    return "-" if not parent else f"{Path(parent).name} @ step {summary.get('resumed_at')}"


def _checkpoint_cell(scanned) -> str:
    """The newest good checkpoint, and whether a newer one is damaged (resume would refuse it)."""
    good = [step for step, _, problem in scanned if problem is None]
    cell = f"step {good[-1]}" if good else "-"
    if scanned and scanned[-1][2] is not None:
        cell += f" (step {scanned[-1][0]} damaged)"
    return cell


def replay(run_dir: RunDirArg,
           speed: Annotated[float | None, typer.Option(
               "--speed", min=0.0, help="playback speed (1 = as recorded, 0 = no pauses); "
                                        "default 1 in the workbench, 0 with --no-ui")] = None,
           from_step: Annotated[int, typer.Option("--from-step", min=0, help="start playing at this step "
                                                   "(what comes before it is shown at once)")] = 0,
           no_ui: Annotated[bool, typer.Option("--no-ui", help="print the events instead of opening the "
                                                              "workbench")] = False,
           to: Annotated[str | None, typer.Option(
               "--to", help="also write the run to these, comma-separated: tensorboard,wandb,mlflow "
                            "(into the run folder, as a live run with --log-to would)")] = None,
           ascii_only: AsciiOpt = False) -> None:
    """Play a recorded run (its events.jsonl) back into the workbench (p pauses, + and - change the speed,
    [ and ] seek); --to converts it for TensorBoard, W&B or MLflow on the way."""
    events = _read(run_dir)
    with user_errors():
        sinks, log_cfg = _replay_sinks(run_dir, to)
    speed = (0.0 if no_ui else 1.0) if speed is None else speed
    if no_ui:
        from nanodist_tui.headless import HeadlessPrinter
        printer = HeadlessPrinter(live=False)
        written = _replay_through_sinks(ReplayPlayer(events, speed, start_step=from_step), printer,
                                        threading.Event(), sinks, run_dir, log_cfg)
        printer.close()
        into = f" and wrote them to {', '.join(written)}" if written else ""
        print(printable(f"replayed {len(events)} events from {run_dir}{into}"))
        if len(written) < len(sinks):  # the sink's own warning above says why
            raise typer.Exit(1)
        return
    from nanodist_tui.app import create_app
    started = next((e for e in events if e.kind == "run_started"), None)
    name = started.preset if started is not None else run_dir.name
    player = ReplayPlayer(events, speed, start_step=from_step)

    def job(emit, control) -> list[str]:
        return _replay_through_sinks(player, emit, control, sinks, run_dir, log_cfg)

    run_app(create_app(name, job, replay=player, user_config=workbench_config(ascii_only)))


def compare(run_a: Annotated[Path, typer.Argument(help="a run folder", show_default=False)],
            run_b: Annotated[Path, typer.Argument(help="another run folder", show_default=False)],
            ascii_only: AsciiOpt = False) -> None:
    """Two recorded runs side by side: loss curves overlaid (m smooths them), memory and traffic."""
    for run_dir in (run_a, run_b):
        _read(run_dir)  # one line and exit 2 for a folder that is not a readable run
    from nanodist_tui.app import create_app
    run_app(create_app(f"{run_a.name} vs {run_b.name}", None, compare=(run_a, run_b),
                       user_config=workbench_config(ascii_only)))


def _read(run_dir: Path) -> list:
    from engine.run.recorder import read_events
    require_run_dir(run_dir)
    with user_errors():
        events = read_events(run_dir)
    if not events:
        fail(f"{run_dir}/events.jsonl: no events recorded")
    return events


def _replay_sinks(run_dir: Path, to: str | None):
    """(sink names, the run's [log] settings) for `replay --to`; user errors raise (one line each)."""
    if to is None:
        return [], None
    from engine.config.presets import load_preset
    from engine.sinks import check_available
    from engine.sinks.tensorboard_sink import logdir
    names = sink_names(to, "--to")
    check_available(names)
    if "tensorboard" in names and any(logdir(run_dir).glob("events.out.tfevents.*")):
        fail(f"{logdir(run_dir)}: already holds TensorBoard event files (the run logged there live, or was "
             "converted before); delete that folder to convert the run again")
    cfg, _, _ = load_preset(run_dir / "config.toml")
    return names, cfg.log


def _replay_through_sinks(player, emit, control, names, run_dir: Path, log_cfg) -> list[str]:
    """Play `player` (a ReplayPlayer) into `emit` and, when `names` are given, into those sinks (their
    messages go to `emit` too); returns the sinks that wrote the whole run."""
    if not names:
        player(emit, control)
        return []
    from engine.events import EventBus
    from engine.sinks.runner import SinkSet
    bus = EventBus()
    bus.subscribe(emit)
    sinks = SinkSet(names, run_dir, log_cfg, bus.emit)
    bus.subscribe(sinks)
    try:
        player(bus.emit, control)
    finally:
        sinks.close()
    return sinks.working
