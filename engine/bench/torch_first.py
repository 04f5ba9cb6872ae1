"""PyTorch imported, when it is installed, before the engine's first matrix product.

Why: with the `mkl` extra, the engine's first product loads MKL into the process's global symbol scope
(engine/fast/blas.py), and a torch imported after that runs its own MKL calls on that library: the peer
would be slowed by us. A benchmark that times ours before it races torch imports this module first.
"""

from __future__ import annotations

import contextlib

with contextlib.suppress(ImportError):
    import torch  # noqa: F401 - imported for its side effect on the symbol scope only
