"""Stopping by the whole process group, as a cluster scheduler (Slurm's scancel, systemd) or a closing
terminal does: the headless CLI and every rank process receive the signal at once, and still every rank
checkpoints after the same step, the run is recorded `stopped`, each process exits 128 + the signal, and
resume continues from that step. Real processes in a new session, signalled once the first steps are
recorded."""

from __future__ import annotations

import os
import signal
import socket
import sys

import pytest
import stop_helpers as stop

pytestmark = pytest.mark.slow

# starts the tcp ranks and waits, as srun or torchrun do, in the ranks' session and deaf to the signals under
# test (a no-op handler, which exec resets for the ranks, unlike an inherited SIG_IGN); writes their codes
LAUNCHER = """
import os, signal, subprocess, sys
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, lambda *_: None)
ranks = [subprocess.Popen(sys.argv[2:], env={**os.environ, 'RANK': str(r)}) for r in range(2)]
with open(sys.argv[1], 'w') as out:
    out.write(' '.join(str(p.wait()) for p in ranks))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_process_group_stops_rank_processes_cleanly(tmp_path, sig):
    runs = tmp_path / "runs"
    command = stop.cli("--no-ui", *stop.SMALL, "--backend", "processes", "--set", f'run.out_dir="{runs}"')
    proc = stop.start(command, tmp_path)
    try:
        run_dir = stop.wait_for_steps(runs, proc)
        os.killpg(proc.pid, sig)  # the CLI and both rank processes at once
        out, err = proc.communicate(timeout=60)
    finally:
        stop.with_group_gone(proc)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err and "(stopped early, checkpoint kept)" in out
    step = stop.assert_stopped_with_checkpoint(run_dir, world=2)
    if sig == signal.SIGTERM:  # one resume is enough: SIGHUP leaves the same kind of checkpoint
        stop.assert_resumes_from(run_dir, step)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_tcp_ranks_session_stops_every_rank_at_the_same_step(tmp_path, sig):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
           "NANODIST_SECRET": "test-secret"}
    codes = tmp_path / "exit-codes"
    rank = stop.cli("run", *stop.SMALL, "--backend", "tcp")
    launcher = stop.start([sys.executable, "-c", LAUNCHER, str(codes), *rank], tmp_path, env)
    try:
        run_dir = stop.wait_for_steps(tmp_path / "runs", launcher)
        os.killpg(launcher.pid, sig)  # both ranks (and their launcher, which lets them finish)
        _, err = launcher.communicate(timeout=60)
    finally:
        stop.with_group_gone(launcher)
    assert launcher.returncode == 0 and codes.read_text() == f"{128 + sig} {128 + sig}", err[-3000:]
    assert "Traceback" not in err
    step = stop.assert_stopped_with_checkpoint(run_dir, world=2)
    if sig == signal.SIGTERM:
        stop.assert_resumes_from(run_dir, step)
