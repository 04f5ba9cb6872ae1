"""The memory pane under pipeline parallelism: each rank's row names the stages it holds and is held against
that rank's own estimate (RunStarted.memory_estimate_per_rank), so the stages' imbalance shows; without a
pipeline the rows are as before (no stage, the run's one estimate)."""

from __future__ import annotations

from engine.events import MemorySnapshot, RunStarted
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets import memory_pane
from nanodist_tui.widgets.glyphs import ASCII
from nanodist_tui.widgets.memory_pane import MemoryPane


def _cats(parameters: int, activations: int) -> dict[str, int]:
    return {"parameters": parameters, "gradients": parameters, "activations": activations}


def _pane(monkeypatch, parallel: dict, world: int, per_rank: list | None) -> MemoryPane:
    monkeypatch.setattr(memory_pane, "glyphs_of", lambda widget: ASCII)  # no app: the plain glyphs
    heaviest = max(per_rank, key=lambda e: sum(e["forward"].values())) if per_rank else {
        "forward": _cats(1000, 500)}
    started = RunStarted(run_id="r", preset="pp", config={"parallel": {"world_size": world, **parallel}},
                         n_params=1, world_size=world, total_steps=1, memory_estimate=heaviest,
                         memory_estimate_per_rank=per_rank)
    pane = MemoryPane(RunInfo.from_started(started))
    for rank in range(world):
        peak = (per_rank[rank] if per_rank else heaviest)["forward"]
        pane.snapshots[(rank, "forward")] = MemorySnapshot(step=1, rank=rank, phase="forward", current={},
                                                           peak=peak)
        pane.high_water[rank] = sum(peak.values())
    return pane


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("rank ")]


def test_each_rank_names_its_stages_and_meets_its_own_estimate(monkeypatch):
    # DP 2 x PP 2, interleaved with 2 chunks: pipeline rank 0 holds stages 0 and 2, rank 1 stages 1 and 3
    stages = [{"forward": _cats(6000, 9000)}, {"forward": _cats(5000, 2000)}]
    pane = _pane(monkeypatch, {"pipeline": 2, "chunks": 2, "schedule": "interleaved"}, 4,
                 [stages[0], stages[0], stages[1], stages[1]])  # the mesh's default order: dp inside pp
    text = pane.render_snapshots(100).plain
    rows = _rows(text)
    assert len(rows) == 4
    for row, total in zip(rows, (21000, 21000, 12000, 12000)):
        assert f"est {total / 1000:.1f} kB +0.0%" in " ".join(row.split()), row
    details = [line.strip() for line in text.splitlines()[1:] if line.startswith(" ")]
    assert [d.split(" · ")[0] for d in details] == ["stages 0,2/4", "stages 0,2/4", "stages 1,3/4",
                                                    "stages 1,3/4"]


def test_without_a_pipeline_no_stage_is_named_and_every_rank_meets_the_runs_estimate(monkeypatch):
    pane = _pane(monkeypatch, {}, 2, None)
    text = pane.render_snapshots(100).plain
    assert "stage" not in text
    assert all("+0.0%" in row for row in _rows(text)) and len(_rows(text)) == 2
