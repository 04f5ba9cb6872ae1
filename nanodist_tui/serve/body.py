"""A limit on request bodies, as plain ASGI middleware: a body larger than any valid request gets 413 and
one line, before the server holds it in memory. A declared Content-Length is checked up front; a chunked
body is counted as it arrives and cut off once it passes the limit."""

from __future__ import annotations

from nanodist_tui.serve.wire import error_body, error_headers


class BodyLimit:
    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        received, refused, started = 0, False, False

        async def counted_receive():
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes and not refused:
                    refused = True
                    if not started:
                        await self._refuse(send)
                    return {"type": "http.disconnect"}  # the app stops reading; its answer goes nowhere
            return message

        async def guarded_send(message):
            nonlocal started
            if refused:
                return
            started = True
            await send(message)

        await self.app(scope, counted_receive, guarded_send)

    async def _refuse(self, send) -> None:
        body = error_body(f"the request body is larger than {self.max_bytes} bytes, more than any valid "
                          "request (see the limits in GET /info)")
        await send({"type": "http.response.start", "status": 413, "headers": error_headers(body)})
        await send({"type": "http.response.body", "body": body})
