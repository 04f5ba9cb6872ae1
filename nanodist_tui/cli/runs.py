"""`nanodist-tui runs` (the run folders and their key figures) and `replay RUN_DIR` (a recorded run,
played back into the workbench, or printed with --no-ui)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import typer

from nanodist_tui.cli.errors import fail, user_errors
from nanodist_tui.cli.options import RunDirArg
from nanodist_tui.cli.running import require_run_dir
from nanodist_tui.replay import replay_events


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def runs(out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="folder holding the run folders")]
         = Path("runs")) -> None:
    """List recorded runs, newest first, with their key figures and latest checkpoint."""
    from engine.checkpoint import CHECKPOINTS
    from engine.checkpoint_io import scan_checkpoints
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
        wall = "-" if r.wall_s is None else f"{r.wall_s:.1f}s"
        checkpoint = _checkpoint_cell(scan_checkpoints(r.run_dir / CHECKPOINTS))
        rows.append((r.run_id, r.status, steps, _fmt(r.final_val_loss, ".4f"), _fmt(r.best_val_loss, ".4f"),
                     _fmt(r.tokens_per_s, ",.0f"), wall, checkpoint))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


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
           no_ui: Annotated[bool, typer.Option("--no-ui", help="print the events instead of opening the "
                                                              "workbench")] = False) -> None:
    """Play a recorded run (its events.jsonl) back into the workbench."""
    from engine.recorder import read_events
    require_run_dir(run_dir)
    with user_errors():
        events = read_events(run_dir)
    if not events:
        fail(f"{run_dir}/events.jsonl: no events recorded")
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
    create_app(name, lambda emit, stop: replay_events(events, emit, stop, speed), replay=True).run()
