"""``algorithm = "auto"``: which all-reduce algorithm runs, by message size, from measured crossovers.

A Crossovers table is a list of rules "below B bytes run A", ascending, the last one open-ended. It
is measured, not guessed: ``nanodist-tui bench allreduce --calibrate`` times every candidate at a ladder
of sizes on the job's backend, world size and node grid (and emulated network, if any), takes the
fastest at each size and puts each crossover at the geometric mean of the two sizes around the change
(`fit`, which lets an algorithm keep winning while within 5% of the fastest, so noise between
near-equals does not flip the choice). The result is saved in a tuning file (JSON, written atomically)
under a key naming what was measured; a run looks its own key up (`lookup`) and falls back to the
defaults below when the file or the key is missing.

Defaults (no calibration), measured with `bench allreduce --calibrate` on the development machine
(processes backend, emulated links: 50 µs and 10 Gbit/s per link on one level; 100 µs and 1 Gbit/s
between two nodes of 2 ranks, real links inside):
  one level, N a power of two   tree below 32 KiB, rhd above
  one level, other N            tree below 128 KiB, ring above
  two levels (a NodeGrid of more than one node of more than one rank)
                                tree below 128 KiB, hierarchical above
The tree's few whole-buffer steps win while per-message cost dominates. Above, halving-doubling moves
the ring's bytes in 2·lg N steps instead of 2(N−1) — unless N is not a power of two, when its extra fold
and unfold of the whole buffer cost more than the ring's extra steps; with nodes, the hierarchical
all-reduce sends only 1/G of the bytes over the slow links between them.

Every rank must pick the same algorithm for the same buffer: a job agrees on rank 0's table
(engine.parallel.data.topology broadcasts it), and the choice depends only on the buffer's size in bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.run.atomic_file import atomic_write

CANDIDATES = ("ring", "rhd", "tree", "hierarchical")  # what auto chooses among
FORMAT, VERSION = "nanodist-allreduce-tuning", 1
DEFAULT_PATH = Path("~/.cache/nanodist/allreduce-tuning.json")
MAX_RULES = 16  # rules a table may hold (the fixed size it is broadcast in)


class TuningError(ValueError):
    """A tuning file that cannot be used (unreadable, not ours, malformed). str() is one line."""


@dataclass(frozen=True)
class Crossovers:
    """``rules``: (upper bound in bytes, exclusive; algorithm), ascending; the last bound is inf.
    ``source``: "measured" or "default" (what the workbench and the bench report)."""

    rules: tuple[tuple[float, str], ...]
    source: str = "default"

    def __post_init__(self):
        bounds = [b for b, _ in self.rules]
        ascending = bounds == sorted(bounds) and bool(bounds) and bounds[-1] == math.inf
        if not ascending or len(self.rules) > MAX_RULES:
            raise ValueError(f"crossover rules must ascend to an open end, at most {MAX_RULES}: {self.rules}")
        unknown = [a for _, a in self.rules if a not in CANDIDATES]
        if unknown:
            raise ValueError(f"unknown algorithm(s) {unknown} in crossover rules; expected {CANDIDATES}")

    def choose(self, nbytes: int) -> str:
        return next(algorithm for bound, algorithm in self.rules if nbytes < bound)

    def to_array(self) -> np.ndarray:
        """[bound, algorithm index] × MAX_RULES as float64 (unused rows: index -1), for a broadcast."""
        out = np.full((MAX_RULES, 2), -1.0)
        for i, (bound, algorithm) in enumerate(self.rules):
            out[i] = bound, CANDIDATES.index(algorithm)
        return out.reshape(-1)

    @classmethod
    def from_array(cls, arr: np.ndarray, source: str = "rank 0's") -> Crossovers:
        rows = arr.reshape(MAX_RULES, 2)
        return cls(tuple((float(b), CANDIDATES[int(i)]) for b, i in rows if i >= 0), source)


KiB = 1024
DEFAULT_POWER_OF_TWO = Crossovers(((32 * KiB, "tree"), (math.inf, "rhd")))
DEFAULT_OTHER = Crossovers(((128 * KiB, "tree"), (math.inf, "ring")))
DEFAULT_TWO_LEVEL = Crossovers(((128 * KiB, "tree"), (math.inf, "hierarchical")))


def default(world_size: int, two_level: bool) -> Crossovers:
    """The documented defaults for an all-reduce over ``world_size`` ranks (on a two-level grid or not)."""
    if two_level:
        return DEFAULT_TWO_LEVEL
    return DEFAULT_POWER_OF_TWO if world_size & (world_size - 1) == 0 else DEFAULT_OTHER


def key(backend: str, world_size: int, ranks_per_node: int, network: str = "") -> str:
    """What a table was measured on: backend, ranks, node grid (0 = one node) and emulated network."""
    return f"{backend}/n{world_size}/g{ranks_per_node}/{network or 'real'}"  # network: network_key()


def network_key(emulation: dict[str, float]) -> str:
    """The network part of a key: the emulation settings that are set ("latency_us=50,..."), or "real"."""
    return ",".join(f"{name}={value:g}" for name, value in emulation.items() if value) or "real"


def fit(times: dict[int, dict[str, float]], tolerance: float = 0.05) -> Crossovers:
    """Rules from measured seconds per size and algorithm: the fastest at each size, switching at the
    geometric mean of the two sizes around each change. An algorithm keeps winning at the next size while
    it is within ``tolerance`` of the fastest there, so noise between near-equals does not flip it."""
    sizes = sorted(times)
    if not sizes:
        raise ValueError("no measurements to fit crossovers to")
    best: list[str] = []
    for s in sizes:
        fastest = min(times[s], key=times[s].__getitem__)
        held = best[-1] if best else None
        keep = held in times[s] and times[s][held] <= (1 + tolerance) * times[s][fastest]
        best.append(held if keep and held is not None else fastest)
    rules: list[tuple[float, str]] = []
    for i in range(1, len(sizes)):
        if best[i] != best[i - 1]:
            rules.append((math.sqrt(sizes[i - 1] * sizes[i]), best[i - 1]))
    rules.append((math.inf, best[-1]))
    return Crossovers(tuple(rules), "measured")


def tuning_path(configured: str = "") -> Path:
    return Path(configured or DEFAULT_PATH).expanduser()


def read(path: Path) -> dict:
    """The tuning file's entries (key -> {"rules": [[bound|null, algorithm]...], ...}); {} if absent."""
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TuningError(f"{path}: not a readable tuning file ({exc}); delete it or run "
                          "`nanodist-tui bench allreduce --calibrate` again") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
        raise TuningError(f"{path}: not a nanoDist tuning file (format {FORMAT!r} expected); delete it or "
                          "name another file with parallel.tuning_file")
    return doc["entries"]


