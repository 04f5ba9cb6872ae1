"""Datasets and deterministic, world-size-independent batching.

Every batch is a pure function of (seed, step, split): `global_batch(step, split)` draws the WHOLE global
batch, and `rank_slice` cuts out one rank's micro-batch (world_size contiguous rank slices, each split
into n_micro contiguous micro-batches). So N ranks training on their slices see exactly the rows one
process sees, and the data position is fully described by the step number: resuming at step k needs no
data state beyond k.

Corpora:
- "stdlib": this interpreter's own standard-library .py sources (the folder of `os.__file__`), walked in
  sorted order, skipping tests and third-party packages, capped at `max_chars`. Deterministic for a given
  Python installation; cached per process (ranks as threads share one copy).
- "text": a user file, or a folder of *.txt/*.md/*.py files (walked in sorted order).
- "synthetic-lm": a noisy fixed-permutation Markov chain (learnable, known structure).
- "synthetic-classification": Gaussian class clusters.
"""

from __future__ import annotations

import functools
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import paths

# data.kind -> what it holds: token streams for language models, or labelled samples for classifiers
DATA_KINDS = {"stdlib": "lm", "text": "lm", "synthetic-lm": "lm",
              "synthetic-classification": "classification"}
DEFAULT_MAX_CHARS = 2_000_000
SYNTHETIC_LM_VOCAB = 32
TEXT_SUFFIXES = (".txt", ".md", ".py")
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})
_SPLIT_IDS = {"train": 0, "val": 1}


class DataError(Exception):
    """A data problem a person can fix; str() is one line naming the path and the fix."""


# ----------------------------------------------------------------------------- text corpora

