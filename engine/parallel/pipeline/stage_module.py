"""One pipeline stage as a Module, made of the dense GPT's own layers (not copies of them).

Every rank builds the same dense GPT from one seed, so each stage starts from the weights one device
starts from; a rank then keeps only its stages (and the dense model can be dropped). The one exception: a
head tied to the embedding on another stage gets its own Parameter, a copy of wte.weight under the name
"lm_head.weight", which the executor keeps in step (stage.TiedWeight). The dense model is never changed.

The stage's forward is the GPT's forward restricted to its pieces: the embedding (stage 0), its blocks,
the final LayerNorm and output layer (the last stage). Its dropout draws from the GPT's own DropoutRNG;
the runner sets the site counter to where one device's forward would be when this stage begins.
"""

from __future__ import annotations

import copy

from engine.nn import GPT, Module, embed
from engine.parallel.pipeline.split import PipelineSplit, StagePart
from engine.tensor import Parameter, Tensor


class GPTStage(Module):
    """Stage `part.index` of `split`: forward(token ids [b, t]) on the first stage, forward(Tensor [b, t, c])
    on the others; returns the hidden state, or the logits on the last stage."""

    def __init__(self, model: GPT, split: PipelineSplit, part: StagePart):
        super().__init__()
        self.index, self.part = part.index, part
        self.rng = model.rng
        self.block_size = model.block_size
        self.wte = model.wte if part.embedding else None
        self.wpe = model.wpe if part.embedding else None
        self.drop = model.drop if part.embedding else None
        self.blocks = [model.blocks[b] for b in part.blocks]
        self.ln_f = model.ln_f if part.head else None
        self.lm_head: Module | None = model.lm_head if part.head else None
        self.holds_copy = part.head and split.tied_copy
        if self.holds_copy:
            self.lm_head = _untied_copy(model.lm_head)

    @property
    def head_copy(self) -> Parameter | None:
        """The last stage's own copy of a weight tied to the embedding on stage 0 (else None)."""
        return self.lm_head.weight if self.holds_copy else None  # type: ignore[union-attr]

    def units(self) -> list[Module]:
        return list(self.blocks)

    def checkpoint_units(self) -> list[Module]:
        return list(self.blocks)

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """Dense names (the model named them): a stage's parameters are the dense model's, by name."""
        seen, named = set(), []
        for _, _, _, p in self._owned_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                named.append((str(p.name), p))
        return named

    def forward(self, x) -> Tensor:
        if self.wte is not None:  # GPT.forward's embedding
            assert self.wpe is not None and self.drop is not None
            x = embed(self.wte, self.wpe, self.drop, self.block_size, x)
        for block in self.blocks:
            x = block(x)
        if self.lm_head is not None:
            assert self.ln_f is not None
            x = self.lm_head(self.ln_f(x))
        return x


def _untied_copy(head: Module) -> Module:
    """`head` (a Linear, or a tensor-parallel model's column-parallel head) with its own weight, equal to the
    tied one: a shallow copy, so the layer's kind and its group stay as they are."""
    twin = copy.copy(head)
    twin.forward_pre_hooks, twin.forward_post_hooks = [], []  # hooks others install are on `head`, not here
    weight = head.weight  # type: ignore[attr-defined]
    twin.weight = Parameter(weight.data.copy(), name="lm_head.weight")  # type: ignore[attr-defined]
    return twin


def build_stages(model: GPT, split: PipelineSplit, indices) -> dict[int, GPTStage]:
    """The stages `indices` of `split`, by index."""
    return {i: GPTStage(model, split, split.stages[i]) for i in indices}