def lookup(path: Path, table_key: str, world_size: int, two_level: bool) -> Crossovers:
    """The measured crossovers saved under ``table_key`` (an all-reduce over ``world_size`` ranks, on a
    two-level grid or not), else the defaults."""
    entry = read(path).get(table_key)
    if entry is None:
        return default(world_size, two_level)
    try:
        rules = tuple((math.inf if b is None else float(b), str(a)) for b, a in entry["rules"])
        found = Crossovers(rules, "measured")
    except (KeyError, TypeError, ValueError) as exc:
        raise TuningError(f"{path}: entry {table_key!r} is malformed ({exc}); run "
                          "`nanodist-tui bench allreduce --calibrate` again") from None
    if "hierarchical" in (a for _, a in found.rules) and not two_level:
        raise TuningError(f"{path}: entry {table_key!r} picks the hierarchical all-reduce on one node; run "
                          "`nanodist-tui bench allreduce --calibrate` again")
    return found


def save(path: Path, table_key: str, crossovers: Crossovers, times: dict[int, dict[str, float]]) -> None:
    """Add (or replace) one entry, with the measurements it was fitted to; the file is written atomically."""
    entries = read(path)
    entries[table_key] = {
        "rules": [[None if math.isinf(b) else b, a] for b, a in crossovers.rules],
        "seconds": {str(size): per for size, per in sorted(times.items())},
    }
    doc = {"format": FORMAT, "version": VERSION, "entries": entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(json.dumps(doc, indent=1).encode()))

