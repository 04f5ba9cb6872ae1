"""A corpus of malformed invocations across every subcommand: each ends with exit code 2 (a mistake the
user can fix) or 1 (an internal failure), exactly one line on stderr naming the input, and no traceback.

Table-driven: add a row to CASES for a new subcommand's mistakes. A row is
    id: (arguments, {"code": 2, "named": "text the line must contain", "env": {...}, "setup": fn})
Arguments may use {run} (a finished tiny GPT run), {tmp} (this test's folder) and {damaged} (a copy of
the run whose newest manifest has a string numel); `setup(tmp, monkeypatch)` prepares files or patches.
"""
from __future__ import annotations

import errno
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.run import error_log
from nanodist_tui.cli import app
from tests.run_helpers import train

# ----------------------------------------------------------------------------- setups


def _write(name: str, data: str | bytes):
    def setup(tmp: Path, monkeypatch) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


def _folder(name: str):
    def setup(tmp: Path, monkeypatch) -> None:
        (tmp / name).mkdir(parents=True)
    return setup


def _run_copy(change):
    """A copy of the finished run at {tmp}/copy, then `change(copy)`."""
    def setup(tmp: Path, monkeypatch) -> None:
        change(Path(shutil.copytree(monkeypatch.run_dir, tmp / "copy")))
    return setup


def _events(text: bytes | None = None, folder: bool = False):
    def change(copy: Path) -> None:
        (copy / "events.jsonl").unlink()
        if folder:
            (copy / "events.jsonl").mkdir()
        elif text is not None:
            (copy / "events.jsonl").write_bytes(text)
    return change


def _typed_wrong(copy: Path) -> None:
    lines = (copy / "events.jsonl").read_text().splitlines()
    event = json.loads(next(line for line in lines if '"step_end"' in line))
    event["loss"] = "low"
    (copy / "events.jsonl").write_text("\n".join([lines[0], json.dumps(event), *lines[1:]]) + "\n")


def _no_config(copy: Path) -> None:
    (copy / "config.toml").unlink()


def _flip_shard(copy: Path) -> None:
    shard = copy / "checkpoints" / "step-000006" / "rank-00000.npz"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def _secret(content: bytes | None):
    """A secret file at {tmp}/secret (a folder when content is None)."""
    def setup(tmp: Path, monkeypatch) -> None:
        if content is None:
            (tmp / "secret").mkdir()
        else:
            (tmp / "secret").write_bytes(content)
            (tmp / "secret").chmod(0o600)
    return setup


def _no_mpi4py(tmp: Path, monkeypatch) -> None:
    """Started by mpiexec (its rank variable set), but the mpi extra is not installed."""
    import importlib.util
    monkeypatch.setenv("PMI_RANK", "0")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mpi4py" else real(name, *a))


def _disk_full_on_run_folder(tmp: Path, monkeypatch) -> None:
    from engine.run import atomic_file

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(atomic_file, "atomic_write_text", full)


def _bug_in(module: str, name: str):
    """An internal failure: `module.name` raises an error that is nobody's input."""
    def setup(tmp: Path, monkeypatch) -> None:
        import importlib

        def broken(*args, **kwargs):
            raise RuntimeError("an invariant broke")
        monkeypatch.setattr(importlib.import_module(module), name, broken)
    return setup


TCP = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29511", "NANODIST_SECRET": "s3cret"}
# thread ranks: a bug patched into this process reaches them (quickstart's rank processes would not see it)
TINY = ["--set", "train.steps=2", "--set", "model.n_layer=1", "--set", "model.n_embd=16",
        "--set", "data.max_chars=20000", "--set", "train.eval_batches=1", "--set", "parallel.backend=threads"]
# a preset whose batch does not split over its own world size, whatever the flags say
_ODD_BATCH = 'name = "odd"\n[train]\nglobal_batch = 3\n[parallel]\nworld_size = 2\n'
HUGE_GPT = ["--set", "model.n_embd=131072", "--set", "model.n_head=4"]

