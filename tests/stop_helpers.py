"""Real process groups stopped by a signal, as a scheduler or a closing terminal stops them: start the CLI (or
a launcher of ranks) in a new session, wait for its first recorded steps, signal the group, read back what it
left (tests/run/test_stop_group.py, tests/comm/test_mpi_stop.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from engine.checkpoint.sharded import find_checkpoint
from engine.run.job import resume_training

REPO = str(Path(__file__).resolve().parents[1])
# quickstart's small GPT on 2 ranks, 400 steps (tens of seconds): the signal lands mid-run; no periodic
# checkpoint and no evaluation until the end, so the one checkpoint is the stop's and it is quick
STEPS = 400
SMALL = ["--preset", "quickstart", "--world-size", "2", "--set", f"train.steps={STEPS}",
         "--set", "checkpoint.every=0", "--set", "train.eval_every=0", "--set", "train.eval_batches=1",
         "--set", "data.max_chars=100000"]


def default_signals() -> None:
    """In the child: the signals under test as a terminal or a scheduler finds them, even when this suite
    runs under nohup or as a background job (which hand their children SIGHUP or SIGINT ignored)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "nanodist_tui.cli", *args]


def start(command: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """`command` as the leader of a new session (its own process group), output captured."""
    return subprocess.Popen(command, cwd=cwd, env={**os.environ, "PYTHONPATH": REPO, **(env or {})},
                            start_new_session=True, preexec_fn=default_signals, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_steps(runs: Path, proc: subprocess.Popen, steps: int = 3, timeout: float = 60) -> Path:
    """The run folder once its events.jsonl records `steps` finished steps (the run is under way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for events in runs.glob("*/events.jsonl"):
            if events.read_text().count('"kind": "step_end"') >= steps:
                return events.parent
        time.sleep(0.05)
    raise AssertionError(f"no {steps} steps recorded under {runs} in {timeout} s")


def assert_stopped_with_checkpoint(run_dir: Path, world: int) -> int:
    """The run is recorded stopped, and its one checkpoint holds every rank's shard of the same step, the
    last step its events finished; returns that step."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped", summary
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    last = max(e["step"] for e in events if e["kind"] == "step_end")
    assert 3 <= last < STEPS and summary["steps"] == last
    ckpt = find_checkpoint(run_dir)
    assert ckpt.step == last and [p.name for p in (run_dir / "checkpoints").iterdir()] == [ckpt.path.name]
    ckpt.verify()  # every rank's file against the manifest's checksums
    for rank in range(world):  # each rank's own record of the step it saved
        with np.load(ckpt.path / f"rank-{rank:05d}.npz", allow_pickle=False) as shard:
            meta = json.loads(bytes(shard["__meta__"]))
        assert (meta["rank"], meta["step"]) == (rank, last)
    return last


def assert_resumes_from(run_dir: Path, step: int) -> None:
    """`resume` continues the run from `step` (two more steps, on thread ranks to be quick)."""
    events: list = []
    done = resume_training(run_dir, [f"train.steps={step + 2}", 'parallel.backend="threads"'],
                           on_event=events.append)
    started = next(e for e in events if e.kind == "run_started")
    assert started.first_step == step
    assert [e.step for e in events if e.kind == "step_end"] == [step + 1, step + 2]
    assert done["steps"] == step + 2 and not done["stopped"]


def with_group_gone(proc: subprocess.Popen) -> None:
    """Whatever the test's outcome, nothing it started outlives it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
