"""Text from a trained GPT: encode a prompt with the corpus vocabulary, sample, decode.

Character corpora store their vocabulary (characters in token-id order) in checkpoints and exports.
Synthetic token streams have none: their prompts and samples are token ids separated by spaces.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from engine import nn
from engine.checkpoint.export import LoadedModel
from engine.checkpoint.files import CheckpointError

# what `nanodist-tui sample` and the model server use when a request does not say
TOKENS, TEMPERATURE, TOP_K, SEED = 200, 0.8, 0, 0


def encode(vocab: list[str] | None, prompt: str, vocab_size: int) -> list[int]:
    """Token ids of a prompt; CheckpointError naming the characters the model never saw."""
    if vocab is None:
        try:
            ids = [int(t) for t in prompt.split()]
        except ValueError:
            raise CheckpointError("this model was trained on synthetic tokens: give the prompt as token ids "
                                  f"separated by spaces, from 0 to {vocab_size - 1}") from None
        if any(not 0 <= i < vocab_size for i in ids):
            raise CheckpointError(f"prompt token ids must be between 0 and {vocab_size - 1}")
        return ids
    index = {c: i for i, c in enumerate(vocab)}
    unknown = sorted({c for c in prompt if c not in index})
    if unknown:
        raise CheckpointError(f"the prompt has characters the model never saw: {''.join(unknown)!r}; "
                              "use characters of its training corpus")
    return [index[c] for c in prompt]


def decode(vocab: list[str] | None, ids) -> str:
    """Text of token ids; ids past the corpus's characters (a model vocabulary larger than its corpus)
    read as U+FFFD."""
    if vocab is None:
        return " ".join(str(int(i)) for i in ids)
    return "".join(vocab[int(i)] if int(i) < len(vocab) else "\ufffd" for i in ids)


class Sample(NamedTuple):
    text: str  # the prompt and what followed it: what `nanodist-tui sample` prints
    completion: str  # what followed the prompt
    tokens: int  # how many tokens were sampled


def sample(loaded: LoadedModel, prompt: str, tokens: int = TOKENS, temperature: float = TEMPERATURE,
           seed: int = SEED, top_k: int = TOP_K) -> Sample:
    """The prompt followed by `tokens` sampled tokens (temperature 0: greedy; top_k > 0: among the k most
    likely only), deterministic in `seed`. CheckpointError (one line) for a prompt the model cannot read."""
    model, vocab = loaded.model, loaded.vocab
    if not isinstance(model, nn.GPT):
        raise CheckpointError("this run trained an MLP classifier; sample needs a GPT run")
    ids = encode(vocab, prompt, model.vocab_size)
    start = ids or [vocab.index("\n") if vocab and "\n" in vocab else 0]  # an empty prompt starts a line
    out = model.generate(np.array([start], dtype=np.int64), tokens, temperature, np.random.default_rng(seed),
                         top_k)
    new = decode(vocab, out[0, len(start):])
    if vocab is None:
        return Sample(" ".join(part for part in (prompt.strip(), new) if part), new, tokens)
    return Sample(prompt + new, new, tokens)
