"""Run recorder: the files of a run folder, replay, listing, and what is left after failure."""
import csv
import json
import os
import re
import time

import pytest
import tomlkit

from engine import config
from engine import events as ev
from engine.config import presets
from engine.run import recorder
from engine.run import summary as run_summary
from engine.run.recorder import METRIC_COLUMNS, RunRecorder, list_runs, read_events
from engine.run.summary import is_interruption


def step(n, loss=2.0, scale=None):
    """StepEnd.tokens counts that step's tokens only."""
    return ev.StepEnd(step=n, loss=loss, lr=1e-3, tokens=32, step_time_s=0.5, tokens_per_s=64.0,
                      grad_norm=0.25, loss_scale=scale)


def a_run(out_dir, preset="quickstart", finish=True):
    cfg, doc, _ = presets.load_preset(preset)
    rec = RunRecorder(out_dir, preset, doc)
    stream = [ev.RunStarted(run_id=rec.run_id, preset=preset, config=config.to_dict(cfg), n_params=100,
                            world_size=1, total_steps=2),
              ev.Eval(step=0, val_loss=4.0), step(1, 3.0, 1024.0), step(2, 2.5, 1024.0),
              ev.Eval(step=2, val_loss=2.2),
              ev.LossScaleChange(step=2, reason="growth", old_scale=1024.0, new_scale=2048.0)]
    if finish:
        stream.append(ev.RunFinished(steps=2, initial_val_loss=4.0, final_val_loss=2.2, tokens_per_s=64.0,
                                     wall_s=1.5, run_dir=str(rec.run_dir)))
    for event in stream:
        rec(ev.to_json(event) if isinstance(event, ev.Eval) else event)  # dicts from other processes too
    rec.close()
    return rec, stream, cfg


