"""The device mesh in the workbench: the grid and group logic (nanodist_tui/mesh_grid.py, mesh_groups.py)
against layouts written out by hand, the mesh tab (snapshots at 80x24 and 160x50, nothing cut, scrolled to
its end), the rank table's coordinates, the new-run form's degrees, the layout in summary.json and the
headless summary, and the mesh tab in a real terminal (tmux) at 80x24.

A layout this release may not train (world 8 = dp 2 x pp 2 x tp 2) is drawn from a synthetic event stream:
its config names the degrees, and its Traffic events book bytes under the mesh's group names as the meter
books a real run's (engine.parallel.mesh.Mesh.group_name). After a deliberate change of the picture:
pytest tests/workbench/test_mesh_view.py --snapshot-update."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from engine.config import ConfigError, presets
from engine.events import RankStats, RunFinished, RunStarted, StepEnd, Traffic, to_json
from engine.parallel.mesh import Mesh
from engine.run.recorder import RunRecorder
from engine.run.summary import summary_problem
from nanodist_tui.headless import summary_lines
from nanodist_tui.mesh_grid import grid_lines, grid_of, layout_text, rank_coords, rank_formula
from nanodist_tui.mesh_groups import group_kinds, link_of, meter_members, unknown_groups
from nanodist_tui.shots import replay_app, settle
from nanodist_tui.widgets.mesh_pane import MeshPane
from nanodist_tui.widgets.rank_table import RankTable
from tests.app_helpers import SIZE, SMALL, TEST_PANE_INTERVAL_S, FakeJob, demo_events, screen_text, wait_for

REPO = Path(__file__).resolve().parents[2]
SIZES = pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])
# per rank and step: what each kind of group sends (bytes), and under which phase the meter books it
SENDS = (("tp", "tp-fwd-all-reduce", 1_048_576), ("dpcp", "reduce-scatter", 200_000), ("pp", "p2p", 65_536))


def mesh_events(world: int = 8, tp: int = 2, pp: int = 2, ranks_per_node: int = 4, steps: int = 3) -> list:
    """A run of this layout as the workbench receives it: each rank sends to the next member of its tp, dpcp
    and pp groups every step, booked under the group's name."""
    config = {"parallel": {"backend": "threads", "world_size": world, "tensor": tp, "pipeline": pp,
                           "ranks_per_node": ranks_per_node},
              "precision": {"dtype": "fp32"}, "memory": {"checkpointing": "none"}}
    mesh = Mesh(world, tp=tp, pp=pp)
    out: list = [RunStarted(run_id="r1", preset="mesh", config=config, n_params=100_000, world_size=world,
                            total_steps=steps)]
    for step in range(1, steps + 1):
        for rank in range(world):
            links = []
            for kind, phase, sent in SENDS:
                members = mesh.members(kind, rank)
                if len(members) > 1:
                    links.append({"src": rank, "dst": members[(members.index(rank) + 1) % len(members)],
                                  "phase": phase, "group": mesh.group_name(kind, rank), "algorithm": "ring",
                                  "bytes": sent, "seconds": 0.001})
            out.append(Traffic(step=step, rank=rank, links=links))
            out.append(RankStats(step=step, rank=rank, step_time_s=1.11, comm_wait_s=0.413,
                                 bytes_sent=sum(link["bytes"] for link in links)))
        out.append(StepEnd(step=step, loss=3.0, lr=1e-3, tokens=1000, step_time_s=1.11, tokens_per_s=900.0,
                           grad_norm=1.0))
    out.append(RunFinished(steps=steps, initial_val_loss=None, final_val_loss=None, tokens_per_s=900.0,
                           wall_s=3.3, run_dir=""))
    return out


# ---------------------------------------------------------------- the grid and the groups, by hand


