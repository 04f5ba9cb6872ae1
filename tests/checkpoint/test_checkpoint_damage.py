"""Damaged checkpoints are refused with one line before any rank starts: a corpus of damaged manifests
(the newest one names the file, the problem and the `--step K` fallback; an older one never breaks
`runs`) and of forged shards (checksums made to match, so only the field checks can catch them), through
the engine and through the command line. Killed writes leave nothing behind a later start trips over."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from engine.checkpoint.files import MANIFEST, CheckpointError, checkpoint_dirs
from engine.checkpoint.resume import prepare_resume
from engine.checkpoint.sharded import find_checkpoint
from engine.run import lock
from nanodist_tui.cli import app
from tests.run_helpers import train

NEWEST = "step-000006"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 2-rank ZeRO-1 run (each rank saves state), checkpoints at steps 2, 4 and 6."""
    summary, _ = train(tmp_path_factory.mktemp("damage"), "parallel.world_size=2", "parallel.zero_stage=1")
    return Path(summary["run_dir"])


@pytest.fixture
def run_copy(finished_run, tmp_path):
    return Path(shutil.copytree(finished_run, tmp_path / "runs" / "copy"))


def manifest_of(run_dir: Path, step_dir: str = NEWEST) -> dict:
    return json.loads((run_dir / "checkpoints" / step_dir / MANIFEST).read_text())


def write_manifest(run_dir: Path, manifest, step_dir: str = NEWEST) -> Path:
    path = run_dir / "checkpoints" / step_dir / MANIFEST
    path.write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return path


def _parent(manifest: dict, path: tuple):
    """The container of the field a path of keys and indices leads to."""
    for key in path[:-1]:
        manifest = manifest[key]
    return manifest


def _set(*path_and_value):
    *path, value = path_and_value
    return lambda m: _parent(m, tuple(path)).__setitem__(path[-1], value)


def _drop(*path):
    return lambda m: _parent(m, path).__delitem__(path[-1])


def _swap_layout(m):
    m["layout"][0], m["layout"][1] = m["layout"][1], m["layout"][0]


def _overlap(m):
    m["shards"][1]["range"][0] -= 1


def _short(m):
    m["shards"][1]["range"] = None


MANIFEST_DAMAGE = {
    "truncated": ("text", lambda text: text[:300], "unreadable manifest"),
    "garbage bytes": ("bytes", lambda _: bytes(range(256)) * 4, "unreadable manifest"),
    "empty": ("text", lambda _: "", "unreadable manifest"),
    "deeply nested": ("text", lambda _: "[" * 100_000 + "]" * 100_000, "unreadable manifest"),
    "a list": ("text", lambda _: "[1, 2]", "expected a JSON object"),
    "another format": ("json", _set("format", "zip"), "not a nanoDist checkpoint"),
    "another version": ("json", _set("version", 2), "format version 2"),
    "missing bytes": ("json", _drop("shards", 0, "bytes"), "shards[0].bytes: missing"),
    "string numel": ("json", _set("numel", "16000"), "numel: expected a whole number"),
    "non-list layout": ("json", _set("layout", {"wte.weight": [65, 32]}), "layout: expected a list"),
    "non-object shard": ("json", _set("shards", ["rank-00000.npz", "rank-00001.npz"]), "shards[0]: expected"),
    "negative step": ("json", _set("step", -6), "step: -6 is out of range"),
    "boolean step": ("json", _set("step", True), "step: expected a whole number"),
    "float world size": ("json", _set("world_size", 2.0), "world_size: expected a whole number"),
    "world size off": ("json", _set("world_size", 3), "2 entries for a world size of 3"),
    "unknown stage": ("json", _set("zero_stage", 7), "zero_stage: 7 is not one of"),
    "unknown precision": ("json", _set("precision", "fp8"), "precision: 'fp8' is not one of"),
    "numel off": ("json", lambda m: m.update(numel=m["numel"] + 1), "but the layout's shapes hold"),
    "negative dim": ("json", _set("layout", 0, "shape", [-65, 32]), "layout[0].shape"),
    "string dim": ("json", _set("layout", 0, "shape", ["65", 32]), "layout[0].shape"),
    "repeated name": ("json", _set("layout", 1, "name", "wte.weight"), "layout[1].name"),
    "layout not the model's": ("json", _swap_layout, "layout: does not match the model spec"),
    "unknown model kind": ("json", _set("model", "kind", "rnn"), "model.kind: 'rnn' is not one of"),
    "unknown model field": ("json", _set("model", "n_expert", 8), "model.n_expert: not a gpt model setting"),
    "string width": ("json", _set("model", "n_embd", "32"), "model.n_embd: expected a whole number"),
    "heads off": ("json", _set("model", "n_head", 3), "does not divide n_embd"),
    "huge model": ("json", _set("model", "n_layer", 1 << 40), "model.n_layer"),
    "model not an object": ("json", _set("model", "gpt"), "model: expected a JSON object"),
    "vocab not characters": ("json", _set("vocab", [1, 2, 3]), "vocab: expected a list of single characters"),
    "shard path escapes": ("json", _set("shards", 0, "file", "../../../etc/passwd"), "shards[0].file"),
    "ranks out of order": ("json", lambda m: m["shards"].reverse(), "shards[0].rank: 1, expected 0"),
    "bad sha256": ("json", _set("shards", 0, "sha256", "not hex"), "shards[0].sha256"),
    "negative bytes": ("json", _set("shards", 0, "bytes", -1), "shards[0].bytes: -1 is out of range"),
    "range not a pair": ("json", _set("shards", 0, "range", [0]), "shards[0].range"),
    "overlapping ranges": ("json", _overlap, "gap or overlap"),
    "ranges short": ("json", _short, "the ranges cover"),
    "config not an object": ("json", _set("config", "quickstart"), "config: expected a JSON object"),
    "a folder": ("folder", None, "unreadable manifest"),
}


