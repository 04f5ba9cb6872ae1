"""OpenBLAS's idle workers sleep instead of spinning once the engine is imported (engine/fast/blas_idle.py):
measured as the CPU time a process burns while it sleeps between matrix products, against the same
process with the spin set to OpenBLAS's longest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.fast.blas_idle import THREAD_TIMEOUT, THREAD_TIMEOUT_VAR

# The child imports the engine first, as `nanodist-tui` and every rank process do, then times a loop of
# small products each followed by a sleep, with BLAS at 2 threads; it reports its CPU seconds (all its
# threads, time.process_time) and wall seconds over the loop, and what OpenBLAS was told.
_CHILD = r"""
import json, os, time
import engine
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
threadpool_limits(2)
blas = next(p for p in threadpool_info() if p["user_api"] == "blas")
a = np.ones((1024, 128), np.float32); b = np.ones((128, 256), np.float32)
for _ in range(5):
    a @ b
cpu, wall = time.process_time(), time.perf_counter()
for _ in range(20):
    a @ b
    time.sleep(0.02)
print(json.dumps({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall,
                  "env": os.environ.get("OPENBLAS_THREAD_TIMEOUT"), "api": blas["internal_api"],
                  "threads": blas["num_threads"]}))
"""


def _child(**env: str) -> dict:
    run_env = {k: v for k, v in os.environ.items() if k != THREAD_TIMEOUT_VAR} | env
    out = subprocess.run([sys.executable, "-c", _CHILD], env=run_env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_engine_sets_the_timeout_and_keeps_a_users_value():
    assert _child()["env"] == THREAD_TIMEOUT
    assert _child(**{THREAD_TIMEOUT_VAR: "12"})["env"] == "12"


def test_idle_blas_workers_sleep_instead_of_spinning():
    ours = _child()
    if ours["api"] != "openblas" or ours["threads"] < 2:
        pytest.skip(f"needs OpenBLAS with 2 threads; this NumPy has {ours['api']} with {ours['threads']}")
    spinning = _child(**{THREAD_TIMEOUT_VAR: "30"})  # OpenBLAS's longest spin: ~2^30 cycles
    # Spinning, the worker keeps a core busy through each 20 ms sleep (CPU ~ wall); asleep, the process
    # uses CPU only for the products (~ a tenth of the wall time on a quiet machine).
    assert spinning["cpu"] > 0.5 * spinning["wall"], spinning
    assert ours["cpu"] < 0.5 * spinning["cpu"], (ours, spinning)
