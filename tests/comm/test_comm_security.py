"""The socket transport refuses what it should, logs it, and the job carries on: wrong secrets,
strangers, oversized and malformed headers. Headers are checked before anything is allocated."""

from __future__ import annotations

import logging
import random
import socket
import struct
import time
import tracemalloc

import numpy as np
import pytest

from engine.comm import ProtocolError, admission, rendezvous, wire
from engine.comm.auth import AuthError, authenticate
from engine.comm.rendezvous import connect_from_env
from tests.socket_helpers import SECRET, job_still_works, wire_job


def header(**fields) -> bytes:
    values = {"magic": wire.MAGIC, "version": wire.VERSION, "kind": wire.DATA, "code": 3, "ndim": 1,
              "flags": 0, "slot": 0, "nbytes": 40, "dims": (10,)}
    values.update(fields)
    dims = tuple(values["dims"]) + (0,) * (wire.MAX_NDIM - len(values["dims"]))
    return wire.HEADER.pack(values["magic"], values["version"], values["kind"], values["code"],
                            values["ndim"], values["flags"], values["slot"], values["nbytes"], *dims)


BAD_HEADERS = {
    "bad magic": header(magic=b"HTTP"),
    "unsupported version": header(version=9),
    "unknown frame kind": header(kind=77),
    "not in the allowlist": header(code=200),
    "bad ndim": header(ndim=9),
    "stray shape": header(ndim=1, dims=(10, 3)),
    "does not match the payload": header(nbytes=12),
    "exceeds the limit": header(nbytes=1 << 50, dims=(1 << 48,)),
    "control frame": header(kind=wire.ACK),
}


@pytest.mark.parametrize("what", BAD_HEADERS)
def test_malformed_headers_rejected_before_allocation(what):
    tracemalloc.start()
    try:
        with pytest.raises(wire.FrameError, match=what):
            wire.unpack(BAD_HEADERS[what], max_bytes=1 << 40)
        assert tracemalloc.get_traced_memory()[1] < 64 * 1024  # nothing sized by the peer's numbers
    finally:
        tracemalloc.stop()
    assert wire.unpack(header(), max_bytes=1 << 40).shape == (10,)


@pytest.mark.parametrize("what", ["bad magic", "exceeds the limit", "does not match the payload"])
@pytest.mark.parametrize("use_shm", [False, True])
def test_malformed_frame_from_a_peer_is_refused_and_named(what, use_shm, caplog):
    comms, _ = wire_job(use_shm=use_shm)
    comms[1].links[0].sock.send(BAD_HEADERS[what])
    with caplog.at_level(logging.ERROR, "nanodist.comm"), pytest.raises(ProtocolError, match=what) as err:
        comms[0].recv(1, np.empty(10, np.float32))
    assert err.value.rank == 1
    assert "malformed frame from rank 1" in caplog.text
    for comm in comms:
        comm.close()


def test_frame_that_does_not_fit_the_receive_is_refused():
    comms, _ = wire_job(use_shm=False)
    comms[1].links[0].sock.send(header(code=4, nbytes=80))  # float64[10], but rank 0 wants float32[10]
    with pytest.raises(ProtocolError, match="expected float32"):
        comms[0].recv(1, np.empty(10, np.float32))
    for comm in comms:
        comm.close()


def test_wrong_secret_refused_and_logged_job_unharmed(caplog):
    outcome = {}

    def impostor(port: int) -> None:
        try:
            admission.dial("127.0.0.1", port, b"not the secret", time.monotonic() + 1)  # retries, fails
        except AuthError as exc:
            outcome["error"] = exc

    with caplog.at_level(logging.WARNING, "nanodist.comm"):
        comms, _ = wire_job(before_peers=impostor)
    assert isinstance(outcome.get("error"), AuthError)
    assert "refused connection" in caplog.text and "secret" in caplog.text
    job_still_works(comms)


STRANGERS = {"random bytes": random.Random(0).randbytes(300),
             "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 3, "silent": b""}


@pytest.mark.parametrize("stranger", STRANGERS)
def test_stranger_refused_and_logged_job_unharmed(stranger, caplog, monkeypatch):
    monkeypatch.setattr(admission, "HANDSHAKE_S", 0.5)  # a silent stranger is dropped after this

    def connect_as_stranger(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(STRANGERS[stranger])
            time.sleep(0.6)

    with caplog.at_level(logging.WARNING, "nanodist.comm"):
        comms, _ = wire_job(before_peers=connect_as_stranger)
    assert "refused connection" in caplog.text
    job_still_works(comms)


def test_oversized_setup_message_after_auth_refused(caplog):
    def oversized(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            authenticate(sock, SECRET, dialer=True)
            sock.sendall(struct.pack("<I", 1 << 31))
            time.sleep(0.2)

    with caplog.at_level(logging.WARNING, "nanodist.comm"):
        comms, _ = wire_job(before_peers=oversized)
    assert "exceeds the limit" in caplog.text
    job_still_works(comms)


def test_binds_loopback_and_stops_listening_once_wired():
    comms, port = wire_job(world_size=3)
    for comm in comms:
        for link in comm.links.values():
            assert link.sock.getsockname()[0] == "127.0.0.1"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    job_still_works(comms)


def test_secret_comes_from_env_or_file(tmp_path):
    with pytest.raises(ValueError, match="NANODIST_SECRET"):
        connect_from_env(environ={"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "0"})
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    secret_file.chmod(0o600)
    assert rendezvous.read_secret({"NANODIST_SECRET_FILE": str(secret_file)}) == SECRET
    comm = connect_from_env(environ={"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "0",
                                     "NANODIST_SECRET_FILE": str(secret_file)})
    assert comm.world_size == 1
    comm.close()