CASES: dict[str, tuple[list[str], dict]] = {
    # ---- training: the workbench's command (main) and `run`
    "main: unknown preset": (["--no-ui", "--preset", "nope"], {"named": "nope"}),
    "run: misspelt preset": (["run", "-p", "quickstrat"], {"named": "did you mean quickstart"}),
    "run: unknown key": (["run", "--set", "optim.lrr=1"], {"named": "optim.lrr"}),
    "run: override without =": (["run", "--set", "optim.lr"], {"named": "optim.lr"}),
    "run: override of nothing": (["run", "--set", "=3"], {"named": "=3"}),
    "run: word for a number": (["run", "--set", "train.steps=many"], {"named": "train.steps"}),
    "run: batch of 2^64": (["run", "--set", "train.global_batch=18446744073709551616"],
                           {"named": "64-bit"}),
    "run: batch of 2^62": (["run", "--set", "train.global_batch=4611686018427387904"],
                           {"named": "run.check_memory"}),
    "run: widths needing terabytes": (["run", *HUGE_GPT], {"named": "run.check_memory"}),
    "run: mlp needing terabytes": (["run", "-p", "mlp", "--set", "model.widths=[784, 100000000, 10]"],
                                   {"named": "run.check_memory"}),
    "run: data needing terabytes": (["run", "-p", "mlp", "--set", "data.n_samples=100000000000"],
                                    {"named": "data.n_samples"}),
    "run: timeout past time_t": (["run", "--set", "parallel.timeout_s=1e300"],
                                 {"named": "parallel.timeout_s"}),
    "run: negative seed": (["run", "--set", "seed=-1"], {"named": "seed"}),
    "run: dropout of 1.5": (["run", "--set", "model.dropout=1.5"], {"named": "model.dropout"}),
    "run: no ranks": (["run", "--world-size", "0"], {"named": "--world-size 0: parallel.world_size"}),
    "run: unknown backend": (["run", "--backend", "nccl"], {"named": "--backend nccl: parallel.backend"}),
    # the preset's batch is fine; the flag made it unsplittable, so the line names the flag, not the file
    "run: batch that does not split": (["run", "--world-size", "3"],
                                       {"named": "--world-size 3: train.global_batch"}),
    "run: batch that does not split, mlp": (["run", "-p", "mlp", "--world-size", "3"],
                                            {"named": "--world-size 3: train.global_batch"}),
    "run: batch --set unsplittable": (["run", "--set", "train.global_batch=33"],
                                      {"named": "--set train.global_batch=33: train.global_batch"}),
    "run: file's own mistake stays the file's": (
        ["run", "-p", "{tmp}/odd.toml", "--set", "optim.lr=0.001"],
        {"named": "odd.toml:3: train.global_batch", "setup": _write("odd.toml", _ODD_BATCH)}),
    "run: vocabulary smaller than the corpus": (
        ["run", "--set", "model.vocab_size=40"],
        {"named": "model.vocab_size: 40 is smaller than the corpus's"}),
    "run: context longer than the validation data": (
        ["run", "--set", "data.max_chars=400", "--set", "data.val_fraction=0.02"],
        {"named": "the val split has 8 tokens, fewer than block_size + 1"}),
    "run: text corpus missing": (["run", "--set", "data.kind=text", "--set", "data.path=/no/such/file.txt"],
                                 {"named": "/no/such/file.txt"}),
    "run: preset not TOML": (["run", "-p", "{tmp}/bad.toml"],
                             {"named": "bad.toml", "setup": _write("bad.toml", "[model\nx = 1")}),
    "run: preset not UTF-8": (["run", "-p", "{tmp}/latin.toml"],
                              {"named": "latin.toml",
                               "setup": _write("latin.toml", b"name = \"caf\xe9\"\n")}),
    "run: preset is a folder": (["run", "-p", "{tmp}/folder.toml"],
                                {"named": "folder.toml", "setup": _folder("folder.toml")}),
    "run: out_dir is a file": (["run", "--set", "run.out_dir={tmp}/file"],
                               {"named": "run.out_dir", "setup": _write("file", "x")}),
    "run: out_dir under a file": (["run", "--set", "run.out_dir={tmp}/file/runs"],
                                  {"named": "run.out_dir", "setup": _write("file", "x")}),
    "run: out_dir name too long": (["run", "--set", "run.out_dir={tmp}/" + "d" * 300],
                                   {"named": "run.out_dir"}),
    "run: disk full making the run folder": (["run", *TINY, "--set", "run.out_dir={tmp}/runs"],
                                             {"named": "No space left", "setup": _disk_full_on_run_folder}),
    "run: tcp without its environment": (["run", "--backend", "tcp", "--world-size", "2"], {"named": "RANK"}),
    "run: tcp RANK >= WORLD_SIZE": (["run", "--backend", "tcp", "--world-size", "2"],
                                    {"named": "RANK=2", "env": {**TCP, "RANK": "2"}}),
    "run: tcp port out of range": (["run", "--backend", "tcp", "--world-size", "2"],
                                   {"named": "MASTER_PORT=70000", "env": {**TCP, "MASTER_PORT": "70000"}}),
    "run: tcp WORLD_SIZE differs": (["run", "--backend", "tcp", "--world-size", "2"],
                                    {"named": "WORLD_SIZE=3", "env": {**TCP, "WORLD_SIZE": "3"}}),
    "run: tcp empty secret file": (["run", "--backend", "tcp", "--world-size", "2"],
                                   {"named": "is empty", "setup": _secret(b"\n"),
                                    "env": {**TCP, "NANODIST_SECRET": None,
                                            "NANODIST_SECRET_FILE": "{tmp}/secret"}}),
    "run: tcp secret path a folder": (["run", "--backend", "tcp", "--world-size", "2"],
                                      {"named": "NANODIST_SECRET_FILE", "setup": _secret(None),
                                       "env": {**TCP, "NANODIST_SECRET": None,
                                               "NANODIST_SECRET_FILE": "{tmp}/secret"}}),
    "run: tcp secret file missing": (["run", "--backend", "tcp", "--world-size", "2"],
                                     {"named": "No such file",
                                      "env": {**TCP, "NANODIST_SECRET": None,
                                              "NANODIST_SECRET_FILE": "{tmp}/none"}}),
    "run: tcp without a secret": (["run", "--backend", "tcp", "--world-size", "2"],
                                  {"named": "NANODIST_SECRET", "env": {**TCP, "NANODIST_SECRET": None}}),
    "run: tcp master unresolvable": (["run", "--backend", "tcp", "--world-size", "2"],
                                     {"named": "MASTER_ADDR",
                                      "env": {**TCP, "MASTER_ADDR": "no.such.host.invalid"}}),
    "run: mpi outside mpiexec": (["run", "--backend", "mpi", "--world-size", "2"], {"named": "mpiexec"}),
    "run: unknown option": (["run", "--presett", "x"], {"named": "--presett"}),
    "run: a bug inside a rank": (["run", *TINY, "--set", "run.out_dir={tmp}/runs"],
                                 {"code": 1, "named": "an invariant broke",
                                  "setup": _bug_in("engine.trainer", "global_norm_clip_scale")}),
    # ---- runs and replay
    "runs: no such folder": (["runs", "--out-dir", "{tmp}/nowhere"], {"named": "nowhere"}),
    "runs: a file for a folder": (["runs", "--out-dir", "{tmp}/file"],
                                  {"named": "file", "setup": _write("file", "")}),
    "runs: unknown option": (["runs", "--frce"], {"named": "--frce"}),
    "replay: no such run": (["replay", "{tmp}/nowhere", "--no-ui"], {"named": "nowhere"}),
    "replay: events not UTF-8": (["replay", "{tmp}/copy", "--no-ui"],
                                 {"named": "not UTF-8", "setup": _run_copy(_events(b'{"kind": "\xff"}\n'))}),
    "replay: events a folder": (["replay", "{tmp}/copy", "--no-ui"],
                                {"named": "events.jsonl", "setup": _run_copy(_events(folder=True))}),
    "replay: events missing": (["replay", "{tmp}/copy", "--no-ui"],
                               {"named": "events.jsonl", "setup": _run_copy(_events())}),
    "replay: events empty": (["replay", "{tmp}/copy", "--no-ui"],
                             {"named": "no events", "setup": _run_copy(_events(b""))}),
    "replay: a value of the wrong type": (["replay", "{tmp}/copy", "--no-ui"],
                                          {"named": "loss should be float",
                                           "setup": _run_copy(_typed_wrong)}),
    "replay: not JSON": (["replay", "{tmp}/copy", "--no-ui"],
                         {"named": "events.jsonl:1", "setup": _run_copy(_events(b"nonsense\n{}\n"))}),
    "replay: negative speed": (["replay", "{run}", "--speed", "-1"], {"named": "--speed"}),
    "replay: speed not a number": (["replay", "{run}", "--speed", "fast"], {"named": "--speed"}),
    # ---- resume
    "resume: no such run": (["resume", "{tmp}/nowhere", "--no-ui"], {"named": "no such run folder"}),
    "resume: no checkpoint of that step": (["resume", "{run}", "--no-ui", "--step", "5"],
                                           {"named": "step 5"}),
    "resume: negative step": (["resume", "{run}", "--no-ui", "--step", "-1"], {"named": "--step"}),
    "resume: another model": (["resume", "{run}", "--no-ui", "--set", "model.n_embd=48"],
                              {"named": "different model"}),
    "resume: unknown key": (["resume", "{run}", "--no-ui", "--set", "optim.lrr=1"], {"named": "optim.lrr"}),
    "resume: fewer steps than saved": (["resume", "{run}", "--no-ui", "--set", "train.steps=3"],
                                       {"named": "train.steps=6"}),
    "resume: batch that does not split": (["resume", "{run}", "--no-ui", "--world-size", "3"],
                                          {"named": "--world-size 3: train.global_batch"}),
    "resume: damaged newest manifest": (["resume", "{damaged}", "--no-ui"], {"named": "--step 4"}),
    "resume: corrupted shard": (["resume", "{tmp}/copy", "--no-ui"],
                                {"named": "corrupted", "setup": _run_copy(_flip_shard)}),
    "resume: run without its config": (["resume", "{tmp}/copy", "--no-ui"],
                                       {"named": "config.toml", "setup": _run_copy(_no_config)}),
    "resume: too big for this machine": (["resume", "{run}", "--no-ui",
                                          "--set", "train.global_batch=8589934592"],
                                         {"named": "run.check_memory"}),
    # ---- export and sample
    "export: to a folder": (["export", "{run}", "-o", "{tmp}/models"], {"named": "is a folder",
                                                                        "setup": _folder("models")}),
    "export: under a file": (["export", "{run}", "-o", "{tmp}/file/model.npz"],
                             {"named": "is a file, not a folder", "setup": _write("file", "x")}),
    "export: to an empty name": (["export", "{run}", "-o", ""], {"named": "empty file name"}),
    "export: nowhere writable": (["export", "{run}", "-o", "/proc/nanodist/model.npz"], {"named": "/proc"}),
    "export: no checkpoint of that step": (["export", "{run}", "--step", "3"], {"named": "step 3"}),
    "export: no such run": (["export", "{tmp}/nowhere"], {"named": "nowhere"}),
    "export: damaged newest manifest": (["export", "{damaged}", "-o", "{tmp}/m.npz"], {"named": "numel"}),
    "export: corrupted shard": (["export", "{tmp}/copy", "-o", "{tmp}/m.npz"],
                                {"named": "corrupted", "setup": _run_copy(_flip_shard)}),
    "sample: characters never seen": (["sample", "{run}", "--prompt", "caf\u00e9 \u20ac"],
                                      {"named": "never saw"}),
    "sample: no such source": (["sample", "{tmp}/nowhere", "--prompt", "x"], {"named": "nowhere"}),
    "sample: not a model file": (["sample", "{tmp}/junk.npz"], {"named": "junk.npz",
                                                                 "setup": _write("junk.npz", b"not a zip")}),
    "sample: zero tokens": (["sample", "{run}", "--tokens", "0"], {"named": "--tokens"}),
    "sample: negative temperature": (["sample", "{run}", "--temperature", "-1"], {"named": "--temperature"}),
    "sample: damaged newest manifest": (["sample", "{damaged}"], {"named": "--step 4"}),
    # ---- memory
    "memory: unknown preset": (["memory", "--preset", "nope"], {"named": "nope"}),
    "memory: no such ZeRO stage": (["memory", "--zero", "7"], {"named": "zero_stage"}),
    "memory: unknown precision": (["memory", "--precision", "fp8"], {"named": "precision.dtype"}),
    "memory: no steps to measure": (["memory", "--measure", "--steps", "0"], {"named": "--steps"}),
    "memory: no ranks": (["memory", "--world-size", "0"], {"named": "--world-size 0: parallel.world_size"}),
    "memory: precision flag named": (["memory", "--precision", "fp8"], {"named": "--precision fp8:"}),
    "memory: zero flag named": (["memory", "--zero", "7"], {"named": "--zero 7:"}),
    "memory: measuring what cannot fit": (["memory", "-p", "gpt-mini", "--measure", *HUGE_GPT],
                                          {"named": "run.check_memory"}),
    # ---- bench
    "bench step: unknown preset": (["bench", "step", "--preset", "nope"], {"named": "nope"}),
    "bench step: no steps": (["bench", "step", "--steps", "0"], {"named": "--steps"}),
    "bench step: what cannot fit": (["bench", "step", *HUGE_GPT], {"named": "run.check_memory"}),
    "bench allreduce: mpi without mpi4py": (["bench", "allreduce", "-b", "mpi"],
                                            {"named": "mpi4py", "setup": _no_mpi4py}),
    "bench allreduce: mpi outside mpiexec": (["bench", "allreduce", "-b", "mpi"], {"named": "mpiexec"}),
    "bench allreduce: unknown algorithm": (["bench", "allreduce", "--algorithm", "butterfly"],
                                            {"named": "butterfly"}),
    "bench allreduce: mpi-native off mpi": (["bench", "allreduce", "--algorithm", "mpi-native"],
                                            {"named": "--backend mpi"}),
    "bench allreduce: unknown backend": (["bench", "allreduce", "-b", "gloo"], {"named": "gloo"}),
    "bench allreduce: absurd size": (["bench", "allreduce", "--sizes", "1e30"], {"named": "--sizes"}),
    "bench allreduce: size past memory": (["bench", "allreduce", "--sizes", "99999GiB"],
                                          {"named": "--sizes"}),
    "bench allreduce: size not a number": (["bench", "allreduce", "--sizes", "big"], {"named": "--sizes"}),
    "bench allreduce: size not whole floats": (["bench", "allreduce", "--sizes", "3"],
                                               {"named": "multiple of 4"}),
    "bench allreduce: no size": (["bench", "allreduce", "--sizes", ","], {"named": "--sizes"}),
    "bench allreduce: too many ranks": (["bench", "allreduce", "-n", "5000"], {"named": "--world-size"}),
    "bench allreduce: no ranks": (["bench", "allreduce", "-n", "0"], {"named": "--world-size"}),
    "bench techniques: checkpointing an MLP": (["bench", "techniques", "--preset", "mlp"],
                                               {"named": "memory.checkpointing"}),
    "bench techniques: no steps": (["bench", "techniques", "--steps", "0"], {"named": "--steps"}),
    "bench: no such benchmark": (["bench", "latency"], {"named": "latency"}),
    # ---- presets
    "presets show: misspelt": (["presets", "show", "quickstrat"], {"named": "did you mean quickstart"}),
    "presets show: missing file": (["presets", "show", "missing/file.toml"], {"named": "missing/file.toml"}),
    "presets show: no name": (["presets", "show"], {"named": "Missing argument 'name'"}),
    "presets new: bad name": (["presets", "new", "bad name!", "--from", "quickstart"],
                              {"named": "bad name!"}),
    "presets new: unknown source": (["presets", "new", "x", "--from", "nope"], {"named": "nope"}),
    "presets new: no source": (["presets", "new", "x"], {"named": "--from"}),
    "presets new: bad override": (["presets", "new", "x", "--from", "quickstart", "--set", "optim.lrr=1"],
                                  {"named": "optim.lrr"}),
    "presets new: exists": (["presets", "new", "mine", "--from", "quickstart"],
                            {"named": "exists", "setup": _write("presets/mine.toml", "name = \"mine\"\n")}),
    "presets new: ./presets is a file": (["presets", "new", "x", "--from", "quickstart"],
                                         {"named": "presets", "setup": _write("presets", "")}),
    "presets diff: unknown preset": (["presets", "diff", "quickstart", "nope"], {"named": "nope"}),
    "presets: unknown command": (["presets", "remove", "x"], {"named": "remove"}),
    "presets list: a bug": (["presets", "list"], {"code": 1, "named": "an invariant broke",
                                                  "setup": _bug_in("engine.config.presets", "list_presets")}),
    "main: unknown command": (["fly"], {"named": "fly"}),
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny GPT run (checkpoints at 2, 4, 6) and a copy whose newest manifest is damaged."""
    out = tmp_path_factory.mktemp("cli-errors")
    summary, _ = train(out / "runs")
    run = Path(summary["run_dir"])
    damaged = Path(shutil.copytree(run, out / "damaged"))
    manifest = damaged / "checkpoints" / "step-000006" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["numel"] = str(data["numel"])
    manifest.write_text(json.dumps(data))
    return {"run": run, "damaged": damaged}


def test_the_corpus_is_large():
    assert len(CASES) >= 60


@pytest.mark.parametrize("case", CASES)
def test_a_malformed_invocation_ends_in_one_line(case, finished, in_tmp, monkeypatch):
    args, spec = CASES[case]
    places = {"run": finished["run"], "damaged": finished["damaged"], "tmp": in_tmp}
    monkeypatch.run_dir = finished["run"]  # for the setups that copy the run
    if "setup" in spec:
        spec["setup"](in_tmp, monkeypatch)
    env = {k: None if v is None else v.format(**places) for k, v in spec.get("env", {}).items()}
    for name in (*TCP, "MASTER_ADDR", "NANODIST_SECRET_FILE"):  # a test's own environment never leaks in
        env.setdefault(name, None)
    result = CliRunner().invoke(app, [a.format(**places) for a in args], env=env)
    code = spec.get("code", 2)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert len(lines) == 1, result.stderr
    assert spec["named"] in lines[0], lines[0]
    assert lines[0].startswith(("error: ", "run failed: ")) and "Traceback" not in result.output
    if code == 1:  # an internal failure names the file that holds the whole traceback
        log = Path(re.search(r"(?:is in|traceback in) (\S+?\.log)", lines[0]).group(1))
        assert log.is_file() and "Traceback (most recent call last)" in log.read_text()
        assert "RuntimeError: an invariant broke" in log.read_text()


def test_a_bug_inside_a_rank_leaves_its_traceback_in_the_run_folder(in_tmp, monkeypatch):
    _bug_in("engine.trainer", "global_norm_clip_scale")(in_tmp, monkeypatch)
    result = CliRunner().invoke(app, ["run", *TINY, "--set", f"run.out_dir={in_tmp / 'runs'}"])
    assert result.exit_code == 1
    (run_dir,) = (in_tmp / "runs").iterdir()
    log = run_dir / error_log.ERROR_LOG
    assert f"traceback in {log}" in result.stderr
    text = log.read_text()
    # every rank hits the same bug; which one is logged first is a race between the rank threads
    assert re.search(r"rank \d failed", text)
    assert "Traceback (most recent call last)" in text and "invariant" in text
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "an invariant broke" in summary["error"]
