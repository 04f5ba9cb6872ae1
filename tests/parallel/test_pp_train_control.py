"""A pipeline run as a whole (DP 2 × PP 2, thread ranks): an fp16 overflow on one stage's gradient is
skipped by every stage alike (the overflow flag agreed over the pipeline group); each step reports every
rank's PipelineTimeline, one row per action of its schedule. Stop and pause: test_layout_stop_pause.py."""

from __future__ import annotations

import pytest

from engine.comm.launch import run_ranks
from engine.parallel.pipeline.schedules import build_schedule
from engine.run.job import run_training
from tests.pp_train_helpers import overflow_rank, pp_config
from tests.run_helpers import tiny_config

PP = ["parallel.world_size=4", "parallel.pipeline=2", "parallel.zero_stage=1", "model.n_layer=2",
      "train.micro_batches=2", "train.steps=8", "checkpoint.every=0"]


def test_every_step_reports_each_ranks_timeline(tmp_path):
    cfg, doc = tiny_config(tmp_path, *PP, "train.steps=3", "parallel.schedule=\"gpipe\"")
    events: list = []
    run_training(cfg, on_event=events.append, preset_doc=doc)
    timelines = [e for e in events if e.kind == "pipeline_timeline"]
    assert sorted((e.step, e.rank) for e in timelines) == [(s, r) for s in (1, 2, 3) for r in range(4)]
    schedule = build_schedule("gpipe", 2, 2)
    for e in timelines:
        want = [(a.op.value, a.micro_batch, a.stage) for a in schedule.actions[e.stage_rank]]
        got = [(row[0], row[1], row[2]) for row in e.actions]
        assert sorted(got) == sorted(want)  # every action once
        computes = ("F", "B", "I", "W")
        assert [g for g in got if g[0] in computes] == [w for w in want if w[0] in computes]  # in list order
        assert all(0 <= row[3] <= row[4] for row in e.actions)
        # in the order they ran, one action (or one batch of messages, sharing its times) at a time; a batch
        # is waited for after the compute action that posted it
        assert all(a[3:] == b[3:] or a[4] <= b[3] for a, b in zip(e.actions, e.actions[1:]))
        for row in e.actions:
            if row[0] not in computes:
                posted_after = want.index(tuple(row[:3])) - 1
                while want[posted_after][0] not in computes and posted_after >= 0:
                    posted_after -= 1
                if posted_after >= 0:
                    assert got.index(want[posted_after]) < got.index(tuple(row[:3]))


def test_an_overflow_on_one_stage_is_skipped_by_every_rank():
    """ZeRO-1: the flag is agreed over the data-parallel group (the ranks' shards differ), then over the
    pipeline group; ranks 0, 1 hold the first stage, 2, 3 the last (pp is the outermost axis)."""
    cfg = pp_config(4, 2, 2, zero=1, precision__dtype="fp16", precision__init_scale=1024.0,
                    model__n_layer=5)  # stages of unequal parameter counts
    for poisoned in (0, 3):  # a first-stage rank, a last-stage rank
        ranks = run_ranks(4, "threads", overflow_rank, args=(cfg, 3, poisoned), timeout_s=60)
        assert all(r["skipped"] == [True, False, False] for r in ranks)
        # every rank names the one parameter that overflowed, though only the poisoned rank's stage holds it
        named = ranks[0]["named"]
        assert len(named) == 1 and all(r["named"] == named for r in ranks)
        assert named[0] in ranks[poisoned]["held"]
        assert named[0] not in ranks[3 - poisoned]["held"]
        assert len({r["scale"] for r in ranks}) == 1 and ranks[0]["scale"] < 1024.0
        assert all(r["finite"] for r in ranks)


def test_an_emulated_run_measures_the_formulas_bubble(tmp_path):
    """pipeline_emulate_ms: 4 stages on thread ranks, each action a 20 ms sleep; the measured idle share of
    a step over all ranks is 1F1B's (p−1)/(m+p−1) = 3/11 for m = 8, within 2 points."""
    sets = ["parallel.world_size=4", "parallel.pipeline=4", "model.n_layer=4", "train.micro_batches=8",
            "train.global_batch=8", "train.steps=2", "parallel.pipeline_emulate_ms=20"]
    cfg, doc = tiny_config(tmp_path, *sets)
    events: list = []
    run_training(cfg, on_event=events.append, preset_doc=doc)
    rows = [e.actions for e in events if e.kind == "pipeline_timeline" and e.step == 2]
    assert len(rows) == 4 and all(e.emulated for e in events if e.kind == "pipeline_timeline")
    wall = max(row[4] for actions in rows for row in actions)
    busy = sum(row[4] - row[3] for actions in rows for row in actions if row[0] in ("F", "B", "I", "W"))
    assert 1 - busy / (4 * wall) == pytest.approx(3 / 11, abs=0.02)
