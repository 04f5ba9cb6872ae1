"""tokens/s has one definition (engine.run.throughput): the run's summary.json (what `runs` lists), the
compare screen, the workbench header once the run has ended, the headless summary and the trainer's own
RunFinished figure are the same number for one run (issue 27: `runs` said 28,433 and compare 30,209)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.events import RunStarted, StepEnd
from engine.run import throughput
from nanodist_tui.compare import read_run
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.run_header import RunHeader
from tests.run_helpers import train


def _step(step: int, tokens: int, seconds: float) -> StepEnd:
    return StepEnd(step=step, loss=1.0, lr=1e-3, tokens=tokens, step_time_s=seconds,
                   tokens_per_s=tokens / seconds, grad_norm=1.0)


def _tick(steps: tuple = (), events: tuple = ()) -> Tick:
    return Tick(0, steps, 0, {}, {}, {}, events)


def test_throughput_is_tokens_over_step_seconds_not_a_mean_of_rates():
    steps = [_step(1, 100, 1.0), _step(2, 100, 3.0)]  # rates 100 and 33.3: their mean or median is 66.7
    assert throughput.of_steps(steps) == pytest.approx(200 / 4.0)
    assert throughput.of_steps([]) is None


def test_every_place_shows_the_same_tokens_per_s(tmp_path: Path):
    summary, events = train(tmp_path, "train.steps=6")
    run_dir = Path(summary["run_dir"])
    steps = [e for e in events if isinstance(e, StepEnd)]
    reference = sum(e.tokens for e in steps) / sum(e.step_time_s for e in steps)
    recorded = json.loads((run_dir / "summary.json").read_text())["tokens_per_s"]
    finished = next(e for e in events if e.kind == "run_finished").tokens_per_s
    header = RunHeader("quickstart")  # the steps alone (a replay cut short has no RunFinished), then all
    header.ingest(_tick(steps=tuple(steps), events=(next(e for e in events if isinstance(e, RunStarted)),)))
    header.set_state("stopped")
    from_steps = header.tokens_per_s()
    header.ingest(_tick(events=tuple(e for e in events if e.kind == "run_finished")))
    for shown in (recorded, read_run(run_dir).tokens_per_s, from_steps, header.tokens_per_s(),
                  summary["tokens_per_s"], finished):
        assert shown == pytest.approx(reference, rel=1e-12)
