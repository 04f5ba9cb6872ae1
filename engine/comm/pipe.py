"""The child's end of a launcher pipe that carries JSON messages only (codec.py; never pickle): thread-safe
sends, and a listener thread for what the launcher says. Rank processes (procs.py) and sweep jobs
(engine.sweep.jobs) talk to their launchers this way."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from engine.comm import codec

MAX_MESSAGE = 1 << 28


def sender(conn) -> Callable[[dict], None]:
    """send(message): one whole message at a time, from any thread."""
    lock = threading.Lock()

    def send(message: dict) -> None:
        data = codec.dumps(message)
        with lock:
            conn.send_bytes(data)
    return send


def listen(conn, handle: Callable[[dict], None], name: str) -> None:
    """Hand each message from the launcher to `handle` on a daemon thread. When the pipe closes (the
    launcher is gone) the process exits at once: it never lingers as an orphan."""
    def loop() -> None:
        while True:
            try:
                message = codec.loads(conn.recv_bytes(MAX_MESSAGE))
            except (EOFError, OSError):
                os._exit(70)
            handle(message)
    threading.Thread(target=loop, name=name, daemon=True).start()
