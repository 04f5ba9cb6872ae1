"""The workbench in a real terminal (tmux): start `nanodist-tui`, wait for progress, switch panes by key,
stop (and confirm), quit; the screen shows the panes and no traceback, the command exits 0 and the shell
shows the run folder. Skips, saying why, only where tmux cannot be run (.ci/run installs it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TMUX = shutil.which("tmux")
# quickstart's own backend (processes), trained long enough that the test stops it mid-run
SETS = ["train.steps=3000", "train.eval_every=100", "model.block_size=32", "data.max_chars=200000",
        "parallel.world_size=2"]


def tmux(*args: str) -> str:
    return subprocess.run([TMUX, *args], capture_output=True, text=True, check=True).stdout


class Terminal:
    def __init__(self, name: str, cwd: Path, size: tuple[int, int] = (160, 50)) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", "NANODIST_CONFIG": "/nowhere"}
        subprocess.run([TMUX, "new-session", "-d", "-s", name, "-x", str(size[0]), "-y", str(size[1]),
                        "-c", str(cwd), "bash --norc --noprofile"], check=True, env=env)

    def screen(self) -> str:
        # -J: a line the terminal wrapped (a long run folder at 80 columns) comes back whole
        return tmux("capture-pane", "-p", "-J", "-t", self.name, "-S", "-200")

    def keys(self, *keys: str) -> None:
        tmux("send-keys", "-t", self.name, *keys)

    def wait_for(self, pattern: str, timeout: float, every_s: float = 0.5) -> str:
        """The screen once `pattern` (a regular expression) appears on it (looked for every `every_s`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = self.screen()
            if re.search(pattern, shown):
                return shown
            time.sleep(every_s)
        raise AssertionError(f"{pattern!r} never appeared; the screen shows:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run([TMUX, "kill-session", "-t", self.name], capture_output=True)


@pytest.mark.slow
@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (.ci/run installs it with apt-get)")
def test_start_watch_switch_stop_and_quit_in_a_real_terminal(tmp_path):
    term = Terminal(f"nanodist-{uuid.uuid4().hex[:8]}", tmp_path)
    try:
        sets = " ".join(f"--set {s}" for s in SETS)
        term.keys(f"{sys.executable} -m nanodist_tui.cli {sets}; echo EXIT=$?", "Enter")
        term.wait_for("2 ranks on processes", timeout=120)
        shown = term.wait_for("tok/s", timeout=120)  # progress: steps have arrived
        assert "1 overview" in shown and "memory per rank" in shown and "ring traffic" in shown
        term.keys("4")
        term.wait_for("sent per rank and step", timeout=30)
        term.keys("5")
        term.wait_for("sent/step", timeout=30)
        term.keys("s")
        term.wait_for(r"Stop training here\?", timeout=30)
        term.keys("y")
        term.wait_for(" stopped ", timeout=120)
        before_quit = term.screen()
        term.keys("q")
        after = term.wait_for(r"EXIT=\d", timeout=60)  # the shell's echo, not the command line's
        assert "Traceback" not in before_quit + after
        assert "EXIT=0" in after
        assert "run folder     " in after and "(stopped early, checkpoint kept)" in after
        run_dirs = list((tmp_path / "runs").iterdir())
        assert len(run_dirs) == 1 and str(run_dirs[0].name) in after
    finally:
        term.close()


def start(term: Terminal) -> None:
    sets = " ".join(f"--set {s}" for s in SETS)
    term.keys(f"{sys.executable} -m nanodist_tui.cli {sets}; echo EXIT=$?", "Enter")


def ended_with_the_checkpoint_kept(term: Terminal, tmp_path: Path, since: float, within_s: float) -> None:
    """The command exits 0 within `within_s` of `since`, the shell shows the stopped run's folder, and the
    folder holds its checkpoint."""
    after = term.wait_for(r"EXIT=\d", timeout=60)
    took = time.monotonic() - since
    assert "Traceback" not in after and "EXIT=0" in after, after
    assert took < within_s, f"took {took:.1f} s to exit"
    assert "(stopped early, checkpoint kept)" in after
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert "run folder     " in after and run_dir.name in after
    assert any("manifest" in p.name for p in run_dir.rglob("*")), sorted(p.name for p in run_dir.rglob("*"))


def first_screen_comes_before_training(term: Terminal) -> None:
    """The workbench is on screen before the ranks have trained a step: it does not wait for them, and says
    what it is doing. (How soon, against a bare Textual program, is a benchmark's: `nanodist-tui bench
    ui-start`; a timed assertion here failed on loaded CI machines.)"""
    shown = term.wait_for("quickstart", timeout=30, every_s=0.05)
    assert "tok/s" not in shown and "step -/" in shown, f"the first screen shows:\n{shown}"


@pytest.mark.slow
@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (.ci/run installs it with apt-get)")
def test_ctrl_c_in_the_stop_dialog_at_80x24_stops_keeping_the_checkpoint_and_exits_0(tmp_path):
    term = Terminal(f"nanodist-{uuid.uuid4().hex[:8]}", tmp_path, size=(80, 24))
    try:
        start(term)
        first_screen_comes_before_training(term)
        term.wait_for("tok/s", timeout=120)
        term.keys("s")
        term.wait_for(r"Stop training here\?", timeout=10)
        pressed = time.monotonic()
        term.keys("C-c")
        ended_with_the_checkpoint_kept(term, tmp_path, pressed, within_s=20)
    finally:
        term.close()


@pytest.mark.slow
@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (.ci/run installs it with apt-get)")
def test_q_twice_at_80x24_stops_keeping_the_checkpoint_and_exits_0(tmp_path):
    term = Terminal(f"nanodist-{uuid.uuid4().hex[:8]}", tmp_path, size=(80, 24))
    try:
        start(term)
        term.wait_for("tok/s", timeout=120)
        term.keys("q")
        term.wait_for(r"Stop the run and quit\?", timeout=10)
        pressed = time.monotonic()
        term.keys("q")
        ended_with_the_checkpoint_kept(term, tmp_path, pressed, within_s=20)
    finally:
        term.close()
