"""Checkpoint files on disk: durable atomic writes, shard files, manifests, finding and pruning.

A checkpoint is a folder `checkpoints/step-000123/` holding one `rank-00000.npz` per rank and a
`manifest.json`. Every file is written to a temporary name in the same folder, fsynced, renamed over
its final name with `os.replace`, and the folder is fsynced so the rename itself is durable. The
manifest, which lists each shard's size and sha256, is written last: a folder without a manifest is an
unfinished checkpoint (a crash at any moment leaves the previous checkpoint intact), and what a killed
write leaves behind (the folder, `.tmp` files) is removed by `clean_leftovers`. A manifest that is there
but does not read, or fails engine.checkpoint.schema's checks, is a damaged checkpoint: an error, never
silently skipped.

Shards are .npz files of plain arrays, loaded with allow_pickle=False; their metadata (step, owned
range, loss-scaler state) is JSON stored as a uint8 array under `__meta__`. Never pickle.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np

from engine.checkpoint.schema import FORMAT, MANIFEST, VERSION, CheckpointError, check_manifest, shard_name
from engine.run.atomic_file import atomic_write, fsync_dir, sha256_file

META_KEY = "__meta__"
_STEP_DIR = re.compile(r"^step-(\d+)$")

__all__ = ["FORMAT", "MANIFEST", "META_KEY", "VERSION", "CheckpointError", "checkpoint_dirs",
           "clean_leftovers", "finished_checkpoints", "make_dir", "prune", "read_manifest", "read_shard",
           "remove_tmp_files", "scan_checkpoints", "shard_headers", "shard_name", "step_dir_name", "step_of",
           "verify_shard", "write_manifest", "write_shard"]


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def step_of(folder: Path) -> int | None:
    """The step a step-NNNNNN folder name holds; None for any other name."""
    match = _STEP_DIR.match(folder.name)
    return int(match.group(1)) if match else None


def make_dir(path: Path) -> None:
    """mkdir -p, with each new folder's entry made durable in its parent."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for p in reversed(missing):
        fsync_dir(p.parent)


# ----------------------------------------------------------------------------- shards

def write_shard(path: Path, arrays: dict[str, np.ndarray], meta: dict) -> tuple[str, int]:
    """One rank's shard: named arrays plus JSON metadata, uncompressed .npz, written atomically."""
    payload = dict(arrays)
    payload[META_KEY] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    return atomic_write(path, lambda f: np.savez(f, allow_pickle=False, **payload))


