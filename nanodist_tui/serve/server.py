"""uvicorn serving an app on a socket bound before it starts, on a thread the caller stops.

Binding first makes port 0 work (the OS picks a free port) and gives the URL before the first request.
uvicorn runs on its own thread, where it installs no signal handlers: the caller decides what stops it
(`nanodist-tui serve` turns SIGINT and SIGTERM into `stop()`; the tests call it). `stop()` lets requests
in flight finish (at most GRACE_S), then returns once uvicorn's thread — and with it the event loop and
its worker threads — has ended. Connections are served by protocol.py's guarded h11 protocol, with the
read deadline and the connection cap of the app's limits (`app.state.limits`, set by api.create_api).
"""

from __future__ import annotations

import socket
import threading
import time

GRACE_S = 10.0  # requests still running at stop get this long to finish
START_TIMEOUT_S = 30.0


class ModelServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 8000) -> None:
        """Bind host:port now (OSError if it cannot be bound)."""
        import uvicorn

        from nanodist_tui.serve.protocol import guarded_protocol
        limits = app.state.limits
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.host, self.port = host, self._sock.getsockname()[1]
        protocol = guarded_protocol(limits.read_timeout_s, limits.max_connections)
        config = uvicorn.Config(app, http=protocol, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=int(GRACE_S))
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Serve on a thread; returns once the server accepts connections."""
        self._thread = threading.Thread(target=self._serve, name="nanodist-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.01)

    def _serve(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        finally:
            self._sock.close()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped (or `timeout` passed); True once it has."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Stop accepting, let requests in flight finish, and wait for the server's thread to end."""
        self._server.should_exit = True
        self.wait()
