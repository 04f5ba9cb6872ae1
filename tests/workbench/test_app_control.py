"""Run control in the workbench: the preset picker with descriptions, the form checked as you type with the
command line's own messages, 'will it fit?' with the estimator's figures, save as a preset (comments kept),
start (asking before it stops the run going), and every action and pane in the palette."""

from __future__ import annotations

import pytest
import tomlkit
from textual.widgets import Input, OptionList, Select, Static
from typer.testing import CliRunner

from engine.config import presets
from engine.memory.estimator import estimate
from nanodist_tui.app import NanoDistApp
from nanodist_tui.cli import app as cli
from nanodist_tui.screens.confirm import ConfirmScreen
from nanodist_tui.screens.fit_table import FitTable
from nanodist_tui.screens.new_run import NewRunScreen
from nanodist_tui.widgets.memory_pane import style_of
from nanodist_tui.widgets.units import format_bytes
from tests.app_helpers import FakeJob, run, wait_for

# Whole screens drawn many times over: out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow


class JobFactory:
    """make_job for the app: records the configs it was asked to run and runs a fake job for each."""

    def __init__(self) -> None:
        self.configs: list = []

    def __call__(self, cfg, doc):
        self.configs.append(cfg)
        return FakeJob(steps=3, world_size=cfg.parallel.world_size, dtype=cfg.precision.dtype)


def form(app: NanoDistApp) -> NewRunScreen:
    assert isinstance(app.screen, NewRunScreen)
    return app.screen


async def type_into(pilot, screen: NewRunScreen, key: str, text: str) -> None:
    field = screen.query_one(f"#field-{key.replace('.', '-')}", Input)
    field.value = text
    await pilot.pause(0.1)


def error_line(screen: NewRunScreen) -> str:
    return str(screen.query_one("#form-error", Static).content)


def cli_error(*sets: str) -> str:
    """What the command line says about the same override."""
    args = ["presets", "new", "probe", "--from", "quickstart"]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    return result.output.strip().removeprefix("error: ")


def test_the_form_checks_as_you_type_with_the_clis_messages(in_tmp):
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        await pilot.press("n")
        screen = form(app)
        picker = screen.query_one(OptionList)
        names = [str(picker.get_option_at_index(i).id) for i in range(picker.option_count)]
        assert names == [p.name for p in presets.list_presets() if p.error is None]
        quick = picker.get_option_at_index(names.index("quickstart")).prompt
        assert presets.load_preset("quickstart")[0].description in str(quick)  # each with its description
        steps = presets.load_preset("quickstart")[0].train.steps
        assert screen.query_one("#field-train-steps", Input).value == str(steps)
        assert "ok: the settings are valid" in error_line(screen)
        await type_into(pilot, screen, "train.steps", "0")
        assert error_line(screen) == cli_error("train.steps=0")
        await type_into(pilot, screen, "train.steps", "many")
        assert error_line(screen) == cli_error("train.steps=many")
        await type_into(pilot, screen, "train.steps", "50")
        await type_into(pilot, screen, "train.global_batch", "30")
        screen.query_one("#field-parallel-world_size", Input).value = "4"
        both = cli_error("train.steps=50", "train.global_batch=30", "parallel.world_size=4")
        await wait_for(pilot, lambda: error_line(screen) == both)  # once the form hears of the change
        await pilot.press("escape")
        assert not isinstance(app.screen, NewRunScreen)

    run(scenario, FakeJob(steps=0, then="wait_for_stop"), make_job=JobFactory())


