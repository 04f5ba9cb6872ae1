"""Sharded checkpoints: saved every `checkpoint.every` steps and at the end; resumed at any world size,
ZeRO stage and tensor-parallel degree.

Each rank writes what it owns (engine.checkpoint.files does the durable writing): its range of the flat
fp32 master weights and Adam moments (`replica.owned_range()` / `optimizer_state()`) and its loss-scaler
state (dropout needs nothing: its masks are keyed by the step, engine.dropout_rng). With replicated state
(ZeRO stage 0) only the lowest rank owning a range writes it. Then rank 0 gathers every shard's size and
sha256 and writes the manifest last, with the world size, ZeRO stage, precision, parameter layout, model
spec, vocabulary and config. Reading checks every field of both (engine.checkpoint.schema).

Under tensor parallelism each rank's state is its own shard of the model (its own flat layout): ranges are
then per tensor-parallel coordinate (`tp` in the shard's entry; the manifest's `tensor` is the degree), and
of the ranks holding the same range of the same coordinate only the lowest writes it.

Under pipeline parallelism a rank's flat state is its stage's run of the model's parameters (the dense
order, the tied head's copy left out), so its owned range is offset by where that run starts
(its ZeRO padding clipped off): the stages' ranges tile the whole model's as one rank's would, the
checkpoint reads as the dense model's, and a run resumes at any pipeline degree, each rank taking its
stage's run back out (engine.parallel.pipeline.checkpoint_share; interleaved chunks are joined first).

Under expert parallelism a rank's state is two flat buffers, neither one run of the model's: its replicated
parameters' (every one of its stages but the split experts'; ZeRO owns a part) and its split experts'. Each
maps by the parameters' names onto runs of its tensor-parallel coordinate's flat state (expert_share.py,
experts.py); a shard's entry lists its runs (`ranges`, its `range` null) and the global experts it holds
(`experts`), the manifest's `expert` is the degree, and of the ranks holding the same runs only the lowest
writes them. Consolidating puts every run in place, so a run resumes at any expert degree, or none, beside any
tensor, pipeline or data-parallel degree, each rank gathering its parameters back by name.

Loading consolidates the shards into full, unpadded fp32 master/m/v of the dense model — the same arrays
whatever world size, stage or tensor degree saved them (reshard.py joins the tensor-parallel shards) — and
each rank cuts its own tensor-parallel shard back out (any degree; none for a whole model) before
`replica.load_optimizer_state(full)` takes its own slice. The data position is the step number
(engine.data batches are a pure function of the step), so resuming needs nothing else to continue
bitwise-identically at the same layout.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import events as ev
from engine.checkpoint import expert_share
from engine.checkpoint.files import (
    FORMAT,
    MANIFEST,
    VERSION,
    CheckpointError,
    make_dir,
    prune,
    read_manifest,
    read_shard,
    scan_checkpoints,
    shard_headers,
    shard_name,
    step_dir_name,
    step_of,
    verify_shard,
    write_manifest,
    write_shard,
)
from engine.checkpoint.reshard import cut, join, local_numel
from engine.checkpoint.schema import STATE_KEYS, check_shard, expert_degree, pieces, spec_layout
from engine.comm.collectives import all_gather
from engine.comm.objects import all_gather_json
from engine.config.build import vocab_chars
from engine.parallel.expert import checkpoint_state as expert_state
from engine.parallel.pipeline import checkpoint_share

CHECKPOINTS = "checkpoints"

__all__ = ["CHECKPOINTS", "Checkpoint", "CheckpointError", "Checkpointer", "NoCheckpoints", "check_layout",
           "find_checkpoint", "layout_of_model", "restore"]


# ----------------------------------------------------------------------------- what describes a model

def layout_of_model(model) -> list[dict]:
    """[{"name", "shape"}] of every parameter in flat-buffer order: what a checkpoint must match."""
    return [{"name": name, "shape": list(p.shape)} for name, p in model.named_parameters()]


def model_spec(cfg, model) -> dict:
    """What engine.checkpoint.export needs to rebuild the network: its kind and constructor arguments."""
    return {"kind": cfg.model.kind, **model.config}


def check_layout(ckpt: Checkpoint, layout: list[dict]) -> None:
    """Refuse a checkpoint saved for a different model, naming the first difference."""
    saved = ckpt.manifest["layout"]
    where = f"{ckpt.path}: checkpoint is for a different model"
    fix = "keep the run's [model] settings (and data) when resuming"
    for old, new in zip(saved, layout):
        if old["name"] != new["name"] or list(old["shape"]) != list(new["shape"]):
            raise CheckpointError(f"{where} (parameter {old['name']} {old['shape']} there, {new['name']} "
                                  f"{new['shape']} here); {fix}")
    if len(saved) != len(layout):
        raise CheckpointError(f"{where} ({len(saved)} parameters there, {len(layout)} here); {fix}")


# ----------------------------------------------------------------------------- saving (every rank)

class NoCheckpoints:
    """Checkpointing off (no run folder): the training loop calls it all the same."""

    def after_step(self, trainer, stepped: bool) -> None:
        pass

    def at_end(self, trainer) -> None:
        pass


class Checkpointer:
    """One rank's side of checkpointing. Every rank calls after_step/at_end at the same steps (collective)."""

    def __init__(self, root: str | Path, every: int, keep: int, config: dict, run_id: str = ""):
        self.root, self.every, self.keep = Path(root), every, keep
        self.config, self.run_id = config, run_id
        self.last_saved: int | None = None

    def after_step(self, trainer, stepped: bool) -> None:
        if self.every and stepped and trainer.step % self.every == 0:
            self.save(trainer)

    def at_end(self, trainer) -> None:
        if self.last_saved != trainer.step:
            self.save(trainer)

    def save(self, trainer) -> Path | None:
        """Save this step's checkpoint (every rank calls it); None, saving nothing, when the run folder
        that holds `root` is gone: removed or moved mid-run, as the recorder then says and stops the run."""
        comm, replica, rank, step = trainer.comm, trainer.replica, trainer.rank, trainer.step
        tp = trainer.layout.rank  # which tensor-parallel shard this rank's state is (0: the whole model)
        split = trainer.cfg.parallel.expert > 1  # split experts: the state is runs (expert_share.py)
        if split:
            runs, state, optimizer_step = expert_share.share(trainer, model_spec(trainer.cfg, trainer.model))
            start = end = 0
        else:
            start, end, state = checkpoint_share.share(trainer)  # collective in ZeRO 1-3 and pipelines
            optimizer_step = int(state["step"])
        owners = _gather_ints(comm, [step, int(self.root.parent.is_dir()), tp, start, end])
        if len(set(owners[:, 0].tolist())) != 1:
            raise RuntimeError(f"ranks reached a checkpoint at different steps: {owners[:, 0].tolist()}")
        if not owners[0, 1]:  # rank 0's view decides, for every rank alike: it writes the manifest
            return None  # making it again would leave a folder of checkpoints alone, which no resume reads
        folder = self.root / step_dir_name(step)
        make_dir(folder)
        ranges = [None] * trainer.world if split else _written_ranges(owners[:, 2:5])
        meta = {"rank": rank, "step": step, "tp": tp, "range": ranges[rank],
                "optimizer_step": optimizer_step, "scaler": replica.scaler.state_dict()}
        arrays = {k: state[k] for k in STATE_KEYS} if ranges[rank] else {}
        held = None
        if split:
            held = list(expert_state.held_experts(replica) or ()) or None
            meta |= {"ranges": runs, "experts": held}
            arrays = state
            held = all_gather_json(comm, [runs, held])  # every rank's, for the manifest
        digest, size = write_shard(folder / shard_name(rank), arrays, meta)
        records = _gather_ints(comm, [size, *np.frombuffer(bytes.fromhex(digest), dtype=np.int64).tolist()])
        if rank == 0:
            self._finish(trainer, folder, step, ranges, owners[:, 2].tolist(), records, held)
        # Nobody leaves before the manifest exists: a rank that failed right after its share (the next step
        # failing at once) would otherwise abort rank 0's last collective, and the checkpoint every shard of
        # which is on disk would never be finished.
        if trainer.world > 1:
            comm.barrier()
        self.last_saved = step
        return folder

    def _finish(self, trainer, folder: Path, step: int, ranges: list, tps: list[int], records: np.ndarray,
                experts: list | None) -> None:
        cfg, world = trainer.cfg, trainer.world
        spec = model_spec(cfg, trainer.model)
        layout = spec_layout(spec)  # the dense model's: what every tensor degree consolidates to
        shards = [{"rank": r, "file": shard_name(r), "bytes": int(records[r, 0]),
                   "sha256": records[r, 1:].astype(np.int64).tobytes().hex(), "tp": int(tps[r]),
                   "range": ranges[r]} for r in range(world)]
        if experts is not None:  # split experts: each shard's runs and the global experts it holds
            for entry, (runs, held) in zip(shards, experts):
                entry |= {"ranges": runs, "experts": held}
        manifest = {
            "format": FORMAT, "version": VERSION, "step": step, "run_id": self.run_id,
            "world_size": world, "tensor": trainer.layout.degree,
            "expert": 1 if experts is None else cfg.parallel.expert, "zero_stage": cfg.parallel.zero_stage,
            "precision": cfg.precision.dtype,
            "numel": sum(math.prod(p["shape"]) for p in layout), "layout": layout,
            "model": spec, "vocab": vocab_chars(trainer.dataset),
            "config": self.config, "shards": shards, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_manifest(folder, manifest)  # last: from here on the checkpoint exists
        prune(self.root, self.keep)
        trainer.emit(ev.CheckpointSaved(step=step, path=str(folder)))


def _written_ranges(owned: np.ndarray) -> list[list[int] | None]:
    """Per rank, the [start, end) of state it writes: its owned range (rows [tp, start, end]), unless a lower
    rank owns the same range of the same tensor-parallel shard (replicated state: ZeRO stage 0, and the
    data-parallel ranks of one shard), in which case None."""
    rows = owned.tolist()
    return [None if row in rows[:r] or row[1] == row[2] else row[1:] for r, row in enumerate(rows)]


def _gather_ints(comm, values: list[int]) -> np.ndarray:
    """[world, len(values)] int64: every rank's values, on every rank."""
    k = len(values)
    buf = np.zeros(comm.world_size * k, dtype=np.int64)
    buf[comm.rank * k:(comm.rank + 1) * k] = values
    if comm.world_size > 1:
        all_gather(comm, buf)
    return buf.reshape(comm.world_size, k)


# ----------------------------------------------------------------------------- finding and loading

@dataclass(frozen=True)
class Checkpoint:
    """A finished checkpoint folder and its manifest (checked field by field when it was read)."""
    path: Path
    manifest: dict

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    def verify(self) -> None:
        """Every shard present, of the recorded size and checksum, its metadata and array shapes fitting
        its manifest entry — what ranks rely on, checked before any starts."""
        try:
            for entry in self.manifest["shards"]:
                verify_shard(self.path, entry)
                arrays, meta = shard_headers(self.path / entry["file"])
                check_shard(meta, arrays, entry, self.manifest, self.path / entry["file"])
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}; {fallback_hint(self.path.parent, self.step)}") from None

    @property
    def tensor(self) -> int:
        """The tensor-parallel degree that saved it (1 for checkpoints from before tensor parallelism)."""
        return int(self.manifest.get("tensor", 1))

    @property
    def expert(self) -> int:
        """The expert-parallel degree that saved it (1: every expert in the flat state, or no experts)."""
        return expert_degree(self.manifest)

    def consolidate(self, keys: tuple[str, ...] = STATE_KEYS) -> dict:
        """Full unpadded arrays of the dense model (fp32 master, m, v) and the optimizer step, however many
        ranks, of whatever tensor-parallel or expert-parallel degree, saved them."""
        t, layout = self.tensor, self.manifest["layout"]
        kind = self.manifest["model"]["kind"]
        numel = self.manifest["numel"] if t == 1 else local_numel(kind, layout, t)
        if self.expert > 1:
            return self._from_runs(keys, numel)
        parts: dict[str, list[list[np.ndarray]]] = {k: [[] for _ in range(t)] for k in keys}
        step = None
        for _, _, rank in pieces(self.manifest):
            arrays, meta = read_shard(self.path / shard_name(rank), keys)
            step = meta["optimizer_step"] if step is None else step
            for k in keys:
                parts[k][self.manifest["shards"][rank].get("tp", 0)].append(arrays[k])
        if step is None:
            raise CheckpointError(f"{self.path}/{MANIFEST}: no shard holds optimizer state; "
                                  "the checkpoint is damaged")
        full = {}
        for k, by_tp in parts.items():
            locals_ = [np.concatenate(p)[:numel] for p in by_tp]
            full[k] = locals_[0] if t == 1 else join(kind, layout, t, locals_)
        return full | {"step": int(step)}

    def _from_runs(self, keys: tuple[str, ...], numel: int) -> dict:
        """An expert-parallel run's checkpoint: every shard's runs put in place in its tensor-parallel
        coordinate's flat state (they tile it), the coordinates joined."""
        t, layout = self.tensor, self.manifest["layout"]
        coordinates: list[dict] = [{} for _ in range(t)]
        step = None
        for entry in self.manifest["shards"]:
            if not entry["ranges"]:
                continue
            arrays, meta = read_shard(self.path / entry["file"], keys)
            step = meta["optimizer_step"] if step is None else step
            flat = coordinates[entry.get("tp", 0)]
            for k in keys:
                out = flat.setdefault(k, np.empty(numel, arrays[k].dtype))
                at = 0
                for start, end in entry["ranges"]:
                    out[start:end] = arrays[k][at:at + end - start]
                    at += end - start
        if step is None:
            raise CheckpointError(f"{self.path}/{MANIFEST}: no shard holds optimizer state; "
                                  "the checkpoint is damaged")
        kind = self.manifest["model"]["kind"]
        full = {k: coordinates[0][k] if t == 1 else join(kind, layout, t, [c[k] for c in coordinates])
                for k in keys}
        return full | {"step": int(step)}

    def rank_meta(self, rank: int) -> dict:
        """The saved per-rank state (the loss scaler's) for `rank`; rank 0's for ranks that did not exist."""
        source = rank if rank < self.manifest["world_size"] else 0
        return read_shard(self.path / shard_name(source), ())[1]