def test_run_folder_files(tmp_path):
    rec, stream, cfg = a_run(tmp_path / "runs")
    assert re.fullmatch(r"\d{8}-\d{6}-quickstart", rec.run_dir.name)
    assert rec.run_dir.parent == tmp_path / "runs"
    assert sorted(p.name for p in rec.run_dir.iterdir()) == ["config.toml", "events.jsonl", "metrics.csv",
                                                             "summary.json"]
    text = (rec.run_dir / "config.toml").read_text()
    assert config.from_dict(tomlkit.parse(text).unwrap()) == cfg
    assert "lr = 3e-3" in text and "# peak learning rate" in text  # the preset's own lines and comments
    lines = (rec.run_dir / "events.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [ev.to_json(e) for e in stream]


def test_metrics_rows_merge_eval_into_its_step(tmp_path):
    rec, _, _ = a_run(tmp_path)
    with open(rec.run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == METRIC_COLUMNS
    assert [(r["step"], r["loss"], r["val_loss"], r["loss_scale"]) for r in rows] == [
        ("0", "", "4.0", ""), ("1", "3.0", "", "1024.0"), ("2", "2.5", "2.2", "1024.0")]
    assert rows[1]["tokens"] == "32" and rows[1]["grad_norm"] == "0.25"


def test_summary(tmp_path):
    rec, _, _ = a_run(tmp_path)
    summary = json.loads((rec.run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["run_id"] == rec.run_id
    assert (summary["steps"], summary["initial_val_loss"], summary["final_val_loss"]) == (2, 4.0, 2.2)
    assert (summary["best_val_loss"], summary["wall_s"], summary["n_params"]) == (2.2, 1.5, 100)
    assert summary["loss_scale_changes"] == 1 and summary["last_loss"] == 2.5
    assert summary["tokens"] == 64  # the run's total: 32 tokens in each of its 2 steps


def test_replay_and_listing(tmp_path):
    first, stream, _ = a_run(tmp_path)
    second, _, _ = a_run(tmp_path, "mlp", finish=False)
    assert read_events(first.run_dir) == stream
    runs = list_runs(tmp_path)
    assert {r.run_id for r in runs} == {first.run_id, second.run_id}
    by_id = {r.run_id: r for r in runs}
    assert by_id[first.run_id].status == "finished" and by_id[first.run_id].final_val_loss == 2.2
    assert by_id[second.run_id].status == "stopped" and by_id[second.run_id].preset == "mlp"
    assert list_runs(tmp_path / "nothing-here") == []


def test_same_second_gets_a_unique_folder(tmp_path):
    names = {RunRecorder(tmp_path, "same", {}).run_dir.name for _ in range(3)}
    assert len(names) == 3


def test_config_from_dict_or_config_is_fully_resolved(tmp_path):
    cfg = config.replace(config.Config(), "optim.lr", 0.01)
    for given in (cfg, config.to_dict(cfg)):
        rec = RunRecorder(tmp_path, "../odd name/x.toml", given)
        assert re.fullmatch(r"\d{8}-\d{6}-x(-2)?", rec.run_dir.name) and rec.run_dir.parent == tmp_path
        assert config.from_dict(tomlkit.parse((rec.run_dir / "config.toml").read_text()).unwrap()) == cfg
        rec.close()


def test_failed_run_and_non_finite_values(tmp_path):
    rec = RunRecorder(tmp_path, "quickstart", {})
    rec(step(1, loss=float("nan")))
    rec(ev.RunFailed(message="rank 1: boom", rank=1))
    rec.close()
    rec(step(2))  # after close: ignored, never a crash
    summary = json.loads((rec.run_dir / "summary.json").read_text())  # strict JSON: NaN became null
    assert summary["status"] == "failed" and summary["failed_rank"] == 1 and summary["last_loss"] is None
    assert len(read_events(rec.run_dir)) == 2


@pytest.mark.parametrize("message, status", [
    ("interrupted (Ctrl-C)", "interrupted"),  # what engine.run.job reports for a KeyboardInterrupt
    ("KeyboardInterrupt", "interrupted"),
    ("killed by signal SIGTERM", "interrupted"),
    ("killed by signal SIGKILL", "failed"),  # also what the OOM killer sends
    ("ValueError: loss is NaN", "failed"),
])
def test_interrupted_run_is_not_a_failure(tmp_path, message, status):
    assert is_interruption(message) == (status == "interrupted")
    with RunRecorder(tmp_path, "quickstart", {}) as rec:
        rec(step(1))
        rec(ev.RunFailed(message=message))
    summary = json.loads((rec.run_dir / "summary.json").read_text())
    assert (summary["status"], summary["error"]) == (status, message)
    assert [r.status for r in list_runs(tmp_path)] == [status]


def killed_run(out_dir, name, stream, silent_s):
    """What a run killed outright leaves: events.jsonl (last written silent_s ago), no summary.json."""
    run_dir = out_dir / name
    run_dir.mkdir(parents=True)
    path = run_dir / "events.jsonl"
    path.write_text("".join(json.dumps(ev.to_json(e)) + "\n" for e in stream))
    then = time.time() - silent_s
    os.utime(path, (then, then))
    return run_dir


def test_killed_run_is_listed_as_interrupted_with_figures_from_its_events(tmp_path):
    stream = [ev.RunStarted(run_id="r", preset="mlp", config={}, n_params=10, world_size=2, total_steps=9),
              ev.Eval(step=0, val_loss=4.0), step(1, 3.0), step(2, 2.5)]
    killed_run(tmp_path, "20250101-000000-mlp", stream, silent_s=recorder.INTERRUPTED_AFTER_S + 5)
    killed_run(tmp_path, "20250101-000001-mlp", stream, silent_s=1)  # still writing: running
    killed_run(tmp_path, "20250101-000002-mlp", [*stream, ev.RunFailed(message="boom", rank=0)],
               silent_s=recorder.INTERRUPTED_AFTER_S + 5)  # died after its end event, before summary.json
    (tmp_path / "20250101-000003-mlp").mkdir()
    (tmp_path / "20250101-000003-mlp" / "events.jsonl").write_text('{"kind": "nope"}\n')
    runs = {r.run_id[14]: r for r in list_runs(tmp_path)}  # keyed by the last digit of the time
    assert {k: r.status for k, r in runs.items()} == {
        "0": "interrupted", "1": "running", "2": "failed", "3": "unreadable"}
    killed = runs["0"]
    assert (killed.preset, killed.steps, killed.final_val_loss, killed.tokens_per_s) == ("mlp", 2, 4.0, 64.0)
    figures = killed.summary
    assert (figures["last_loss"], figures["tokens"], figures["total_steps"]) == (2.5, 64, 9)


def test_running_run_is_listed_without_summary(tmp_path):
    with RunRecorder(tmp_path, "live", {}) as rec:
        rec(step(1))
        assert [(r.run_id, r.status) for r in list_runs(tmp_path)] == [(rec.run_id, "running")]
        assert len(read_events(rec.run_dir)) == 1  # flushed as it happens


def test_cut_off_last_line_is_ignored_but_a_broken_middle_line_is_not(tmp_path):
    rec, stream, _ = a_run(tmp_path)
    path = rec.run_dir / "events.jsonl"
    good = path.read_text()
    path.write_text(good + '{"kind": "step_end", "st')
    assert read_events(rec.run_dir) == stream
    path.write_text('{"kind": "nope"}\n' + good)
    with pytest.raises(ev.EventError, match=r"events.jsonl:1: unknown event kind 'nope'"):
        read_events(rec.run_dir)


def test_an_older_recording_reads_with_its_memory_estimate_once_on_run_started():
    """The bundled demo recording predates RunStarted.memory_estimate: each memory event carried the
    estimate of its phase. Read back, the run's RunStarted carries them, and the memory events what was
    measured."""
    from nanodist_tui.demo import DEMO_DIR
    lines = [json.loads(line) for line in (DEMO_DIR / "events.jsonl").read_text().splitlines()]
    recorded = {d["phase"]: d["estimate"] for d in lines if d["kind"] == "memory_snapshot"}
    assert "memory_estimate" not in lines[0] and set(recorded) == {"forward", "backward", "optimizer"}
    events = read_events(DEMO_DIR)
    started = [e for e in events if isinstance(e, ev.RunStarted)]
    assert len(started) == 1 and started[0].memory_estimate == recorded
    memory = [e for e in events if isinstance(e, ev.MemorySnapshot)]
    snapshots = [d for d in lines if d["kind"] == "memory_snapshot"]
    measured = [{k: v for k, v in d.items() if k != "estimate"} for d in snapshots]
    assert [ev.to_json(e) for e in memory] == measured


def test_summary_keeps_each_ranks_bytes_per_group_of_its_last_traffic_step(tmp_path):
    """summary.json's traffic_per_step: per rank, the bytes it sent by process group in the last step it
    reported (a later step replaces an earlier one, links of one group add up); the headless summary sums the
    ranks per group, largest first."""
    from nanodist_tui.headless import summary_lines

    def links(*items):
        return [{"src": 0, "dst": 1, "phase": "all-reduce", "group": g, "algorithm": "ring", "bytes": b,
                 "seconds": 0.001} for g, b in items]
    rec = RunRecorder(tmp_path, "traffic", {})
    rec(ev.Traffic(step=1, rank=0, links=links(("tp0", 999))))
    rec(ev.Traffic(step=2, rank=0, links=links(("tp0", 1_000_000), ("tp0", 500_000), ("dp0", 200_000))))
    rec(ev.Traffic(step=2, rank=1, links=links(("tp0", 1_500_000), ("dp1", 200_000))))
    rec.close()
    summary = json.loads((rec.run_dir / "summary.json").read_text())
    assert run_summary.summary_problem(summary) is None
    assert summary["traffic_per_step"] == {"0": {"tp0": 1_500_000, "dp0": 200_000},
                                           "1": {"tp0": 1_500_000, "dp1": 200_000}}
    lines = summary_lines({**summary, "initial_val_loss": 4.0, "final_val_loss": 2.0, "tokens_per_s": 1.0,
                           "wall_s": 1.0})
    assert "sent per step  tp0 3.0 MB, dp0 200.0 kB, dp1 200.0 kB" in lines
