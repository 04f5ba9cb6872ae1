"""Events: JSON round trip of every kind, clear errors, and the bus's isolation and thread safety."""
import dataclasses
import json
import logging
import math
import threading

import numpy as np
import pytest

from engine import events as ev

SAMPLES = [
    ev.RunStarted(run_id="r1", preset="quickstart", config={"model": {"n_layer": 2}}, n_params=123,
                  world_size=2, total_steps=10),
    ev.RunStarted(run_id="r2", preset="quickstart", config={}, n_params=123, world_size=2, total_steps=10,
                  first_step=4, run_dir="runs/r2", memory_estimate={"forward": {"params": 4}}),
    ev.History(parent="runs/r1", step=4, steps=[[1, 4.5, 1e-3, 0.9], [2, 4.25, 1e-3, 0.8]],
               evals=[[0, 4.6], [4, 4.1]]),
    ev.StepEnd(step=3, loss=2.5, lr=1e-3, tokens=4096, step_time_s=0.1, tokens_per_s=40960.0, grad_norm=0.7),
    ev.StepEnd(step=4, loss=2.4, lr=1e-3, tokens=4096, step_time_s=0.1, tokens_per_s=40960.0, grad_norm=0.7,
               loss_scale=65536.0, skipped=True),
    ev.Eval(step=50, val_loss=1.9),
    ev.RankStats(step=3, rank=1, step_time_s=0.1, comm_wait_s=0.02, bytes_sent=1 << 20),
    ev.Traffic(step=3, rank=0,
               links=[{"src": 0, "dst": 1, "phase": "reduce_scatter", "bytes": 10, "seconds": 0.1}]),
    ev.MemorySnapshot(step=3, rank=0, phase="after_backward", current={"params": 4}, peak={"params": 8}),
    ev.MemorySnapshot(step=3, rank=1, phase="end", current={"params": 4}, peak={"params": 8}),
    ev.PipelineTimeline(step=3, rank=2, stage_rank=1, schedule="1f1b", micro_batches=2, chunks=1,
                        actions=[["RECV_ACT", 0, 1, 0.0, 0.01], ["F", 0, 1, 0.01, 0.05],
                                 ["B", 0, 1, 0.05, 0.12]], clock_s=1796380800.25),
    ev.PipelineTimeline(step=4, rank=0, stage_rank=0, schedule="zb-h1", micro_batches=1, chunks=1,
                        actions=[["F", 0, 0, 0.0, 0.5], ["I", 0, 0, 0.9, 1.4], ["W", 0, 0, 1.4, 1.9]],
                        emulated=True),
    ev.ExpertLoad(step=3, rank=1, tokens_per_expert=[[5, 3, 0, 8]], received=[16], dropped=[2],
                  entropy=[1.2], aux_loss=[0.0105]),
    ev.ContextWork(step=3, rank=1, layout="zigzag", degree=2, blocks=10, scores=40960),
    ev.LossScaleChange(step=7, reason="inf", old_scale=65536.0, new_scale=32768.0, first_param="blocks.0.w"),
    ev.LossScaleChange(step=9, reason="growth", old_scale=32768.0, new_scale=65536.0),
    ev.CheckpointSaved(step=10, path="runs/x/ckpt-10"),
    ev.RunPaused(step=4, paused=True),
    ev.Log(level="info", message="hello"),
    ev.Phase(name="building the model"),
    ev.RunFinished(steps=10, initial_val_loss=4.2, final_val_loss=2.1, tokens_per_s=1e4, wall_s=12.5,
                   run_dir="runs/x"),
    ev.RunFinished(steps=4, initial_val_loss=4.2, final_val_loss=3.0, tokens_per_s=1e4, wall_s=2.5,
                   run_dir="runs/x", stopped=True),
    ev.RunFinished(steps=0, initial_val_loss=None, final_val_loss=None, tokens_per_s=0.0, wall_s=0.1,
                   run_dir=None),
    ev.RunFailed(message="rank 1 died", rank=1),
    ev.RunFailed(message="boom"),
    ev.SweepStarted(study="lr", sweep_dir="runs/sweep-lr", storage="runs/sweep-lr/study.db",
                    metrics=["val_loss"], directions=["minimize"], n_trials=8, timeout_s=0.0, existing=2,
                    jobs=1),
    ev.TrialStarted(number=3, params={"optim.lr": 1e-3, "precision.dtype": "bf16"}),
    ev.TrialReport(number=3, step=50, value=2.25),
    ev.TrialFinished(number=3, state="pruned", metrics=["val_loss"], values=[2.25], params={"optim.lr": 1e-3},
                     duration_s=4.5,
                     steps=51, reason="pruned at step 50: val_loss 2.25", run_dir="runs/sweep-lr/t3",
                     best=[1], best_values=[1.9]),
    ev.TrialFinished(number=4, state="complete", metrics=["val_loss", "peak_memory_mb"], values=[1.8, 12.5],
                     params={}, duration_s=9.0, steps=100),
    ev.SweepFinished(study="lr", counts={"complete": 3, "pruned": 1}, best=[4], stopped=False),
]


