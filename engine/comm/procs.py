"""The ``processes`` backend: N spawned OS processes wired by the socket transport on loopback.

The launcher spawns each rank with multiprocessing 'spawn' and talks to it over a pipe carrying
JSON messages only (codec.py; never pickle): the launch spec with a fresh random secret goes
down, events / result / error come up. Rank 0 binds a free port and reports it; the launcher
relays it to the others, so there is no port race. Control messages down the pipe: "master"
(the port), "stop" (should_stop() turns True), "pause" / "resume" (should_pause() turns True /
False), "abort" (the job failed: blocked calls raise RankFailure). A rank whose pipe closes (the
launcher died) exits at once: no orphans.

Ctrl-C in the terminal, a scheduler's SIGTERM and a hang-up reach the whole process group: the launcher turns
the first one into a stop request, and so does a rank process (engine.run.stop_signals: the ranks agree on the
step); a second one kills; run_ranks then raises KeyboardInterrupt.
On the first failure the launcher tells every rank to abort, gives them a short grace period to
exit by themselves, then kills what is left; it always reaps every child before returning. A timeout
(a rank that waited too long on a peer) is first given COLLECT_S for the other ranks' timeouts to come
in: a rank waiting on a hung rank is itself silent to whoever waits on it, so the rank blamed is the end
of the chain of waits — the one that stopped communicating — which is killed at once. Before any rank
times out, it asks the job's progress board (progress.py, a small shared file the launcher makes and
every rank maps) whether the end of its chain of waits is still making progress: a rank starved of a
core among many others is slow, not hung, and the wait goes on.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.connection
import os
import secrets
import signal
import sys
import threading
import time
import traceback

from engine.comm import codec, cores, pipe
from engine.comm.base import PeerTimeout, RankFailure, Signals, StopRequested, blame
from engine.comm.child import ChildProcess
from engine.comm.pipe import MAX_MESSAGE
from engine.comm.progress import Board
from engine.run import stop_signals

ABORT_GRACE_S = 3.0
COLLECT_S = 0.3  # after a first timeout, how long to gather the others before naming the hung rank


def run_processes(world_size, rank_fn, args, on_event, timeout_s, signals: Signals, threads: int = 1,
                  network=None) -> list:
    """Run rank_fn on `world_size` spawned processes, each limiting its thread pools to `threads`;
    ``network``: a NetworkEmulation that shapes every rank's links, or None."""
    target = _qualified_name(rank_fn)
    board_path = Board.create_file(world_size)
    board = Board.attach(board_path, world_size)
    spec = {"world_size": world_size, "target": target, "args": list(args), "secret": secrets.token_hex(32),
            "timeout_s": timeout_s, "shm": os.environ.get("NANODIST_SHM", "1") != "0", "threads": threads,
            "network": network.to_dict() if network is not None else None, "board": board_path}
    children: list[_Child] = []
    try:
        for rank in range(world_size):
            children.append(_Child(rank))
            children[-1].tell({**spec, "rank": rank})
        return _Supervisor(children, on_event, timeout_s, signals, board_path, board).run()
    finally:
        for child in children:
            child.reap()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(board_path)
        if board is not None:
            board.close()


class _Child(ChildProcess):
    """A rank process; `outcome` is what it reported (result or failure), None until then."""

    def __init__(self, rank: int):
        super().__init__(child_main, f"nanodist-rank{rank}", daemon=True)
        self.rank = rank
        self.outcome: tuple | None = None


