"""One rank's step as two threads, the way nanoDist runs it: the training thread computes and submits
collectives; the rank's communication thread (engine.parallel.worker) runs them one at a time, in the
order submitted. Replaying a step's program on this clock gives what a step costs and where it went.

    compute(s)        the training thread works for s seconds
    submit(s, cpu)    queue a collective of s seconds (cpu of them copying and reducing) on the
                      communication thread: it starts when the thread is free and the work is submitted
    wait(task)        the training thread waits until that collective has finished
    blocking(s, cpu)  a collective the training thread runs itself (the communication thread is idle)
    wait_for_peers(s) the training thread waits for a slower rank to reach the same collective

`lag`: where ranks outnumber the host's cores, the last rank, the one the scheduler ran last, reaches a
meeting this late (engine.projection.meeting_lag): a collective the training thread runs itself after it
has computed since the last one waits that long for its peers first. Back-to-back collectives meet once
(no compute in between lets the ranks drift apart again), and the communication thread's collectives
wait on peers that are still computing, where the lag hides behind the compute.

Figures: compute (seconds computing), exposed (seconds waiting on communication, or running it),
overlapped (communication hidden behind compute), and interference — where ranks share a host's cores,
the CPU part of a collective that overlapped compute takes those cores (and, for its Python, the rank's
interpreter lock) from it: κ seconds of compute per CPU second (engine.projection.interference) come back
onto the step.
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
    lag: float = 0.0  # how late time-sliced peers reach a meeting
    computed_since_meeting: bool = False

    def compute(self, seconds: float) -> None:
        if seconds > 0:
            self.computed_since_meeting = True
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
        if task.end > self.now:
            self.exposed_s += task.end - self.now
            self.now = task.end

    def wait_all(self) -> None:
        if self.free_at > self.now:
            self.exposed_s += self.free_at - self.now
            self.now = self.free_at

    def blocking(self, seconds: float, cpu: float = 0.0) -> None:
        self.wait_all()
        if self.computed_since_meeting:
            self.wait_for_peers(self.lag)
            self.computed_since_meeting = False
        self.now += seconds
        self.exposed_s += seconds
        self.comm_s += seconds

    def wait_for_peers(self, seconds: float) -> None:
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
