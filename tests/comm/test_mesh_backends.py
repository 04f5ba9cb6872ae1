"""Tensor, pipeline and context parallelism on the backends whose ranks are started from outside: DP 2 x TP 2
with sequence parallelism (the tp-sp-4 preset, shrunk, float64), DP 2 x PP 2 (the pp-2 preset on 4 ranks,
1F1B, shrunk, float64) and CP 2 x TP 2 (the cp-2-long preset on 4 ranks, shrunk, no dropout) on tcp ranks
started by hand (torchrun-style environment) and under `mpiexec -n 4`: one run folder, every rank's part in
its checkpoint, and the losses of the same layout on thread ranks."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from engine.config.presets import load_preset
from engine.run.job import run_training

pytestmark = pytest.mark.slow
LAYOUTS = {"tp-sp-4": ["model.n_layer=1"], "pp-2": ["model.n_layer=2", "parallel.world_size=4"],
           "cp-2-long": ["model.n_layer=1", "parallel.world_size=4", "parallel.tensor=2",
                         "model.dropout=0.0"]}
SMALL = [ "model.n_embd=32", "model.block_size=16", "data.max_chars=20000",
         "train.steps=3", "train.global_batch=8", "train.eval_every=0", "train.eval_batches=1",
         "optim.warmup_steps=0", 'precision.dtype="fp64"', "model.dropout=0.1"]


def _cli(preset: str, backend: str) -> list[str]:
    args = [a for s in [*SMALL, *LAYOUTS[preset]] for a in ("--set", s)]
    return [sys.executable, "-m", "nanodist_tui.cli", "run", "--preset", preset, "--backend", backend, *args]


def _losses(run_dir) -> list[float]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e["loss"] for e in map(json.loads, lines) if e["kind"] == "step_end"]


def _assert_like_thread_ranks(preset: str, tmp_path, monkeypatch) -> None:
    (run_dir,) = (tmp_path / "runs").iterdir()  # one folder: rank 0's process records the run
    (step,) = (run_dir / "checkpoints").iterdir()
    manifest = json.loads((step / "manifest.json").read_text())
    assert manifest["world_size"] == 4 and len(manifest["shards"]) == 4
    if preset == "tp-sp-4":
        assert manifest["tensor"] == 2 and [e["tp"] for e in manifest["shards"]] == [0, 1, 0, 1]
    monkeypatch.chdir(tmp_path)
    cfg, _, _ = load_preset(preset, [*SMALL, *LAYOUTS[preset], 'parallel.backend="threads"',
                                     f"run.out_dir={tmp_path / 't'}"])
    threads = run_training(cfg)
    assert _losses(run_dir) == pytest.approx(_losses(tmp_path / "t" / threads["run_dir"]), rel=1e-12)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("preset", list(LAYOUTS))
def test_tcp_ranks_started_by_hand(preset, tmp_path, monkeypatch):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "4", "NANODIST_SECRET": "test-secret"}
    ranks = [subprocess.Popen(_cli(preset, "tcp"), cwd=tmp_path, env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(4)]
    outputs = [p.communicate(timeout=300) for p in ranks]
    for p, (_, err) in zip(ranks, outputs):
        assert p.returncode == 0, err[-2000:]
    _assert_like_thread_ranks(preset, tmp_path, monkeypatch)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH (pip install mpi4py mpich)")
@pytest.mark.parametrize("preset", list(LAYOUTS))
def test_mpiexec_ranks(preset, tmp_path, monkeypatch):
    pytest.importorskip("mpi4py", reason="the MPI backend needs the mpi extra")
    done = subprocess.run([shutil.which("mpiexec") or "mpiexec", "-n", "4", *_cli(preset, "mpi")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_like_thread_ranks(preset, tmp_path, monkeypatch)
