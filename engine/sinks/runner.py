"""SinkSet: a run's telemetry sinks as one event-bus subscriber.

On the emitting thread it only folds the event into scalars and queues them, so a slow backend (a W&B
upload, an MLflow server) never slows training. Each sink works on its own thread, in event order. A sink
that fails — its library missing, its backend refusing, a write raising — is reported once, as a warning
`Log` event through `report` (the bus: the run log, the headless printer, the workbench), and is switched
off; training and the other sinks go on.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from engine import events as ev
from engine.run.summary import is_interruption
from engine.sinks import SinkUnavailable, make_sink
from engine.sinks.scalars import ScalarFolder

CLOSE_TIMEOUT_S = 60.0  # how long closing waits for a sink to finish (an online W&B run uploading)


class SinkSet:
    """The sinks named in `names` for the run folder `run_dir`; call it with events, then `close()`."""

    def __init__(self, names, run_dir: str | Path, log_cfg, report) -> None:
        self._report = report
        self._folder = ScalarFolder()
        self._status = "stopped"  # until a RunFinished or RunFailed says otherwise
        self._lock = threading.Lock()
        self._closed = False
        self._runners: list[_Runner] = []
        for name in names:
            try:
                sink = make_sink(name, Path(run_dir), log_cfg)
            except Exception as exc:  # e.g. the library is missing: the message names the extra
                report(_failure(name, exc, "could not start"))
                continue
            self._runners.append(_Runner(sink, report))
        self._requested = list(names)

    @property
    def working(self) -> list[str]:
        """The sinks that started and have not failed so far."""
        ok = {r.sink.name for r in self._runners if not r.failed}
        return [n for n in self._requested if n in ok]

    def __call__(self, event: Any) -> None:
        event = ev.as_event(event)
        with self._lock:
            if self._closed:
                return
            if isinstance(event, ev.RunStarted):
                self._put(("open", event))
            if points := self._folder.fold(event):
                self._put(("write", points))
            if isinstance(event, ev.RunFinished):
                self._status = "finished"
            elif isinstance(event, ev.RunFailed):
                self._status = "stopped" if is_interruption(event.message) else "failed"

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is pending, end every sink's run and wait for it (at most `timeout_s` in all)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if points := self._folder.flush():
                self._put(("write", points))
            self._put(("close", self._status))
        for runner in self._runners:
            if not runner.join(timeout_s):
                self._report(ev.Log(level="warning", message=f"{runner.sink.name} sink: still closing after "
                                    f"{timeout_s:.0f} s; left to finish in the background"))

    def _put(self, item: tuple[str, Any]) -> None:
        for runner in self._runners:
            runner.queue.put(item)


class _Runner:
    """One sink on its own thread: open, write, close in queue order; after a failure only close runs."""

    def __init__(self, sink, report) -> None:
        self.sink, self._report = sink, report
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self._opened = self.failed = False
        self._thread = threading.Thread(target=self._loop, name=f"nanodist-sink-{sink.name}", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            for kind, payload in _batched(self._drain()):
                if kind == "close":
                    if self._opened:
                        self._call("closing", self.sink.close, payload)
                    return
                if self.failed or (kind == "write" and not self._opened):
                    continue
                if kind == "open":
                    self._opened = self._call("opening", self.sink.open, payload)
                    if self._opened:
                        self._report(ev.Log(level="info", message=f"{self.sink.name}: {self.sink.where()}"))
                else:
                    self._call("writing", self.sink.write, payload)

    def _drain(self) -> list:
        items = [self.queue.get()]
        while True:
            try:
                items.append(self.queue.get_nowait())
            except queue.Empty:
                return items

    def _call(self, doing: str, fn, arg) -> bool:
        try:
            fn(arg)
            return True
        except Exception as exc:
            self.failed = True
            self._report(_failure(self.sink.name, exc, f"failed while {doing}"))
            return False


def _batched(items: list) -> list:
    """Consecutive writes merged into one, so a sink that fell behind catches up in few calls."""
    out: list = []
    for kind, payload in items:
        if kind == "write" and out and out[-1][0] == "write":
            out[-1] = ("write", out[-1][1] + payload)
        else:
            out.append((kind, payload))
    return out


def _failure(name: str, exc: BaseException, what: str) -> ev.Log:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    if len(text) > 300:
        text = text[:297] + "..."
    detail = text if isinstance(exc, SinkUnavailable) else f"{type(exc).__name__}: {text}"
    return ev.Log(level="warning", message=f"{name} sink {what} ({detail}); training goes on without it")