def damage_manifest(run_dir: Path, how: str, step_dir: str = NEWEST) -> Path:
    form, change, _ = MANIFEST_DAMAGE[how]
    path = run_dir / "checkpoints" / step_dir / MANIFEST
    if form == "text":
        path.write_text(change(path.read_text()))
    elif form == "bytes":
        path.write_bytes(change(path.read_bytes()))
    elif form == "folder":
        path.unlink()
        path.mkdir()
    else:
        manifest = json.loads(path.read_text())
        change(manifest)
        path.write_text(json.dumps(manifest))
    return path


def assert_one_line(err, *named):
    text = str(err)
    assert "\n" not in text and "Traceback" not in text, text
    for part in named:
        assert part in text, (part, text)


@pytest.mark.parametrize("how", MANIFEST_DAMAGE)
def test_a_damaged_newest_manifest_is_refused_naming_file_problem_and_fallback(run_copy, how):
    path = damage_manifest(run_copy, how)
    with pytest.raises(CheckpointError) as err:
        prepare_resume(run_copy)
    assert_one_line(err.value, str(path), MANIFEST_DAMAGE[how][2], "--step 4")
    assert prepare_resume(run_copy, step=4)[2].step == 4  # the explicit fallback works


def test_there_are_many_damaged_manifests():
    assert len(MANIFEST_DAMAGE) >= 30


