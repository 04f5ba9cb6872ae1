"""A run folder that fills up mid-run: the run stops once, cleanly, with one message (not a traceback per
event), a checkpoint of the step reached where the disk still allows one, and a summary.json that says
what happened. Two real ways to fill a disk: a file-size limit (RLIMIT_FSIZE: every write past it fails
with EFBIG, the checkpoint is small enough to fit) and a tiny tmpfs (ENOSPC for everything, the
checkpoint included), mounted in a private mount namespace where the system allows one."""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.checkpoint.sharded import find_checkpoint
from engine.run.recorder import read_events

REPO = Path(__file__).resolve().parents[2]
# a ~5k-parameter GPT (its checkpoint shard is ~60 kB) that would write ~2 kB of events per step for 400 steps
RUN = [sys.executable, "-m", "nanodist_tui.cli", "run", "-p", "quickstart", "--set",
       "parallel.backend=threads", "--set", "data.max_chars=20000",
       "--set", "model.n_layer=1", "--set", "model.n_embd=16", "--set", "model.n_head=2",
       "--set", "model.block_size=16", "--set", "train.global_batch=8", "--set", "train.eval_batches=1",
       "--set", "train.eval_every=0", "--set", "optim.warmup_steps=0", "--set", "train.steps=400",
       "--set", "checkpoint.every=0"]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}


def only_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.slow
def test_a_file_size_limit_stops_the_run_once_with_a_checkpoint(tmp_path):
    limit = 100_000  # events.jsonl reaches it after ~50 steps; the checkpoint (~60 kB) still fits

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), no kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run([*RUN, "--set", f"run.out_dir={tmp_path}"], env=ENV, cwd=tmp_path,
                          preexec_fn=limited, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    line = only_line(done.stderr)
    (run_dir,) = tmp_path.iterdir()
    assert line.startswith("run failed: recording stopped at step ") and "File too large" in line, line
    assert f"`nanodist-tui resume {run_dir}` continues it" in line
    step = int(line.split("recording stopped at step ")[1].split(":")[0])
    assert 10 < step < 400
    assert find_checkpoint(run_dir).step == step  # the stop kept the step reached
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "File too large" in summary["error"]
    assert read_events(run_dir)[-1].step <= step  # what was recorded reads back (no half line left)


def _can_mount_tmpfs(where: Path) -> bool:
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {where}"],
                           capture_output=True) if shutil.which("unshare") else None
    return probe is not None and probe.returncode == 0


@pytest.mark.slow
def test_a_full_tmpfs_stops_the_run_once_and_says_the_checkpoint_failed(tmp_path):
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    kept.mkdir()
    if not _can_mount_tmpfs(disk):
        pytest.skip("this system allows no private tmpfs mount (unshare -rm); the file-size-limit test "
                    "covers a full disk here")
    run = " ".join(f"'{a}'" for a in [*RUN, "--set", f"run.out_dir={disk}"])
    script = (f"mount -t tmpfs -o size=96k tmpfs {disk} && {{ {run}; rc=$?; cp -r {disk}/. {kept}/; "
              "exit $rc; }")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=ENV, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    line = only_line(done.stderr)
    assert line.startswith("run failed: recording stopped at step ") and "No space left on device" in line
    assert "stopping failed too" in line  # no room for the checkpoint either: said, in the same line
    (run_dir,) = kept.iterdir()
    read_events(run_dir)  # what was recorded reads back


class _FullDisk:
    """A file whose writes fail as on a full disk (the recorder's event log, swapped in)."""

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        pass


def test_a_recorder_that_cannot_write_says_so_once_and_keeps_the_figures(tmp_path):
    from engine import events as ev
    from engine.run.recorder import RunRecorder
    told: list[str] = []
    recorder = RunRecorder(tmp_path, "tiny", {"name": "tiny"}, on_failure=told.append)
    recorder._events = _FullDisk()
    for step in range(1, 6):
        recorder(ev.StepEnd(step=step, loss=1.0, lr=0.1, tokens=8, step_time_s=0.01, tokens_per_s=800.0,
                            grad_norm=1.0))
    recorder(ev.CheckpointSaved(step=5, path="somewhere"))
    assert len(told) == 1 and "No space left on device" in told[0] and str(recorder.run_dir) in told[0]
    assert recorder.summary["steps"] == 5 and recorder.last_checkpoint == 5  # in memory all the same
    recorder.close()
    summary = json.loads((recorder.run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left on device" in summary["error"]