def test_the_grid_lays_stages_and_replicas_down_and_tensor_ranks_across():
    grid = grid_of(Mesh(8, tp=2, pp=2))  # default order tp-cp-ep-dp-pp: rank = tp + 2 dp + 4 pp
    assert grid.row_axes == ("pp", "dp") and grid.column_axes == ("tp",)
    assert grid.rows == [{"pp": 0, "dp": 0}, {"pp": 0, "dp": 1}, {"pp": 1, "dp": 0}, {"pp": 1, "dp": 1}]
    assert grid.columns == [{"tp": 0}, {"tp": 1}]
    assert grid.cells == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # dp innermost: rank = dp + 2 tp + 4 pp, so a row's tensor partners are 2 apart
    assert grid_of(Mesh(8, tp=2, pp=2, order="dp-tp-cp-ep-pp")).cells == [[0, 2], [1, 3], [4, 6], [5, 7]]
    # context and tensor across, context outer: rank = tp + 2 cp + 4 dp
    both = grid_of(Mesh(8, tp=2, cp=2))
    assert both.columns == [{"cp": 0, "tp": 0}, {"cp": 0, "tp": 1}, {"cp": 1, "tp": 0}, {"cp": 1, "tp": 1}]
    assert both.cells == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_grid_as_text():
    assert grid_lines(Mesh(8, tp=2, pp=2), 76) == [
        "         tp0  tp1",
        "pp0 dp0    0    1",
        "pp0 dp1    2    3",
        "pp1 dp0    4    5",
        "pp1 dp1    6    7"]
    # one axis (data parallelism alone) lies on its side: one row of replicas
    assert grid_lines(Mesh(4), 76) == ["      dp0  dp1  dp2  dp3", "rank    0    1    2    3"]
    # too wide for the view: bands of whole columns, one below the other
    assert grid_lines(Mesh(6), 20) == ["      dp0  dp1  dp2", "rank    0    1    2", "",
                                       "      dp3  dp4  dp5", "rank    3    4    5"]
    # expert parallelism is no grid axis: each rank says its place in its EP group
    assert grid_lines(Mesh(4, tp=2, ep=2), 76) == ["       tp0    tp1",
                                                   "dp0  0 ep0  1 ep0",
                                                   "dp1  2 ep1  3 ep1"]


def test_coordinates_layout_and_rank_formula():
    mesh = Mesh(8, tp=2, pp=2)
    assert rank_coords(mesh, 5) == {"dp": 0, "pp": 1, "tp": 1}
    assert rank_coords(Mesh(4), 3) == {"dp": 3}
    assert rank_formula(mesh) == "rank = tp + 2*dp + 4*pp"
    assert rank_formula(Mesh(4)) == "rank = dp"
    assert rank_formula(Mesh(8, tp=2, pp=2, order="pp-dp-tp-cp-ep")) == "rank = pp + 2*dp + 4*tp"
    assert layout_text({"dp": 2, "pp": 2, "tp": 2, "cp": 1, "ep": 1}) == "dp 2 x pp 2 x tp 2"
    assert layout_text({"dp": 4, "pp": 1, "tp": 1, "cp": 1, "ep": 1}) == "dp 4"
    assert layout_text({"dp": 1, "tp": 1}) == "dp 1"
    assert layout_text({"dp": 4, "tp": 2, "ep": 2}, sequence_parallel=True) == \
        "dp 4 x tp 2, ep 2, sequence parallel"


