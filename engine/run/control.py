"""What a person can do to a running job from outside it: stop it, pause it, resume it.

`RunControl` is the job's stop event (``set()`` asks the job to stop; ``is_set()`` and ``wait()`` as on any
``threading.Event``), so it goes wherever a stop event is expected, and carries `pause` beside it: while
`pause` is set, the ranks hold after the step they are in and train on once it is cleared. Both requests
reach every rank on every backend (engine.comm.launch), and the ranks agree on them, so they stop or hold
after the same step.
"""

from __future__ import annotations

import threading


class RunControl(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.pause = threading.Event()

    def toggle_pause(self) -> bool:
        """Ask the job to hold (or to go on); True when it is now asked to hold."""
        if self.pause.is_set():
            self.pause.clear()
            return False
        self.pause.set()
        return True
