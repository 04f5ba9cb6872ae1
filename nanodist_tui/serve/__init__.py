"""`nanodist-tui serve`: a trained GPT over HTTP (the `serve` extra: FastAPI and uvicorn).

    file         what
    api.py       the FastAPI app: POST /generate, GET /info, GET /health, the OpenAPI page (/docs,
                 /openapi.json); request validation and limits, every error a JSON {"error": one line}
    body.py      the request-body size limit (413 before a large body is read)
    pool.py      generations on worker threads, a bounded number at once (503 and Retry-After past it)
    protocol.py  uvicorn's h11 protocol plus a read deadline per request (408), a cap on connections (503),
                 and its own refusals in the JSON error form
    wire.py      the JSON error form as raw response bytes, for answers given below FastAPI
    server.py    uvicorn on a socket bound up front (port 0 works, the URL is known before serving), in a
                 thread the caller stops; no thread outlives stop()

Generation is engine.checkpoint.sample's, the same call `nanodist-tui sample` makes, so equal arguments give
equal text. The engine knows nothing of this package: it never imports the web stack.
"""
from __future__ import annotations

import importlib.util

LIBRARIES = ("fastapi", "uvicorn")
INSTALL_HINT = "pip install 'nanodist[serve]'"


def missing_library() -> str | None:
    """The one line saying what to install when the server's libraries are absent, else None."""
    absent = [name for name in LIBRARIES if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    verb = "is" if len(absent) == 1 else "are"
    return f"serve needs {' and '.join(absent)}, which {verb} not installed; {INSTALL_HINT}"