def test_samples_cover_every_kind_of_the_contract():
    assert {type(e).kind for e in SAMPLES} == set(ev.EVENT_TYPES) == {
        "run_started", "history", "phase", "step_end", "eval", "rank_stats", "traffic", "memory_snapshot",
        "pipeline_timeline", "expert_load", "context_work", "loss_scale_change", "checkpoint_saved",
        "run_paused", "log", "run_finished",
        "run_failed", "sweep_started",
        "trial_started", "trial_report", "trial_finished", "sweep_finished"}


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.kind)
def test_json_round_trip(event):
    d = ev.to_json(event)
    assert d["kind"] == event.kind
    assert ev.from_json(json.loads(json.dumps(d))) == event


def test_numpy_values_become_plain_json():
    event = ev.StepEnd(step=np.int64(1), loss=np.float32(2.5), lr=1e-3, tokens=np.int64(7), step_time_s=0.1,
                       tokens_per_s=1.0, grad_norm=np.float64(0.5))
    d = ev.to_json(event)
    assert type(d["step"]) is int and type(d["loss"]) is float
    memory = ev.to_json(ev.MemorySnapshot(step=0, rank=0, phase="x", current={"a": np.int64(3)}, peak={}))
    assert json.dumps(memory) == json.dumps(json.loads(json.dumps(memory)))


def test_non_finite_losses_survive():
    d = json.loads(json.dumps(ev.to_json(ev.Eval(step=1, val_loss=float("nan")))))
    assert math.isnan(ev.from_json(d).val_loss)


def test_unknown_kind_and_bad_fields_are_clear_errors():
    with pytest.raises(ev.EventError, match="unknown event kind 'step_begin'; known kinds: run_started"):
        ev.from_json({"kind": "step_begin", "step": 1})
    with pytest.raises(ev.EventError, match=r"eval event: missing fields \['val_loss'\], unexpected fields"):
        ev.from_json({"kind": "eval", "step": 1})
    with pytest.raises(ev.EventError, match=r"unexpected fields \['extra'\]"):
        ev.from_json({"kind": "eval", "step": 1, "val_loss": 2.0, "extra": 1})
    with pytest.raises(ev.EventError, match="must be a JSON object"):
        ev.from_json([1, 2])


def test_events_are_immutable_and_as_event_accepts_dicts():
    event = ev.Eval(step=1, val_loss=2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.step = 2
    assert ev.as_event(ev.to_json(event)) == event and ev.as_event(event) is event


def test_failing_subscriber_does_not_stop_the_others(caplog):
    bus = ev.EventBus()
    got_a, got_b = [], []
    bus.subscribe(got_a.append)

    def broken(event):
        raise RuntimeError("subscriber bug")
    bus.subscribe(broken)
    bus.subscribe(got_b.append)
    with caplog.at_level(logging.ERROR, logger="nanodist.events"):
        bus.emit(SAMPLES[3])
        bus.emit(SAMPLES[4])
    assert got_a == got_b == [SAMPLES[3], SAMPLES[4]]
    assert "subscriber bug" in caplog.text and caplog.text.count("failed on a") == 2


def test_unsubscribe():
    bus = ev.EventBus()
    got = []
    unsubscribe = bus.subscribe(got.append)
    bus.subscribe(got.append)  # the same function twice: two separate subscriptions
    bus.emit(1)
    unsubscribe()
    unsubscribe()
    bus.emit(2)
    assert got == [1, 1, 2]


def test_subscriber_may_emit_from_its_callback():
    bus = ev.EventBus()
    got = []

    def echo(event):
        got.append(event)
        if event == "ping":
            bus.emit("pong")
    bus.subscribe(echo)
    bus.emit("ping")
    assert got == ["ping", "pong"]


def test_concurrent_emits_are_all_delivered_one_at_a_time():
    bus = ev.EventBus()
    got, active, overlaps = [], [0], []

    def slow(event):
        active[0] += 1
        overlaps.append(active[0] > 1)
        got.append(event)
        active[0] -= 1
    bus.subscribe(slow)
    threads = [threading.Thread(target=lambda r=r: [bus.emit((r, i)) for i in range(200)]) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [(r, i) for r in range(4) for i in range(200)] and not any(overlaps)
    for r in range(4):  # each thread's events arrive in its emit order
        assert [i for rr, i in got if rr == r] == list(range(200))