class _Supervisor:
    def __init__(self, children: list[_Child], on_event, timeout_s: float, signals: Signals,
                 board_path: str | None = None, board: Board | None = None):
        self.children, self.on_event = children, on_event
        self.board_path, self.board = board_path, board  # the path until every rank has mapped the board
        self.stop_event, self.pause_event = signals.stop, signals.pause
        self.paused = False  # what the ranks were last told
        self.timeout_s = timeout_s
        self.failures: list[tuple[int, int, str]] = []  # (reporting rank, blamed rank, cause) by arrival
        self.timeouts: dict[int, int] = {}  # reporting rank -> the rank it timed out waiting on
        self.failed_at: float | None = None
        self.aborted = False
        self.stop_at: float | None = None
        self.interrupted = False

    def run(self) -> list:
        while not all(child.exited for child in self.children):
            try:
                self._tick()
            except KeyboardInterrupt:
                if self.interrupted:
                    raise
                self.interrupted = True  # first Ctrl-C: stop cleanly; a second one kills
        if self.interrupted:
            raise KeyboardInterrupt
        return self._verdict()

    def _tick(self) -> None:
        live = [c for c in self.children if not c.exited]
        ready = multiprocessing.connection.wait([c.conn for c in live if c.listening]
                                                + [c.process.sentinel for c in live], 0.1)
        for child in live:
            if child.conn in ready:
                self._read(child)
            if child.process.sentinel in ready:
                self._exited(child)
        if self.board_path is not None and self.board is not None and self.board.all_registered():
            os.unlink(self.board_path)  # every rank holds its mapping: a killed launcher leaves nothing
            self.board_path = None
        now = time.monotonic()
        if (self.stop_event.is_set() or self.interrupted) and self.stop_at is None:
            self.stop_at = now
            for child in self.children:
                child.tell({"type": "stop"})
        if self.pause_event.is_set() != self.paused:
            self.paused = not self.paused
            for child in self.children:
                child.tell({"type": "pause" if self.paused else "resume"})
        if self.failed_at is not None and not self.aborted and now - self.failed_at > COLLECT_S:
            self._abort()
        grace = min(ABORT_GRACE_S, self.timeout_s) + COLLECT_S
        if self.failed_at is not None and now - self.failed_at > grace:
            for child in self.children:
                child.kill()
        if self.stop_at is not None and self.failed_at is None and now - self.stop_at > self.timeout_s:
            stuck = next(c.rank for c in self.children if not c.exited)
            self._failed(stuck, stuck, f"did not stop within {self.timeout_s:g} s of the stop request")

    def _read(self, child: _Child) -> bool:
        try:
            message = codec.loads(child.conn.recv_bytes(MAX_MESSAGE))
        except (EOFError, OSError):
            child.listening = False
            return False
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "event":
            self.on_event(message["data"])
        elif kind == "master":
            for other in self.children[1:]:
                other.tell(message)
        elif kind == "result":
            child.outcome = ("result", message.get("value"))
        elif kind == "stopped":
            child.outcome = ("stopped",)
        elif kind == "error":
            child.outcome = ("error",)
            if message.get("timeout") and not self.aborted:
                self.timeouts[child.rank] = int(message["rank"])
            self._failed(child.rank, int(message["rank"]), str(message["cause"]))
        return True

    def _exited(self, child: _Child) -> None:
        while child.listening and child.conn.poll() and self._read(child):
            pass  # read what it said before it exited first
        child.process.join()
        child.exited = True
        if child.outcome is None and not child.killed:
            child.outcome = ("died",)
            self._failed(child.rank, child.rank, _describe_exit(child.process.exitcode))

    def _failed(self, reporter: int, blamed: int, cause: str) -> None:
        self.failures.append((reporter, blamed, cause))
        if self.failed_at is None:
            self.failed_at = time.monotonic()
        if reporter not in self.timeouts:  # a rank raised or died: nothing more to wait for
            self._abort()

    def _abort(self) -> None:
        """Tell every rank the job failed, naming the culprit; a hung culprit is killed at once."""
        if self.aborted:
            return
        self.aborted = True
        blamed, cause = self._culprit()
        for child in self.children:
            child.tell({"type": "abort", "rank": blamed, "cause": cause})
        if blamed in self.timeouts.values() and blamed not in self.timeouts:
            self.children[blamed].kill()  # it stopped communicating and will not notice the abort

    def _culprit(self) -> tuple[int, str]:
        """A rank's own failure explains the others' (they saw its socket close or its abort); else the
        end of the chain of timeouts: the first blamed rank, followed while it too timed out on a peer."""
        own = [(blamed, cause) for reporter, blamed, cause in self.failures if reporter == blamed]
        if own:
            return own[0]
        reporter, blamed, cause = self.failures[0]
        chain = [reporter]
        while blamed in self.timeouts and blamed not in chain:
            chain.append(blamed)
            blamed = self.timeouts[blamed]
        if blamed in chain:  # a cycle of waits: keep the first report
            return self.failures[0][1], cause
        waited = f"rank{'s' * (len(chain) > 1)} {', '.join(map(str, chain))} waited on it"
        return blamed, f"did not answer for {self.timeout_s:g} s ({waited})"

    def _verdict(self) -> list:
        if self.failures:
            raise RankFailure(*self._culprit())
        return [child.outcome[1] if child.outcome and child.outcome[0] == "result" else None
                for child in self.children]