def test_each_kind_of_group_its_link_and_its_bytes():
    mesh = Mesh(8, tp=2, pp=2)
    sent = {"tp0": 10, "tp1": 10, "tp2": 10, "tp3": 30, "pp0": 5, "world": 7, "node1": 3, "mystery9": 2}
    kinds, alone = group_kinds(mesh, 4, sent)
    assert alone == ["cp", "ep"]
    listed = {k.kind: k for k in kinds}
    assert list(listed) == ["tp", "dp", "pp", "dpcp", "edp", "world", "node"]
    assert listed["tp"].groups == [[0, 1], [2, 3], [4, 5], [6, 7]] and listed["tp"].link == "intra-node"
    assert listed["pp"].groups == [[0, 4], [1, 5], [2, 6], [3, 7]] and listed["pp"].link == "inter-node"
    assert listed["dp"].groups == [[0, 2], [1, 3], [4, 6], [5, 7]] and listed["dp"].link == "intra-node"
    assert listed["tp"].sent == {"tp0": 10, "tp1": 10, "tp2": 10, "tp3": 30}
    assert listed["pp"].sent == {"pp0": 5} and listed["dp"].sent == {}
    assert (listed["dpcp"].same_as, listed["edp"].same_as, listed["tp"].same_as) == ("dp", "dp", "")
    assert listed["world"].groups == [list(range(8))] and listed["world"].link == "inter-node"
    assert listed["node"].groups == [[4, 5, 6, 7]] and listed["node"].link == "intra-node"
    assert unknown_groups(mesh, 4, sent) == {"mystery9": 2}
    # data parallelism alone: the world is the dp group, on one node when ranks_per_node is 0
    dp_only, _ = group_kinds(Mesh(4), 0, {"world": 100})
    assert [(k.kind, k.link, k.same_as, k.sent) for k in dp_only] == [
        ("dp", "intra-node", "", {}), ("dpcp", "intra-node", "dp", {}), ("edp", "intra-node", "dp", {}),
        ("world", "intra-node", "dp", {"world": 100})]


def test_links_and_the_meters_own_communicators():
    assert link_of([[0, 1], [2, 3]], 2) == "intra-node"
    assert link_of([[0, 2], [1, 3]], 2) == "inter-node"
    assert link_of([[0, 1], [2, 5]], 4) == "mixed"
    assert link_of([[0], [1]], 1) == "-"  # one-rank groups send nothing
    assert link_of([[0, 7]], 0) == "intra-node"  # ranks_per_node 0: every rank on one node
    assert meter_members("node1", 8, 4) == [4, 5, 6, 7]
    assert meter_members("cross2", 8, 4) == [2, 6]
    assert meter_members("node2", 8, 4) is None and meter_members("tp0", 8, 4) is None


# ---------------------------------------------------------------- the mesh tab


async def show_tab(pilot, pane_id: str) -> None:
    """Once the replay has been shown: the tab of this pane, drawn."""
    await settle(pilot.app, pilot)
    await settle(pilot.app, pilot, pilot.app.workspace.tab_ids.index(f"tab-{pane_id}") + 1)


@pytest.mark.slow
@SIZES
def test_the_mesh_tab(snap_compare, size):
    async def show(pilot) -> None:
        await show_tab(pilot, "mesh")

    assert snap_compare(replay_app(mesh_events()), terminal_size=size, run_before=show)


@pytest.mark.slow
def test_the_mesh_tab_of_data_parallelism_alone(snap_compare):
    """The demo recording: 4 ranks, data parallel only, its traffic booked under "world" (a recording from
    before process groups)."""
    async def show(pilot) -> None:
        await show_tab(pilot, "mesh")

    assert snap_compare(replay_app(demo_events()), terminal_size=SMALL, run_before=show)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [(4, 2, 1), (8, 2, 2)], ids=["dp2-tp2", "dp2-pp2-tp2"])
def test_the_rank_table_gives_coordinates(snap_compare, layout):
    """At 80x24, every column in view: two axes by name, three by their initials."""
    world, tp, pp = layout

    async def show(pilot) -> None:
        await show_tab(pilot, "ranks")
        table = pilot.app.query_one("RankTable.tab-ranks", RankTable)
        assert table.virtual_size.width <= table.scrollable_content_region.width

    assert snap_compare(replay_app(mesh_events(world, tp, pp, ranks_per_node=0)), terminal_size=SMALL,
                        run_before=show)


