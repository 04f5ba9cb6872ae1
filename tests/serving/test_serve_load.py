"""The model server under load and against slow or broken clients, over raw sockets on loopback: /health
answers at once while every generation slot is busy; a generation past the limit is refused with 503 and
Retry-After; a request sent by halves is cut off at the read deadline; connections past the cap are refused;
every error the server gives, from FastAPI or from below it, is the documented form {"error": one line}."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'nanodist[serve]')")
pytest.importorskip("uvicorn", reason="the server needs the serve extra (pip install 'nanodist[serve]')")

from engine.checkpoint.export import read_model  # noqa: E402
from nanodist_tui.serve.api import Limits, create_api  # noqa: E402
from nanodist_tui.serve.server import ModelServer  # noqa: E402

DEADLINE_S = 1.0
LIMITS = Limits(max_prompt_chars=200, max_tokens=20_000, max_generations=2, max_connections=8,
                read_timeout_s=DEADLINE_S)
# Long enough (thousands of tokens of the tiny model) that both generations are still running after the
# probes; the test checks they were.
SLOW = {"prompt": "def ", "max_tokens": 4000, "seed": 1}


@contextmanager
def serving(model_file, limits: Limits = LIMITS):
    api = create_api(read_model(model_file), str(model_file), limits)
    srv = ModelServer(api, port=0)
    srv.start()
    try:
        yield srv, api
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server(model_file):
    with serving(model_file) as (srv, api):
        yield srv, api


def request_bytes(method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
                  ) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + (body or b"")


def read_response(sock: socket.socket, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of the one response on `sock`, read until the server closes it."""
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def exchange(srv, data: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection((srv.host, srv.port), timeout=30) as sock:
        sock.sendall(data)
        return read_response(sock)


def assert_documented_error(status: int, headers: dict, body: bytes, expected_status: int, words: str) -> str:
    assert status == expected_status, (status, body)
    assert headers["content-type"] == "application/json", headers
    answer = json.loads(body)
    assert list(answer) == ["error"] and isinstance(answer["error"], str), answer
    assert words in answer["error"] and "\n" not in answer["error"], answer
    return answer["error"]


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_health_answers_at_once_while_every_generation_slot_is_busy(server):
    srv, api = server
    with ThreadPoolExecutor(max_workers=2) as pool:
        slow = [pool.submit(exchange, srv, request_bytes("POST", "/generate", json.dumps(SLOW).encode()))
                for _ in range(2)]
        wait_for(lambda: api.state.pool.running == 2, timeout=10)
        latencies = []
        for path in ["/health"] * 5 + ["/info"] * 2:
            start = time.monotonic()
            status, _, body = exchange(srv, request_bytes("GET", path))
            latencies.append(time.monotonic() - start)
            assert status == 200, body
        refused = [exchange(srv, request_bytes("POST", "/generate", b'{"max_tokens": 4}')) for _ in range(3)]
        assert api.state.pool.running == 2  # both generations ran all along: the probes ran under load
        answers = [future.result() for future in slow]
    print(f"health/info under load: worst {max(latencies) * 1000:.1f} ms of {len(latencies)}")
    assert max(latencies) < 1.0, latencies
    for status, headers, body in refused:
        line = assert_documented_error(status, headers, body, 503, "all 2 generation slots are busy")
        assert int(headers["retry-after"]) >= 1 and line.endswith(f"retry in {headers['retry-after']} s")
    for status, _, body in answers:
        assert status == 200 and json.loads(body)["tokens"] == SLOW["max_tokens"]
    status, _, _ = exchange(srv, request_bytes("POST", "/generate", b'{"max_tokens": 4}'))
    assert status == 200 and api.state.pool.running == 0  # the slots were given back


@pytest.mark.parametrize("sent", [
    b"POST /generate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n",  # headers unfinished
    b"POST /generate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 40\r\n"
    b'\r\n{"prompt": "de',  # the body unfinished
], ids=["headers-unfinished", "body-unfinished"])
def test_a_request_sent_by_halves_is_cut_off_at_the_read_deadline(server, sent):
    srv, _ = server
    with socket.create_connection((srv.host, srv.port), timeout=30) as sock:
        start = time.monotonic()
        sock.sendall(sent)
        status, headers, body = read_response(sock)
        took = time.monotonic() - start
    assert_documented_error(status, headers, body, 408, f"did not arrive whole within {DEADLINE_S:g} s")
    assert DEADLINE_S * 0.9 <= took < DEADLINE_S + 1.5, took


def test_a_connection_that_sends_nothing_is_closed_at_the_deadline(server):
    srv, _ = server
    with socket.create_connection((srv.host, srv.port), timeout=30) as sock:
        start = time.monotonic()
        assert sock.recv(1024) == b""  # closed, with nothing to answer
        took = time.monotonic() - start
    assert DEADLINE_S * 0.9 <= took < DEADLINE_S + 1.5, took


def test_a_trickled_request_does_not_move_the_deadline(server):
    """A byte every 0.2 s keeps a connection busy but never finishes a request: the deadline counts from the
    first byte, so the server closes it after DEADLINE_S, long before the request could end."""
    srv, _ = server
    with socket.create_connection((srv.host, srv.port), timeout=30) as sock:
        start = time.monotonic()
        try:
            for byte in b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"z" * 40:
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
            raise AssertionError("the server let a trickled request run for 12 s")
        except OSError:  # the server closed it (a reset, or a broken pipe)
            took = time.monotonic() - start
    assert took < DEADLINE_S + 1.5, took


def test_connections_past_the_cap_are_refused_in_the_documented_form(model_file):
    limits = Limits(max_connections=8, read_timeout_s=30.0)  # the held connections outlive the test
    with serving(model_file, limits) as (srv, _):
        held = [socket.create_connection((srv.host, srv.port), timeout=30) for _ in range(8)]
        try:
            with socket.create_connection((srv.host, srv.port), timeout=30) as ninth:
                status, headers, body = read_response(ninth)
            assert_documented_error(status, headers, body, 503, "already holds 8 connections, its limit")
            assert headers["retry-after"] == "1"
        finally:
            for sock in held:
                sock.close()
        status, _, _ = exchange(srv, request_bytes("GET", "/health"))  # once they close, room again
        assert status == 200


ERRORS = [
    (request_bytes("POST", "/generate", '{"prompt": "d\u20acf"}'.encode()), 400,
     "the prompt has characters the model never saw"),
    (b"NOT HTTP AT ALL\r\n\r\n", 400, "the request is not valid HTTP/1.1"),
    (request_bytes("POST", "/generate", b"[" * 3000), 400, "the body cannot be parsed as JSON"),
    (request_bytes("POST", "/generate", b'{"prompt": "\xc3"}'), 400, "the body cannot be parsed as JSON"),
    (request_bytes("GET", "/nope"), 404, "Not Found"),
    (request_bytes("GET", "/generate"), 405, "Method Not Allowed"),
    (request_bytes("DELETE", "/health"), 405, "Method Not Allowed"),
    (request_bytes("POST", "/generate", b'{"prompt": "' + b"x" * 6000 + b'"}'), 413, "larger than"),
    (request_bytes("POST", "/generate", b'{"prompt": "x"}', "text/plain"), 415,
     "sent with Content-Type: application/json"),
    (request_bytes("POST", "/generate", b"{not json"), 422, "the body is not valid JSON"),
    (request_bytes("POST", "/generate", b'{"max_tokens": 0}'), 422, "max_tokens: Input should be greater"),
]


@pytest.mark.parametrize("sent, status, words", ERRORS, ids=[f"{s}-{w[:24]}" for _, s, w in ERRORS])
def test_every_error_is_the_documented_form(server, sent, status, words):
    assert_documented_error(*exchange(server[0], sent), status, words)


def test_a_fault_of_the_server_is_a_500_in_the_documented_form(server, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("an invariant broke\non two lines")
    monkeypatch.setattr("nanodist_tui.serve.api.sample", broken)
    sent = request_bytes("POST", "/generate", b'{"max_tokens": 4}')
    line = assert_documented_error(*exchange(server[0], sent), 500, "internal server error: RuntimeError")
    assert line == "internal server error: RuntimeError: an invariant broke on two lines"
    assert server[1].state.pool.running == 0  # the slot came back
