"""`nanodist-tui serve RUN_DIR|MODEL.npz`: a trained GPT over HTTP until Ctrl-C or SIGTERM.

Bound to 127.0.0.1 unless --host says otherwise. The model file is checked (checksums, names, shapes) before
the server starts; a bad one, a busy port or a missing `serve` extra is one line and exit code 2.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from nanodist_tui.cli.errors import fail, user_errors
from nanodist_tui.cli.options import SourceArg, StepOpt
from nanodist_tui.cli.running import load_source, require_run_dir

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def serve(source: SourceArg,
          host: Annotated[str, typer.Option("--host", help="address to listen on; anything but loopback lets "
                                            "other machines in")] = "127.0.0.1",
          port: Annotated[int, typer.Option("--port", min=0, max=65535, help="port; 0 = any free one")]
          = 8000,
          max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="most tokens one request may "
                                                  "generate")] = 1024,
          max_prompt: Annotated[int, typer.Option("--max-prompt", min=1, help="longest prompt accepted, in "
                                                  "characters")] = 4096,
          max_generations: Annotated[int, typer.Option("--max-generations", min=1, help="generations run at "
                                                       "once; one more is refused with 503 and Retry-After")]
          = 4,
          step: StepOpt = None) -> None:
    """Serve a trained GPT over HTTP: POST /generate, GET /info, GET /health, the OpenAPI page at /docs."""
    from nanodist_tui.serve import missing_library
    if problem := missing_library():
        fail(problem)
    from engine import nn
    from nanodist_tui.serve.api import Limits, create_api
    from nanodist_tui.serve.server import ModelServer
    if not source.is_file():
        require_run_dir(source)
    with user_errors():
        loaded = load_source(source, step)
    if not isinstance(loaded.model, nn.GPT):
        fail(f"{source}: this run trained an MLP classifier; serve needs a GPT run")
    api = create_api(loaded, str(source), Limits(max_prompt_chars=max_prompt, max_tokens=max_tokens,
                                                 max_generations=max_generations))
    try:
        server = ModelServer(api, host, port)
    except OSError as e:
        fail(f"--host {host} --port {port}: cannot listen there ({e.strerror or e}); choose another port "
             "(--port 0 takes any free one) or host")
    _serve_until_signalled(server, source)


def _serve_until_signalled(server, source: Path) -> None:
    stop = threading.Event()
    caught: list[str] = []

    def on_signal(signum, frame) -> None:
        caught.append(signal.Signals(signum).name)
        stop.set()
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        print(f"serving {source} on {server.url}: POST /generate, GET /info, GET /health, API docs at "
              f"{server.url}/docs (Ctrl-C stops)", flush=True)
        if server.host not in LOOPBACK:
            print(f"note: listening on {server.host}: anyone who can reach this machine can use the model",
                  flush=True)
        while not stop.wait(0.5):
            if server.wait(0):  # uvicorn ended by itself
                fail("the HTTP server stopped unexpectedly", code=1)
        server.stop()
        print(f"stopped ({caught[0]}): requests in flight were answered", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
