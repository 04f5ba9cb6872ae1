"""One run folder whose summary.json is damaged (wrong-typed fields, a list, not JSON) is that folder's
problem, shown as its status, while every other folder lists as before: in `nanodist-tui runs` and in the
workbench's run picker. The damaged run's figures come from its events.jsonl, as for a run without one."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import DataTable

from engine import events as ev
from engine.run.recorder import RunRecorder, list_runs
from nanodist_tui.screens.open_run import OpenRunScreen
from tests.cli_helpers import invoke

# what the damage is -> (what summary.json then holds, the status `runs` shows for it)
DAMAGE = {
    "steps as text": ({"steps": "ten"}, "damaged summary.json: steps is not a number (text)"),
    "steps as a fraction": ({"steps": 10.5}, "damaged summary.json: steps is not a whole number"),
    "steps as true": ({"steps": True}, "damaged summary.json: steps is not a number (true/false)"),
    "status null": ({"status": None}, "damaged summary.json: status is missing"),
    "status a number": ({"status": 3}, "damaged summary.json: status is not text (a number)"),
    "loss as text": ({"final_val_loss": "low"},
                     "damaged summary.json: final_val_loss is not a number (text)"),
    "wall time a list": ({"wall_s": [1, 2]}, "damaged summary.json: wall_s is not a number (a list)"),
    "total steps an object": ({"total_steps": {}},
                              "damaged summary.json: total_steps is not a number (an object)"),
    "parent a number": ({"parent": 7}, "damaged summary.json: parent is not text (a number)"),
    "peak memory a list": ({"peak_memory": []},
                           "damaged summary.json: peak_memory is not an object (a list)"),
    "a list": ([1, 2, 3], "damaged summary.json: a list, not an object"),
    "null": (None, "damaged summary.json: null, not an object"),
    "not JSON": ("{\"steps\": 3,", "damaged summary.json: not JSON"),
}


def recorded(out_dir: Path, name: str, steps: int) -> Path:
    """A real finished run folder, as the recorder writes it: steps of loss 2.0, one evaluation."""
    with RunRecorder(out_dir, name, {}) as rec:
        rec(ev.RunStarted(run_id=rec.run_id, preset=name, config={}, n_params=10, world_size=1,
                          total_steps=steps))
        for n in range(1, steps + 1):
            rec(ev.StepEnd(step=n, loss=2.0, lr=1e-3, tokens=32, step_time_s=0.5, tokens_per_s=64.0,
                           grad_norm=0.25))
        rec(ev.Eval(step=steps, val_loss=1.5))
        rec(ev.RunFinished(steps=steps, initial_val_loss=None, final_val_loss=1.5, tokens_per_s=64.0,
                           wall_s=1.0, run_dir=str(rec.run_dir)))
    return rec.run_dir


@pytest.fixture
def three_runs(tmp_path) -> tuple[Path, Path, Path]:
    """Three finished runs; the middle one's summary.json is the one a test damages."""
    return recorded(tmp_path, "first", 3), recorded(tmp_path, "middle", 4), recorded(tmp_path, "last", 5)


def damage(run_dir: Path, kind: str) -> str:
    content, status = DAMAGE[kind]
    path = run_dir / "summary.json"
    if isinstance(content, dict):  # one field changed in the real summary
        path.write_text(json.dumps({**json.loads(path.read_text()), **content}))
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return status


def table_of(output: str) -> dict[str, list[str]]:
    """`runs` output: run id -> its cells (split on the two-space column gaps)."""
    lines = output.splitlines()
    assert lines[0].split()[:2] == ["RUN", "STATUS"], output
    return {line.split("  ")[0]: [c.strip() for c in line.split("  ") if c.strip()] for line in lines[1:]}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_runs_lists_every_folder_and_names_the_damaged_summary(tmp_path, three_runs, kind):
    first, middle, last = three_runs
    status = damage(middle, kind)
    result = invoke("runs", "--out-dir", tmp_path)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    rows = table_of(result.output)
    assert set(rows) == {first.name, middle.name, last.name}
    assert rows[first.name][1:3] == ["finished", "3/3"] and rows[last.name][1:3] == ["finished", "5/5"]
    assert rows[middle.name][1] == status
    # the damaged run's figures come from its events.jsonl: 4 steps of 4, its evaluation 1.5
    assert rows[middle.name][2:4] == ["4/4", "1.5000"], rows[middle.name]


def test_list_runs_gives_the_damaged_run_well_typed_figures(tmp_path, three_runs):
    damage(three_runs[1], "steps as text")
    info = {r.run_dir: r for r in list_runs(tmp_path)}[three_runs[1]]
    assert (info.status, info.steps, info.final_val_loss, info.tokens_per_s) == (
        DAMAGE["steps as text"][1], 4, 1.5, 64.0)
    assert info.summary["steps"] == 4  # what the other readers of RunInfo.summary format


class _Picker(App):
    def __init__(self, out_dir: Path) -> None:
        super().__init__()
        self.out_dir = out_dir

    def on_mount(self) -> None:
        self.push_screen(OpenRunScreen(1, self.out_dir))


@pytest.mark.parametrize("kind", ["steps as text", "a list", "not JSON"])
def test_the_run_picker_lists_the_damaged_run_too(tmp_path, three_runs, kind):
    status = damage(three_runs[1], kind)

    async def scenario() -> list[list[str]]:
        app = _Picker(tmp_path)
        async with app.run_test() as pilot:
            await pilot.pause()
            table = app.screen.query_one(DataTable)
            return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]

    rows = {row[1]: row for row in asyncio.run(scenario())}
    assert set(rows) == {run.name for run in three_runs}
    assert rows[three_runs[1].name][2:4] == [status, "4"]
    assert rows[three_runs[0].name][2:4] == ["finished", "3"]
