"""Run folders: what a run leaves on disk, written as it happens, readable for replay.

    runs/<YYYYmmdd-HHMMSS>-<preset>/
        config.toml    the preset as run: its own lines and comments, overrides applied, defaults filled in
        events.jsonl   every event, one JSON object per line, flushed as it arrives
        metrics.csv    one row per step (val_loss filled in when that step's Eval arrives)
        summary.json   key figures, written atomically when the run finishes, fails or the recorder closes

`RunRecorder` is an EventBus subscriber: `bus.subscribe(recorder)`. A process that is killed outright
(SIGKILL, power loss) writes no summary.json; `list_runs` then rebuilds the figures from events.jsonl and
calls the run "interrupted" once that file has been silent for INTERRUPTED_AFTER_S.

When the folder stops taking writes (a full disk, the folder removed), the recorder stops writing, says
so once through `on_failure(message)` (engine.run.job then stops the run, checkpointing if the disk allows)
and keeps the figures in memory; summary.json, if it can still be written, records the failure. A removed
(or moved, or read-only) folder still takes writes into the files already open, so after each event the
recorder also checks that its folder is where it was and writable; it never makes a vanished folder again.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from engine import config
from engine import events as ev_types
from engine.config import presets
from engine.events import EventError, as_event, from_json, to_json
from engine.run import atomic_file, lock
from engine.run.legacy_events import LegacyFields
from engine.run.summary import new_summary, summarize, summary_problem

METRIC_COLUMNS = ["step", "loss", "lr", "tokens", "step_time_s", "tokens_per_s", "grad_norm", "val_loss",
                  "loss_scale"]

# A live run writes an event every step; a summary-less folder silent for this long lost its process.
INTERRUPTED_AFTER_S = 60.0


def _config_text(cfg: Any) -> str:
    if isinstance(cfg, config.Config):
        return tomlkit.dumps(config.to_dict(cfg))
    if isinstance(cfg, tomlkit.TOMLDocument):
        return presets.resolved_document(cfg).as_string()
    return tomlkit.dumps(config.to_dict(config.from_dict(cfg, source="<run config>")))


class RunFolderError(ValueError):
    """run.out_dir cannot receive a run folder (full disk, no permission, a name too long). One line."""


class RecordingError(RuntimeError):
    """The run folder stopped taking writes mid-run, so the run was stopped. One line."""


def _new_run_dir(out_dir: Path, preset_name: str) -> Path:
    """out_dir/<timestamp>-<preset>, with -2, -3, ... if that exists (mkdir is the atomic claim)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(str(preset_name)).stem).strip("-")[:64] or "run"
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}"
    out_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = out_dir / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{out_dir}: no free run folder name for {base}")