def read_shard(path: Path, keys: tuple[str, ...] | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, meta) of a shard, only the arrays named in `keys` (all when None; .npz members load
    lazily); CheckpointError when it is not a readable shard."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            wanted = [k for k in npz.files if k != META_KEY] if keys is None else keys
            arrays = {k: npz[k] for k in wanted}
            meta = json.loads(npz[META_KEY].tobytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: shard file is missing") from None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError, RecursionError) as exc:
        raise CheckpointError(f"{path}: unreadable shard ({type(exc).__name__}: {exc})") from None
    return arrays, meta


def shard_headers(path: Path) -> tuple[dict[str, tuple[np.dtype, tuple]], object]:
    """({array name: (dtype, shape)}, metadata) of a shard, reading only the arrays' headers."""
    arrays, meta, found_meta = {}, None, False
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                key = name.removesuffix(".npy")
                with archive.open(name) as member:
                    if key == META_KEY:
                        meta = json.loads(np.lib.format.read_array(member, allow_pickle=False).tobytes())
                        found_meta = True
                        continue
                    version = np.lib.format.read_magic(member)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(member)
                    arrays[key] = (np.dtype(dtype), tuple(shape))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: shard file is missing") from None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError, RecursionError) as exc:
        raise CheckpointError(f"{path}: unreadable shard ({type(exc).__name__}: {exc})") from None
    if not found_meta:
        raise CheckpointError(f"{path}: shard has no {META_KEY} metadata; the checkpoint is damaged")
    return arrays, meta


def verify_shard(folder: Path, entry: dict) -> None:
    """Size, then sha256 of one shard against its manifest entry."""
    path = folder / entry["file"]
    if not path.is_file():
        raise CheckpointError(f"{path}: shard file is missing; this checkpoint is incomplete")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise CheckpointError(f"{path}: truncated or altered shard ({size} bytes, the manifest says "
                              f"{entry['bytes']})")
    if sha256_file(path) != entry["sha256"]:
        raise CheckpointError(f"{path}: corrupted shard (sha256 does not match the manifest)")


# ----------------------------------------------------------------------------- manifests

def write_manifest(folder: Path, manifest: dict) -> None:
    text = json.dumps(manifest, indent=1).encode("utf-8")
    atomic_write(folder / MANIFEST, lambda f: f.write(text))


def read_manifest(folder: Path) -> dict:
    """The manifest of a checkpoint folder, every field checked (engine.checkpoint.schema);
    CheckpointError, one line, if it is missing, unreadable, damaged or not ours."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{folder}: no {MANIFEST} (an unfinished checkpoint)") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest ({type(exc).__name__}: {exc}); "
                              "the checkpoint is damaged") from None
    check_manifest(manifest, folder)
    if step_of(folder) not in (None, manifest["step"]):
        raise CheckpointError(f"{path}: step: {manifest['step']}, in the folder of step {step_of(folder)}; "
                              "the checkpoint is damaged")
    return manifest


def checkpoint_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every step-NNNNNN folder under root (finished or not), oldest first."""
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.iterdir() if p.is_dir() and (step := step_of(p)) is not None]
    return sorted(found)


def scan_checkpoints(root: Path) -> list[tuple[int, Path, str | None]]:
    """(step, folder, problem) of every step folder that has a manifest, oldest first: problem is None for
    a good one, else the one-line reason it is damaged. Folders without a manifest (unfinished) are left
    out."""
    out: list[tuple[int, Path, str | None]] = []
    for step, path in checkpoint_dirs(root):
        if not os.path.lexists(path / MANIFEST):
            continue
        try:
            read_manifest(path)
            out.append((step, path, None))
        except CheckpointError as exc:
            out.append((step, path, str(exc)))
    return out


def finished_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Step folders whose manifest reads and checks out, oldest first (unfinished and damaged left out)."""
    return [(step, path) for step, path, problem in scan_checkpoints(root) if problem is None]


def clean_leftovers(root: Path) -> list[Path]:
    """Remove what killed writes left under a checkpoints folder: step folders without a manifest and
    `.tmp` files. Only for a folder no run is writing into (its run has ended)."""
    removed = []
    for _, path in checkpoint_dirs(root):
        if not os.path.lexists(path / MANIFEST):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        else:
            removed += remove_tmp_files(path)
    removed += remove_tmp_files(root)
    if removed:
        fsync_dir(root)
    return removed


def remove_tmp_files(folder: Path) -> list[Path]:
    """Remove the `.NAME.XXXX.tmp` files atomic writes leave in `folder` when killed."""
    removed = []
    for path in folder.glob(".*.tmp") if folder.is_dir() else []:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            path.unlink()
            removed.append(path)
    return removed


def prune(root: Path, keep: int) -> list[Path]:
    """Keep the newest `keep` finished checkpoints; delete older ones and unfinished leftovers older than
    the newest finished one. The manifest goes first, so a crash mid-delete leaves an ignored folder."""
    finished = finished_checkpoints(root)
    if not finished:
        return []
    kept = {path for _, path in finished[-max(keep, 1):]}
    newest = finished[-1][0]
    removed = []
    for step, path in checkpoint_dirs(root):
        if path in kept or step > newest:
            continue
        with contextlib.suppress(FileNotFoundError):
            (path / MANIFEST).unlink()
        fsync_dir(path)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        fsync_dir(root)
    return removed
