"""Getting peers into a job: a listener that serves every connection at once, dialing with retries,
and the small length-prefixed JSON messages of the rendezvous.

`Door` serves a listener's connections concurrently: each handshake (auth.py, then the peer's hello)
runs on its own thread with its own deadline, HANDSHAKE_S, and at most MAX_PENDING connections may be
unauthenticated at a time (more are closed at once). A connection that is silent, fails the handshake or
says something malformed is logged with its address and closed, without delaying anyone else, and is
never blamed on a rank. `dial` and `join` retry (connect, handshake, hello) until the job's deadline, so
a listener that is not up yet, busy or briefly full only delays a joining rank.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import struct
import threading
import time

from engine.comm.auth import AuthError, authenticate, recv_exact
from engine.comm.base import RankFailure, Signals

log = logging.getLogger("nanodist.comm")

HANDSHAKE_S = 5.0          # a connection must authenticate and say hello within this long
MAX_PENDING = 32           # unauthenticated connections served at once; more are closed at once
MAX_SETUP_JSON = 1 << 20   # setup messages are small; refuse anything bigger before reading it
_LENGTH = struct.Struct("<I")


class SetupError(ConnectionError):
    """A peer broke the rendezvous protocol (bad length, bad JSON, wrong fields)."""


class Door:
    """A rendezvous listener that serves every connection at once: each handshake runs on its own thread
    with its own deadline (HANDSHAKE_S), so a silent or broken stranger is dropped without delaying
    anyone else; at most MAX_PENDING connections may be unauthenticated at a time (more are closed at
    once and logged); a stranger is logged with its address and never blamed on a rank."""

    def __init__(self, listener: socket.socket, secret: bytes, world_size: int, signals: Signals):
        self.listener, self.secret, self.world_size, self.signals = listener, secret, world_size, signals
        self.admitted: queue.Queue = queue.Queue()  # (address, peer, sock, hello) of authenticated peers
        self.pending: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.closing = False
        self.refused = 0

    def admit(self, wanted: set[int], deadline: float) -> dict[int, tuple[socket.socket, dict]]:
        """Sockets and hellos of the ranks in `wanted`, once each has joined; RankFailure naming the first
        missing rank if they have not all joined by `deadline`."""
        joined: dict[int, tuple[socket.socket, dict]] = {}
        self.listener.settimeout(0.05)
        try:
            while len(joined) < len(wanted):
                self.signals.raise_if_failed()
                if time.monotonic() > deadline:
                    missing = sorted(wanted - set(joined))
                    strangers = f"; {self.refused} other connection(s) refused" if self.refused else ""
                    raise RankFailure(missing[0], f"did not join the rendezvous within the timeout "
                                                  f"(still waiting for ranks {missing}{strangers})")
                self._accept_one(wanted)
                self._collect(joined)
        except BaseException:
            for sock, _ in joined.values():
                sock.close()
            raise
        finally:
            self._close_pending()
        return joined

    def _accept_one(self, wanted: set[int]) -> None:
        try:
            sock, address = self.listener.accept()
        except TimeoutError:
            return
        with self.lock:
            full = len(self.pending) >= MAX_PENDING
            if not full:
                self.pending.add(sock)
        if full:
            self._refuse(address, f"{MAX_PENDING} connections are already being authenticated")
            sock.close()
            return
        threading.Thread(target=self._handshake, args=(sock, address, wanted), daemon=True,
                         name="nanodist-handshake").start()

    def _handshake(self, sock: socket.socket, address, wanted: set[int]) -> None:
        """On its own thread: prove the secret, read the hello, hand the peer over (or refuse it)."""
        hs_deadline = time.monotonic() + HANDSHAKE_S
        try:
            sock.setblocking(True)
            tune(sock)
            authenticate(sock, self.secret, dialer=False, timeout_s=HANDSHAKE_S)
            hello = recv_json(sock, hs_deadline)
            peer = hello.get("rank")
            if hello.get("world_size") != self.world_size or peer not in wanted:
                raise SetupError(f"unexpected rank {peer!r} / world size {hello.get('world_size')!r}")
            if "listen" in hello and not is_address(hello["listen"]):
                raise SetupError("malformed listen address")
        except Exception as exc:  # noqa: BLE001 - whatever a stranger does, it only loses its connection
            with self.lock:
                self.pending.discard(sock)
                closing = self.closing
            why = "the rendezvous completed before it authenticated" if closing else str(exc)
            self._refuse(address, why or type(exc).__name__)
            sock.close()
            return
        with self.lock:
            self.pending.discard(sock)
        self.admitted.put((address, peer, sock, hello))

    def _collect(self, joined: dict) -> None:
        while True:
            try:
                address, peer, sock, hello = self.admitted.get_nowait()
            except queue.Empty:
                return
            if peer in joined:  # the same rank again (it retried): its newest connection is the live one
                log.warning("rank %d connected again from %s:%s; using the new connection", peer,
                            *address[:2])
                joined[peer][0].close()
            joined[peer] = (sock, hello)

    def _refuse(self, address, why: str) -> None:
        self.refused += 1
        log.warning("refused connection from %s:%s: %s", address[0], address[1], why)

    def _close_pending(self) -> None:
        """Cut the handshakes still running (strangers, or late duplicates) and any admitted too late."""
        with self.lock:
            self.closing = True
            pending = list(self.pending)
        for sock in pending:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        while True:
            try:
                self.admitted.get_nowait()[2].close()
            except queue.Empty:
                break


def join(host: str, port: int, secret: bytes, hello: dict, deadline: float,
          signals: Signals) -> tuple[socket.socket, list]:
    """Dial rank 0, say hello, wait for the address table; start over (until `deadline`) whenever rank 0
    drops the connection before the table comes (it was busy, or refused us while full)."""
    while True:
        sock = dial(host, port, secret, deadline, signals)
        try:
            send_json(sock, hello)
            table = recv_json(sock, deadline).get("table")
            if not (isinstance(table, list) and len(table) == hello["world_size"]
                    and all(is_address(a) for a in table[1:])):
                raise SetupError("rank 0 sent a malformed address table")
            return sock, table
        except OSError as exc:  # SetupError and AuthError (a cut-off read) are OSErrors too
            sock.close()
            if time.monotonic() > deadline:
                raise RankFailure(0, f"did not complete the rendezvous within the timeout ({exc})") from None
            log.info("rendezvous with rank 0 at %s:%s interrupted (%s); joining again", host, port, exc)
            time.sleep(0.1)


def dial(host: str, port: int, secret: bytes, deadline: float,
          signals: Signals | None = None) -> socket.socket:
    """Connect and authenticate, retrying until `deadline` while the listener is not up yet, busy, or
    the handshake fails; AuthError if the last try failed the handshake, ConnectionError otherwise."""
    pause: float = 0.05
    last: OSError | None = None
    while True:
        if signals is not None:
            signals.raise_if_failed()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            kind = AuthError if isinstance(last, AuthError) else ConnectionError
            raise kind(f"could not join {host}:{port} before the rendezvous timeout: {last}")
        sock = None
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(remaining, HANDSHAKE_S)))
            sock.settimeout(None)
            tune(sock)
            authenticate(sock, secret, dialer=True, timeout_s=max(0.1, min(HANDSHAKE_S, remaining)))
            return sock
        except OSError as exc:  # AuthError is one: a wrong secret, or a listener too busy to answer
            if sock is not None:
                sock.close()
            last = exc
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 1.0)


def send_json(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_LENGTH.pack(len(data)) + data)


def recv_json(sock: socket.socket, deadline: float) -> dict:
    try:
        (length,) = _LENGTH.unpack(recv_exact(sock, _LENGTH.size, deadline))
        if length > MAX_SETUP_JSON:
            raise SetupError(f"setup message of {length} bytes exceeds the limit of {MAX_SETUP_JSON}")
        message = json.loads(recv_exact(sock, length, deadline))
    except AuthError as exc:
        raise SetupError(str(exc)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SetupError(f"setup message is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise SetupError("setup message is not a JSON object")
    return message


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, 4 << 20)


def is_address(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) \
        and isinstance(value[1], int) and 0 < value[1] < 65536
