"""torchrun-style rendezvous for the socket transport, with every connection authenticated.

Rank 0 listens on MASTER_ADDR:MASTER_PORT. Every other rank opens its own listener, dials rank
0, proves the shared secret (auth.py) and reports its rank and listen address; rank 0 answers
each with the table of all addresses. Then rank r dials ranks 1..r−1 and accepts ranks r+1..N−1,
so each pair has exactly one connection. Each new link then tries the shared-memory fast path
(both directions must attach, so it only happens on one host). Listeners close once the job is
wired: later strangers are refused by the kernel. During rendezvous, a connection that fails
the handshake or says something malformed is logged and closed; the job carries on.

Addresses: everything binds 127.0.0.1 unless the user names another address — NANODIST_BIND_ADDR,
or a MASTER_ADDR that is not loopback (rank 0 then binds MASTER_ADDR, the others the interface
they reach it through).

Two hosts, 2 ranks each (the secret file must be the same on both, mode 600):

    # host A (10.0.0.1)
    MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 WORLD_SIZE=4 NANODIST_SECRET_FILE=~/.nanodist_secret \\
        RANK=0 nanodist-tui run --preset gpt-mini --backend tcp --world-size 4 &   # and RANK=1
    # host B
    MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 WORLD_SIZE=4 NANODIST_SECRET_FILE=~/.nanodist_secret \\
        RANK=2 nanodist-tui run --preset gpt-mini --backend tcp --world-size 4 &   # and RANK=3
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping

from engine.comm import shm
from engine.comm.auth import AuthError, authenticate, recv_exact
from engine.comm.base import RankFailure, Signals
from engine.comm.meter import TrafficMeter
from engine.comm.tcp import Link, TcpCommunicator

log = logging.getLogger("nanodist.comm")

HANDSHAKE_S = 5.0          # a stranger holds the listener at most this long
MAX_SETUP_JSON = 1 << 20   # setup messages are small; refuse anything bigger before reading it
SHM_SLOTS, SHM_SLOT_BYTES = 4, 1 << 20
_LENGTH = struct.Struct("<I")


class SetupError(ConnectionError):
    """A peer broke the rendezvous protocol (bad length, bad JSON, wrong fields)."""


def connect(rank: int, world_size: int, master_addr: str, master_port: int, secret: bytes, *,
            bind_addr: str | None = None, timeout_s: float = 30.0, use_shm: bool = True,
            meter: TrafficMeter | None = None, signals: Signals | None = None,
            on_listening: Callable[[int], None] | None = None) -> TcpCommunicator:
    """Wire rank ``rank`` into the job; ``master_port`` 0 lets rank 0 pick a free port and report it
    through ``on_listening(port)`` (how the processes launcher does it, without port races)."""
    signals = signals if signals is not None else Signals()
    deadline = time.monotonic() + timeout_s
    use_shm = use_shm and shm.available()
    socks: dict[int, socket.socket] = {}
    if rank == 0:
        host = bind_addr or ("127.0.0.1" if _is_loopback(master_addr) else master_addr)
        listener = _listen(host, master_port)
        if on_listening is not None:
            on_listening(listener.getsockname()[1])
        hellos = {}
        while len(socks) < world_size - 1:
            peer, sock, hello = _accept(listener, secret, world_size, set(range(1, world_size)) - set(socks),
                                        deadline, signals)
            socks[peer], hellos[peer] = sock, hello
        table = [[host, listener.getsockname()[1]]] + [hellos[r]["listen"] for r in range(1, world_size)]
        for sock in socks.values():
            _send_json(sock, {"table": table})
    else:
        master = _dial(master_addr, master_port, secret, deadline)
        local = master.getsockname()[0]
        host = bind_addr or ("127.0.0.1" if _is_loopback(master_addr) else local)
        listener = _listen(host, 0)
        advertised = local if host in ("0.0.0.0", "") else host
        _send_json(master, {"rank": rank, "world_size": world_size,
                            "listen": [advertised, listener.getsockname()[1]]})
        addresses = _recv_json(master, deadline).get("table")
        if not (isinstance(addresses, list) and len(addresses) == world_size):
            raise SetupError("rank 0 sent a malformed address table")
        socks[0] = master
        for peer in range(1, rank):
            socks[peer] = _dial(str(addresses[peer][0]), int(addresses[peer][1]), secret, deadline)
            _send_json(socks[peer], {"rank": rank, "world_size": world_size})
        while len(socks) < world_size - 1:
            peer, sock, _ = _accept(listener, secret, world_size,
                                    set(range(rank + 1, world_size)) - set(socks), deadline, signals)
            socks[peer] = sock
    listener.close()
    # Ascending peer order on every rank visits pairs in one global (low, high) order: no deadlock.
    links = {peer: _make_link(rank, peer, socks[peer], signals, use_shm, deadline) for peer in sorted(socks)}
    return TcpCommunicator(rank, world_size, links, timeout_s, meter, signals)


def connect_from_env(timeout_s: float = 30.0, stop_event: threading.Event | None = None,
                     meter: TrafficMeter | None = None, environ: Mapping[str, str] = os.environ,
                     signals: Signals | None = None):
    """``connect`` configured like torchrun: MASTER_ADDR (default 127.0.0.1), MASTER_PORT, RANK,
    WORLD_SIZE, NANODIST_SECRET or NANODIST_SECRET_FILE, optional NANODIST_BIND_ADDR, NANODIST_SHM=0.
    `signals` (stop and pause flags) wins over `stop_event`."""
    def integer(name: str) -> int:
        try:
            return int(environ[name])
        except (KeyError, ValueError):
            raise ValueError(f"environment variable {name} must be set to an integer for the tcp backend; "
                             f"set it as torchrun would") from None

    return connect(integer("RANK"), integer("WORLD_SIZE"), environ.get("MASTER_ADDR", "127.0.0.1"),
                   integer("MASTER_PORT"), read_secret(environ), bind_addr=environ.get("NANODIST_BIND_ADDR"),
                   timeout_s=timeout_s, use_shm=environ.get("NANODIST_SHM", "1") != "0", meter=meter,
                   signals=signals if signals is not None else Signals(stop_event))


def read_secret(environ: Mapping[str, str]) -> bytes:
    if environ.get("NANODIST_SECRET"):
        return environ["NANODIST_SECRET"].encode()
    path = environ.get("NANODIST_SECRET_FILE")
    if not path:
        raise ValueError("the tcp backend needs a shared secret: set NANODIST_SECRET or NANODIST_SECRET_FILE "
                         "(the same on every host)")
    path = os.path.expanduser(path)
    if os.stat(path).st_mode & 0o077:
        log.warning("secret file %s is readable by other users; chmod 600 it", path)
    with open(path, "rb") as handle:
        secret = handle.read().strip()
    if not secret:
        raise ValueError(f"NANODIST_SECRET_FILE {path} is empty")
    return secret


def _make_link(rank: int, peer: int, sock: socket.socket, signals: Signals, use_shm: bool,
               deadline: float) -> Link:
    """Offer our outgoing segment, attach the peer's; the link uses shared memory only if both worked."""
    mine = shm.Segment.create(SHM_SLOTS, SHM_SLOT_BYTES) if use_shm else None
    try:
        _send_json(sock, {"shm": [mine.path, mine.cookie.hex()] if mine else None})
        offer = _recv_json(sock, deadline).get("shm")
        theirs = None
        if isinstance(offer, list) and len(offer) == 2 and isinstance(offer[1], str) and use_shm:
            try:
                theirs = shm.Segment.attach(offer[0], bytes.fromhex(offer[1]), SHM_SLOTS, SHM_SLOT_BYTES)
            except ValueError:
                theirs = None
        _send_json(sock, {"attached": theirs is not None})
        both = _recv_json(sock, deadline).get("attached") is True and theirs is not None
    finally:
        if mine is not None:
            mine.unlink()
    if not both:
        for segment in (mine, theirs):
            if segment is not None:
                segment.close()
        mine = theirs = None
    return Link(rank, peer, sock, signals, mine, theirs)