def _walk_sorted(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        files += [Path(folder, n) for n in sorted(names) if n.endswith(suffixes)]
    return files


def _concat_capped(files: list[Path], max_chars: int) -> str:
    """Files joined by newlines, reading only as many characters as the cap needs (never a whole large
    file for a small cap); max_chars <= 0 means no cap. Only regular files are read: a FIFO or a device
    is refused (paths.PathError) rather than read, as it would block, never end, or differ per rank."""
    parts, total = [], 0
    for f in files:
        want = max_chars - total if max_chars > 0 else -1
        with io.TextIOWrapper(paths.open_regular(f), encoding="utf-8", errors="replace") as stream:
            parts.append(stream.read(want))
        total += len(parts[-1]) + 1
        if 0 < max_chars <= total:
            break
    text = "\n".join(parts)
    return text[:max_chars] if max_chars > 0 else text


@functools.lru_cache(maxsize=4)
def stdlib_text(max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """The standard library's own sources, concatenated in sorted order and capped (cached per process)."""
    return _concat_capped(_walk_sorted(Path(os.__file__).parent, (".py",)), max_chars)


def read_text(path: str | os.PathLike, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """A text file, or a folder's sorted *.txt/*.md/*.py files concatenated, capped at max_chars."""
    try:
        p = paths.check_name(Path(path).expanduser())
        if not p.exists():
            raise DataError(f"data.path: {p} does not exist; point data.path at a text file or folder "
                            f"of {'/'.join('*' + s for s in TEXT_SUFFIXES)} files, or use data.kind = "
                            "\"stdlib\"")
        files = _walk_sorted(p, TEXT_SUFFIXES) if p.is_dir() else [p]
        if not files:
            raise DataError(f"data.path: {p} has no {'/'.join('*' + s for s in TEXT_SUFFIXES)} files; "
                            "add some or point data.path at a text file")
        return _concat_capped(files, max_chars)
    except paths.PathError as exc:
        raise DataError(f"data.path: {exc}") from None


class CharVocab:
    """Character vocabulary: the sorted set of characters of a text."""

    def __init__(self, text: str):
        self.codes = np.unique(_code_points(text))  # sorted unicode code points
        self.chars = [chr(c) for c in self.codes]

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        codes = _code_points(text)
        ids = np.searchsorted(self.codes, codes)
        if codes.size and (ids.max() >= len(self.codes) or np.any(self.codes[ids] != codes)):
            raise ValueError("text contains characters outside the vocabulary")
        return ids.astype(np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in np.asarray(ids).ravel())


def _code_points(text: str) -> np.ndarray:
    # UTF-32 gives one fixed-width code point per character: vectorised encoding of megabytes of text.
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


# ----------------------------------------------------------------------------- batching

def batch_rng(seed: int, step: int, split: str) -> np.random.Generator:
    """The generator for one global batch: a pure function of (seed, step, split)."""
    if split not in _SPLIT_IDS:
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return np.random.default_rng([seed, _SPLIT_IDS[split], step])


def slice_bounds(rows: int, rank: int, world: int, micro: int = 0, n_micro: int = 1) -> tuple[int, int]:
    """Row range of (rank, micro) in a global batch of `rows`: rank slices, then micro-batches, contiguous."""
    if rows % (world * n_micro):
        raise ValueError(f"global batch of {rows} rows does not split into {world} ranks x {n_micro} "
                         "micro-batches; make train.global_batch a multiple of world_size * micro_batches")
    if not (0 <= rank < world and 0 <= micro < n_micro):
        raise ValueError(f"rank {rank}/{world}, micro {micro}/{n_micro} out of range")
    size = rows // (world * n_micro)
    start = (rank * n_micro + micro) * size
    return start, start + size


def rank_slice(batch, rank: int, world: int, micro: int = 0, n_micro: int = 1):
    """This rank's micro-batch (views) of a global batch: an array, or a tuple of arrays such as (x, y)."""
    arrays = batch if isinstance(batch, tuple) else (batch,)
    start, end = slice_bounds(len(arrays[0]), rank, world, micro, n_micro)
    out = tuple(a[start:end] for a in arrays)
    return out if isinstance(batch, tuple) else out[0]


# ----------------------------------------------------------------------------- datasets

class LMDataset:
    """Next-token prediction over a token stream: rows are windows of block_size tokens at random offsets."""

    kind = "lm"

    def __init__(self, tokens: np.ndarray, vocab_size: int, block_size: int, seed: int, batch_rows: int,
                 val_fraction: float = 0.1, vocab: CharVocab | None = None, source: str = "data"):
        n_val = int(len(tokens) * val_fraction)
        self.splits = {"train": tokens[: len(tokens) - n_val], "val": tokens[len(tokens) - n_val:]}
        for name, part in self.splits.items():
            if len(part) < block_size + 1:
                raise DataError(f"{source}: the {name} split has {len(part)} tokens, fewer than "
                                f"block_size + 1 = {block_size + 1}; use more text (data.max_chars), "
                                "a larger data.val_fraction, or a smaller model.block_size")
            part.flags.writeable = False  # cached corpora are shared between ranks: never mutate
        self.vocab_size, self.block_size, self.vocab = vocab_size, block_size, vocab
        self.seed, self.batch_rows = seed, batch_rows
        self.tokens_per_row = block_size

    def global_batch(self, step: int, split: str = "train", rows: int | None = None):
        """(x, y) int64 [rows, block_size]; y is x shifted by one token."""
        rows = self.batch_rows if rows is None else rows
        rng = batch_rng(self.seed, step, split)
        data = self.splits[split]
        offsets = rng.integers(0, len(data) - self.block_size, size=rows)
        idx = offsets[:, None] + np.arange(self.block_size + 1)
        window = data[idx].astype(np.int64)
        return np.ascontiguousarray(window[:, :-1]), np.ascontiguousarray(window[:, 1:])  # separate arrays

    def decode(self, ids) -> str:
        if self.vocab is None:
            return " ".join(str(int(i)) for i in np.asarray(ids).ravel())
        return self.vocab.decode(ids)


class ClassificationDataset:
    """Fixed (features, label) samples; rows are drawn with replacement per step."""

    kind = "classification"

    def __init__(self, x: np.ndarray, y: np.ndarray, n_classes: int, seed: int, batch_rows: int,
                 val_fraction: float = 0.1):
        n_val = int(len(x) * val_fraction)
        cut = len(x) - n_val
        self.splits = {"train": (x[:cut], y[:cut]), "val": (x[cut:], y[cut:])}
        for name, (xs, _) in self.splits.items():
            if len(xs) == 0:
                raise DataError(f"data.n_samples: the {name} split is empty; raise data.n_samples or "
                                "adjust data.val_fraction")
        self.in_features, self.n_classes = x.shape[1], n_classes
        self.seed, self.batch_rows = seed, batch_rows
        self.tokens_per_row = 1

    def global_batch(self, step: int, split: str = "train", rows: int | None = None):
        """(x float32 [rows, in_features], y int64 [rows])."""
        rows = self.batch_rows if rows is None else rows
        rng = batch_rng(self.seed, step, split)
        xs, ys = self.splits[split]
        pick = rng.integers(0, len(xs), size=rows)
        return xs[pick], ys[pick]


@functools.lru_cache(maxsize=4)
def synthetic_lm_tokens(n_tokens: int, vocab_size: int, seed: int, noise: float = 0.1) -> np.ndarray:
    """A Markov chain: next = perm[prev] with probability 1 - noise, else uniform. Bigram-learnable;
    the best achievable loss is the entropy of one transition. Cached and read-only (shared by ranks)."""
    rng = np.random.default_rng([seed, 0x5EED])
    perm = rng.permutation(vocab_size).tolist()
    jump = (rng.random(n_tokens) < noise).tolist()
    rand = rng.integers(0, vocab_size, size=n_tokens).tolist()
    out, tok = [0] * n_tokens, rand[0]
    for i in range(n_tokens):  # sequential by nature; plain Python lists keep it ~0.1 s per million tokens
        tok = rand[i] if jump[i] else perm[tok]
        out[i] = tok
    tokens = np.asarray(out, dtype=np.int32)
    tokens.flags.writeable = False
    return tokens


def synthetic_classification(n_samples: int, in_features: int, n_classes: int, seed: int,
                             separation: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters: unit-noise samples around class means `separation` apart on average."""
    rng = np.random.default_rng([seed, 0xC1A55])
    means = rng.normal(size=(n_classes, in_features)) * (separation / np.sqrt(2 * in_features))
    y = rng.integers(0, n_classes, size=n_samples)
    x = means[y] + rng.normal(size=(n_samples, in_features))
    return x.astype(np.float32), y.astype(np.int64)


@dataclass(frozen=True)
class _CharCorpus:
    tokens: np.ndarray
    vocab: CharVocab


@functools.lru_cache(maxsize=4)
def _stdlib_corpus(max_chars: int) -> _CharCorpus:
    text = stdlib_text(max_chars)
    vocab = CharVocab(text)
    tokens = vocab.encode(text)
    tokens.flags.writeable = False
    return _CharCorpus(tokens, vocab)


def make_dataset(data_cfg, model_cfg, seed: int, global_batch: int):
    """Build the dataset a config names. Needs only plain attributes:
    data.kind, data.path, data.max_chars, data.val_fraction, data.n_samples; model.block_size, model.widths.
    synthetic-lm: a stream of n_samples * block_size tokens; synthetic-classification: n_samples samples
    with in_features = widths[0], n_classes = widths[-1]."""
    kind = data_cfg.kind
    if kind == "stdlib":
        corpus = _stdlib_corpus(int(data_cfg.max_chars))
        return LMDataset(corpus.tokens, len(corpus.vocab), model_cfg.block_size, seed, global_batch,
                         data_cfg.val_fraction, corpus.vocab, source="stdlib corpus")
    if kind == "text":
        if not data_cfg.path:
            raise DataError("data.path: empty; set data.path to a text file or folder "
                            "(data.kind = \"text\" reads it)")
        text = read_text(data_cfg.path, int(data_cfg.max_chars))
        vocab = CharVocab(text)
        return LMDataset(vocab.encode(text), len(vocab), model_cfg.block_size, seed, global_batch,
                         data_cfg.val_fraction, vocab, source=str(data_cfg.path))
    if kind == "synthetic-lm":
        vocab_size = getattr(model_cfg, "vocab_size", 0) or SYNTHETIC_LM_VOCAB
        tokens = synthetic_lm_tokens(data_cfg.n_samples * model_cfg.block_size, vocab_size, seed)
        return LMDataset(tokens, vocab_size, model_cfg.block_size, seed, global_batch,
                         data_cfg.val_fraction, source="data.n_samples")
    if kind == "synthetic-classification":
        widths = list(model_cfg.widths)
        x, y = synthetic_classification(data_cfg.n_samples, widths[0], widths[-1], seed)
        return ClassificationDataset(x, y, widths[-1], seed, global_batch, data_cfg.val_fraction)
    raise DataError(f"data.kind: unknown {kind!r}; use one of {', '.join(DATA_KINDS)}")
