"""Cluster descriptions: commented TOML files naming the nodes, the per-rank compute and the links, found
like presets and validated into a `Cluster`, with one-line errors (file, line, key, problem, fix).

Lookup for a bare name: $NANODIST_CLUSTERS (folders, os.pathsep-separated), then a `clusters/` folder in
every preset folder (engine.config.presets.search_dirs: $NANODIST_PRESETS, ./presets, the repository's, the
copy shipped in the package). A name with ".toml" or a folder in it is a path.

Every setting is spelled once, in FIELDS (type, default, check, doc); messages and `describe` use it.
Every figure is finite and none is negative; a peak TFLOP/s that is written is above 0 (leave out a peak
you do not know). A zero elsewhere keeps its documented meaning (memory 0: unknown or the host's; a
bandwidth of 0: no figure, refused where a link is used; latency 0: none).
Units: TFLOP/s per rank, GB (10^9 bytes) of memory per rank, GB/s for bandwidths (as nccl-tests prints),
microseconds of latency. A link's `bandwidth_gbs` is what the model uses: the achieved figure (nccl-tests
busbw at large sizes); `nominal_gbs` is the datasheet's, kept beside it for the reader.
"""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import paths
from engine.config import ConfigError
from engine.config.presets import find_named_file, locate_key, search_dirs
from engine.dtypes import DTYPES
from engine.projection.collective_times import NIC_KINDS

ALGORITHMS = ("auto", "engine")  # auto: the fastest per size (NCCL's rule); engine: the preset's own


def _number(low: float, open_low: bool = False) -> Callable[[Any], str | None]:
    def check(v):
        ok = v > low if open_low else v >= low
        return None if ok else f"must be {'>' if open_low else '>='} {low:g}"
    return check


def _choice(*choices: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else "must be one of " + ", ".join(f'"{c}"' for c in choices)


def _fraction(v) -> str | None:
    return None if 0 < v <= 1 else "must be a fraction in (0, 1]"


def _peak(v) -> str | None:
    return None if v > 0 else "must be > 0 (leave out a peak that is not known)"


_ANY: Callable[[Any], str | None] = lambda v: None  # noqa: E731
# A written peak of 0 predicted an MFU of 0.0%: leaving the key out is how a peak is unknown.
_PEAKS = {f"compute.peak_tflops_{d}": (float, 0.0, _peak,
                                       f"peak {d} TFLOP/s per rank (left out = unknown)") for d in DTYPES}

# dotted key -> (type, default, check, doc)
FIELDS: dict[str, tuple[type, Any, Callable[[Any], str | None], str]] = {
    "name": (str, "", _ANY, "what the cluster is"),
    "description": (str, "", _ANY, "one line on where its figures come from"),
    "nodes": (int, 1, _number(1), "nodes available: world sizes beyond nodes x ranks_per_node do not fit"),
    "ranks_per_node": (int, 1, _number(1), "ranks (GPUs, or CPU processes) per node"),
    "compute.calibrate": (bool, False, _ANY, "true: per-rank compute measured on this machine (calibration)"),
    **_PEAKS,
    "compute.memory_gb": (float, 0.0, _number(0), "memory per rank, GB; 0 = unknown (fit not judged)"),
    "compute.memory_bandwidth_gbs": (float, 0.0, _number(0), "memory bandwidth per rank, GB/s"),
    "compute.efficiency_max": (float, 0.5, _fraction, "best fraction of peak a large micro-batch reaches"),
    "compute.efficiency_half_tokens": (float, 2048.0, _number(0, open_low=True),
                                       "tokens per micro-batch at which half of efficiency_max is reached"),
    "compute.cores": (int, 0, _number(0), "CPU cores the ranks of a node share; 0 = not shared (GPUs)"),
    "intra.calibrate": (bool, False, _ANY, "true: the link within a node is measured here (calibration)"),
    "intra.bandwidth_gbs": (float, 0.0, _number(0), "achieved bandwidth within a node, GB/s (busbw)"),
    "intra.latency_us": (float, 0.0, _number(0), "latency of a message within a node, us"),
    "intra.nominal_gbs": (float, 0.0, _number(0), "datasheet bandwidth within a node, GB/s (for reference)"),
    "inter.bandwidth_gbs": (float, 0.0, _number(0), "achieved bandwidth between nodes per NIC, GB/s"),
    "inter.latency_us": (float, 0.0, _number(0), "latency of a message between nodes, us"),
    "inter.nominal_gbs": (float, 0.0, _number(0), "datasheet bandwidth per NIC, GB/s (for reference)"),
    "inter.nic": (str, "rank", _choice(*NIC_KINDS), "one NIC per rank or per node"),
    "collectives.algorithm": (str, "auto", _choice(*ALGORITHMS),
                              "auto: fastest per message size (NCCL's rule); engine: the preset's algorithm"),
    "collectives.reduce_gbs": (float, 0.0, _number(0), "bytes per second a rank reduces (gamma); 0 = free"),
}


@dataclass(frozen=True)
class Cluster:
    """A validated cluster file; `values` holds every FIELDS key (defaults filled in)."""

    path: Path
    values: dict = field(repr=False)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def name(self) -> str:
        return self.values["name"] or self.path.stem

    @property
    def calibrated(self) -> bool:
        return self.values["compute.calibrate"] or self.values["intra.calibrate"]

    def peak_flops(self, dtype: str) -> float:
        return self.values[f"compute.peak_tflops_{dtype}"] * 1e12

    def require_peak(self, dtype: str) -> None:
        """ConfigError unless a run computing in `dtype` has a peak here (its own, or fp32's, which the
        projection falls back to); a calibrated cluster measures its own."""
        if self["compute.calibrate"] or self.peak_flops(dtype) or self.peak_flops("fp32"):
            return
        given = ", ".join(k.rpartition(".")[2] for k in _PEAKS if self.values[k])
        raise ConfigError(f"compute.peak_tflops_{dtype}", f"the run computes in {dtype}, but the cluster "
                          f"gives only {given}", f"add peak_tflops_{dtype} under [compute]", str(self.path))

    @property
    def max_ranks(self) -> int:
        return self.values["nodes"] * self.values["ranks_per_node"]


def cluster_dirs() -> list[Path]:
    """Existing cluster folders in lookup order."""
    user = [Path(p).expanduser() for p in os.environ.get("NANODIST_CLUSTERS", "").split(os.pathsep) if p]
    found, seen = [], set()
    for folder in user + [d / "clusters" for _, d in search_dirs()]:
        if folder.is_dir() and (real := folder.resolve()) not in seen:
            seen.add(real)
            found.append(folder)
    return found


def list_clusters() -> list[Path]:
    """Every cluster file once (earlier folders shadow later ones), sorted by name."""
    found: dict[str, Path] = {}
    for folder in cluster_dirs():
        for path in sorted(folder.glob("*.toml")):
            found.setdefault(path.stem, path)
    return [found[name] for name in sorted(found)]


def find_cluster(name_or_path: str | os.PathLike) -> Path:
    return find_named_file(name_or_path, cluster_dirs(), "cluster")


def load_cluster(name_or_path: str | os.PathLike) -> Cluster:
    """The validated cluster; ConfigError (one line: file, line, key, problem, fix) on any mistake."""
    path = find_cluster(name_or_path)
    try:
        text = paths.read_small(path).decode("utf-8")
        data = tomllib.loads(text)
    except paths.PathError as exc:
        raise ConfigError("", exc.problem, exc.fix, source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"cannot read: {exc}", "save it as UTF-8 text", source=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"TOML syntax error: {exc}", "fix the TOML", source=str(path)) from None
    return Cluster(path, _validate(_flatten(data), text, str(path)))


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= _flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v}
    return out


