"""`--jobs J`: J processes running trials of one study at once, sharing its storage.

Each job is a spawned process that loads the sweep from its folder, opens the same study and runs its
share of the remaining trials (so the sweep ends with exactly n_trials). It talks to the launcher over a
pipe carrying JSON only (engine.comm.codec; never pickle): its events go up, "finish" (stop after the
running trial) and "stop" (stop it now) come down. Trial events come from every job; the training runs'
own events (the workbench's live panes) from job 0 only, so the panes follow one trial at a time.

A job process is not a daemon, since a trial on the processes backend starts rank processes of its own;
the launcher always reaps every job before returning, and a job whose pipe closes (the launcher died)
exits at once. Ctrl-C reaches the whole process group: jobs ignore it, the launcher turns the first one
into "stop" and waits for them to record their trials, a second one kills them.

Cores: the jobs split this host's CPUs between them (each job's affinity mask; its rank processes inherit
it), so J jobs of N ranks never run more compute threads than there are cores: each rank's automatic
thread count (engine.comm.cores) is then its share of its job's CPUs.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading

from engine import events as ev
from engine.comm import codec, pipe
from engine.comm.child import ChildProcess
from engine.comm.cores import usable_cores
from engine.comm.pipe import MAX_MESSAGE
from engine.run import stop_signals
from engine.run.job import one_line
from engine.sweep.loop import run_trials
from engine.sweep.study import load_sweep, open_study


def shares(remaining: int | None, jobs: int) -> list[int | None]:
    """Each job's number of trials: `remaining` split as evenly as it goes (None: no limit for any)."""
    if remaining is None:
        return [None] * jobs
    return [n for n in (remaining // jobs + (j < remaining % jobs) for j in range(jobs)) if n]


def job_cpus(cpus: set[int], jobs: int) -> list[list[int]]:
    """Each job's CPUs: the host's CPUs dealt out in turn, so the jobs' sets are disjoint when there are
    at least as many CPUs as jobs (with fewer, jobs share CPUs round-robin; each gets one)."""
    ordered = sorted(cpus)
    if jobs <= len(ordered):
        return [ordered[j::jobs] for j in range(jobs)]
    return [[ordered[j % len(ordered)]] for j in range(jobs)]


def run_jobs(sweep, jobs: int, remaining: int | None, timeout_s: float, emit, stop_event: threading.Event,
             finish_event: threading.Event) -> None:
    children: list[_Job] = []
    split = shares(remaining, jobs)
    cpus = job_cpus(usable_cores(), len(split))
    try:
        for number, share in enumerate(split):
            job = _Job(number)
            children.append(job)
            job.tell({"type": "run", "sweep_dir": str(sweep.sweep_dir), "n_trials": share,
                      "timeout_s": timeout_s, "job": number, "live": number == 0, "cpus": cpus[number]})
        _supervise(children, emit, stop_event, finish_event)
    finally:
        for job in children:
            job.reap()


class _Job(ChildProcess):
    """A sweep job process (not a daemon: a trial on the processes backend spawns rank processes)."""

    def __init__(self, number: int):
        super().__init__(job_main, f"nanodist-sweep-job{number}", daemon=False)
        self.number = number
        self.done = False


def _supervise(children: list[_Job], emit, stop_event: threading.Event,
               finish_event: threading.Event) -> None:
    told: set[str] = set()
    interrupted = False
    while not all(job.exited for job in children):
        try:
            _tick(children, emit)
            for signal_name, event in (("finish", finish_event), ("stop", stop_event)):
                if (event.is_set() or (interrupted and signal_name == "stop")) and signal_name not in told:
                    told.add(signal_name)
                    for job in children:
                        job.tell({"type": signal_name})
        except KeyboardInterrupt:
            if interrupted:
                for job in children:
                    job.process.kill()
                raise
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt


def _tick(children: list[_Job], emit) -> None:
    live = [job for job in children if not job.exited]
    ready = multiprocessing.connection.wait([j.conn for j in live if j.listening]
                                            + [j.process.sentinel for j in live], 0.1)
    for job in live:
        if job.conn in ready:
            _read(job, emit)
        if job.process.sentinel in ready:
            while job.listening and job.conn.poll() and _read(job, emit):
                pass  # what it said before it exited
            job.process.join()
            job.exited = True
            if not job.done:
                code = job.process.exitcode
                how = f"was killed by signal {signal.Signals(-code).name}" if code and code < 0 else \
                    f"exited with code {code}"
                emit(ev.Log(level="error", message=f"sweep job {job.number} {how}; the other jobs go on"))


def _read(job: _Job, emit) -> bool:
    try:
        message = codec.loads(job.conn.recv_bytes(MAX_MESSAGE))
    except (EOFError, OSError):
        job.listening = False
        return False
    kind = message.get("type") if isinstance(message, dict) else None
    if kind == "event":
        emit(ev.from_json(message["data"]))
    elif kind == "done":
        job.done = True
    elif kind == "error":
        job.done = True
        emit(ev.Log(level="error", message=f"sweep job {job.number} failed: {message.get('message')}"))
    return True


def job_main(conn) -> None:
    """Entry point of a job process (runs in the spawned child)."""
    stop, finish = threading.Event(), threading.Event()
    # A terminal's Ctrl-C and a scheduler's SIGTERM reach the whole process group, this job too: the first
    # stops its trial as the launcher's "stop" would (the trial checkpoints and is recorded as stopped), a
    # second ends the job (engine.run.stop_signals)
    stop_signals.rank_process_stop(stop.set)
    spec = codec.loads(conn.recv_bytes(MAX_MESSAGE))
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, spec["cpus"])  # this job's share of the host (see the module docstring)
    send = pipe.sender(conn)
    signals = {"stop": stop, "finish": finish}
    pipe.listen(conn, lambda message: signals.get(str(message.get("type")), threading.Event()).set(),
                "nanodist-sweep-control")
    try:
        sweep = load_sweep(spec["sweep_dir"])
        study = open_study(sweep, spec["job"])
        run_trials(sweep, study, lambda e: send({"type": "event", "data": ev.to_json(e)}), stop, finish,
                   spec["n_trials"], spec["timeout_s"], job=spec["job"], live=spec["live"])
        send({"type": "done"})
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which logs it
        send({"type": "error", "message": one_line(exc)})
