"""Where full tracebacks go: never onto the screen (a failure is one line there), always into a file the
line names — RUN_DIR/error.log for a run (every rank of it appends to the same file), else a file of its
own in the system's temporary folder."""
from __future__ import annotations

import os
import tempfile
import threading
import time
import traceback
from pathlib import Path

ERROR_LOG = "error.log"
_lock = threading.Lock()  # rank threads of one process append whole entries, one at a time


def write(folder: str | Path | None, title: str, exc: BaseException | None = None,
          text: str | None = None) -> Path | None:
    """Append `title` and the traceback of `exc` (or `text`) to FOLDER/error.log, or to a fresh file in
    the temporary folder when `folder` is None or cannot be written; the file's path, or None when no file
    could be written at all (a full disk)."""
    body = text if text is not None else "".join(traceback.format_exception(exc)) if exc is not None else ""
    entry = f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} pid {os.getpid()}: {title}\n{body.rstrip()}\n\n"
    targets = [Path(folder) / ERROR_LOG] if folder else []
    targets.append(Path(tempfile.gettempdir()) / f"nanodist-error-{time.strftime('%Y%m%d-%H%M%S')}-"
                                                  f"{os.getpid()}.log")
    for path in targets:
        try:
            with _lock, open(path, "a", encoding="utf-8") as log:
                log.write(entry)
            return path
        except OSError:
            continue
    return None