def _validate(flat: dict[str, Any], text: str, source: str) -> dict[str, Any]:
    values = {key: spec[1] for key, spec in FIELDS.items()}
    for key, value in flat.items():
        line = locate_key(text, key)
        if key not in FIELDS:
            close = difflib.get_close_matches(key, list(FIELDS), n=1, cutoff=0.6)
            raise ConfigError(key, "unknown key", f"did you mean {close[0]}?" if close else "remove it",
                              source, line)
        kind, default, check, _ = FIELDS[key]
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is float and is_number:
            value = float(value)
            if not math.isfinite(value):  # TOML reads inf and nan; no figure of a cluster is either
                raise ConfigError(key, f"{value!r} is not a finite number", "write the figure itself, e.g. "
                                  f"{key.rpartition('.')[2]} = {default or 1:g}", source, line)
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            example = str(default).lower() if isinstance(default, bool) else repr(default)
            raise ConfigError(key, f"expected {kind.__name__}, got {value!r}",
                              f"write e.g. {key.rpartition('.')[2]} = {example}", source, line)
        if problem := check(value):
            raise ConfigError(key, f"{value!r} {problem}", "fix the value", source, line)
        values[key] = value
    if not values["compute.calibrate"] and not any(values[k] for k in _PEAKS):
        raise ConfigError("compute", "no compute figures: give peak_tflops_<dtype> or calibrate = true",
                          "add e.g. peak_tflops_bf16 = 312 under [compute]", source)
    if not values["intra.calibrate"] and values["ranks_per_node"] > 1 and not values["intra.bandwidth_gbs"]:
        raise ConfigError("intra.bandwidth_gbs", "ranks share a node but the link between them has no "
                          "bandwidth", "set intra.bandwidth_gbs (GB/s) or intra.calibrate = true", source)
    if values["nodes"] > 1 and not values["inter.bandwidth_gbs"]:
        raise ConfigError("inter.bandwidth_gbs", "several nodes but no link between them",
                          "set inter.bandwidth_gbs (GB/s per NIC)", source)
    return values
