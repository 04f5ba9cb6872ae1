"""How soon the workbench is on screen after its command starts (`nanodist-tui bench ui-start`).

The command runs as a user runs it, in a pseudo-terminal of 80 × 24 cells; the clock starts at the exec and
stops when the terminal has been sent the preset's name (the header's first line: the first frame). The peer,
timed the same way and taking turns with it, is the least a Textual program pays: an interpreter that
imports Textual and draws one line with the same name. What the workbench adds to it is its own imports, its
config and the first layout of its panes; the ranks start after the first frame, so none of their time is in
the figure.

A timed run is stopped as soon as its first frame is seen (its whole process group, rank processes included),
in a folder of its own that is deleted afterwards.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time

SIZE = (80, 24)  # columns, rows: the smallest terminal the workbench is laid out for
PEER_SOURCE = """
import sys
from textual.app import App
from textual.widgets import Static

class Peer(App):
    def compose(self):
        yield Static(sys.argv[1])

Peer().run()
"""


def first_frame_s(argv: list[str], marker: bytes, timeout_s: float = 60.0) -> float:
    """Seconds from starting `argv` in a fresh pseudo-terminal to `marker` in what it wrote to it."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(SIZE[0]), "LINES": str(SIZE[1])}
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        process = subprocess.Popen(argv, stdin=child, stdout=child, stderr=child, cwd=folder, env=env,
                                   start_new_session=True, close_fds=True)
        os.close(child)
        seen = b""
        try:
            while marker not in seen:
                left = began + timeout_s - time.perf_counter()
                exited = process.poll() is not None  # before the read: what it wrote before exiting is read
                ready, _, _ = select.select([parent], [], [], max(0.0, min(left, 0.5)))
                if ready:
                    try:
                        seen += os.read(parent, 65536)
                        continue
                    except OSError:  # the child side closed and nothing is left to read
                        pass
                if marker not in seen and (left <= 0 or exited):
                    tail = seen.decode(errors="replace")[-300:]
                    raise RuntimeError(f"{' '.join(argv[1:3])[:60]}: no first frame "
                                       f"({'timed out' if left <= 0 else 'it exited'}); it wrote: {tail!r}")
            return time.perf_counter() - began
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            os.close(parent)


def start_times(preset: str, sets: list[str], name: str, repeats: int = 5) -> dict:
    """`repeats` first frames of the workbench on `preset` (whose header names it `name`) and of the peer,
    taking turns (medians, every run, and the workbench's median over the peer's)."""
    ours = [sys.executable, "-m", "nanodist_tui.cli", "--preset", os.path.abspath(preset)
            if os.path.exists(preset) else preset, *(arg for s in sets for arg in ("--set", s))]
    peer = [sys.executable, "-c", PEER_SOURCE, name]
    runs: dict[str, list[float]] = {"workbench": [], "textual": []}
    for _ in range(repeats):
        runs["workbench"].append(first_frame_s(ours, name.encode()))
        runs["textual"].append(first_frame_s(peer, name.encode()))
    median = {kind: statistics.median(times) for kind, times in runs.items()}
    return {"runs": runs, "median": median, "ratio": median["workbench"] / median["textual"],
            "size": list(SIZE)}
