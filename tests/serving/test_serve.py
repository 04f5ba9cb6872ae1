"""The model server: a real uvicorn server on loopback, a real HTTP client (the standard library's), the
exported model of a tiny trained run. Generation must equal `nanodist-tui sample` for the same arguments;
every bad request gets a 4xx with one line; concurrent requests are served; stopping leaves no thread."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from nanodist_tui.cli import app

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'nanodist[serve]')")
pytest.importorskip("uvicorn", reason="the server needs the serve extra (pip install 'nanodist[serve]')")

from engine.checkpoint.export import read_model  # noqa: E402
from nanodist_tui.serve.api import Limits, create_api  # noqa: E402
from nanodist_tui.serve.server import ModelServer  # noqa: E402

LIMITS = Limits(max_prompt_chars=200, max_tokens=64, max_generations=8)  # 8: the concurrency test's requests


@pytest.fixture(scope="module")
def server(model_file):
    srv = ModelServer(create_api(read_model(model_file), str(model_file), LIMITS), port=0)
    srv.start()
    yield srv
    srv.stop()


def request(url: str, body=None, method: str | None = None, headers=None, raw: bytes | None = None):
    """(status, parsed JSON body) of one request; errors are answers too."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs | (headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def sample_cli(model_file: Path, prompt: str, tokens: int, temperature: float, top_k: int, seed: int) -> str:
    result = CliRunner().invoke(app, ["sample", str(model_file), "--prompt", prompt, "--tokens", str(tokens),
                                      "--temperature", str(temperature), "--top-k", str(top_k),
                                      "--seed", str(seed)])
    assert result.exit_code == 0, result.output
    return result.output.removesuffix("\n")


def test_health_and_info(server, model_file):
    assert request(server.url + "/health") == (200, {"status": "ok"})
    status, info = request(server.url + "/info")
    assert status == 200
    with np.load(model_file, allow_pickle=False) as npz:
        meta = json.loads(npz["__meta__"].tobytes())
        n_params = sum(npz[k].size for k in npz.files if k != "__meta__")
    assert info["model"] == meta["model"] and info["parameters"] == n_params and info["step"] == meta["step"]
    assert info["vocabulary"] == "characters"
    assert info["limits"] == {"max_prompt_chars": 200, "max_tokens": 64, "max_generations": 8,
                              "max_connections": 256, "read_timeout_s": 10.0}


@pytest.mark.parametrize("temperature, top_k, seed", [(0.8, 0, 0), (1.0, 5, 7), (0.0, 0, 3), (1.5, 1, 11)])
def test_generation_equals_sample_and_is_deterministic_for_a_seed(server, model_file, temperature, top_k,
                                                                  seed):
    body = {"prompt": "def ", "max_tokens": 40, "temperature": temperature, "top_k": top_k, "seed": seed}
    status, first = request(server.url + "/generate", body)
    assert status == 200, first
    assert request(server.url + "/generate", body) == (200, first)
    assert first["text"] == sample_cli(model_file, "def ", 40, temperature, top_k, seed)
    assert first["text"] == "def " + first["completion"] and len(first["completion"]) == 40
    assert first["tokens"] == 40 and first["seed"] == seed


def test_another_seed_gives_other_text(server):
    texts = {request(server.url + "/generate", {"prompt": "def ", "max_tokens": 30, "seed": s})[1]["text"]
             for s in range(4)}
    assert len(texts) == 4


BAD_REQUESTS = [
    ({"prompt": "def ", "max_tokens": 65}, 422, "max_tokens: Input should be less than or equal to 64 (this "
                                                 "server's limit"),
    ({"prompt": "x" * 201}, 422, "prompt: String should have at most 200 characters"),
    ({"prompt": "d\u20acf"}, 400, "the prompt has characters the model never saw"),
    ({"prompt": 5}, 422, "prompt: Input should be a valid string"),
    ({"prompt": "x", "max_tokens": 0}, 422, "max_tokens: Input should be greater than or equal to 1"),
    ({"prompt": "x", "max_tokens": True}, 422, "max_tokens: Input should be a valid integer"),
    ({"prompt": "x", "max_tokens": 2.5}, 422, "max_tokens: Input should be a valid integer"),
    ({"temperature": -1}, 422, "temperature: Input should be greater than or equal to 0"),
    ({"temperature": "hot"}, 422, "temperature: Input should be a valid number"),
    ({"top_k": -1, "seed": -2}, 422, "top_k: Input should be greater than or equal to 0; seed: Input should "
                                     "be greater than or equal to 0"),
    ({"prompt": "x", "stream": True}, 422, "stream: Extra inputs are not permitted"),
    ([1, 2], 422, 'the body must be a JSON object such as {"prompt": "def "}'),
]