def test_will_it_fit_shows_the_estimate_per_rank_and_category(in_tmp):
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        await pilot.press("n")
        screen = form(app)
        screen.query_one("#field-parallel-world_size", Input).value = "4"
        screen.query_one("#field-parallel-zero_stage", Select).value = 3
        screen.query_one("#field-precision-dtype", Select).value = "fp16"
        screen.query_one("#field-memory-checkpointing", Input).value = "blocks"
        cfg, _, _ = presets.load_preset("quickstart", ["parallel.world_size=4", "parallel.zero_stage=3",
                                                       "precision.dtype=fp16", "memory.checkpointing=blocks"])
        e = estimate(cfg)
        shape = f"4 rank(s) on {cfg.parallel.backend} · ZeRO-3 · fp16 · checkpointing blocks"
        await wait_for(pilot, lambda: shape in str(screen.query_one(FitTable).content))  # every change heard
        text = str(screen.query_one(FitTable).content)
        peaks = e.category_peaks()
        rows = [line for line in text.splitlines() if line.startswith("rank ")]
        assert [line.split()[1] for line in rows] == ["0", "1", "2", "3"]  # a row per rank
        header = next(line for line in text.splitlines() if line.startswith("estimated, per rank"))
        for category, amount in peaks.items():
            if amount:
                assert style_of(category)[0][:12] in header and format_bytes(amount) in rows[0]
        assert format_bytes(sum(e.peak()[1].values())) in rows[0]
        assert "fits:" in text  # a small GPT on four ranks fits in this machine's memory

    run(scenario, FakeJob(steps=0, then="wait_for_stop"), make_job=JobFactory())


def test_save_as_a_preset_keeps_every_comment(in_tmp):
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        await pilot.press("n")
        screen = form(app)
        await type_into(pilot, screen, "optim.lr", "1e-3")
        screen.query_one("#save-name", Input).value = "mine"
        screen.save()
        await pilot.pause(0.1)

    run(scenario, FakeJob(steps=0, then="wait_for_stop"), make_job=JobFactory())
    new = (in_tmp / "presets" / "mine.toml").read_text().splitlines()
    old = presets.find_preset("quickstart").read_text().splitlines()
    changed = [(a, b) for a, b in zip(old, new) if a != b]
    assert len(new) == len(old) and len(changed) == 2  # the name and the learning rate, comments kept
    assert changed[0][1].startswith('name = "mine"') and changed[1][1].startswith("lr = 1e-3 ")
    assert changed[1][0].split("#", 1)[1] == changed[1][1].split("#", 1)[1]
    assert tomlkit.parse("\n".join(new))["optim"]["lr"] == 1e-3


def test_start_asks_before_stopping_the_run_going_and_then_runs_the_form(in_tmp):
    factory = JobFactory()
    first = FakeJob(steps=0, then="wait_for_stop")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "running")
        await pilot.press("n")
        screen = form(app)
        screen.query_one("#field-parallel-world_size", Input).value = "2"
        await type_into(pilot, screen, "train.steps", "3")
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, ConfirmScreen)  # a run is going: stop it first?
        await pilot.press("y")
        await wait_for(pilot, lambda: len(factory.configs) == 1 and app.session.job_fn is not first)
        await wait_for(pilot, lambda: app.session.state == "finished")
        assert first.saw_stop.is_set()  # the first run was stopped (its checkpoint kept) before this one
        cfg = factory.configs[0]
        assert (cfg.name, cfg.train.steps, cfg.parallel.world_size) == ("quickstart", 3, 2)
        assert [t.removeprefix("tab-") for t in app.workspace.tab_ids] == [
            "overview", "curves", "memory", "traffic", "ranks", "log", "mesh"]  # the new run's own layout

    run(scenario, first, make_job=factory)


def test_a_run_the_machine_cannot_start_is_one_line_in_the_form(in_tmp):
    def refuse(cfg) -> None:
        raise FileNotFoundError("data.path: no such file big.txt; give a readable text file")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        await pilot.press("n")
        screen = form(app)
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, NewRunScreen)  # not started
        assert error_line(screen) == "data.path: no such file big.txt; give a readable text file"

    run(scenario, FakeJob(steps=0, then="wait_for_stop"), make_job=JobFactory(), check_run=refuse)


def test_a_preset_that_is_not_a_regular_file_is_one_line_in_the_form(in_tmp):
    """A FIFO among the presets (opening it would wait for a writer forever) is listed, and choosing it says
    what it is in the form's error line; the workbench goes on."""
    import os
    (in_tmp / "presets").mkdir(exist_ok=True)
    os.mkfifo(in_tmp / "presets" / "pipe.toml")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        await pilot.press("n")
        screen = form(app)
        screen.load(in_tmp / "presets" / "pipe.toml")
        await wait_for(pilot, lambda: "pipe.toml" in error_line(screen) and "FIFO" in error_line(screen))
        assert app.is_running and isinstance(app.screen, NewRunScreen)

    run(scenario, FakeJob(steps=0, then="wait_for_stop"), make_job=JobFactory())
