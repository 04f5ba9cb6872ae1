"""uvicorn's h11 connection protocol with what it leaves out, so that slow or idle clients cannot hold the
server: a deadline for reading each request, a cap on open connections, and its own refusals in the API's
JSON error form.

- A request must arrive whole (request line, headers and body) within `read_timeout_s` of its first byte,
  or of the connection opening. uvicorn times out idle keep-alive connections but not a request half sent:
  without this, a client that sends a request line and some headers and then nothing holds a socket for
  ever. Past the deadline a half-sent request gets 408 and the connection closes; a connection that sent
  nothing is closed without an answer.
- More than `max_connections` open at once: the newest gets 503 (Retry-After) and is closed. uvicorn's own
  `limit_concurrency` answers in plain text, outside the API's form, hence this.
- A request that is not valid HTTP/1.1 gets 400 in the JSON form (uvicorn's is plain text).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from nanodist_tui.serve.wire import error_response

WHOLE = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED)  # the client has sent its request to the end


def guarded_protocol(read_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """The protocol class to give uvicorn (`Config(http=...)`), with these limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"read_timeout_s": read_timeout_s, "max_connections": max_connections})


class GuardedH11Protocol(H11Protocol):
    read_timeout_s = 10.0
    max_connections = 256
    _deadline: asyncio.TimerHandle | None = None
    _sent_something = False  # bytes of a request arrived since the deadline was set

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:  # this connection counts itself
            self._answer_and_close(503, f"the server already holds {self.max_connections} connections, its "
                                        "limit; retry in a moment", retry_after_s=1)
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._arm()  # the first byte of a request starts its deadline; later bytes do not move it
        self._sent_something = True
        super().data_received(data)
        if self.conn.their_state in WHOLE:
            self._disarm()  # what follows is the app's time, then uvicorn's keep-alive timeout

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY or self.conn.trailing_data[0]:
            self._arm()  # a pipelined request, already begun, gets its deadline too
            self._sent_something = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:  # uvicorn's msg says no more than this
        self._answer_and_close(400, "the request is not valid HTTP/1.1")

    def _arm(self) -> None:
        if self._deadline is None:
            self._sent_something = False
            self._deadline = self.loop.call_later(self.read_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state in WHOLE:
            return
        cycle = self.cycle if self.conn.their_state is h11.SEND_BODY else None
        if cycle is not None and not cycle.response_started:
            # the app reads the missing body as a disconnect; whatever it answers is dropped
            cycle.disconnected = True
            cycle.message_event.set()
        answered = cycle is not None and cycle.response_started
        if self._sent_something and not answered:
            self._answer_and_close(408, f"the request did not arrive whole within {self.read_timeout_s:g} s; "
                                        "send it at once")
        else:  # nothing asked, or already answered: nothing to say
            self.transport.close()

    def _answer_and_close(self, status: int, message: str, retry_after_s: int | None = None) -> None:
        self._disarm()
        self.transport.write(error_response(status, message, retry_after_s))
        self.transport.close()
