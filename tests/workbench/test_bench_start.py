"""`nanodist-tui bench ui-start`: the clock stops at the first frame a program writes to its pseudo-terminal
(not before: a program that never draws the name is an error, with what it wrote), the timed run is stopped
with its whole process group, and the command prints both medians. How long the start takes is the
benchmark's figure, not asserted here."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from nanodist_tui.bench_start import PEER_SOURCE, first_frame_s
from tests.cli_helpers import assert_user_error, invoke

pytestmark = pytest.mark.slow


def test_the_clock_stops_when_the_name_reaches_the_terminal():
    """A program that sleeps 0.5 s and then prints the marker: the time includes the sleep."""
    slow = [sys.executable, "-c", "import time; time.sleep(0.5); print('here', flush=True); time.sleep(60)"]
    began = time.perf_counter()
    took = first_frame_s(slow, b"here")
    assert 0.5 <= took <= time.perf_counter() - began
    assert time.perf_counter() - began < 30  # stopped at once, not after its 60 s


def test_a_program_that_never_draws_the_name_is_an_error_saying_what_it_wrote():
    with pytest.raises(RuntimeError, match="it exited.*something else"):
        first_frame_s([sys.executable, "-c", "print('something else')"], b"quickstart")


def test_the_timed_program_and_what_it_started_are_stopped(tmp_path):
    """The process group goes: a child the timed program started is gone too."""
    pid_file = tmp_path / "child.pid"
    parent = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
              f"'import time; time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(p.pid)); "
              "print('ready', flush=True); time.sleep(60)")
    first_frame_s([sys.executable, "-c", parent], b"ready")
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and os.path.exists(f"/proc/{child}") and not zombie(child):
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}") or zombie(child)


def zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_peer_is_a_textual_program_drawing_the_name():
    assert first_frame_s([sys.executable, "-c", PEER_SOURCE, "quickstart"], b"quickstart") > 0


def test_the_command_prints_both_medians_and_refuses_a_bad_preset():
    result = invoke("bench", "ui-start", "--repeats", "1", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["median"]) == {"workbench", "textual"}
    assert len(report["runs"]["workbench"]) == len(report["runs"]["textual"]) == 1
    assert report["ratio"] == report["median"]["workbench"] / report["median"]["textual"]
    assert_user_error(invoke("bench", "ui-start", "--preset", "nope"), "nope")
