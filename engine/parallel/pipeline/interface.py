"""What the executor drives: one pipeline rank's stages, one micro-batch and action at a time.

The stage runner (engine.parallel.pipeline.stage) implements this; the executor
(engine.parallel.pipeline.executor) and the by-hand GPipe only call it. Arrays cross this line, never
Tensors or tape nodes, so what travels between ranks is plain bytes and what stays is the runner's.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class StageRunner(Protocol):
    """The virtual stages this rank holds, each keeping its micro-batches' tapes until their backward."""

    def forward(self, stage: int, micro_batch: int, inputs: np.ndarray | None) -> np.ndarray | float:
        """Run `stage` on `micro_batch`: the first stage reads its token ids itself (`inputs` is None),
        every other stage its predecessor's output. Returns the output to send on, or, on the last stage,
        the micro-batch's loss (its targets are the runner's). Keeps what the backward needs."""

    def backward(self, stage: int, micro_batch: int, grad_output: np.ndarray | None) -> np.ndarray | None:
        """Input and weight gradients of `stage` for `micro_batch`; `grad_output` is None on the last stage
        (the loss seeds it). Accumulates into the parameters' gradients; returns the input's gradient to
        send back (None on the first stage) and frees the micro-batch's saved activations."""

    def backward_input(self, stage: int, micro_batch: int,
                       grad_output: np.ndarray | None) -> np.ndarray | None:
        """The input-gradient half of `backward`; keeps what the weight half needs."""

    def backward_weight(self, stage: int, micro_batch: int) -> None:
        """The weight-gradient half, after `backward_input` of this stage and micro-batch; frees the rest."""
