"""Whether a process is still writing into a run folder: the recorder holds an advisory lock on
`RUN_DIR/.lock` for the run's lifetime. The kernel drops it when that process ends in any way (SIGKILL
and power loss included), so a free lock means nobody is writing there, and what killed writes left
behind may be cleaned away."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO

LOCK_NAME = ".lock"


def hold(run_dir: Path) -> IO[bytes] | None:
    """Take the run folder's lock (kept while the returned file stays open); None where the file system
    cannot lock (then the folder counts as ended only once its event log has been silent a while)."""
    try:
        handle = open(run_dir / LOCK_NAME, "wb")  # noqa: SIM115 - held open for the run's lifetime
    except OSError:
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def release(handle: IO[bytes] | None, run_dir: Path) -> None:
    if handle is None:
        return
    with contextlib.suppress(OSError):
        os.unlink(run_dir / LOCK_NAME)
    handle.close()


def is_held(run_dir: Path) -> bool | None:
    """True while a live process holds the folder's lock, False when none does, None when there is no
    lock to ask (a folder from before locks, or a file system that cannot lock)."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False
