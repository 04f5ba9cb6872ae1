"""Mutual HMAC-SHA256 challenge-response on a fresh socket, before any other byte is trusted.

Each side sends ``HELLO_MAGIC + nonce`` (fixed 40 bytes), then proves it knows the shared secret
with HMAC(secret, role + dialer_nonce + listener_nonce). The role tag differs per direction, so
a proof cannot be reflected back. Every read has a fixed size and a deadline: a stranger that
sends garbage, too little, or nothing gets AuthError and costs the listener at most the deadline.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import time

HELLO_MAGIC = b"NDAUTH01"
NONCE_BYTES = 32
MAC_BYTES = hashlib.sha256().digest_size


class AuthError(ConnectionError):
    """The peer did not prove it knows the secret (or spoke something else entirely)."""


def authenticate(sock: socket.socket, secret: bytes, dialer: bool, timeout_s: float = 5.0) -> None:
    """Run the handshake on a blocking socket; returns only if both sides proved the secret."""
    if not secret:
        raise ValueError("an empty secret cannot authenticate anything")
    deadline = time.monotonic() + timeout_s
    mine = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(HELLO_MAGIC + mine)
    hello = recv_exact(sock, len(HELLO_MAGIC) + NONCE_BYTES, deadline)
    if not hmac.compare_digest(hello[:len(HELLO_MAGIC)], HELLO_MAGIC):
        raise AuthError("peer did not start with the nanoDist handshake")
    theirs = hello[len(HELLO_MAGIC):]
    dialer_nonce, listener_nonce = (mine, theirs) if dialer else (theirs, mine)

    def proof(role: bytes) -> bytes:
        return hmac.new(secret, role + dialer_nonce + listener_nonce, hashlib.sha256).digest()

    sock.sendall(proof(b"dialer" if dialer else b"listener"))
    expected = proof(b"listener" if dialer else b"dialer")
    if not hmac.compare_digest(recv_exact(sock, MAC_BYTES, deadline), expected):
        raise AuthError("peer does not know the shared secret")


def recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Read exactly n bytes (n fixed by the protocol, never by the peer) before ``deadline``."""
    chunks, got = [], 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AuthError(f"peer sent {got} of {n} expected bytes before the deadline")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(n - got)
        except TimeoutError:
            continue
        if not chunk:
            raise AuthError(f"peer closed the connection after {got} of {n} expected bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