def child_main(conn) -> None:
    """Entry point of a rank process (runs in the spawned child)."""
    signals, master = Signals(), {}
    # Ctrl-C, a scheduler's SIGTERM or a hang-up reaches the whole process group: the rank stops after the
    # step the ranks agree on, as the launcher (which hears it too) asks every rank to; a second one kills
    stop_signals.rank_process_stop(signals.stop.set)
    spec = codec.loads(conn.recv_bytes(MAX_MESSAGE))
    rank, world_size, timeout_s = spec["rank"], spec["world_size"], spec["timeout_s"]
    cores.apply(spec["threads"])  # before rank_fn's module is imported or anything is built
    board = Board.attach(spec["board"], world_size)
    if board is not None:
        board.register(rank)  # this thread runs rank_fn: its CPU time is the rank's progress
    master_known = threading.Event()
    send = pipe.sender(conn)

    def on_message(message: dict) -> None:
        kind = message.get("type")
        if kind == "stop":
            signals.stop.set()
        elif kind == "pause":
            signals.pause.set()
        elif kind == "resume":
            signals.pause.clear()
        elif kind == "abort":
            signals.fail(int(message["rank"]), str(message["cause"]))
        elif kind == "master":
            master["port"] = int(message["port"])
            master_known.set()

    pipe.listen(conn, on_message, "nanodist-control")
    from engine.comm.emulation import NetworkEmulation
    from engine.comm.rendezvous import connect

    comm = None
    try:
        rank_fn = _resolve(spec["target"])
        if rank != 0 and not master_known.wait(timeout_s):
            raise RankFailure(0, "never reported its rendezvous port")
        comm = connect(rank, world_size, "127.0.0.1", master.get("port", 0), bytes.fromhex(spec["secret"]),
                       timeout_s=timeout_s, use_shm=spec["shm"], signals=signals,
                       on_listening=lambda port: send({"type": "master", "port": port}),
                       emulation=NetworkEmulation.from_dict(spec.get("network")))
        comm.threads_per_rank = spec["threads"]
        comm.board = board
        value = rank_fn(comm, lambda event: send({"type": "event", "data": event}), *spec["args"])
        send({"type": "result", "value": value})
    except StopRequested:
        send({"type": "stopped"})
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which names the rank
        blamed, cause = blame(rank, exc)
        signals.fail(blamed, cause)  # close without waiting for peers
        send({"type": "error", "rank": blamed, "cause": cause, "timeout": isinstance(exc, PeerTimeout),
              "traceback": traceback.format_exc()})
    finally:
        if comm is not None:
            comm.close()


def _qualified_name(fn) -> str:
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in name:
        raise ValueError("the processes backend needs rank_fn defined at module level of an importable "
                         f"module (got {fn!r})")
    return f"{module}:{name}"


def _resolve(target: str):
    module_name, name = target.split(":", 1)
    # A script's functions live in __mp_main__ in a spawned child.
    module = sys.modules["__mp_main__"] if module_name == "__main__" else importlib.import_module(module_name)
    for part in name.split("."):
        module = getattr(module, part)
    return module


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code} without reporting a result"
