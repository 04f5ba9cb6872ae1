"""The API's error form, {"error": one line}, as the bytes of a whole HTTP response: for answers given below
FastAPI (the request-body limit, the connection protocol), which write to the socket or to ASGI directly."""

from __future__ import annotations

import json
from http import HTTPStatus


def error_body(message: str) -> bytes:
    return json.dumps({"error": " ".join(message.split())}).encode()


def error_headers(body: bytes, retry_after_s: int | None = None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return headers + ([(b"retry-after", str(retry_after_s).encode())] if retry_after_s else [])


def error_response(status: int, message: str, retry_after_s: int | None = None) -> bytes:
    """A complete response that closes the connection."""
    body = error_body(message)
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    lines += [name + b": " + value for name, value in error_headers(body, retry_after_s)]
    return b"\r\n".join([*lines, b"connection: close", b"", b""]) + body
