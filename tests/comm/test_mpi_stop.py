"""Stopping a run under mpiexec by its process group, as a scheduler or Ctrl-C does: mpiexec (MPICH's Hydra)
forwards SIGTERM and SIGINT to every rank, each rank's CLI turns it into a stop request, the ranks agree on
the step, every rank checkpoints there, and the run is recorded stopped. (Hydra's mpiexec itself dies on
SIGHUP without forwarding it, so a hang-up is not covered here: docs/reliability.md.)"""

from __future__ import annotations

import os
import shutil
import signal

import pytest
import stop_helpers as stop
from extras import needs

needs("mpi4py", "mpi", "the MPI backend")
MPIEXEC = shutil.which("mpiexec")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install mpi4py mpich)")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_mpiexecs_group_stops_every_rank_at_the_same_step(tmp_path, sig):
    assert MPIEXEC is not None
    proc = stop.start([MPIEXEC, "-n", "2", *stop.cli("run", *stop.SMALL, "--backend", "mpi")], tmp_path)
    try:
        run_dir = stop.wait_for_steps(tmp_path / "runs", proc)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        stop.with_group_gone(proc)
    assert proc.returncode == 128 + sig, err[-3000:]  # mpiexec passes on its ranks' status
    assert "Traceback" not in err
    step = stop.assert_stopped_with_checkpoint(run_dir, world=2)
    if sig == signal.SIGTERM:
        stop.assert_resumes_from(run_dir, step)
