"""One consolidated model file: fp32 parameters and the model's description in a single .npz.

    model.npz
        <parameter name>   fp32 array per parameter ("blocks.0.attn.c_attn.weight", ...)
        __meta__           JSON (uint8 bytes): format, model spec (kind + constructor arguments),
                           vocabulary (corpus characters, for decoding samples), step, run id, config

No pickle anywhere: it loads with allow_pickle=False. `load_model(path)` rebuilds the network in
fp32 for evaluation or sampling; `model_from_checkpoint` does the same straight from a checkpoint.
"""
from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import nn
from engine.checkpoint import Checkpoint
from engine.checkpoint_io import META_KEY, CheckpointError, atomic_write

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


def build(meta: dict, params: dict[str, np.ndarray], source: str = "model") -> nn.Module:
    """The fp32 network a model spec describes, with these parameters loaded (names and shapes checked)."""
    spec = dict(meta["model"])
    kind = spec.pop("kind")
    model: nn.Module
    if kind == "gpt":
        model = nn.GPT(**spec, dtype=np.float32)
    elif kind == "mlp":
        model = nn.MLP(spec["widths"], dropout=spec["dropout"], bias=spec["bias"], dtype=np.float32)
    else:
        raise CheckpointError(f"{source}: unknown model kind {kind!r}")
    for name, p in model.named_parameters():
        if name not in params:
            raise CheckpointError(f"{source}: parameter {name} is missing")
        value = params[name]
        if tuple(value.shape) != tuple(p.shape):
            raise CheckpointError(f"{source}: parameter {name} has shape {list(value.shape)}, "
                                  f"the model needs {list(p.shape)}")
        p.data[...] = value
    return model.eval()


def model_from_checkpoint(ckpt: Checkpoint) -> LoadedModel:
    meta = _meta(ckpt)
    return LoadedModel(build(meta, params_from_checkpoint(ckpt), str(ckpt.path)), meta)


def export_model(ckpt: Checkpoint, out: str | Path) -> Path:
    """Write the checkpoint's fp32 parameters and model description to one .npz (atomically)."""
    out = Path(out)
    ckpt.verify()
    payload = dict(params_from_checkpoint(ckpt))
    payload[META_KEY] = np.frombuffer(json.dumps(_meta(ckpt)).encode("utf-8"), dtype=np.uint8)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda f: np.savez(f, allow_pickle=False, **payload))
    return out


def read_model(path: str | Path) -> LoadedModel:
    """An exported model file: the fp32 network and its metadata (vocab, step, config)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        meta = json.loads(arrays.pop(META_KEY).tobytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such model file") from None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        raise CheckpointError(f"{path}: not a nanoDist model file ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a nanoDist model file (export one with `nanodist-tui export`)")
    return LoadedModel(build(meta, arrays, str(path)), meta)


def load_model(path: str | Path) -> nn.Module:
    """The fp32 model of an exported .npz, in eval mode."""
    return read_model(path).model
