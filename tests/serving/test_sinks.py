"""The telemetry sinks against their real libraries, offline and local: one tiny two-rank fp16 run logged
to TensorBoard, W&B and MLflow, read back with each library's own reader (tests/sink_readers.py) and held
to the run's own events. A sink whose library is not installed here is skipped, and says so; the
missing-library behaviour is tested for every sink whether installed or not."""

from __future__ import annotations

import shutil
import sys
import threading

import numpy as np
import pytest
from typer.testing import CliRunner

from engine import events as ev
from engine.run.job import run_training
from engine.sinks import SINKS, SinkUnavailable, check_available, missing_library
from engine.sinks import runner as sink_runner
from engine.sinks.scalars import Point, ScalarFolder
from nanodist_tui.cli import app
from tests.run_helpers import only_run, tiny_config
from tests.sink_readers import mlflow_run, tensorboard_scalars, wandb_offline_run

# Whole screens drawn many times over: out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow

MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
INSTALLED = [name for name in SINKS if missing_library(name) is None]


def needs(name: str) -> None:
    if name not in INSTALLED:
        pytest.skip(f"the {name} library is not installed (pip install 'nanodist[{name}]')")


def offline_env(mp: pytest.MonkeyPatch, home) -> None:
    """No W&B key anywhere (so the sink must choose offline by itself), W&B's files in a temporary home."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_DIR"):
        mp.delenv(var, raising=False)
    mp.setenv("HOME", str(home))  # no ~/.netrc with a W&B key; W&B's settings and cache land here


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """(run folder, the run's events) of a run logged to every installed sink."""
    if not INSTALLED:
        pytest.skip("none of tensorboard, wandb, mlflow is installed (pip install 'nanodist[tensorboard]')")
    tmp = tmp_path_factory.mktemp("logged")
    with pytest.MonkeyPatch.context() as mp:
        offline_env(mp, tmp / "home")
        sinks = "log.to=[" + ", ".join(f'"{n}"' for n in INSTALLED) + "]"
        cfg, doc = tiny_config(tmp / "runs", "parallel.world_size=2", 'precision.dtype="fp16"',
                               "train.eval_every=3", sinks)
        events: list = []
        summary = run_training(cfg, on_event=events.append, preset_doc=doc)
    assert summary["steps"] == cfg.train.steps
    return only_run(tmp / "runs"), events


# ---- what the run's events say each sink must hold (computed from the events, not by the sinks) ----

def expected(events) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}

    def put(tag, step, value):
        out.setdefault(tag, {})[step] = float(value)
    for e in events:
        if isinstance(e, ev.StepEnd):
            for key in ("loss", "lr", "tokens_per_s", "step_time_s"):
                put(f"train/{key}", e.step, getattr(e, key))
            put("train/loss_scale", e.step, e.loss_scale)
            if np.isfinite(e.grad_norm):
                put("train/grad_norm", e.step, e.grad_norm)
        elif isinstance(e, ev.Eval):
            put("val/loss", e.step, e.val_loss)
        elif isinstance(e, ev.MemorySnapshot):
            for category, held in e.peak.items():
                tag = f"memory/rank{e.rank}/{category}"
                put(tag, e.step, max(out.get(tag, {}).get(e.step, 0), held))
            tag = f"memory/rank{e.rank}/total"
            put(tag, e.step, max(out.get(tag, {}).get(e.step, 0), sum(e.peak.values())))
        elif isinstance(e, ev.Traffic):
            for link in e.links:
                tag = f"traffic/{link['src']}_to_{link['dst']}"
                put(tag, e.step, out.get(tag, {}).get(e.step, 0) + link["bytes"])
    return out


CHECKED = ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/loss_scale", "val/loss",
           "memory/rank0/parameters", "memory/rank1/activations", "memory/rank1/total", "traffic/0_to_1",
           "traffic/1_to_0"]


