"""One job the workbench runs (a training run or a replay): its worker thread, its control (stop, pause),
its event batcher, the state the header shows, and what it came to (the summary, or the one failure).

The job runs as `job_fn(emit, control)` for a Textual thread worker (on a thread of normal priority: the
workbench's own draw at a lower one, priority.py); it only ever emits into the batcher,
which posts Ticks stamped with this session's id, so ticks of a previous session (a replaced run, a seek)
are told apart and dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from engine.run.control import RunControl
from nanodist_tui.bridge import EventBatcher
from nanodist_tui.messages import Tick
from nanodist_tui.priority import run_at_normal_priority
from nanodist_tui.replay import ReplayPlayer
from nanodist_tui.run_info import RunInfo

Emit = Callable[[Any], None]
JobFn = Callable[[Emit, RunControl], Any]
ACTIVE_STATES = ("starting", "running", "pausing", "paused", "stopping")
_ids = itertools.count(1)


class RunSession:
    def __init__(self, job_fn: JobFn, post: Callable[[Tick], bool], *, player: ReplayPlayer | None = None
                 ) -> None:
        self.id = next(_ids)
        self.job_fn = job_fn
        self.player = player
        self.control = RunControl()
        self.state = "starting"
        self.info: RunInfo | None = None
        # what a training job returned; until it has, what its RunFinished event said (app.py)
        self.summary: dict | None = None
        self.failure: str | None = None  # the first failure, shown once
        self.run_dir = ""
        self.worker: Any = None

        def stamped(tick: Tick) -> bool:
            tick.session = self.id
            return post(tick)

        self.batcher = EventBatcher(stamped)

    @property
    def replay(self) -> bool:
        return self.player is not None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def job_running(self) -> bool:
        """The job has not returned yet: after its run ends it still closes the run folder."""
        return self.worker is not None and not self.worker.is_finished

    def run(self) -> Any:
        """On the worker thread; the job itself on a thread at normal priority (priority.py)."""
        try:
            return run_at_normal_priority(lambda: self.job_fn(self.batcher.emit, self.control))
        finally:
            self.batcher.close()

    def fail(self, message: str) -> bool:
        """Record a failure; True for the first (the one to show), False for its echoes."""
        if self.failure is not None:
            return False
        self.failure = message
        return True
