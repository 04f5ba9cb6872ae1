"""A whole training run under mpiexec: rank 0's process records one run folder, every rank writes its
checkpoint shard into it, and the losses equal the same run on thread ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from extras import needs

from engine.config.presets import load_preset
from engine.run.job import run_training

needs("mpi4py", "mpi", "the MPI backend")
MPIEXEC = shutil.which("mpiexec")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install mpi4py mpich)")]
SETTINGS = ["train.steps=4", "optim.warmup_steps=0", "data.n_samples=2048", "train.eval_every=2",
            "checkpoint.every=2", "parallel.world_size=2", "precision.dtype=\"fp64\""]


def _losses(run_dir) -> list[float]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e["loss"] for e in map(json.loads, lines) if e["kind"] == "step_end"]


@pytest.mark.parametrize("algorithm", ["ring", "mpi-native"])
def test_training_under_mpiexec_matches_thread_ranks(tmp_path, monkeypatch, algorithm):
    sets = [*SETTINGS, f'parallel.algorithm="{algorithm}"']
    args = [a for s in sets for a in ("--set", s)]
    command = [MPIEXEC, "-n", "2", sys.executable, "-m", "nanodist_tui.cli", "run", "--preset", "mlp",
               "--backend", "mpi", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()  # one folder, made by rank 0's process
    manifest = json.loads((run_dir / "checkpoints" / "step-000004" / "manifest.json").read_text())
    assert manifest["world_size"] == 2

    monkeypatch.chdir(tmp_path / "runs")
    cfg, _, _ = load_preset("mlp", [*SETTINGS, 'parallel.backend="threads"'])
    threads = run_training(cfg)
    assert _losses(run_dir) == pytest.approx(_losses(tmp_path / "runs" / threads["run_dir"]), rel=1e-12)
