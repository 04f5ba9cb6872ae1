"""One consolidated model file: fp32 parameters and the model's description in a single .npz.

    model.npz
        <parameter name>   fp32 array per parameter ("blocks.0.attn.c_attn.weight", ...)
        __meta__           JSON (uint8 bytes): format, model spec (kind + constructor arguments),
                           vocabulary (corpus characters, for decoding samples), step, run id, config

No pickle anywhere: it loads with allow_pickle=False. `load_model(path)` rebuilds the network in
fp32 for evaluation or sampling; `model_from_checkpoint` does the same straight from a checkpoint.
"""
from __future__ import annotations

import errno
import json
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import nn, paths
from engine.checkpoint.files import META_KEY, CheckpointError
from engine.checkpoint.schema import check_model_spec, check_vocab, spec_layout
from engine.checkpoint.sharded import Checkpoint
from engine.moe import build_gpt
from engine.run.atomic_file import atomic_write

FORMAT = "nanodist-model"
VERSION = 1


@dataclass(frozen=True)
class LoadedModel:
    model: nn.Module
    meta: dict

    @property
    def vocab(self) -> list[str] | None:
        return self.meta.get("vocab")


def params_from_checkpoint(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    """Parameter name -> fp32 array, consolidated from the checkpoint's master weights."""
    master = ckpt.consolidate(("master",))["master"]
    params, start = {}, 0
    for slot in ckpt.manifest["layout"]:
        end = start + math.prod(slot["shape"])
        params[slot["name"]] = master[start:end].astype(np.float32).reshape(slot["shape"])
        start = end
    return params


def _meta(ckpt: Checkpoint) -> dict:
    m = ckpt.manifest
    return {"format": FORMAT, "version": VERSION, "model": m["model"], "vocab": m.get("vocab"),
            "step": m["step"], "run_id": m.get("run_id", ""), "config": m.get("config")}


class ExportError(ValueError):
    """The model file cannot be written where asked (a folder, under a file, no space). One line."""


def build(meta: dict, params: dict[str, np.ndarray], source: str = "model") -> nn.Module:
    """The fp32 network a model spec describes, with these parameters loaded. The spec and every
    parameter's name and shape are checked against each other before the network is built, so a file
    that does not fit its spec is one clear line (and never an allocation the file does not back)."""
    spec = dict(check_model_spec(meta.get("model"), Path(source)))
    check_vocab(meta.get("vocab"), spec, Path(source))
    for slot in spec_layout(spec):
        name, shape = slot["name"], slot["shape"]
        if name not in params:
            raise CheckpointError(f"{source}: parameter {name} is missing")
        value = params[name]
        if list(value.shape) != shape or value.dtype.kind != "f":
            raise CheckpointError(f"{source}: parameter {name} is {value.dtype}{list(value.shape)}, "
                                  f"the model needs float{shape}")
    kind = spec.pop("kind")
    model: nn.Module
    if kind == "gpt":
        model = build_gpt(**spec, dtype=np.float32)  # a mixture of experts too (its spec's "moe")
    else:
        model = nn.MLP(spec["widths"], dropout=spec["dropout"], bias=spec["bias"], dtype=np.float32)
    for name, p in model.named_parameters():
        p.data[...] = params[name]
    return model.eval()


def model_from_checkpoint(ckpt: Checkpoint) -> LoadedModel:
    meta = _meta(ckpt)
    return LoadedModel(build(meta, params_from_checkpoint(ckpt), str(ckpt.path)), meta)


def check_output(out: str | Path) -> Path:
    """Where a model file may go: a file name (not empty, not a folder) whose parent is or can be a folder."""
    text = str(out)
    if not text.strip():
        raise ExportError("--output: empty file name; give a file such as -o model.npz")
    out = Path(text)
    try:
        paths.check_name(out)
        if out.is_dir() or text.endswith(os.sep):
            raise ExportError(f"--output {out}: is a folder; name a file inside it, "
                              f"e.g. -o {out / 'model.npz'}")
        blocking = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            raise ExportError(f"--output {out}: {blocking} is a file, not a folder; choose another path")
        return paths.check_output(out)  # a device, FIFO or socket there would be replaced by the rename
    except paths.PathError as exc:
        raise ExportError(f"--output {exc}") from None


def export_model(ckpt: Checkpoint, out: str | Path) -> Path:
    """Write the checkpoint's fp32 parameters and model description to one .npz (atomically). The
    checkpoint is verified and its parameters are checked against its model spec first."""
    out = check_output(out)
    ckpt.verify()
    params = params_from_checkpoint(ckpt)
    meta = _meta(ckpt)
    build(meta, params, str(ckpt.path))  # shapes against the model, before anything is written
    payload = dict(params)
    payload[META_KEY] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, lambda f: np.savez(f, allow_pickle=False, **payload))
    except OSError as exc:
        fix = "free some space or choose another path" if exc.errno == errno.ENOSPC else "choose another path"
        raise ExportError(f"--output {out}: cannot write it ({exc.strerror or exc}); {fix}") from None
    return out


def read_model(path: str | Path) -> LoadedModel:
    """An exported model file: the fp32 network and its metadata (vocab, step, config)."""
    path = Path(path)
    if path.is_file() and not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path}: not a nanoDist model file (not an .npz archive); export one with "
                              "`nanodist-tui export`")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        meta = json.loads(arrays.pop(META_KEY).tobytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such model file") from None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError, RecursionError) as exc:
        raise CheckpointError(f"{path}: not a nanoDist model file ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a nanoDist model file (export one with `nanodist-tui export`)")
    return LoadedModel(build(meta, arrays, str(path)), meta)


def load_model(path: str | Path) -> nn.Module:
    """The fp32 model of an exported .npz, in eval mode."""
    return read_model(path).model