def test_the_run_has_every_kind_of_figure(logged):
    _, events = logged
    want = expected(events)
    for tag in CHECKED:
        assert len(want[tag]) >= 2, tag
    assert all(v > 0 for v in want["traffic/0_to_1"].values())


def test_tensorboard_event_files_hold_the_runs_values(logged):
    needs("tensorboard")
    run_dir, events = logged
    got = tensorboard_scalars(run_dir / "tensorboard")
    want = expected(events)
    for tag in CHECKED:  # TensorBoard keeps 32-bit floats
        assert dict(got[tag]) == {s: float(np.float32(v)) for s, v in want[tag].items()}, tag


def test_wandb_offline_run_holds_the_runs_values(logged):
    needs("wandb")
    run_dir, events = logged
    run = wandb_offline_run(run_dir)
    started = next(e for e in events if isinstance(e, ev.RunStarted))  # after the launcher's Phase events
    assert run["name"] == started.run_id and run["project"] == "nanodist"
    assert run["config"]["optim"]["lr"] == started.config["optim"]["lr"]
    assert run["exit_code"] == 0
    got: dict[str, dict[int, float]] = {}
    for row in run["history"]:
        for tag, value in row.items():
            if not tag.startswith("_") and tag != "step":
                got.setdefault(tag, {})[row["step"]] = value
    want = expected(events)
    for tag in CHECKED:
        assert got[tag] == want[tag], tag


def test_mlflow_run_holds_the_runs_values(logged):
    needs("mlflow")
    run_dir, events = logged
    client, run = mlflow_run((run_dir / "mlruns").resolve().as_uri(), "nanodist")
    started = next(e for e in events if isinstance(e, ev.RunStarted))  # after the launcher's Phase events
    assert run.info.run_name == started.run_id and run.info.status == "FINISHED"
    assert float(run.data.params["optim.lr"]) == started.config["optim"]["lr"]
    assert run.data.params["parallel.world_size"] == "2"
    want = expected(events)
    for tag in CHECKED:
        got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, tag)}
        assert got == want[tag], tag


def test_each_sink_says_once_where_its_run_went(logged):
    run_dir, events = logged
    said = [e.message for e in events if isinstance(e, ev.Log)]
    for name in INSTALLED:
        (line,) = [m for m in said if m.startswith(f"{name}: ")]
        assert str(run_dir) in line, line
    assert not [e for e in events if isinstance(e, ev.Log) and e.level == "warning"]


def test_no_sink_thread_outlives_the_run(logged):
    assert not [t for t in threading.enumerate() if t.name.startswith("nanodist-sink-")]


def test_replay_to_tensorboard_writes_what_the_live_run_wrote(logged, tmp_path):
    needs("tensorboard")
    run_dir, _ = logged
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("tensorboard", "wandb", "mlruns"))
    result = CliRunner().invoke(app, ["replay", str(copy), "--to", "tensorboard", "--no-ui"])
    assert result.exit_code == 0, result.output
    assert "wrote them to tensorboard" in result.output
    assert tensorboard_scalars(copy / "tensorboard") == tensorboard_scalars(run_dir / "tensorboard")
    again = CliRunner().invoke(app, ["replay", str(copy), "--to", "tensorboard", "--no-ui"])
    assert again.exit_code == 2 and "already holds TensorBoard event files" in again.output


# ---- a sink that is missing or fails ----

