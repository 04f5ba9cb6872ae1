"""`nanodist-tui runs` (the run folders and their key figures), `replay RUN_DIR` (a recorded run, played
back into the workbench at any speed, or printed with --no-ui) and `compare RUN_A RUN_B` (two runs side by
side)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import typer

from nanodist_tui.cli.errors import fail, run_errors
from nanodist_tui.cli.options import AsciiOpt, RunDirArg
from nanodist_tui.cli.running import require_run_dir, run_app, workbench_config
from nanodist_tui.replay import ReplayPlayer, replay_events


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def runs(out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="folder holding the run folders")]
         = Path("runs")) -> None:
    """List recorded runs, newest first, with their key figures and latest checkpoint."""
    from engine.checkpoint import CHECKPOINTS
    from engine.checkpoint_io import finished_checkpoints
    from engine.recorder import list_runs
    if not out_dir.is_dir():
        fail(f"{out_dir}: no such folder; train a run first (`nanodist-tui run`) or pass --out-dir")
    infos = list_runs(out_dir)
    if not infos:
        print(f"no runs in {out_dir}")
        return
    rows = [("RUN", "STATUS", "STEPS", "VAL LOSS", "BEST", "TOK/S", "WALL", "CHECKPOINT")]
    for r in infos:
        total = r.summary.get("total_steps")
        steps = _fmt(r.steps, "d") + (f"/{total}" if total else "")
        ckpts = finished_checkpoints(r.run_dir / CHECKPOINTS)
        wall = "-" if r.wall_s is None else f"{r.wall_s:.1f}s"
        rows.append((r.run_id, r.status, steps, _fmt(r.final_val_loss, ".4f"), _fmt(r.best_val_loss, ".4f"),
                     _fmt(r.tokens_per_s, ",.0f"), wall, f"step {ckpts[-1][0]}" if ckpts else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def replay(run_dir: RunDirArg,
           speed: Annotated[float | None, typer.Option(
               "--speed", min=0.0, help="playback speed (1 = as recorded, 0 = no pauses); "
                                        "default 1 in the workbench, 0 with --no-ui")] = None,
           from_step: Annotated[int, typer.Option("--from-step", min=0, help="start playing at this step "
                                                   "(what comes before it is shown at once)")] = 0,
           no_ui: Annotated[bool, typer.Option("--no-ui", help="print the events instead of opening the "
                                                              "workbench")] = False,
           ascii_only: AsciiOpt = False) -> None:
    """Play a recorded run (its events.jsonl) back into the workbench: p pauses, + and - change the speed,
    [ and ] seek."""
    events = _read(run_dir)
    speed = (0.0 if no_ui else 1.0) if speed is None else speed
    if no_ui:
        from nanodist_tui.headless import HeadlessPrinter
        printer = HeadlessPrinter(live=False)
        replay_events(events, printer, threading.Event(), speed)
        printer.close()
        print(f"replayed {len(events)} events from {run_dir}")
        return
    from nanodist_tui.app import create_app
    started = next((e for e in events if e.kind == "run_started"), None)
    name = started.preset if started is not None else run_dir.name
    player = ReplayPlayer(events, speed, start_step=from_step)
    run_app(create_app(name, player, replay=player, user_config=workbench_config(ascii_only)))


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
    from engine.recorder import read_events
    require_run_dir(run_dir)
    with run_errors():
        events = read_events(run_dir)
    if not events:
        fail(f"{run_dir}/events.jsonl: no events recorded")
    return events
