"""Headless sweep progress and results: one line per finished trial (number, state, value, best so far,
the sampled parameters, duration), above a rich progress bar of trials on a terminal; plain lines
anywhere else (rich's live display only prints its last frame off a terminal). The trials' own training
progress is not printed: their run folders hold it.

`result_lines` words a study's trials and its best trial (or Pareto front) once, for the end of a sweep,
for `nanodist-tui sweep show` and for the workbench's sweep screen (`sweep_results` reads them from a sweep).
"""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine import events as ev
from engine.run.printable import printable
from nanodist_tui.describe import describe, number, params_text, scores_text
from nanodist_tui.headless import LinePrinter


class SweepPrinter(LinePrinter):
    """An event subscriber that reports a sweep on stdout."""

    def __call__(self, event) -> None:
        if isinstance(event, ev.SweepStarted):
            self._print(describe(event).text)
            if self.live:
                self._start_bar(event)
        elif isinstance(event, ev.TrialStarted) and self._progress is not None:
            status = printable(f"trial {event.number}: {params_text(event.params)}")
            self._progress.update(self._task, status=status)
        elif isinstance(event, ev.TrialFinished) and event.resumed:
            return  # the SweepStarted line counts the trials a resumed sweep already holds
        elif isinstance(event, (ev.TrialFinished, ev.Log)):
            self._print(describe(event).text)
            if isinstance(event, ev.TrialFinished) and self._progress is not None:
                self._progress.advance(self._task)
        elif isinstance(event, ev.SweepFinished):
            self.close()
            self._print(describe(event).text)

    def _start_bar(self, e: ev.SweepStarted) -> None:
        total = max(0, e.n_trials - e.existing) if e.n_trials else None
        self._progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[status]}", markup=False), TimeElapsedColumn(),
                                  console=self.console, transient=False)
        self._task = self._progress.add_task("trials", total=total, status="")
        self._progress.start()


def result_lines(rows: list[dict], metrics: list[str], directions: list[str], best: list[int],
                 storage: str, trials_csv: str) -> list[str]:
    """A study's trials as a table, then its best trial or Pareto front, then where to look further."""
    header = ["trial", "state", *metrics, "steps", "time", "parameters / reason"]
    table = [header]
    for row in rows:
        detail = params_text(row["params"]) + (f"  ({row['reason']})" if row["reason"] else "")
        duration = "-" if row["duration_s"] is None else f"{row['duration_s']:.1f}s"
        table.append([str(row["number"]), row["state"], *(_cell(row.get(m)) for m in metrics),
                      _cell(row["steps"]), duration, detail])
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in table]
    by_number = {row["number"]: row for row in rows}
    goal = ", ".join(f"{d} {m}" for m, d in zip(metrics, directions))
    if not best:
        lines.append(f"no trial has completed yet ({goal})")
    elif len(metrics) == 1:
        row = by_number[best[0]]
        lines.append(f"best trial {best[0]} ({goal}): {scores_text(metrics, [row[m] for m in metrics])}; "
                     f"{params_text(row['params'])}")
        if row["run_dir"]:
            lines.append(f"  run folder {row['run_dir']}")
    else:
        lines.append(f"Pareto front ({goal}), {len(best)} trial(s):")
        for n in best:
            row = by_number[n]
            lines.append(f"  trial {n}: {scores_text(metrics, [row[m] for m in metrics])}; "
                         f"{params_text(row['params'])}")
    lines.append(f"trials.csv     {trials_csv}")
    lines.append(f"dashboard      optuna-dashboard {storage}")
    return lines


def _cell(value) -> str:
    return "-" if value is None else number(value)


def sweep_results(swept) -> list[str]:
    """`result_lines` for a stored sweep (engine.sweep.study.Sweep); its study's errors raise (SweepError)."""
    from engine.sweep.results import TRIALS_CSV, best_trials, trial_row
    from engine.sweep.study import load_study
    stored = load_study(swept)
    rows = [trial_row(t, swept.metrics) for t in stored.get_trials(deepcopy=False)]
    best = [t.number for t in best_trials(stored)]
    return result_lines(rows, swept.metrics, swept.directions, best, swept.storage.describe(swept.sweep_dir),
                        str(swept.sweep_dir / TRIALS_CSV))
