"""Measurements against a peer in the same run: the training step against PyTorch (`step.py`, with the
PyTorch twins of our models in `torch_peer.py`), the all-reduce against gloo (`allreduce.py`), the cost
of each memory technique (`techniques.py`) and a run's memory as the ledger measures it (`memory.py`).

The only room outside the tests that imports torch, and only inside functions that need it (or, for
torch_peer.py and torch_first.py, at import): the engine never depends on PyTorch.
"""
