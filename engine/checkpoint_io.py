"""Checkpoint files on disk: durable atomic writes, shard files, manifests, finding and pruning.

A checkpoint is a folder `checkpoints/step-000123/` holding one `rank-00000.npz` per rank and a
`manifest.json`. Every file is written to a temporary name in the same folder, fsynced, renamed over
its final name with `os.replace`, and the folder is fsynced so the rename itself is durable. The
manifest, which lists each shard's size and sha256, is written last: a folder without a readable
manifest is an unfinished checkpoint and is ignored, so a crash at any moment leaves the previous
checkpoint intact.

Shards are .npz files of plain arrays, loaded with allow_pickle=False; their metadata (step, owned
range, loss-scaler and RNG state) is JSON stored as a uint8 array under `__meta__`. Never pickle.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

MANIFEST = "manifest.json"
FORMAT = "nanodist-checkpoint"
VERSION = 1
META_KEY = "__meta__"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_MANIFEST_KEYS = ("step", "world_size", "zero_stage", "precision", "numel", "layout", "model", "shards")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, truncated, corrupted or for another model. One line."""

    def __init__(self, message: str):
        super().__init__(" ".join(message.split()))


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}.npz"


def fsync_dir(path: Path) -> None:
    """Make renames and new entries in `path` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a folder; the rename is still atomic
    finally:
        os.close(fd)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> tuple[str, int]:
    """Write a file via `write(f)` to a temporary name, fsync, rename over `path`, fsync the folder.
    Returns (sha256, size) of the bytes as they went to disk, hashed before the rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; checkpoints are ordinary readable files
        digest, size = sha256_file(Path(tmp)), os.path.getsize(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return digest, size


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
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        raise CheckpointError(f"{path}: unreadable shard ({type(exc).__name__}: {exc})") from None
    return arrays, meta


def verify_shard(folder: Path, entry: dict) -> None:
    """Size, then sha256 of one shard against its manifest entry."""
    path = folder / entry["file"]
    if not path.is_file():
        raise CheckpointError(f"{path}: shard file is missing; this checkpoint is incomplete, "
                              "use an earlier one (--step)")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise CheckpointError(f"{path}: truncated or altered shard ({size} bytes, the manifest says "
                              f"{entry['bytes']}); use an earlier checkpoint (--step)")
    if sha256_file(path) != entry["sha256"]:
        raise CheckpointError(f"{path}: corrupted shard (sha256 does not match the manifest); "
                              "use an earlier checkpoint (--step)")


# ----------------------------------------------------------------------------- manifests

def write_manifest(folder: Path, manifest: dict) -> None:
    text = json.dumps(manifest, indent=1).encode("utf-8")
    atomic_write(folder / MANIFEST, lambda f: f.write(text))


def read_manifest(folder: Path) -> dict:
    """The manifest of a checkpoint folder; CheckpointError if it is missing or not ours."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{folder}: no {MANIFEST} (an unfinished checkpoint)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a nanoDist checkpoint manifest")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {manifest.get('version')}, this nanoDist "
                              f"reads version {VERSION}")
    missing = [key for key in _MANIFEST_KEYS if key not in manifest]
    if missing:
        raise CheckpointError(f"{path}: manifest lacks {', '.join(missing)}; the checkpoint is damaged")
    for entry in manifest["shards"]:
        if entry.get("file") != shard_name(entry.get("rank", -1)):  # never a path outside the folder
            raise CheckpointError(f"{path}: bad shard entry {entry.get('file')!r}; the checkpoint is damaged")
    return manifest


def checkpoint_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every step-NNNNNN folder under root (finished or not), oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def finished_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Step folders whose manifest reads, oldest first; unfinished ones are ignored."""
    out = []
    for step, path in checkpoint_dirs(root):
        with contextlib.suppress(CheckpointError):
            read_manifest(path)
            out.append((step, path))
    return out


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
