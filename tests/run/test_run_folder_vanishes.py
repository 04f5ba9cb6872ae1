"""A run folder removed (or made read-only) while its run goes on: the run stops once, with one line saying
what happened, a non-zero exit like a full disk's (tests/checkpoint/test_disk_full.py), its rank threads
ended, and no half folder made again behind the user's back (the stop checkpoint and summary.json used to
make it anew: a folder of checkpoints alone, without config.toml or events.jsonl, which nothing resumes)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine import events as ev
from engine.run.job import run_training
from engine.run.recorder import RecordingError
from tests.run_helpers import tiny_config

REPO = Path(__file__).resolve().parents[2]


def rank_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("nanodist-rank")]


def event_run_dir(seen: list) -> str:
    """The run folder its RunStarted names."""
    return next(e.run_dir for e in seen if isinstance(e, ev.RunStarted))


def test_a_folder_removed_mid_run_stops_it_once_and_is_not_made_again(tmp_path):
    # checkpoints every 2 steps, so one exists (and goes with the folder) before the removal at step 3
    cfg, doc = tiny_config(tmp_path, "parallel.world_size=2", "train.steps=200", "checkpoint.every=2")
    seen: list = []

    def remove_at_step_3(event) -> None:
        seen.append(event)
        if isinstance(event, ev.StepEnd) and event.step == 3:
            shutil.rmtree(event_run_dir(seen))

    with pytest.raises(RecordingError) as raised:
        run_training(cfg, on_event=remove_at_step_3, preset_doc=doc)
    (started,) = [e for e in seen if isinstance(e, ev.RunStarted)]
    message = str(raised.value)
    assert message.startswith("recording stopped at step ") and "\n" not in message
    assert f"the run folder {started.run_dir} was removed or moved while the run went on" in message
    assert "no checkpoint is left to resume from" in message and "nanodist-tui resume" not in message
    failed = [e for e in seen if isinstance(e, ev.RunFailed)]
    assert [e.message for e in failed] == [message]  # said once
    steps = [e.step for e in seen if isinstance(e, ev.StepEnd)]
    assert 3 <= steps[-1] < 200  # stopped soon after, not run to its end
    assert list(tmp_path.iterdir()) == []  # neither the stop checkpoint nor summary.json made it again
    assert rank_threads() == []  # the ranks ended



def test_the_command_line_ends_with_one_line_and_exit_code_1(tmp_path):
    """The whole command, the folder removed from outside (another process's rm -r) after a few steps."""
    out = tmp_path / "runs"
    command = [sys.executable, "-m", "nanodist_tui.cli", "run", "-p", "quickstart", "--set",
               "parallel.backend=threads", "--set", "data.max_chars=20000", "--set", "model.n_layer=1",
               "--set", "model.n_embd=16", "--set", "model.n_head=2", "--set", "model.block_size=16",
               "--set", "train.global_batch=8", "--set", "train.eval_batches=1",
               "--set", "train.eval_every=0",
               "--set", "optim.warmup_steps=0", "--set", "train.steps=100000", "--set", f"run.out_dir={out}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        run_dir = _after_steps(out, 3, run)
        subprocess.run(["rm", "-r", str(run_dir)], check=True)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr + stdout, stderr
    assert lines[0].startswith("run failed: recording stopped at step "), lines[0]
    assert f"the run folder {run_dir} was removed or moved while the run went on" in lines[0]
    assert list(out.iterdir()) == []


def _after_steps(out: Path, steps: int, run: subprocess.Popen) -> Path:
    """The run folder once its metrics.csv holds `steps` rows."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and run.poll() is None:
        for metrics in out.glob("*/metrics.csv"):
            if len(metrics.read_text().splitlines()) > steps:
                return metrics.parent
        time.sleep(0.05)
    raise AssertionError(f"no run reached step {steps} (exit code {run.poll()})")


READ_ONLY_RUN = """
import subprocess, sys
from engine import events as ev
from engine.run.job import run_training
from engine.run.recorder import RecordingError
from tests.run_helpers import tiny_config
out = sys.argv[1]
cfg, doc = tiny_config(out, "parallel.world_size=2", "train.steps=200")
seen = []
def read_only_at_step_3(event):  # a read-only mount stacked on the run folder: its open files stay writable
    seen.append(event)
    if isinstance(event, ev.StepEnd) and event.step == 3:
        run_dir = next(e.run_dir for e in seen if isinstance(e, ev.RunStarted))
        subprocess.run(f"mount --bind {run_dir} {run_dir} && mount -o remount,bind,ro {run_dir}",
                       shell=True, check=True)
try:
    run_training(cfg, on_event=read_only_at_step_3, preset_doc=doc)
except RecordingError as e:
    print(e)
"""


def test_a_folder_made_read_only_mid_run_stops_it_once(tmp_path):
    """Read-only by chmod where permission bits bind; as root (they do not) by a read-only mount of the
    run's out_dir in a private mount namespace, which refuses root's writes too."""
    probe = tmp_path / "probe"
    probe.write_text("")
    probe.chmod(0o444)
    if os.access(probe, os.W_OK):
        message = _read_only_mount_run(tmp_path / "runs")
    else:
        cfg, doc = tiny_config(tmp_path, "parallel.world_size=2", "train.steps=200")
        seen: list = []

        def read_only_at_step_3(event) -> None:
            seen.append(event)
            if isinstance(event, ev.StepEnd) and event.step == 3:
                os.chmod(event_run_dir(seen), 0o555)

        with pytest.raises(RecordingError) as raised:
            run_training(cfg, on_event=read_only_at_step_3, preset_doc=doc)
        message = str(raised.value)
        os.chmod(event_run_dir(seen), 0o755)
    assert message.startswith("recording stopped at step ") and "(it became read-only)" in message, message
    step = int(message.split("recording stopped at step ")[1].split(":")[0])
    assert 3 <= step < 200
    assert rank_threads() == []


def _read_only_mount_run(out: Path) -> str:
    out.mkdir()
    unshare = shutil.which("unshare")
    mount = f"mount --bind {out} {out} && mount -o remount,bind,ro {out}"
    probe = subprocess.run([unshare, "-m", "sh", "-c", mount], capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("running as root (permission bits do not bind) on a system that allows no private "
                    "read-only mount (unshare -m): no run folder can be made read-only here")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([unshare, "-m", sys.executable, "-c", READ_ONLY_RUN, str(out)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    return lines[0]
