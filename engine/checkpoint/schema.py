"""What a checkpoint's manifest and shards must hold, checked field by field before anything uses them.

A checksum proves a shard is the one the manifest lists, not that either says something sensible: a
hand-edited or forged checkpoint passes its checksums. So every field is checked for its type and range,
the shards' ranges must tile the parameters, the parameter layout must be the one the model spec builds,
and each shard's metadata and array headers (dtype, shape) must fit its manifest entry — all before any
rank starts. Each problem is a CheckpointError: one line naming the file, the field and what is wrong.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import numpy as np

from engine.checkpoint.reshard import local_numel
from engine.config.build import param_shapes
from engine.dtypes import DTYPES
from engine.nn import MODEL_KINDS
from engine.parallel.data import ZERO_STAGES

MANIFEST = "manifest.json"
FORMAT = "nanodist-checkpoint"
VERSION = 1
MAX_WORLD = 1 << 16
STATE_KEYS = ("master", "m", "v")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# model spec fields (the constructors' arguments) -> the check of their values, per model kind
_GPT_INTS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
_SPEC_FIELDS = {"gpt": (*_GPT_INTS, "dropout", "tie_weights", "bias", "moe"),  # moe: a mixture of experts
                "mlp": ("widths", "dropout", "bias")}
_MOE_FIELDS = ("n_experts", "top_k", "every", "capacity_factor", "aux_loss_coef")  # its keys (engine.moe)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, truncated, corrupted or for another model. One line."""

    def __init__(self, message: str):
        super().__init__(" ".join(message.split()))


def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}.npz"


class _Fields:
    """Reads typed fields of one JSON object, raising CheckpointError naming the file and field."""

    def __init__(self, obj: Any, path: Path, where: str = ""):
        self.path, self.where = path, where
        if not isinstance(obj, dict):
            self.fail("", f"expected a JSON object, got {_kind(obj)}")
        self.obj = obj

    def fail(self, key: str, problem: str) -> NoReturn:
        field = f"{self.where}{key}" if key else self.where.rstrip(".")
        where = f"{field}: " if field else ""
        raise CheckpointError(f"{self.path}: {where}{problem}; the checkpoint is damaged")

    def get(self, key: str, required: bool = True) -> Any:
        if key not in self.obj:
            if required:
                self.fail(key, "missing")
            return None
        return self.obj[key]

    def whole(self, key: str, lo: int = 0, hi: int = 1 << 62) -> int:
        value = self.get(key)
        if not _is_int(value):
            self.fail(key, f"expected a whole number, got {_kind(value)}")
        if not lo <= value <= hi:
            self.fail(key, f"{value} is out of range [{lo}, {hi}]")
        return value

    def number(self, key: str, lo: float, hi: float, required: bool = True) -> float | None:
        value = self.get(key, required)
        if value is None and not required:
            return None
        numeric = _is_int(value) or isinstance(value, float)
        if not numeric or not math.isfinite(value) or not lo <= value <= hi:
            self.fail(key, f"expected a number in [{lo:g}, {hi:g}], got {_kind(value)}")
        return float(value)

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            self.fail(key, f"expected true or false, got {_kind(value)}")
        return value

    def text(self, key: str, required: bool = True) -> str | None:
        value = self.get(key, required)
        if value is not None and not isinstance(value, str):
            self.fail(key, f"expected a string, got {_kind(value)}")
        return value

    def array(self, key: str) -> list:
        value = self.get(key)
        if not isinstance(value, list):
            self.fail(key, f"expected a list, got {_kind(value)}")
        return value

    def one_of(self, key: str, allowed) -> Any:
        value = self.get(key)
        if value not in allowed or isinstance(value, bool):
            self.fail(key, f"{value!r} is not one of {list(allowed)}")
        return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


# ----------------------------------------------------------------------------- the manifest