def _finite(value: Any) -> Any:
    """NaN/inf become null so summary.json is strict JSON that any tool reads."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class RunRecorder:
    """Writes one run folder. Thread-safe; call it with events (or their dicts), then `close()`.
    RunFolderError (one line) when the folder cannot be made or written to at all."""

    def __init__(self, out_dir: str | Path, preset_name: str, config_doc_or_dict: Any,
                 on_failure: Callable[[str], None] | None = None):
        config_text = _config_text(config_doc_or_dict)
        self.run_dir = Path()
        try:
            self.run_dir = _new_run_dir(Path(out_dir), preset_name)
            atomic_file.atomic_write_text(self.run_dir / "config.toml", config_text)
            # kept open for the run's lifetime (closed in close()), so no context manager
            self._events = open(self.run_dir / "events.jsonl", "a", encoding="utf-8")  # noqa: SIM115
            self._metrics = open(self.run_dir / "metrics.csv", "w", encoding="utf-8", newline="")  # noqa: SIM115
            self._csv = csv.writer(self._metrics)
            self._csv.writerow(METRIC_COLUMNS)
            self._metrics.flush()
        except OSError as exc:
            if self.run_dir.name:  # the folder this call made, and what it wrote before the failure
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise RunFolderError(f"run.out_dir: cannot create a run folder in {out_dir} "
                                 f"({exc.strerror or exc}); free some space, or choose another folder with "
                                 "--set run.out_dir=PATH") from None
        self._run_lock = lock.hold(self.run_dir)  # "a process writes here", for engine.checkpoint.resume
        # a folder (or event log) of the same name made later is not this one
        self._identity = _identity(self.run_dir), _identity(self.run_dir / "events.jsonl")
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._pending: dict | None = None  # the last step's row, waiting for a possible Eval of that step
        self._closed = False
        self.on_failure = on_failure
        self.failure: str | None = None  # why the folder stopped taking writes, once it has
        self.vanished = False  # the folder was removed or moved: nothing of the run is left in it
        self.last_checkpoint: int | None = None  # the step of the newest CheckpointSaved seen
        self.summary = new_summary(self.run_dir.name, preset_name)
        self.summary["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    @property
    def run_id(self) -> str:
        """The run folder's name, e.g. 20250101-120000-quickstart."""
        return self.run_dir.name

    def __call__(self, ev: Any) -> None:
        ev = as_event(ev)
        # A Phase is the live display's (what a run does before its first step), not the run's: a record
        # starts with run_started.
        if isinstance(ev, ev_types.Phase):
            return
        with self._lock:
            if self._closed:
                return
            if isinstance(ev, ev_types.CheckpointSaved):
                self.last_checkpoint = ev.step
            if self.failure is not None:
                summarize(self.summary, ev)  # the figures go on in memory, for the final message
                return
            try:
                self._events.write(json.dumps(to_json(ev)) + "\n")
                self._events.flush()
                if problem := self._folder_problem():
                    self._stop(problem)
                    summarize(self.summary, ev)
                    return
                self._update(ev)
            except OSError as exc:
                said = f"cannot write to {self.run_dir} ({exc.strerror or exc})"
                self._stop(self._folder_problem() or said)

    def _folder_problem(self) -> str | None:
        """Why the run folder can no longer hold the run, or None. Writes into files already open go on
        succeeding after the folder is removed, so that is asked of the folder itself."""
        try:
            folder = _identity(self.run_dir)
        except FileNotFoundError:
            self.vanished = True
            return f"the run folder {self.run_dir} was removed or moved while the run went on"
        except OSError as exc:
            return f"cannot reach {self.run_dir} ({exc.strerror or exc})"
        if folder != self._identity[0]:
            self.vanished = True
            return f"the run folder {self.run_dir} was replaced by another folder while the run went on"
        try:
            removed = _identity(self.run_dir / "events.jsonl") != self._identity[1]
        except OSError:
            removed = True
        if removed:
            return f"{self.run_dir / 'events.jsonl'} was removed or replaced while the run went on"
        if not os.access(self.run_dir, os.W_OK):  # a chmod, or a read-only mount (which binds root too)
            return f"cannot write to {self.run_dir} (it became read-only)"
        return None

    def check_folder(self) -> str | None:
        """Why recording stopped, or None: asked of the folder once more, for a folder removed after the last
        event (engine.run.job asks before it reports the run finished)."""
        with self._lock:
            if not self._closed and not self.vanished and (problem := self._folder_problem()):
                if self.failure is None:
                    self._stop(problem)
                elif self.vanished:  # its files went first (rm -r), then the folder: the folder is the news
                    self.failure = problem
            return self.failure

    def _stop(self, problem: str) -> None:
        """The folder stopped taking the run: stop writing, and say so once."""
        self.failure = problem
        if self.on_failure is not None:
            self.on_failure(self.failure)

    def _update(self, ev: Any) -> None:
        if isinstance(ev, ev_types.StepEnd):
            self._write_pending()
            self._pending = {c: getattr(ev, c, None) for c in METRIC_COLUMNS}
        elif isinstance(ev, ev_types.Eval):
            if self._pending is not None and self._pending["step"] == ev.step:
                self._pending["val_loss"] = ev.val_loss
            else:
                self._write_pending()
                self._pending = {"step": ev.step, "val_loss": ev.val_loss}
            self._write_pending()
        summarize(self.summary, ev)
        if isinstance(ev, (ev_types.RunFinished, ev_types.RunFailed)):
            self._finish()

    def _write_pending(self) -> None:
        if self._pending is not None:
            row = [self._pending.get(c) for c in METRIC_COLUMNS]
            self._csv.writerow(["" if v is None else v for v in row])
            self._metrics.flush()
            self._pending = None

    def _finish(self) -> None:
        self._write_pending()
        self.summary["ended_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if self.summary["wall_s"] is None:
            self.summary["wall_s"] = round(time.monotonic() - self._started, 3)
        text = json.dumps({k: _finite(v) for k, v in self.summary.items()}, indent=2) + "\n"
        # atomic_write, not atomic_write_text: that one would make a removed run folder again
        atomic_file.atomic_write(self.run_dir / "summary.json", lambda f: f.write(text.encode("utf-8")))

    def close(self) -> None:
        """Flush everything and write summary.json; a run that never finished is marked "stopped". After
        a write failure, summary.json is still attempted (a freed disk takes it) and says what happened."""
        with self._lock:
            if self._closed:
                return
            if self.failure is not None and self.summary["status"] not in ("failed", "interrupted"):
                self.summary.update(status="failed", error=f"recording stopped: {self.failure}")
            if self.summary["status"] == "running":
                self.summary["status"] = "stopped"
            self._closed = True
            # no summary.json into a folder made later under the same name: it holds another run, or none
            finishers = (self._events.close, self._metrics.close) if self.vanished else (
                self._finish, self._events.close, self._metrics.close)
            for finish in finishers:
                with contextlib.suppress(OSError):
                    finish()
            lock.release(self._run_lock, self.run_dir)

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _identity(path: Path) -> tuple[int, int]:
    """(device, inode): the same name may later be another file or folder."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def read_events(run_dir: str | Path) -> list:
    """The events of a run, in order, for replay. A cut-off last line (a crash mid-write) is ignored;
    anything else that is not an event is an EventError naming the file, the line and the problem. Older
    recordings read as today's events (engine.run.legacy_events)."""
    path = Path(run_dir) / "events.jsonl"
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise EventError(f"{path}: no such file; a run folder holds the events.jsonl it recorded") from None
    except UnicodeDecodeError as exc:
        bad_line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise EventError(f"{path}:{bad_line}: not UTF-8 text (byte {exc.start}); the file is "
                         "damaged") from None
    except OSError as exc:
        raise EventError(f"{path}: cannot read it ({exc.strerror or exc}); it must be the run's event "
                         "log file") from None
    lines = text.split("\n")
    events, legacy = [], LegacyFields()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            events.append(from_json(legacy.take(json.loads(line))))
        except (ValueError, TypeError, RecursionError) as exc:  # JSON and Event errors are ValueErrors
            if number == len(lines):  # no newline after it: the writer stopped mid-line
                break
            what = f"not JSON ({exc})" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise EventError(f"{path}:{number}: {what}") from None
    return legacy.apply(events)


@dataclass(frozen=True)
class RunInfo:
    run_dir: Path
    run_id: str
    preset: str | None
    # "finished" | "failed" | "interrupted" | "stopped" (closed before its end) | "running" | "unreadable" |
    # "damaged summary.json: <what>" (its figures then come from events.jsonl, as for a run without one)
    status: str
    steps: int | None
    final_val_loss: float | None
    best_val_loss: float | None
    tokens_per_s: float | None
    wall_s: float | None
    summary: dict = field(default_factory=dict, repr=False)


def list_runs(out_dir: str | Path = "runs") -> list[RunInfo]:
    """Run folders under out_dir, newest first, with key figures from their summary.json (or, while a
    run has none, from its events.jsonl). A damaged summary.json is that one run's status, never an error:
    "damaged summary.json: steps is not a number", with the figures its events.jsonl gives."""
    root = Path(out_dir)
    runs = []
    for run_dir in sorted(root.iterdir() if root.is_dir() else [], reverse=True):
        if not (run_dir / "events.jsonl").is_file():
            continue
        summary, damage = _read_summary(run_dir)
        if damage is not None:
            try:
                summary = _summary_from_events(run_dir)
            except (OSError, ValueError, RecursionError):
                summary = {}
        status = f"damaged summary.json: {damage}" if damage else summary.get("status", "unreadable")
        runs.append(RunInfo(run_dir, run_dir.name, summary.get("preset"), status, summary.get("steps"),
                            summary.get("final_val_loss"), summary.get("best_val_loss"),
                            summary.get("tokens_per_s"), summary.get("wall_s"), summary))
    return runs


def _read_summary(run_dir: Path) -> tuple[dict, str | None]:
    """(the run's figures, what is wrong with its summary.json or None); {} when neither they nor its
    events.jsonl can be read."""
    path = run_dir / "summary.json"
    if path.is_dir():
        return {}, "a folder, not a file"
    if not path.is_file():
        try:
            return _summary_from_events(run_dir), None
        except (OSError, ValueError, RecursionError):
            return {}, None
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return {}, f"cannot be read ({exc.strerror or exc})"
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError too
        return {}, "not JSON"
    return (summary, None) if (problem := summary_problem(summary)) is None else ({}, problem)


def _summary_from_events(run_dir: Path) -> dict[str, Any]:
    """The figures of a run without summary.json so far. It is "running" while events.jsonl keeps
    changing; silent for INTERRUPTED_AFTER_S with no end event, its process is gone: "interrupted"."""
    silent_s = time.time() - (run_dir / "events.jsonl").stat().st_mtime
    summary = new_summary(run_dir.name, None)
    for event in read_events(run_dir):
        summarize(summary, event)
    if summary["status"] == "running" and silent_s > INTERRUPTED_AFTER_S:
        summary["status"] = "interrupted"
    return summary
