"""Checkpoint files: what a SIGKILL mid-write leaves (the previous checkpoint loads and resume works),
and refusing corrupted, truncated and mismatched checkpoints with one clear line."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from engine.checkpoint.files import MANIFEST, CheckpointError, checkpoint_dirs, finished_checkpoints, prune
from engine.checkpoint.resume import prepare_resume
from engine.checkpoint.sharded import find_checkpoint
from engine.run.job import resume_training
from tests.run_helpers import TINY, only_run, step_losses, train


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 2-rank run with checkpoints at steps 2, 4 and 6 (copy it before damaging it)."""
    out = tmp_path_factory.mktemp("finished")
    summary, events = train(out, "parallel.world_size=2")
    return summary, events


@pytest.fixture
def run_copy(finished_run, tmp_path):
    run_dir = tmp_path / "runs" / "copy"
    shutil.copytree(finished_run[0]["run_dir"], run_dir)
    return run_dir


# ----------------------------------------------------------------------------- SIGKILL while writing

# The child trains 2 ranks (threads) with a checkpoint every 2 steps. A hook in checkpoint_io makes the
# write of one file of the step-4 checkpoint stop half-way ("during") or before it starts ("before"),
# tells the test through a marker file and waits to be killed: a crash at exactly that moment.
_CHILD = """
import io, json, os, sys, time
from pathlib import Path
import engine.checkpoint.files as cio
from engine.config import presets
from engine.run.job import run_training

overrides, target, when, marker = json.loads(sys.argv[1])
real_atomic_write = cio.atomic_write

def wait_to_be_killed():
    Path(marker).write_text("now")
    time.sleep(600)

def hooked(path, write):
    path = Path(path)
    if path.parent.name != "step-000004" or path.name != target:
        return real_atomic_write(path, write)
    if when == "before":
        wait_to_be_killed()
    def half_then_stall(f):
        buf = io.BytesIO()
        write(buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        os.fsync(f.fileno())
        wait_to_be_killed()
    return real_atomic_write(path, half_then_stall)

cio.atomic_write = hooked
cfg, doc, _ = presets.load_preset("quickstart", overrides)
run_training(cfg, preset_doc=doc)
"""