@pytest.mark.parametrize("body, status, message", BAD_REQUESTS)
def test_a_bad_request_is_a_4xx_with_one_line(server, body, status, message):
    got, answer = request(server.url + "/generate", body)
    assert got == status and set(answer) == {"error"}, answer
    assert message in answer["error"] and "\n" not in answer["error"]


@pytest.mark.parametrize("raw, headers, status, message", [
    (b"{not json", {}, 422, "the body is not valid JSON"),
    (b'{"prompt": "x"}', {"Content-Type": "text/plain"}, 415, "sent with Content-Type: application/json"),
    (b'{"prompt": "' + b"x" * 10_000 + b'"}', {}, 413, "the request body is larger than 5296 bytes"),
])
def test_malformed_and_oversized_bodies(server, raw, headers, status, message):
    got, answer = request(server.url + "/generate", raw=raw, headers=headers)
    assert got == status and message in answer["error"], answer


def test_an_oversized_chunked_body_is_cut_off(server):
    """No Content-Length to check up front: the limit counts the chunks as they come."""
    import http.client
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    chunk = b'{"prompt": "' + b"x" * 4000
    conn.request("POST", "/generate", body=iter([chunk, b"x" * 4000, b'"}']),
                 headers={"Content-Type": "application/json"}, encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 413 and "larger than" in json.loads(resp.read())["error"]
    conn.close()


def test_wrong_paths_and_methods(server):
    assert request(server.url + "/nope") == (404, {"error": "Not Found"})
    assert request(server.url + "/generate") == (405, {"error": "Method Not Allowed"})


def test_the_openapi_page_describes_the_api(server):
    status, schema = request(server.url + "/openapi.json")
    assert status == 200 and {"/generate", "/info", "/health"} <= set(schema["paths"])
    fields = next(iter(schema["components"]["schemas"][n] for n in schema["components"]["schemas"]
                       if n.startswith("GenerateRequest")))["properties"]
    assert fields["max_tokens"]["maximum"] == 64 and fields["prompt"]["maxLength"] == 200
    with urllib.request.urlopen(server.url + "/docs", timeout=30) as resp:
        assert resp.status == 200 and b"swagger" in resp.read().lower()


def test_concurrent_requests_are_served_and_each_equals_its_sequential_answer(server):
    bodies = [{"prompt": "def ", "max_tokens": 48, "seed": s, "top_k": s % 3} for s in range(8)]
    alone = [request(server.url + "/generate", b) for b in bodies]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(lambda b: request(server.url + "/generate", b), bodies))
    assert together == alone and all(status == 200 for status, _ in together)


def test_stopping_the_server_leaves_no_thread(model_file):
    before = set(threading.enumerate())
    srv = ModelServer(create_api(read_model(model_file), str(model_file), LIMITS), port=0)
    srv.start()
    assert srv.host == "127.0.0.1"  # loopback unless told otherwise
    with ThreadPoolExecutor(max_workers=4) as pool:  # puts work on the server's thread pool
        answers = list(pool.map(lambda s: request(srv.url + "/generate", {"max_tokens": 8, "seed": s}),
                                range(4)))
    assert all(status == 200 for status, _ in answers)
    srv.stop()
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(srv.url + "/health", timeout=5)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_serve_command_stops_cleanly_on_a_signal(model_file, tmp_path, sig):
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "nanodist_tui.cli", "serve", str(model_file), "--port", "0",
               "--max-generations", "3"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path)
    try:
        first = proc.stdout.readline()
        assert first.startswith(f"serving {model_file} on http://127.0.0.1:"), first + proc.stderr.read()
        base = re.search(r"http://127\.0\.0\.1:\d+", first).group(0)
        assert request(base + "/info")[1]["limits"]["max_generations"] == 3
        status, answer = request(base + "/generate", {"prompt": "def ", "max_tokens": 20, "seed": 5})
        assert status == 200 and answer["text"] == sample_cli(model_file, "def ", 20, 0.8, 0, 5)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert f"stopped ({signal.Signals(sig).name})" in out and err == ""
