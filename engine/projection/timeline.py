"""One rank's step as two threads, the way nanoDist runs it: the training thread computes and submits
collectives; the rank's communication thread (engine.parallel.data.worker) runs them one at a time, in the
order submitted. Replaying a step's program on this clock gives what a step costs and where it went.

    compute(s)        the training thread works for s seconds
    submit(s, cpu)    queue a collective of s seconds (cpu of them copying and reducing) on the
                      communication thread: it starts when the thread is free and the work is submitted
    wait(task)        the training thread waits until that collective has finished
    blocking(s, cpu)  a collective the training thread runs itself (the communication thread is idle)
    inline(s)         a collective the training thread runs inside forward or backward (tensor
                      parallelism's): the communication thread keeps working on what it was given
    wait_for_peers(s) the training thread waits for a slower rank to reach the same collective

`lag`: where ranks outnumber the host's cores (`slicing` ranks per core's worth of CPU), the last rank,
the one the scheduler ran last, falls behind while the ranks compute — by the CPU seconds each computed
(compute ÷ slicing), at most `lag` (engine.projection.meeting_lag: a time slice, about) — and catches up
while the others wait on communication. At a meeting the training thread waits for what is left of it: a
collective it runs itself after computing, or one it waits for (minus the wait, in which the late rank
caught up).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Task:
    start: float
    end: float
    cpu: float


@dataclass
class Timeline:
    now: float = 0.0
    free_at: float = 0.0  # when the communication thread finishes what it was given
    compute_s: float = 0.0
    exposed_s: float = 0.0
    comm_s: float = 0.0  # every collective's seconds, hidden or not
    imbalance_s: float = 0.0  # waiting for slower ranks (counted in exposed_s)
    tasks: list[Task] = field(default_factory=list)
    busy: list[tuple[float, float]] = field(default_factory=list)  # the training thread computing
    shares_cores: bool = False
    kappa: float = 1.0  # compute lost per CPU second of overlapping communication
    lag: float = 0.0  # how late time-sliced peers reach a meeting, at most
    slicing: float = 1.0  # the ranks' CPU demand over the host's cores (1: no time-slicing)
    late: float = 0.0  # how far the last peer is behind now

    def compute(self, seconds: float) -> None:
        if seconds > 0:
            self.late = min(self.lag, self.late + seconds / self.slicing)
            self.busy.append((self.now, self.now + seconds))
            self.now += seconds
            self.compute_s += seconds

    def submit(self, seconds: float, cpu: float = 0.0) -> Task:
        start = max(self.now, self.free_at)
        task = Task(start, start + seconds, cpu)
        self.free_at = task.end
        self.tasks.append(task)
        self.comm_s += seconds
        return task

    def wait(self, task: Task) -> None:
        self._wait_until(task.end)

    def wait_all(self) -> None:
        self._wait_until(self.free_at)

    def _wait_until(self, end: float) -> None:
        if end > self.now:
            waited = end - self.now
            self.exposed_s += waited
            self.now = end
            self._meet(waited)

    def _meet(self, waited: float = 0.0) -> None:
        """The ranks meet: wait for what is left of the last one's lag after `waited` (it caught up)."""
        self.wait_for_peers(max(0.0, self.late - waited))
        self.late = 0.0

    def blocking(self, seconds: float, cpu: float = 0.0) -> None:
        self.wait_all()
        self._meet()
        self.now += seconds
        self.exposed_s += seconds
        self.comm_s += seconds

    def inline(self, seconds: float) -> None:
        if seconds <= 0:
            return
        self._meet()
        self.now += seconds
        self.exposed_s += seconds
        self.comm_s += seconds

    def wait_for_peers(self, seconds: float) -> None:
        if seconds <= 0:
            return
        self.now += seconds
        self.exposed_s += seconds
        self.imbalance_s += seconds

    @property
    def overlapped_s(self) -> float:
        return max(0.0, self.comm_s - (self.exposed_s - self.imbalance_s))

    @property
    def interference_s(self) -> float:
        """κ × the CPU share of every collective that ran while the training thread computed."""
        if not self.shares_cores:
            return 0.0
        total = 0.0
        for task in self.tasks:
            length = task.end - task.start
            if length <= 0 or task.cpu <= 0:
                continue
            hidden = sum(max(0.0, min(task.end, b) - max(task.start, a)) for a, b in self.busy)
            total += task.cpu * hidden / length
        return self.kappa * total

    @property
    def step_s(self) -> float:
        return self.now + self.interference_s