@pytest.mark.parametrize("name", SINKS)
def test_a_missing_library_is_one_line_naming_the_extra(name, monkeypatch, in_tmp):
    monkeypatch.setitem(sys.modules, MODULES[name], None)  # import fails as if it were not installed
    with pytest.raises(SinkUnavailable, match=rf"pip install 'nanodist\[{name}\]'"):
        check_available([name])
    result = CliRunner().invoke(app, ["run", "--log-to", name, "--set", "train.steps=2"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"pip install 'nanodist[{name}]'" in lines[0], result.output
    assert not (in_tmp / "runs").exists() or not any((in_tmp / "runs").iterdir())  # refused before it began


def test_a_missing_library_inside_a_run_is_one_warning_and_training_goes_on(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    cfg, doc = tiny_config(tmp_path, 'log.to=["tensorboard"]')
    events: list = []
    summary = run_training(cfg, on_event=events.append, preset_doc=doc)
    assert summary["steps"] == cfg.train.steps
    (warning,) = [e for e in events if isinstance(e, ev.Log) and e.level == "warning"]
    assert "pip install 'nanodist[tensorboard]'" in warning.message and "training goes on" in warning.message


class _BrokenSink:
    name = "tensorboard"

    def __init__(self, fail_on: str):
        self.fail_on, self.calls = fail_on, []

    def where(self):
        return "nowhere"

    def _maybe_fail(self, what):
        self.calls.append(what)
        if what == self.fail_on:
            raise OSError("disk full\nsecond line")

    def open(self, started):
        self._maybe_fail("open")

    def write(self, points):
        self._maybe_fail("write")

    def close(self, status):
        self.calls.append(f"close:{status}")


@pytest.mark.parametrize("fail_on", ["open", "write"])
def test_a_failing_sink_is_reported_once_and_training_goes_on(fail_on, monkeypatch, tmp_path):
    broken = _BrokenSink(fail_on)
    monkeypatch.setattr(sink_runner, "make_sink", lambda name, run_dir, log_cfg: broken)
    cfg, doc = tiny_config(tmp_path, 'log.to=["tensorboard"]')
    events: list = []
    summary = run_training(cfg, on_event=events.append, preset_doc=doc)
    assert summary["steps"] == cfg.train.steps
    (warning,) = [e for e in events if isinstance(e, ev.Log) and e.level == "warning"]
    doing = {"open": "opening", "write": "writing"}[fail_on]
    assert warning.message == (f"tensorboard sink failed while {doing} (OSError: disk full); training goes "
                               "on without it")
    assert broken.calls.count(fail_on) == 1  # switched off after its failure
    recorded = (only_run(tmp_path) / "events.jsonl").read_text()
    assert "disk full" in recorded  # the warning is in the run's own log too


# ---- the scalars every sink writes ----

def _snapshot(step, rank, phase, **peak):
    return ev.MemorySnapshot(step=step, rank=rank, phase=phase, current=peak, peak=peak)


def test_memory_figures_are_each_categorys_peak_and_the_highest_total():
    folder = ScalarFolder()
    assert folder.fold(_snapshot(1, 0, "forward", parameters=10, activations=50)) == []
    assert folder.fold(_snapshot(1, 0, "backward", parameters=10, activations=20, gradients=40)) == []
    points = folder.fold(_snapshot(2, 0, "forward", parameters=10, activations=7))  # rank 0's next step
    assert sorted(points) == sorted([Point("memory/rank0/parameters", 10.0, 1),
                                     Point("memory/rank0/activations", 50.0, 1),
                                     Point("memory/rank0/gradients", 40.0, 1),
                                     Point("memory/rank0/total", 70.0, 1)])  # 10+20+40 beats 10+50
    assert sorted(folder.flush()) == sorted([Point("memory/rank0/parameters", 10.0, 2),
                                             Point("memory/rank0/activations", 7.0, 2),
                                             Point("memory/rank0/total", 17.0, 2)])


def test_a_step_that_overflowed_leaves_out_its_infinite_gradient_norm():
    step = ev.StepEnd(step=3, loss=2.5, lr=1e-3, tokens=64, step_time_s=0.1, tokens_per_s=640.0,
                      grad_norm=float("inf"), loss_scale=32768.0, skipped=True)
    tags = {p.tag: p.value for p in ScalarFolder().fold(step)}
    assert "train/grad_norm" not in tags
    assert tags["train/skipped"] == 1.0 and tags["train/loss_scale"] == 32768.0


def test_sink_names_are_checked_by_the_config_rule(in_tmp):
    result = CliRunner().invoke(app, ["run", "--log-to", "tensorbord"])
    assert result.exit_code == 2
    assert result.output.strip() == ('error: --log-to: "tensorbord" is not allowed; use one of '
                                     '"tensorboard", "wandb", "mlflow" (did you mean "tensorboard"?)')


# ---- W&B: online only with a key, and never a hang without a network ----

def test_wandb_is_online_only_with_a_key(monkeypatch, tmp_path):
    from engine.sinks.wandb_sink import wandb_mode
    offline_env(monkeypatch, tmp_path)
    assert wandb_mode() == "offline"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_mode() == "online"  # `wandb login` wrote a key
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"  # the user's own choice wins


@pytest.mark.slow
def test_wandb_online_without_a_network_gives_up_and_training_goes_on(monkeypatch, tmp_path):
    """A key but no reachable W&B server (a closed port on loopback): the sink gives up after its init
    timeout with one warning, and the run finishes."""
    import socket
    import time

    from engine.sinks import wandb_sink
    needs("wandb")
    offline_env(monkeypatch, tmp_path / "home")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef" * 2 + "01234567")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(wandb_sink, "INIT_TIMEOUT_S", 3.0)
    cfg, doc = tiny_config(tmp_path / "runs", 'log.to=["wandb"]')
    events: list = []
    t0 = time.monotonic()
    summary = run_training(cfg, on_event=events.append, preset_doc=doc)
    assert time.monotonic() - t0 < 60
    assert summary["steps"] == cfg.train.steps
    (warning,) = [e for e in events if isinstance(e, ev.Log) and e.level == "warning"]
    assert warning.message.startswith("wandb sink failed while opening")
    assert "training goes on" in warning.message


def test_replay_to_a_sink_in_the_workbench(logged, tmp_path, workbench):
    """Without --no-ui the run plays in the workbench and is converted on the way; the sink's line is in
    the workbench's log."""
    needs("tensorboard")
    run_dir, _ = logged
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("tensorboard", "wandb", "mlruns"))
    result = CliRunner().invoke(app, ["replay", str(copy), "--to", "tensorboard", "--speed", "0"])
    assert result.exit_code == 0, result.output
    assert workbench["replay"] and workbench["state"] == "finished"
    assert f"tensorboard: event files in {copy}" in workbench["log"].replace("\n", "")  # this replay's sink
    assert tensorboard_scalars(copy / "tensorboard") == tensorboard_scalars(run_dir / "tensorboard")


def test_log_to_in_the_workbench_and_on_resume(in_tmp, workbench):
    """The workbench (the default command) and `resume` take --log-to like `run`: each run folder gets its
    event files, holding that run's steps."""
    needs("tensorboard")
    fast = ["--set", "train.steps=4", "--set", "train.eval_every=0", "--set", "data.max_chars=20000",
            "--set", "model.n_layer=1", "--set", "model.n_embd=32", "--set", "model.block_size=16",
            "--set", "train.global_batch=8", "--set", "train.eval_batches=1", "--set", "optim.warmup_steps=0"]
    result = CliRunner().invoke(app, ["--log-to", "tensorboard", *fast])
    assert result.exit_code == 0, result.output
    assert workbench["state"] == "finished"
    first = only_run(in_tmp / "runs")
    assert [s for s, _ in tensorboard_scalars(first / "tensorboard")["train/loss"]] == [1, 2, 3, 4]
    result = CliRunner().invoke(app, ["resume", str(first), "--no-ui", "--log-to", "tensorboard",
                                      "--set", "train.steps=6"])
    assert result.exit_code == 0, result.output
    (resumed,) = [p for p in (in_tmp / "runs").iterdir() if p != first]
    assert [s for s, _ in tensorboard_scalars(resumed / "tensorboard")["train/loss"]] == [5, 6]