@SIZES
def test_nothing_is_cut_and_the_end_is_in_reach(size):
    """Every line of the mesh fits its view, whatever the size; at 80x24 the groups run below the fold and
    End scrolls to them (the tab strip keeps the focus, as it does for every pane)."""
    app = replay_app(mesh_events())

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await show_tab(pilot, "mesh")
            pane = app.query_one("MeshPane.tab-mesh", MeshPane)
            lines = str(pane.view.content).splitlines()
            assert lines[0].startswith("8 ranks = dp 2 x pp 2 x tp 2")
            assert max(len(line) for line in lines) <= pane.view.content_region.width
            for row in ("tp        2      4  intra-node       2.1 MB    8.4 MB",
                        "pp        2      4  inter-node     131.1 kB  524.3 kB"):
                assert any(line.startswith(row) for line in lines), row
            await pilot.press("end")
            await wait_for(pilot, lambda: pane.scroll_y == pane.max_scroll_y)
            assert "same experts: their gradient reduce (= dp here)" in screen_text(app)

    import asyncio
    asyncio.run(main())


def test_the_rank_table_gives_coordinates_only_for_more_than_one_axis():
    from nanodist_tui.run_info import RunInfo
    two = RankTable(RunInfo.from_started(mesh_events(4, 2, 1)[0])).where
    assert two.heading == "rank dp tp" and two.cell(3) == "   3  1  1"
    three = RankTable(RunInfo.from_started(mesh_events()[0])).where  # initials: 80 columns hold it
    assert three.heading == "rank d p t" and three.cell(5) == "   5 0 1 1"
    plain = RankTable(RunInfo.from_started(demo_events()[0])).where
    assert plain.heading == "rank" and plain.cell(3) == "3"


def test_a_layout_that_cannot_be_is_one_line_not_a_crash():
    """Only a damaged recording holds one (a run's layout is checked before it starts)."""
    import dataclasses

    from nanodist_tui.run_info import RunInfo
    damaged = dataclasses.replace(RunInfo.from_started(mesh_events()[0]), tensor=3)
    assert MeshPane(damaged).render_mesh(76).plain == \
        "no mesh to draw: world size 8 is not a multiple of tp 3 x pp 2 x cp 1"
    places = RankTable(damaged).where
    assert places.heading == "rank" and places.cell(5) == "5"


# ---------------------------------------------------------------- the new-run form


def test_the_new_run_form_offers_the_degrees(monkeypatch):
    from nanodist_tui.app import create_app
    from nanodist_tui.screens.new_run import NewRunScreen, _field_id
    monkeypatch.chdir(REPO)
    app = create_app("fake", FakeJob(steps=0, then="wait_for_stop"), pane_interval_s=TEST_PANE_INTERVAL_S,
                     make_job=lambda cfg, doc: FakeJob(steps=0, then="wait_for_stop"))

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.workspace is not None)
            await pilot.press("n")
            await wait_for(pilot, lambda: isinstance(app.screen, NewRunScreen))
            form = app.screen
            await pilot.pause(0.3)
            for key in ("tensor", "pipeline", "context", "expert", "sequence_parallel"):
                assert form.query_one(f"#{_field_id('parallel.' + key)}").value in ("1", False)
            sp = form.query_one(f"#{_field_id('parallel.sequence_parallel')}")
            assert [str(option[0]) for option in sp._options] == ["false", "true"]
            for overrides in (["parallel.tensor=3"], ["parallel.sequence_parallel=true"]):
                key, value = overrides[0].split("=")
                field = form.query_one(f"#{_field_id(key)}")
                field.value = {"true": True}.get(value, value)
                await pilot.pause(0.2)
                assert form.overrides() == overrides
                with pytest.raises(ConfigError) as expected:  # the command line's own line for it
                    presets.apply_overrides(presets.read_document(form.path), overrides,
                                            source=str(form.path))
                shown = str(form.query_one("#form-error").content)
                assert shown == str(expected.value) and "\n" not in shown and key in shown
                field.value = {"true": False}.get(value, "1")
                await pilot.pause(0.2)
                assert form.overrides() == [] and "ok" in str(form.query_one("#form-error").content)
            await pilot.press("escape")

    import asyncio
    asyncio.run(main())


# ---------------------------------------------------------------- the summary