def find_checkpoint(path: str | Path, step: int | None = None) -> Checkpoint:
    """The checkpoint a path names: a step folder, a checkpoints/ folder or a run folder (its newest
    checkpoint, or the one of `step`). Unfinished folders (no manifest: a write was cut short) are
    skipped; the chosen one's manifest, if damaged, is an error naming the file, what is wrong and the
    older checkpoint to fall back to with --step K — never silently replaced by an older one."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        try:
            return Checkpoint(path, read_manifest(path))
        except CheckpointError as exc:
            saved_at = step_of(path)
            raise CheckpointError(f"{exc}; {fallback_hint(path.parent, saved_at)}" if saved_at is not None
                                  else str(exc)) from None
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such run folder; `nanodist-tui runs` lists the runs")
    root = path if path.name == CHECKPOINTS else path / CHECKPOINTS
    present = scan_checkpoints(root)
    chosen = [p for p in present if p[0] == step] if step is not None else present[-1:]
    if not chosen:
        what = f"no finished checkpoint for step {step}" if step is not None else "no finished checkpoint"
        steps = [s for s, _, problem in present if problem is None]
        known = f" (there are: {', '.join(map(str, steps))})" if steps else ""
        raise CheckpointError(f"{root}: {what}{known}; checkpoints are written every checkpoint.every steps "
                              "and at the end of a run")
    found, folder, problem = chosen[0]
    if problem is not None:
        raise CheckpointError(f"{problem}; {fallback_hint(root, found)}")
    return Checkpoint(folder, read_manifest(folder))


def fallback_hint(root: Path, step: int) -> str:
    """How to use the newest good checkpoint older than `step` instead (or that there is none)."""
    older = [s for s, _, problem in scan_checkpoints(root) if problem is None and s < step]
    if older:
        return f"use the checkpoint of step {older[-1]} instead with --step {older[-1]}"
    return "no older checkpoint of this run is usable"


def restore(trainer, ckpt: Checkpoint) -> None:
    """Put a trainer in the state of the checkpoint: step (= data position and dropout masks), fp32 master
    weights and Adam state via the replica (this rank's tensor-parallel shard of them, at any degree), loss
    scaler (same precision only)."""
    full, layout = ckpt.consolidate(), trainer.layout
    if trainer.cfg.parallel.expert > 1:  # split experts: each parameter gathered by name (expert_share.py)
        expert_share.load(trainer, ckpt.manifest["layout"], full)
    else:
        dense = {k: cut(layout.specs, layout.rank, ckpt.manifest["layout"], full[k]) for k in STATE_KEYS}
        mine = {k: checkpoint_share.mine(trainer, flat) for k, flat in dense.items()}
        trainer.replica.load_optimizer_state(mine | {"step": full["step"]})
    meta = ckpt.rank_meta(trainer.rank)
    if ckpt.manifest["precision"] == trainer.cfg.precision.dtype:
        trainer.replica.scaler.load_state_dict(meta["scaler"])
    trainer.step = ckpt.step
