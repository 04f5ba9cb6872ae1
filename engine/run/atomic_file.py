"""Files written so that a crash or a full disk never leaves a half-written one in place: write to a
temporary name in the same folder, fsync, rename over the final name (os.replace is atomic), fsync the
folder so the rename itself is durable. Standard library only: every module that writes may use it."""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from engine import paths


def fsync_dir(path: Path) -> None:
    """Make renames and new entries in `path` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a folder; the rename is still atomic
    finally:
        os.close(fd)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def atomic_write(path: Path, write: Callable[[IO[bytes]], object], mode: int = 0o644) -> tuple[str, int]:
    """Write a file via `write(f)` to a temporary name, fsync, rename over `path`, fsync the folder.
    Returns (sha256, size) of the bytes as they went to disk, hashed before the rename. A folder, device,
    FIFO or socket at `path` (or a link to one) is refused with paths.PathError: the rename would replace it.
    """
    path = paths.check_output(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp creates 0600; what we write are ordinary readable files
        digest, size = sha256_file(Path(tmp)), os.path.getsize(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return digest, size


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """atomic_write of UTF-8 text, making the folder if needed and keeping an existing file's mode."""
    path = paths.check_output(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), mode)