def check_manifest(manifest: Any, folder: Path) -> dict:
    """The manifest of `folder`, every field checked; CheckpointError (one line) on the first problem."""
    path = folder / MANIFEST
    f = _Fields(manifest, path)
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a nanoDist checkpoint manifest")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {manifest.get('version')!r}, this nanoDist "
                              f"reads version {VERSION}")
    f.whole("step")
    f.text("run_id", required=False)
    f.text("saved_at", required=False)
    world = f.whole("world_size", 1, MAX_WORLD)
    tensor = f.whole("tensor", 1, world) if "tensor" in manifest else 1  # absent: saved before TP existed
    if world % tensor:
        f.fail("tensor", f"{tensor} does not divide world_size {world}")
    f.one_of("zero_stage", ZERO_STAGES)
    f.one_of("precision", DTYPES)
    numel = f.whole("numel")
    layout = _check_layout(f, numel)
    spec = check_model_spec(manifest.get("model"), path)
    check_vocab(manifest.get("vocab"), spec, path)
    if "config" in manifest and manifest["config"] is not None and not isinstance(manifest["config"], dict):
        f.fail("config", f"expected a JSON object, got {_kind(manifest['config'])}")
    expected = spec_layout(spec)
    if expected != layout:
        diff = next((f"{a['name']} {a['shape']} there, {b['name']} {b['shape']} for the model spec"
                     for a, b in zip(layout, expected) if a != b),
                    f"{len(layout)} parameters there, {len(expected)} for the model spec")
        f.fail("layout", f"does not match the model spec ({diff})")
    expert = _check_expert(f, world, spec)
    if tensor > 1:  # each coordinate's ranges tile its own shard of the model
        numel = local_numel(spec["kind"], layout, tensor)
    if expert > 1:  # each shard's runs, together tiling each coordinate's flat state
        _check_runs(f, world, numel, tensor, spec["moe"]["n_experts"] // expert)
    else:
        _check_shards(f, world, numel, tensor)
    return manifest


def expert_degree(manifest: dict) -> int:
    """The expert-parallel degree that saved a checkpoint (1 for checkpoints from before it was recorded)."""
    return int(manifest.get("expert", 1))


def _check_expert(f: _Fields, world: int, spec: dict) -> int:
    """The expert-parallel degree: 1, or a divisor of the world and of the model's experts."""
    if "expert" not in f.obj:
        return 1
    expert = f.whole("expert", 1, world)
    n_experts = (spec.get("moe") or {}).get("n_experts", 0)
    if expert > 1 and (world % expert or not n_experts or n_experts % expert):
        f.fail("expert", f"{expert} does not divide world_size {world} and the model's {n_experts} experts")
    return expert


def _check_runs(f: _Fields, world: int, numel: int, tensor: int, per: int) -> None:
    """An expert-parallel run's shards (engine.checkpoint.expert_share): each entry in rank order, with no
    range but its runs ([start, end) of its tensor-parallel coordinate's flat state, in order) and the global
    experts it holds (null, or one expert-parallel rank's share of `per`); per coordinate the runs tile
    [0, numel)."""
    shards = f.array("shards")
    if len(shards) != world:
        f.fail("shards", f"{len(shards)} entries for a world size of {world}")
    pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(tensor)]
    for rank, entry in enumerate(shards):
        e = _shard_entry(f, entry, rank)
        tp = e.whole("tp", 0, tensor - 1) if tensor > 1 or "tp" in entry else 0
        if check_range(e, "range") is not None:
            e.fail("range", "expected null: an expert-parallel shard lists its runs")
        held = check_range(e, "experts")
        if held is not None and (held[1] - held[0] != per or held[0] % per):
            e.fail("experts", f"{list(held)} is not one expert-parallel rank's {per} experts")
        runs = check_runs(e, "ranges")
        pieces[tp] += [(start, end, rank) for start, end in runs]
    for tp in range(tensor):
        covered = 0
        for start, end, rank in sorted(pieces[tp]):
            if start != covered:
                f.fail(f"shards[{rank}].ranges", f"a run starts at {start}, expected {covered} "
                       "(gap or overlap)")
            covered = end
        if covered != numel:
            f.fail("shards", f"the runs cover {covered} elements of {numel} parameters")


def check_runs(e: _Fields, key: str) -> list[tuple[int, int]]:
    """A list of runs [start, end) with start < end, in the order the shard's arrays hold them."""
    value = e.array(key)
    out: list[tuple[int, int]] = []
    for i, run in enumerate(value):
        if not (isinstance(run, list) and len(run) == 2 and all(_is_int(v) for v in run)
                and 0 <= run[0] < run[1] <= 1 << 50):
            e.fail(f"{key}[{i}]", f"expected [start, end] with 0 <= start < end, got {_kind(run)}")
        out.append((run[0], run[1]))
    return out


