"""The CLI's other commands have a place in the workbench too: a stored sweep's results (what `sweep show`
prints) and its best trial exported as a preset (what `sweep export-best` writes), and a run's model served
over HTTP (what `serve` does), all from the palette."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from engine.config import presets
from engine.sweep.study import load_study, load_sweep
from nanodist_tui.app import NanoDistApp
from nanodist_tui.screens.sweeps import SweepsScreen
from nanodist_tui.serve import missing_library
from tests.app_helpers import FakeJob, run, wait_for
from tests.cli_helpers import invoke
from tests.run_helpers import gpt_and_mlp_runs
from tests.sweep_helpers import SPACE, write_preset


def palette_titles(app: NanoDistApp) -> list[str]:
    return [c.title for c in app.get_system_commands(app.screen)]


def test_sweep_results_show_what_sweep_show_prints_and_export_the_best(in_tmp):
    assert invoke("sweep", "--no-ui", "--preset", write_preset(in_tmp, SPACE), "--trials", "2").exit_code == 0
    shown = invoke("sweep", "show", "cli")
    assert shown.exit_code == 0, shown.output
    (in_tmp / "presets").mkdir()
    (in_tmp / "presets" / "taken.toml").write_text("name = 'taken'\n")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        assert "Sweep results" in palette_titles(app)
        app.action_sweeps()
        await pilot.pause(0.2)
        screen = app.screen
        assert isinstance(screen, SweepsScreen) and [p.name for p in screen.sweep_dirs] == ["sweep-cli"]
        await pilot.press("e")  # nothing picked yet: it says what to do
        assert "pick a sweep first" in str(screen.query_one("#sweeps-message").content)
        await pilot.press("enter")  # the first (only) sweep
        await wait_for(pilot, lambda: screen.swept is not None)
        results = str(screen.query_one("#sweeps-results").content)
        assert results.split() == shown.output.split()  # the CLI's own lines, word for word
        await pilot.press("e")
        await pilot.press(*"taken", "enter")  # an existing preset is not overwritten
        assert "presets/taken.toml exists" in str(screen.query_one("#sweeps-message").content)
        assert (in_tmp / "presets" / "taken.toml").read_text() == "name = 'taken'\n"
        screen.query_one("#sweeps-name").value = ""
        await pilot.press(*"best-lr", "enter")
        await wait_for(pilot, lambda: "wrote presets/best-lr.toml" in str(screen.query_one("#sweeps-message")
                                                                            .content))

    run(scenario, FakeJob(steps=0, then="wait_for_stop"))
    sweep = load_sweep(in_tmp / "runs" / "sweep-cli")
    best = min(load_study(sweep).get_trials(deepcopy=False), key=lambda t: t.values[0])
    cfg = presets.load_preset(str(in_tmp / "presets" / "best-lr.toml"))[0]
    assert cfg.optim.lr == best.params["optim.lr"]
    assert cfg.optim.warmup_steps == best.params["optim.warmup_steps"]
    assert "# " in (in_tmp / "presets" / "best-lr.toml").read_text()  # the swept preset's comments kept


@pytest.mark.skipif(missing_library() is not None, reason=f"needs the serve extra: {missing_library()}")
def test_a_runs_model_is_served_from_the_palette_and_stopped(tmp_path):
    runs = gpt_and_mlp_runs(tmp_path)
    seen: dict = {}

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        assert "Serve a run's model" in palette_titles(app) and "Stop serving" not in palette_titles(app)
        app._serve_chosen([runs["mlp"]])  # what picking the MLP run in the run list does
        await wait_for(pilot, lambda: any("serve needs a GPT run" in n.message for n in app._notifications))
        assert app.model_server is None
        app._serve_chosen([runs["gpt"]])
        await wait_for(pilot, lambda: app.model_server is not None, timeout=30)
        url = app.model_server.url
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{url}/health", timeout=10) as reply:
            seen["health"] = reply.status
        with urllib.request.urlopen(f"{url}/info", timeout=10) as reply:
            seen["info"] = json.loads(reply.read())
        assert "Stop serving" in palette_titles(app)
        app.action_stop_serving()
        assert app.model_server is None
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{url}/health", timeout=2)

    run(scenario, FakeJob(steps=0, then="wait_for_stop"))
    assert seen["health"] == 200
    assert str(runs["gpt"]) in json.dumps(seen["info"])  # the model it serves is that run's
