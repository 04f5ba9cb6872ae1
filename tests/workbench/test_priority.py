"""The workbench draws at a lower priority than the jobs it runs (nanodist_tui/priority.py): the drawing
thread's nice value is raised; a job, and the rank processes it starts, keep the process's own."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from nanodist_tui import priority

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")


def nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def spawner_nice() -> int:
    spawner = next(t for t in threading.enumerate() if t.name == priority.SPAWNER)
    return os.getpriority(os.PRIO_PROCESS, spawner.native_id)


def on_a_lowered_thread(fn):
    """fn() on a new thread that first lowers its own priority (as the workbench's drawing thread does)."""
    out: dict = {}

    def body() -> None:
        out["lowered"] = priority.lower_this_thread()
        out["own"] = nice_of_this_thread()
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    return out


def test_a_job_runs_at_the_spawners_priority_while_the_caller_is_lowered():
    priority.start_spawner()
    normal = spawner_nice()
    out = on_a_lowered_thread(lambda: priority.run_at_normal_priority(
        lambda: (nice_of_this_thread(), threading.current_thread().name)))
    assert out["lowered"] and out["own"] == max(normal, priority.UI_NICE)
    assert out["value"] == (normal, "nanodist-engine")


def test_a_process_the_job_starts_has_normal_priority():
    priority.start_spawner()
    normal = spawner_nice()
    child = [sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"]
    out = on_a_lowered_thread(lambda: priority.run_at_normal_priority(
        lambda: int(subprocess.run(child, capture_output=True, text=True, check=True).stdout)))
    assert out["value"] == normal
    # started by the lowered thread itself, the child inherits the lowered priority: the spawner is needed
    direct = on_a_lowered_thread(lambda: int(subprocess.run(child, capture_output=True, text=True,
                                                             check=True).stdout))
    assert direct["value"] == max(normal, priority.UI_NICE)


def test_a_jobs_error_reaches_the_caller():
    priority.start_spawner()

    def broken():
        raise ValueError("bad job")

    out = on_a_lowered_thread(lambda: priority.run_at_normal_priority(broken))
    assert isinstance(out["error"], ValueError) and str(out["error"]) == "bad job"


def test_the_workbench_draws_lowered_and_trains_at_normal_priority():
    from nanodist_tui.app import create_app
    seen: dict = {}

    def job(emit, control) -> dict:
        seen["job"] = nice_of_this_thread()
        return {}

    app = create_app("fake", job)

    async def until_done(pilot) -> None:
        await pilot.pause(0.2)
        while app.session is not None and app.session.active:
            await pilot.pause(0.05)
        seen["drawing"] = nice_of_this_thread()  # the event loop's thread: the app draws here
        app.exit()

    app.run(headless=True, size=(80, 24), auto_pilot=until_done)
    assert seen["drawing"] >= priority.UI_NICE
    assert seen["job"] == spawner_nice()
    assert seen["job"] < seen["drawing"] or seen["job"] >= priority.UI_NICE