def _listen(host: str, port: int) -> socket.socket:
    return socket.create_server((host, port), backlog=128)


def _dial(host: str, port: int, secret: bytes, deadline: float) -> socket.socket:
    """Connect (retrying while the listener is not up yet) and authenticate."""
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
            break
        except (TimeoutError, ConnectionRefusedError, OSError) as exc:
            if time.monotonic() > deadline:
                raise ConnectionError(f"could not reach {host}:{port} before the rendezvous timeout: "
                                      f"{exc}") from None
            time.sleep(0.05)
    _tune(sock)
    authenticate(sock, secret, dialer=True, timeout_s=max(0.1, min(HANDSHAKE_S, deadline - time.monotonic())))
    return sock


def _accept(listener: socket.socket, secret: bytes, world_size: int, wanted: set[int], deadline: float,
            signals: Signals) -> tuple[int, socket.socket, dict]:
    """The next authenticated peer among ``wanted``; strangers and broken peers are logged and dropped."""
    while True:
        signals.raise_if_failed()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RankFailure(min(wanted), f"did not join the rendezvous within the timeout "
                                           f"(still waiting for ranks {sorted(wanted)})")
        listener.settimeout(min(remaining, 0.5))
        try:
            sock, address = listener.accept()
        except TimeoutError:
            continue
        try:
            _tune(sock)
            hs_deadline = time.monotonic() + min(HANDSHAKE_S, remaining)
            authenticate(sock, secret, dialer=False, timeout_s=hs_deadline - time.monotonic())
            hello = _recv_json(sock, hs_deadline)
            peer = hello.get("rank")
            if hello.get("world_size") != world_size or peer not in wanted:
                raise SetupError(f"unexpected rank {peer!r} / world size {hello.get('world_size')!r}")
            if "listen" in hello and not _is_address(hello["listen"]):
                raise SetupError("malformed listen address")
            return peer, sock, hello
        except (AuthError, SetupError, OSError) as exc:
            log.warning("refused connection from %s:%s: %s", address[0], address[1], exc)
            sock.close()


def _send_json(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_LENGTH.pack(len(data)) + data)


def _recv_json(sock: socket.socket, deadline: float) -> dict:
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


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, 4 << 20)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _is_address(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) \
        and isinstance(value[1], int) and 0 < value[1] < 65536