@pytest.mark.parametrize("how", ["string numel", "non-object shard", "truncated", "a folder"])
def test_damage_in_an_older_checkpoint_leaves_runs_and_the_newest_alone(run_copy, how):
    older = damage_manifest(run_copy, how, "step-000004")
    assert find_checkpoint(run_copy).step == 6
    result = CliRunner().invoke(app, ["runs", "--out-dir", str(run_copy.parent)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("copy "))
    assert row.endswith("step 6") and "Traceback" not in result.output
    with pytest.raises(CheckpointError) as err:
        find_checkpoint(run_copy, step=4)
    assert_one_line(err.value, str(older), "--step 2")


def test_runs_says_when_the_newest_checkpoint_is_damaged(run_copy):
    damage_manifest(run_copy, "negative step")
    result = CliRunner().invoke(app, ["runs", "--out-dir", str(run_copy.parent)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("copy "))
    assert row.endswith("step 4 (step 6 damaged)")


def test_a_manifest_in_the_folder_of_another_step_is_refused(run_copy):
    root = run_copy / "checkpoints"
    shutil.rmtree(root / NEWEST)
    shutil.copytree(root / "step-000004", root / NEWEST)  # step 4's checkpoint, filed as step 6
    with pytest.raises(CheckpointError) as err:
        find_checkpoint(run_copy)
    assert_one_line(err.value, str(root / NEWEST / MANIFEST), "step 4", "--step 4")


# ----------------------------------------------------------------------------- forged shards

def shard_parts(path: Path) -> tuple[dict, dict]:
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "__meta__"}
        meta = json.loads(npz["__meta__"].tobytes())
    return arrays, meta


def forge(run_dir: Path, rank: int, data: bytes) -> Path:
    """Replace a shard of the newest checkpoint and make its manifest entry match it (size, sha256)."""
    path = run_dir / "checkpoints" / NEWEST / f"rank-{rank:05d}.npz"
    path.write_bytes(data)
    manifest = manifest_of(run_dir)
    manifest["shards"][rank].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    write_manifest(run_dir, manifest)
    return path


def npz_bytes(arrays: dict, meta=None, raw_meta: bytes | None = None, pickle_ok: bool = False) -> bytes:
    payload = dict(arrays)
    if raw_meta is not None or meta is not None:
        raw = raw_meta if raw_meta is not None else json.dumps(meta).encode()
        payload["__meta__"] = np.frombuffer(raw, dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=pickle_ok, **payload)
    return buf.getvalue()


def _meta(**changes):
    def forge_meta(arrays, meta):
        for key, value in changes.items():
            if value is _DELETE:
                del meta[key]
            else:
                meta[key] = value
        return npz_bytes(arrays, meta)
    return forge_meta


def _arrays(change):
    def forge_arrays(arrays, meta):
        change(arrays)
        pickled = any(a.dtype.hasobject for a in arrays.values())
        return npz_bytes(arrays, meta, pickle_ok=pickled)
    return forge_arrays


_DELETE = object()

FORGED_SHARDS = {
    "rank of another shard": (_meta(rank=0), "meta.rank: 0, but the manifest lists this file for rank 1"),
    "another step": (_meta(step=4), "meta.step: 4, but the manifest is for step 6"),
    "another range": (_meta(range=[0, 10]), "meta.range"),
    "no optimizer step": (_meta(optimizer_step=_DELETE), "meta.optimizer_step: missing"),
    "string optimizer step": (_meta(optimizer_step="6"), "meta.optimizer_step: expected a whole number"),
    "no scaler": (_meta(scaler=_DELETE), "meta.scaler: missing"),
    "negative scale": (_meta(scaler={"scale": -1.0}), "meta.scaler.scale"),
    "string scale": (_meta(scaler={"scale": "big"}), "meta.scaler.scale"),
    "meta a list": (_meta(), None),  # replaced below
    "master too short": (_arrays(lambda a: a.update(master=a["master"][:-1])), "array master is float32"),
    "m missing": (_arrays(lambda a: a.pop("m")), "array m is missing"),
    "v of integers": (_arrays(lambda a: a.update(v=a["v"].astype(np.int32))), "array v is int32"),
    "master 2-D": (_arrays(lambda a: a.update(master=a["master"].reshape(1, -1))), "array master is"),
    "meta not JSON": (lambda arrays, meta: npz_bytes(arrays, raw_meta=b"\xff\xfe{"), "unreadable shard"),
    "no meta": (lambda arrays, meta: npz_bytes(arrays), "no __meta__ metadata"),
    "an extra pickled array": (lambda arrays, meta: npz_bytes({**arrays, "x": np.array([{}], dtype=object)},
                                                              meta, pickle_ok=True), "holds array 'x'"),
    "pickled master": (_arrays(lambda a: a.update(master=np.array([{}] * len(a["master"]), dtype=object))),
                       "array master is object"),
    "not a zip file": (lambda arrays, meta: b"PK\x03\x04" + bytes(500), "unreadable shard"),
}
FORGED_SHARDS["meta a list"] = (lambda arrays, meta: npz_bytes(arrays, [meta]),
                                "meta: expected a JSON object")


@pytest.mark.parametrize("how", FORGED_SHARDS)
def test_a_forged_shard_with_matching_checksums_is_refused_before_any_rank_starts(run_copy, how):
    shard = run_copy / "checkpoints" / NEWEST / "rank-00001.npz"
    arrays, meta = shard_parts(shard)
    make, named = FORGED_SHARDS[how]
    path = forge(run_copy, 1, make(arrays, meta))
    with pytest.raises(CheckpointError) as err:
        prepare_resume(run_copy)
    assert_one_line(err.value, str(path), named, "--step 4")


def test_export_refuses_parameters_that_do_not_fit_the_model(run_copy, tmp_path):
    """A model file whose parameter shapes do not fit its spec: one line naming the parameter."""
    from engine.checkpoint.export import read_model
    out = tmp_path / "model.npz"
    result = CliRunner().invoke(app, ["export", str(run_copy), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with np.load(out, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["ln_f.weight"] = arrays["ln_f.weight"][:-1]
    np.savez(out, **arrays)
    with pytest.raises(CheckpointError) as err:
        read_model(out)
    assert_one_line(err.value, "ln_f.weight", "the model needs float[32]")


@pytest.mark.parametrize("command", [["resume", "--no-ui"], ["export", "-o", "model.npz"],
                                     ["sample", "--prompt", "def"]])
@pytest.mark.parametrize("how", ["string numel", "non-list layout", "missing bytes", "negative step"])
def test_every_command_reading_checkpoints_refuses_damage_with_one_line(run_copy, in_tmp, command, how):
    damage_manifest(run_copy, how)
    result = CliRunner().invoke(app, [command[0], str(run_copy), *command[1:]])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and MANIFEST_DAMAGE[how][2] in lines[0] and "--step 4" in lines[0], result.output
    assert not (in_tmp / "model.npz").exists()


# ----------------------------------------------------------------------------- what killed writes leave

def leave_leftovers(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    (root / "step-000008").mkdir()  # killed right after making the folder
    (root / "step-000010").mkdir()
    (root / "step-000010" / ".rank-00000.npz.abc123.tmp").write_bytes(b"half a shard")
    (root / NEWEST / ".manifest.json.x1.tmp").write_bytes(b"{")
    (run_dir / ".summary.json.q9.tmp").write_text("{")
    return [root / "step-000008", root / "step-000010", root / NEWEST / ".manifest.json.x1.tmp",
            run_dir / ".summary.json.q9.tmp"]


def test_the_next_start_cleans_what_killed_writes_left(run_copy):
    left = leave_leftovers(run_copy)
    assert find_checkpoint(run_copy).step == 6  # unfinished folders are skipped...
    prepare_resume(run_copy)  # ...and removed once the run has ended
    assert not any(p.exists() for p in left)
    assert [s for s, _ in checkpoint_dirs(run_copy / "checkpoints")] == [2, 4, 6]


def test_a_run_still_being_written_is_left_alone(run_copy):
    left = leave_leftovers(run_copy)
    handle = lock.hold(run_copy)  # a live recorder holds the run folder
    try:
        assert lock.is_held(run_copy)
        prepare_resume(run_copy)
        assert all(p.exists() for p in left)
    finally:
        lock.release(handle, run_copy)
    assert lock.is_held(run_copy) is None


def test_zip_members_are_read_by_header_only(run_copy):
    """The shape check reads .npy headers, not the arrays (a huge forged array costs nothing to refuse)."""
    from engine.checkpoint.files import shard_headers
    shard = run_copy / "checkpoints" / NEWEST / "rank-00000.npz"
    arrays, meta = shard_headers(shard)
    real, real_meta = shard_parts(shard)
    assert {k: (v.dtype, v.shape) for k, v in real.items()} == arrays and meta == real_meta
    with zipfile.ZipFile(shard) as archive:
        assert sorted(archive.namelist()) == sorted(f"{k}.npy" for k in [*real, "__meta__"])