def test_summary_json_carries_the_layout(tmp_path):
    recorder = RunRecorder(tmp_path, "mesh", {})
    for event in mesh_events(steps=1):
        recorder(event)
    recorder.close()
    summary = json.loads((recorder.run_dir / "summary.json").read_text())
    assert summary_problem(summary) is None
    assert summary["layout"] == {"degrees": {"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 2},
                                 "order": "tp-cp-ep-dp-pp", "sequence_parallel": False}
    lines = summary_lines({**summary, "initial_val_loss": 4.0, "final_val_loss": 2.0})
    assert "layout         dp 2 x pp 2 x tp 2  (order tp-cp-ep-dp-pp)" in lines
    # a recording from before the mesh (no degrees in its config): data parallelism over the world
    demo = RunRecorder(tmp_path, "demo", {})
    demo(demo_events()[0])
    demo.close()
    layout = json.loads((demo.run_dir / "summary.json").read_text())["layout"]
    assert layout["degrees"] == {"tp": 1, "cp": 1, "ep": 1, "dp": 4, "pp": 1}
    assert "layout         dp 4" in summary_lines({"layout": layout, "steps": 1, "initial_val_loss": 4.0,
                                                   "final_val_loss": 2.0, "tokens_per_s": 1.0, "wall_s": 1.0})


@pytest.mark.slow
def test_a_runs_summary_carries_its_layout(tmp_path):
    from tests.run_helpers import train
    summary, _ = train(tmp_path, "parallel.world_size=2")
    assert summary["layout"]["degrees"]["dp"] == 2
    assert "layout         dp 2" in summary_lines(summary)
    assert json.loads((Path(summary["run_dir"]) / "summary.json").read_text())["layout"] == summary["layout"]


# ---------------------------------------------------------------- a real terminal

TMUX = shutil.which("tmux")


def tmux(*args: str) -> str:
    return subprocess.run([TMUX or "tmux", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (.ci/run installs it with apt-get)")
def test_the_mesh_tab_in_a_real_terminal_at_80x24(tmp_path):
    """`nanodist-tui replay` of the synthetic dp 2 x pp 2 x tp 2 run: the mesh tab by its key, the groups
    reached with End, quit with q; no traceback, exit 0."""
    run = tmp_path / "runs" / "mesh"
    run.mkdir(parents=True)
    (run / "events.jsonl").write_text("".join(json.dumps(to_json(e)) + "\n" for e in mesh_events()))
    name = f"nanodist-mesh-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", "NANODIST_CONFIG": "/nowhere"}
    subprocess.run([TMUX or "tmux", "new-session", "-d", "-s", name, "-x", "80", "-y", "24",
                    "-c", str(tmp_path), "bash --norc --noprofile"], check=True, env=env)

    def wait_for_screen(pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = tmux("capture-pane", "-p", "-J", "-t", name, "-S", "-200")
            if pattern in shown.replace("echo EXIT=$?", ""):  # the command line is no answer
                return shown
            time.sleep(0.5)
        raise AssertionError(f"{pattern!r} never appeared; the screen shows:\n{shown}")

    try:
        # the environment on the command line: a tmux server already running gives new sessions its own
        tmux("send-keys", "-t", name, f"PYTHONPATH={REPO} NANODIST_CONFIG=/nowhere {sys.executable} -m "
             f"nanodist_tui.cli replay {run} --speed 0; echo EXIT=$?", "Enter")
        wait_for_screen(" finished ", timeout=120)
        wait_for_screen("6 log  7 mesh", timeout=30)
        tmux("send-keys", "-t", name, "7")
        grid = wait_for_screen("pp1 dp1    6    7", timeout=30)
        assert "8 ranks = dp 2 x pp 2 x tp 2" in grid and "tp0  tp1" in grid
        tmux("send-keys", "-t", name, "End")
        groups = wait_for_screen("what each group is for", timeout=30)
        assert "pp        2      4  inter-node     131.1 kB  524.3 kB" in groups
        tmux("send-keys", "-t", name, "q")
        after = wait_for_screen("EXIT=0", timeout=60)
        assert "EXIT=0" in after and "Traceback" not in grid + groups + after
    finally:
        subprocess.run([TMUX or "tmux", "kill-session", "-t", name], capture_output=True)
