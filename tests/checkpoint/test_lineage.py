"""A resumed run is linked to the run it continues (engine.run.lineage): its History holds the parent's
steps and evaluations up to the checkpoint (and the grandparent's before them), summary.json names the
parent and measures the improvement from the lineage's first evaluation, `runs` shows parent -> child, and
compare draws the whole lineage. The original folder stays as it was."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from engine.run.job import resume_training
from engine.run.recorder import read_events
from nanodist_tui.cli import app
from nanodist_tui.compare import read_run
from tests.run_helpers import train


def _points(events, kind: str) -> list:
    if kind == "step_end":
        return [[e.step, e.loss, e.lr, e.grad_norm] for e in events if e.kind == kind and not e.skipped]
    return [[e.step, e.val_loss] for e in events if e.kind == kind]


def test_a_resumed_run_carries_its_whole_lineage(tmp_path: Path):
    first, first_events = train(tmp_path, "train.eval_every=2")
    parent = Path(first["run_dir"])
    before = {p.name: p.read_bytes() for p in parent.iterdir() if p.is_file()}
    # from the step-4 checkpoint of a 6-step run: the parent's steps 5 and 6 are not this lineage's
    second = resume_training(parent, ["train.steps=8"], step=4)
    child = Path(second["run_dir"])
    assert {p.name: p.read_bytes() for p in parent.iterdir() if p.is_file()} == before  # left as it was

    child_events = read_events(child)
    history = next(e for e in child_events if e.kind == "history")
    kinds = [e.kind for e in child_events if e.kind not in ("phase", "log")]
    assert kinds[:2] == ["run_started", "history"]  # right after RunStarted, before any step
    assert (history.parent, history.step) == (str(parent), 4)
    assert history.steps == [p for p in _points(first_events, "step_end") if p[0] <= 4]
    assert history.evals == [p for p in _points(first_events, "eval") if p[0] <= 4]

    summary = json.loads((child / "summary.json").read_text())
    lineage_start = _points(first_events, "eval")[0][1]
    assert (summary["parent"], summary["resumed_at"]) == (str(parent), 4)
    assert summary["initial_val_loss"] == second["initial_val_loss"] == lineage_start
    evals = history.evals + _points(child_events, "eval")
    assert summary["best_val_loss"] == min(v for _, v in evals)

    # a grandchild's history reaches back to the first run's first step, without the parent's steps 5-6
    third = resume_training(child, ["train.steps=10"])
    grand = next(e for e in read_events(third["run_dir"]) if e.kind == "history")
    assert [p[0] for p in grand.steps] == list(range(1, 9))
    assert grand.steps[:4] == history.steps and grand.evals[0][1] == lineage_start
    assert third["initial_val_loss"] == lineage_start

    figures = read_run(Path(third["run_dir"]))  # compare draws the whole lineage
    assert [s for s, _ in figures.train] == list(range(1, 11))

    listing = CliRunner().invoke(app, ["runs", "-o", str(tmp_path)]).output
    row = next(line for line in listing.splitlines() if line.split()[0] == child.name)
    assert f"  {parent.name} @ step 4  " in row
    row = next(line for line in listing.splitlines() if line.split()[0] == parent.name)
    assert " @ step " not in row


def test_the_workbench_curves_start_where_the_lineage_does():
    from engine.events import History, RunStarted
    from nanodist_tui.messages import Tick
    from nanodist_tui.run_info import RunInfo
    from nanodist_tui.widgets.loss_plot import LossPlot
    from nanodist_tui.widgets.metric_plot import MetricPlot
    info = RunInfo.from_started(RunStarted(run_id="c", preset="quickstart", config={}, n_params=1,
                                           world_size=1, total_steps=8, first_step=4))
    history = History(parent="runs/p", step=4, steps=[[s, 5.0 - s / 10, 1e-3, 1.0 + s] for s in range(1, 5)],
                      evals=[[0, 5.0], [4, 4.5]])
    tick = Tick(0, (), 0, {}, {}, {}, (history,))
    loss, grad = LossPlot(info), MetricPlot(info, "grad_norm", "gradient norm", "magenta")
    assert loss.collect(tick) and grad.collect(tick)
    assert loss.train.points(100)[0] == [1, 2, 3, 4] and loss.val.points(100)[1] == [5.0, 4.5]
    assert grad.history.points(100)[1] == [2.0, 3.0, 4.0, 5.0]
    assert loss.first_step == grad.first_step == 0  # the step axis starts at the lineage's start, not at 4