def _check_layout(f: _Fields, numel: int) -> list[dict]:
    layout = f.array("layout")
    total, names = 0, set()
    for i, slot in enumerate(layout):
        s = _Fields(slot, f.path, f"layout[{i}].")
        name = s.text("name")
        if not name or name in names:
            s.fail("name", f"{name!r} is empty or repeated")
        names.add(name)
        shape = s.array("shape")
        if not all(_is_int(d) and 0 <= d <= 1 << 40 for d in shape) or len(shape) > 8:
            s.fail("shape", f"expected up to 8 whole numbers >= 0, got {shape!r}"[:120])
        total += math.prod(shape)
    if total != numel:
        f.fail("numel", f"{numel}, but the layout's shapes hold {total} elements")
    return [{"name": s["name"], "shape": list(s["shape"])} for s in layout]


def check_model_spec(spec: Any, path: Path) -> dict:
    """A model spec (kind + constructor arguments, as manifests and model files store it), checked."""
    if spec is None:
        raise CheckpointError(f"{path}: model: missing; the checkpoint is damaged")
    m = _Fields(spec, path, "model.")
    kind = m.one_of("kind", MODEL_KINDS)
    unknown = sorted(set(spec) - {"kind", *_SPEC_FIELDS[kind]})
    if unknown:
        m.fail(unknown[0], f"not a {kind} model setting")
    m.number("dropout", 0.0, 0.999999)
    m.flag("bias")
    if kind == "gpt":
        for key in _GPT_INTS:
            m.whole(key, 1, 1 << 16 if key == "n_layer" else 1 << 24)
        m.flag("tie_weights")
        if spec["n_embd"] % spec["n_head"]:
            m.fail("n_head", f"{spec['n_head']} does not divide n_embd {spec['n_embd']}")
        if "moe" in spec:
            _check_moe(_Fields(spec["moe"], path, "model.moe."))
    else:
        widths = m.array("widths")
        if len(widths) < 2 or not all(_is_int(w) and 1 <= w <= 1 << 24 for w in widths):
            m.fail("widths", f"expected at least two whole numbers >= 1, got {widths!r}"[:120])
    return spec


def _check_moe(moe: _Fields) -> None:
    """A mixture-of-experts GPT's settings: its fields, whole and in range."""
    if unknown := sorted(set(moe.obj) - set(_MOE_FIELDS)):
        moe.fail(unknown[0], "not a mixture-of-experts setting")
    experts = moe.whole("n_experts", 1, 1 << 16)
    moe.whole("top_k", 1, experts)
    moe.whole("every", 1, 1 << 16)
    moe.number("capacity_factor", 0.0, 1e6)
    moe.number("aux_loss_coef", 0.0, 1e6)


def check_vocab(vocab: Any, spec: dict, path: Path) -> None:
    """The corpus characters in token order (or None), against the model they belong to."""
    f = _Fields({"vocab": vocab}, path)
    if vocab is None:
        return
    if not isinstance(vocab, list) or not all(isinstance(c, str) and len(c) == 1 for c in vocab):
        f.fail("vocab", "expected a list of single characters (or null)")
    if spec["kind"] != "gpt" or len(vocab) > spec["vocab_size"] or len(set(vocab)) != len(vocab):
        f.fail("vocab", f"{len(vocab)} characters do not fit the model (repeated, or more than its "
               "vocabulary)")


def spec_layout(spec: dict) -> list[dict]:
    """[{"name", "shape"}] of the parameters the model spec builds, without building it."""
    model = SimpleNamespace(**{"n_layer": 0, "n_embd": 0, "block_size": 0, "tie_weights": True, "widths": (),
                               **spec})
    return [{"name": name, "shape": list(shape)}
            for name, shape, _ in param_shapes(SimpleNamespace(model=model), spec.get("vocab_size", 0))]


def _check_shards(f: _Fields, world: int, numel: int, tensor: int) -> None:
    """Every entry in rank order, and per tensor-parallel coordinate the ranges tiling its `numel`."""
    shards = f.array("shards")
    if len(shards) != world:
        f.fail("shards", f"{len(shards)} entries for a world size of {world}")
    for rank, entry in enumerate(shards):
        e = _Fields(entry, f.path, f"shards[{rank}].")
        if tensor > 1 or "tp" in entry:
            e.whole("tp", 0, tensor - 1)
    for tp in range(tensor):
        mine = [(r, e) for r, e in enumerate(shards) if e.get("tp", 0) == tp]
        _check_tiling(f, [r for r, _ in mine], [e for _, e in mine], numel, world)


def _check_tiling(f: _Fields, ranks: list[int], shards: list, numel: int, world: int) -> None:
    pieces = []
    for rank, entry in zip(ranks, shards):
        e = _shard_entry(f, entry, rank)
        span = check_range(e, "range")
        if span is not None:
            pieces.append((*span, rank))
    covered = 0
    for start, end, rank in sorted(pieces):
        if start != covered:
            f.fail(f"shards[{rank}].range", f"starts at {start}, expected {covered} (gap or overlap)")
        covered = end
    if not numel <= covered < numel + world:
        f.fail("shards", f"the ranges cover {covered} elements of {numel} parameters (padding < world size)")