def _kill_mid_checkpoint(tmp_path, target: str, when: str):
    marker = tmp_path / "writing"
    overrides = [*TINY, f"run.out_dir={tmp_path / 'runs'}", "parallel.world_size=2", "model.dropout=0.1"]
    spec = json.dumps([overrides, target, when, str(marker)])
    child = subprocess.Popen([sys.executable, "-c", _CHILD, spec], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, child.communicate()[1]
            assert time.monotonic() < deadline, "the child never reached the step-4 checkpoint"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return only_run(tmp_path / "runs")


@pytest.mark.slow
@pytest.mark.parametrize("target, when", [("rank-00001.npz", "during"), ("manifest.json", "before"),
                                          ("manifest.json", "during")],
                         ids=["mid-shard", "shards-done-no-manifest", "mid-manifest"])
def test_sigkill_while_writing_a_checkpoint_leaves_the_previous_one_usable(tmp_path, target, when):
    run_dir = _kill_mid_checkpoint(tmp_path, target, when)
    folders = dict(checkpoint_dirs(run_dir / "checkpoints"))
    assert sorted(folders) == [2, 4]
    assert not (folders[4] / MANIFEST).exists()  # the unfinished checkpoint has no manifest...
    half_written = [p.name for p in folders[4].iterdir() if p.name.endswith(".tmp")]
    assert any(target in name for name in half_written) == (when == "during")
    # The stalled write is half done; another rank may still have been writing its own shard at the kill
    # (it does not wait for the stalled one), never anything else.
    others = [name for name in half_written if target not in name]
    assert all(name.startswith(".rank-") for name in others) and (not others or target.startswith("rank-"))
    assert [s for s, _ in finished_checkpoints(run_dir / "checkpoints")] == [2]  # ...so it is ignored

    ckpt = find_checkpoint(run_dir)
    assert ckpt.step == 2
    ckpt.verify()
    assert ckpt.consolidate()["step"] == 2

    events: list = []
    summary = resume_training(run_dir, on_event=events.append)
    assert sorted(step_losses(events)) == [3, 4, 5, 6]
    assert summary["steps"] == 6 and find_checkpoint(summary["run_dir"]).step == 6
    # the next start cleaned what the killed writes left: the unfinished folder and every .tmp file
    assert [s for s, _ in checkpoint_dirs(run_dir / "checkpoints")] == [2]
    assert not list(run_dir.rglob("*.tmp"))


# ----------------------------------------------------------------------------- refusing bad checkpoints

def test_a_finished_checkpoint_verifies_and_holds_no_pickle(finished_run):
    run_dir = finished_run[0]["run_dir"]
    ckpt = find_checkpoint(run_dir)
    assert ckpt.step == 6 and ckpt.manifest["world_size"] == 2
    ckpt.verify()
    for entry in ckpt.manifest["shards"]:
        with np.load(ckpt.path / entry["file"], allow_pickle=False) as npz:
            assert all(npz[k].dtype != object for k in npz.files)
    manifest = json.loads((ckpt.path / MANIFEST).read_text())
    assert manifest["layout"][0]["name"] == "wte.weight" and manifest["vocab"]
    events = finished_run[1]
    assert [(e.step, e.path) for e in events if e.kind == "checkpoint_saved"][-1] == (6, str(ckpt.path))


def test_a_flipped_byte_is_caught_by_the_checksum(run_copy):
    shard = run_copy / "checkpoints" / "step-000006" / "rank-00000.npz"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted shard .*sha256") as err:
        prepare_resume(run_copy)
    assert "\n" not in str(err.value) and "rank-00000.npz" in str(err.value)
    assert prepare_resume(run_copy, step=4)[2].step == 4  # an earlier checkpoint is still fine


def test_a_truncated_shard_is_refused(run_copy):
    shard = run_copy / "checkpoints" / "step-000006" / "rank-00001.npz"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated"):
        prepare_resume(run_copy)


def test_a_missing_shard_is_refused(run_copy):
    (run_copy / "checkpoints" / "step-000006" / "rank-00000.npz").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        prepare_resume(run_copy)


def test_a_truncated_newest_manifest_is_an_error_naming_the_fallback(run_copy):
    manifest = run_copy / "checkpoints" / "step-000006" / MANIFEST
    manifest.write_text(manifest.read_text()[:200])
    with pytest.raises(CheckpointError, match="unreadable manifest") as err:
        find_checkpoint(run_copy)
    assert str(manifest) in str(err.value) and "--step 4" in str(err.value) and "\n" not in str(err.value)
    assert find_checkpoint(run_copy, step=4).step == 4  # the explicit fallback


@pytest.mark.parametrize("override, named", [("model.n_embd=48", "wte.weight"), ("model.n_layer=2", "blocks"),
                                             ("model.bias=false", "ln_1.bias"),
                                             ("model.tie_weights=false", "parameters there")])
def test_a_checkpoint_of_another_model_is_refused(run_copy, override, named):
    with pytest.raises(CheckpointError, match="different model") as err:
        prepare_resume(run_copy, [override])
    assert named in str(err.value)


def test_no_checkpoint_and_no_run_folder_are_one_line_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such run folder"):
        prepare_resume(tmp_path / "nowhere")
    (tmp_path / "empty" / "checkpoints" / "step-000002").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no finished checkpoint"):
        find_checkpoint(tmp_path / "empty")


def test_prune_keeps_the_newest_and_clears_unfinished_leftovers(run_copy):
    root = run_copy / "checkpoints"
    (root / "step-000001").mkdir()  # an unfinished leftover older than the newest finished one
    (root / "step-000009").mkdir()  # an unfinished newer one may still be being written: kept
    removed = prune(root, keep=2)
    assert sorted(p.name for p in removed) == ["step-000001", "step-000002"]
    assert [s for s, _ in checkpoint_dirs(root)] == [4, 6, 9]
