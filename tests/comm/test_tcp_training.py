"""A training run on the tcp backend, ranks started by hand as on two hosts (torchrun-style env):
rank 0's process records the run, and its events carry every rank's step statistics, memory and traffic."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tcp_ranks_started_by_hand_train_and_report_every_rank(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2", "NANODIST_SECRET": "test-secret"}
    command = [sys.executable, "-m", "nanodist_tui.cli", "run", "--preset", "mlp", "--backend", "tcp",
               "--world-size", "2", "--set", "train.steps=3", "--set", "optim.warmup_steps=0",
               "--set", "data.n_samples=1024", "--set", "train.eval_every=0"]
    ranks = [subprocess.Popen(command, cwd=tmp_path, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outputs = [p.communicate(timeout=180) for p in ranks]
    for p, (_, err) in zip(ranks, outputs):
        assert p.returncode == 0, err[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()  # one folder: rank 0's process records the run
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    stats = [(e["step"], e["rank"]) for e in events if e["kind"] == "rank_stats"]
    assert stats == [(step, rank) for step in (1, 2, 3) for rank in (0, 1)]
    assert all(e["bytes_sent"] > 0 for e in events if e["kind"] == "rank_stats")
    # every rank's memory (one snapshot per phase) and traffic (its own links) reach rank 0's recorder
    memory = sorted((e["step"], e["rank"], e["phase"]) for e in events if e["kind"] == "memory_snapshot")
    assert memory == sorted((s, r, p) for s in (1, 2, 3) for r in (0, 1) for p in ("forward", "backward",
                                                                                     "optimizer"))
    traffic = [e for e in events if e["kind"] == "traffic"]
    assert sorted((e["step"], e["rank"]) for e in traffic) == [(s, r) for s in (1, 2, 3) for r in (0, 1)]
    sent = {(e["step"], e["rank"]): e["bytes_sent"] for e in events if e["kind"] == "rank_stats"}
    for e in traffic:  # a rank's links are its own sends, and add up to what its RankStats says
        assert {link["src"] for link in e["links"]} == {e["rank"]}
        assert sum(link["bytes"] for link in e["links"]) == sent[(e["step"], e["rank"])]
    assert "steps          3" in outputs[0][0] and "steps" not in outputs[1][0]