def _shard_entry(f: _Fields, entry, rank: int) -> _Fields:
    """A shard's entry checked for what every layout's shards carry: its rank (entries in rank order), its
    file (never a path outside the folder), its size and its digest."""
    e = _Fields(entry, f.path, f"shards[{rank}].")
    if e.whole("rank", 0, MAX_WORLD) != rank:
        e.fail("rank", f"{entry['rank']}, expected {rank} (entries in rank order)")
    if e.get("file") != shard_name(rank):
        e.fail("file", f"{entry['file']!r}, expected {shard_name(rank)!r}")
    e.whole("bytes", 0, 1 << 50)
    if not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
        e.fail("sha256", "expected 64 lowercase hex digits")
    return e


def check_range(e: _Fields, key: str) -> tuple[int, int] | None:
    value = e.get(key)
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and all(_is_int(v) for v in value)
            and 0 <= value[0] <= value[1] <= 1 << 50):
        e.fail(key, f"expected null or [start, end] with 0 <= start <= end, got {_kind(value)}")
    return value[0], value[1]


def pieces(manifest: dict) -> list[tuple[int, int, int]]:
    """(start, end, rank) of the shards holding state, in order (a checked manifest tiles [0, numel))."""
    return sorted((e["range"][0], e["range"][1], e["rank"]) for e in manifest["shards"] if e["range"])


# ----------------------------------------------------------------------------- shards

def check_shard(meta: Any, arrays: dict[str, tuple[np.dtype, tuple]], entry: dict, manifest: dict,
                path: Path) -> None:
    """A shard's metadata and its arrays' (dtype, shape) against its manifest entry."""
    f = _Fields(meta, path, "meta.")
    if f.whole("rank", 0, MAX_WORLD) != entry["rank"]:
        f.fail("rank", f"{meta['rank']}, but the manifest lists this file for rank {entry['rank']}")
    if f.whole("step") != manifest["step"]:
        f.fail("step", f"{meta['step']}, but the manifest is for step {manifest['step']}")
    if ("tp" in meta or "tp" in entry) and f.whole("tp", 0, MAX_WORLD) != entry.get("tp", 0):
        f.fail("tp", f"{meta['tp']}, but the manifest lists this file for tensor-parallel shard "
               f"{entry.get('tp', 0)}")
    if check_range(f, "range") != (tuple(entry["range"]) if entry["range"] else None):
        f.fail("range", f"{meta['range']}, but the manifest says {entry['range']}")
    f.whole("optimizer_step")
    s = _Fields(f.get("scaler"), path, "meta.scaler.")
    s.number("scale", 0.0, math.inf)
    for key in ("growth_tracker", "hysteresis_left", "skipped_in_a_row"):
        if key in meta["scaler"]:
            s.whole(key)
    if "ranges" in entry:  # an expert-parallel run's shard: its runs and the experts it holds
        if meta.get("ranges") != entry["ranges"] or meta.get("experts") != entry["experts"]:
            f.fail("ranges", f"{meta.get('ranges')} of experts {meta.get('experts')}, but the manifest says "
                   f"{entry['ranges']} of experts {entry['experts']}")
        length = sum(end - start for start, end in entry["ranges"])
    else:
        length = entry["range"][1] - entry["range"][0] if entry["range"] else 0
    if extra := sorted(set(arrays) - (set(STATE_KEYS) if length else set())):
        raise CheckpointError(f"{path}: holds array {extra[0]!r} that a shard "
                              f"{'without state does not have' if extra[0] in STATE_KEYS else 'never has'}; "
                              "the checkpoint is damaged")
    if length:
        _check_arrays(arrays, STATE_KEYS, length, path)


def _check_arrays(arrays: dict, keys, length: int, path: Path) -> None:
    for key in keys:
        if key not in arrays:
            raise CheckpointError(f"{path}: array {key} is missing; the checkpoint is damaged")
        dtype, shape = arrays[key]
        if dtype.kind != "f" or dtype.itemsize not in (4, 8) or tuple(shape) != (length,):
            raise CheckpointError(f"{path}: array {key} is {dtype}{list(shape)}, expected float32 or "
                                  f"float64 [{length}] (its range); the checkpoint is damaged")
