"""torchrun-style rendezvous for the socket transport, with every connection authenticated.

Rank 0 listens on MASTER_ADDR:MASTER_PORT. Every other rank opens its own listener, dials rank
0, proves the shared secret (auth.py) and reports its rank and listen address; rank 0 answers
each with the table of all addresses. Then rank r dials ranks 1..r−1 and accepts ranks r+1..N−1,
so each pair has exactly one connection. Each new link then tries the shared-memory fast path
(both directions must attach, so it only happens on one host). Listeners close once the job is
wired: later strangers are refused by the kernel.

Strangers (the port faces the network on multi-host jobs) are admission.py's business: listeners serve
every connection at once, each with its own deadline, and drop a stranger without delaying anyone; a
joining rank retries until the job's timeout.

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
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

from engine.comm import shm
from engine.comm.admission import Door, dial, join, recv_json, send_json
from engine.comm.base import Signals
from engine.comm.emulation import NetworkEmulation
from engine.comm.meter import TrafficMeter
from engine.comm.tcp import Link, TcpCommunicator

log = logging.getLogger("nanodist.comm")

SHM_SLOTS, SHM_SLOT_BYTES = 4, 1 << 20


def connect(rank: int, world_size: int, master_addr: str, master_port: int, secret: bytes, *,
            bind_addr: str | None = None, timeout_s: float = 30.0, use_shm: bool = True,
            meter: TrafficMeter | None = None, signals: Signals | None = None,
            on_listening: Callable[[int], None] | None = None,
            emulation: NetworkEmulation | None = None) -> TcpCommunicator:
    """Wire rank ``rank`` into the job; ``master_port`` 0 lets rank 0 pick a free port and report it
    through ``on_listening(port)`` (how the processes launcher does it, without port races).
    ``emulation`` shapes the links (latency, bandwidth cap, virtual nodes: emulation.py)."""
    signals = signals if signals is not None else Signals()
    deadline = time.monotonic() + timeout_s
    use_shm = use_shm and shm.available()
    socks: dict[int, socket.socket] = {}
    if rank == 0:
        host = bind_addr or ("127.0.0.1" if _is_loopback(master_addr) else master_addr)
        listener = _listen(host, master_port)
        if on_listening is not None:
            on_listening(listener.getsockname()[1])
        joined = Door(listener, secret, world_size, signals).admit(set(range(1, world_size)), deadline)
        socks = {peer: sock for peer, (sock, _) in joined.items()}
        table = [[host, listener.getsockname()[1]]] + [joined[r][1]["listen"] for r in range(1, world_size)]
        for sock in socks.values():
            send_json(sock, {"table": table})
    else:
        host = bind_addr or ("127.0.0.1" if _is_loopback(master_addr) else _local_address(master_addr))
        listener = _listen(host, 0)
        advertised = _local_address(master_addr) if host in ("0.0.0.0", "") else host
        hello = {"rank": rank, "world_size": world_size, "listen": [advertised, listener.getsockname()[1]]}
        socks[0], addresses = join(master_addr, master_port, secret, hello, deadline, signals)
        for peer in range(1, rank):
            socks[peer] = dial(str(addresses[peer][0]), int(addresses[peer][1]), secret, deadline, signals)
            send_json(socks[peer], {"rank": rank, "world_size": world_size})
        wanted = set(range(rank + 1, world_size))
        if wanted:
            joined = Door(listener, secret, world_size, signals).admit(wanted, deadline)
            socks.update({peer: sock for peer, (sock, _) in joined.items()})
    listener.close()
    # Ascending peer order on every rank visits pairs in one global (low, high) order: no deadlock.
    links = {peer: _make_link(rank, peer, socks[peer], signals, use_shm, deadline) for peer in sorted(socks)}
    return TcpCommunicator(rank, world_size, links, timeout_s, meter, signals, emulation)


def connect_from_env(timeout_s: float = 30.0, stop_event: threading.Event | None = None,
                     meter: TrafficMeter | None = None, environ: Mapping[str, str] = os.environ,
                     signals: Signals | None = None, emulation: NetworkEmulation | None = None):
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
                   signals=signals if signals is not None else Signals(stop_event), emulation=emulation)


def read_secret(environ: Mapping[str, str]) -> bytes:
    """The shared secret, from NANODIST_SECRET or the file NANODIST_SECRET_FILE names; ValueError (one
    line naming the variable and the fix) when there is none or the file cannot give one."""
    if environ.get("NANODIST_SECRET"):
        return environ["NANODIST_SECRET"].encode()
    path = environ.get("NANODIST_SECRET_FILE")
    if not path:
        raise ValueError("the tcp backend needs a shared secret: set NANODIST_SECRET or NANODIST_SECRET_FILE "
                         "(the same on every host)")
    path = os.path.expanduser(path)
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_mode & 0o077:
                log.warning("secret file %s is readable by other users; chmod 600 it", path)
            secret = handle.read(1 << 16).strip()
    except OSError as exc:
        raise ValueError(f"NANODIST_SECRET_FILE {path}: {exc.strerror or exc}; point it at a file holding "
                         "the shared secret (the same on every host, mode 600)") from None
    if not secret:
        raise ValueError(f"NANODIST_SECRET_FILE {path} is empty; write the shared secret into it (e.g. "
                         "`openssl rand -hex 32 > FILE`)")
    return secret


def _make_link(rank: int, peer: int, sock: socket.socket, signals: Signals, use_shm: bool,
               deadline: float) -> Link:
    """Offer our outgoing segment, attach the peer's; the link uses shared memory only if both worked."""
    mine = shm.Segment.create(SHM_SLOTS, SHM_SLOT_BYTES) if use_shm else None
    try:
        send_json(sock, {"shm": [mine.path, mine.cookie.hex()] if mine else None})
        offer = recv_json(sock, deadline).get("shm")
        theirs = None
        if isinstance(offer, list) and len(offer) == 2 and isinstance(offer[1], str) and use_shm:
            try:
                theirs = shm.Segment.attach(offer[0], bytes.fromhex(offer[1]), SHM_SLOTS, SHM_SLOT_BYTES)
            except ValueError:
                theirs = None
        send_json(sock, {"attached": theirs is not None})
        both = recv_json(sock, deadline).get("attached") is True and theirs is not None
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


def _local_address(host: str) -> str:
    """The address of this host's interface towards `host` (a UDP "connect" sends nothing)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return probe.getsockname()[0]
    except OSError as exc:
        raise ConnectionError(f"MASTER_ADDR {host}: cannot find a route to it ({exc})") from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False
