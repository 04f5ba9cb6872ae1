"""Shared-memory segments for the socket transport's same-host fast path.

One segment per direction of a link, owned by the sender: ``slots`` slots of ``slot_bytes``
after a 64-byte header holding a random cookie. The sender copies a piece of a message into a
free slot and sends a small SHM frame over the socket; the receiver reduces straight out of the
slot and answers with an ACK frame that frees it. The socket carries only 84-byte headers, so
waiting still sleeps in the kernel rather than spinning.

The receiver attaches by path and checks the size and the cookie it was told over the
authenticated socket (so a same-named file in another /dev/shm is never mistaken for it); then
the sender unlinks the name, and the memory lives only as long as both mappings. Files are
created 0600 with O_EXCL under /dev/shm with a random name.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets

import numpy as np

ROOT = "/dev/shm"
HEADER_BYTES = 64
COOKIE_BYTES = 32
_NAME = re.compile(r"^/dev/shm/nanodist-[0-9a-f]{32}$")


def available() -> bool:
    return os.path.isdir(ROOT) and os.access(ROOT, os.W_OK)


class Segment:
    def __init__(self, path: str, memory: mmap.mmap, slots: int, slot_bytes: int, cookie: bytes):
        self.path, self.slots, self.slot_bytes, self.cookie = path, slots, slot_bytes, cookie
        self._memory = memory
        self._bytes: np.ndarray | None = np.frombuffer(memory, dtype=np.uint8)  # None once closed

    @classmethod
    def create(cls, slots: int, slot_bytes: int) -> Segment:
        path = f"{ROOT}/nanodist-{secrets.token_hex(16)}"
        cookie = secrets.token_bytes(COOKIE_BYTES)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, HEADER_BYTES + slots * slot_bytes)
            memory = mmap.mmap(fd, HEADER_BYTES + slots * slot_bytes)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        memory[:COOKIE_BYTES] = cookie
        return cls(path, memory, slots, slot_bytes, cookie)

    @classmethod
    def attach(cls, path: str, cookie: bytes, slots: int, slot_bytes: int) -> Segment | None:
        """The peer's segment, or None if it is not reachable from here or not what was promised."""
        if not isinstance(path, str) or not _NAME.match(path) or len(cookie) != COOKIE_BYTES:
            return None
        size = HEADER_BYTES + slots * slot_bytes
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size != size:
                return None
            memory = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        if memory[:COOKIE_BYTES] != cookie:
            memory.close()
            return None
        return cls(path, memory, slots, slot_bytes, cookie)

    def slot(self, index: int, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of slot ``index`` as a uint8 view (valid until close)."""
        if self._bytes is None:
            raise ValueError(f"shared-memory segment {self.path} is closed")
        start = HEADER_BYTES + index * self.slot_bytes
        return self._bytes[start:start + nbytes]

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def close(self) -> None:
        self._bytes = None
        with contextlib.suppress(BufferError):  # a view is still held: the mapping goes with the process
            self._memory.close()
