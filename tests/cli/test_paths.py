"""Every path the user names is checked for what it is before it is read or written (engine.paths).

Outputs replace only regular files: a device (/dev/null, reached directly or through a link under
tmp_path), a FIFO or a folder named as an output is one line, exit 2, and is left exactly as it was.
Inputs are read bounded: data.path reads only data.max_chars of a 3 GiB sparse file, refuses a FIFO or a
device; a preset or cluster file over paths.MAX_CONFIG_BYTES is refused unread. A name longer than a file
system allows is one line naming the path and the limit, in every command that takes a path.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from extras import needs

from engine import paths
from engine.data import DataError, read_text
from engine.run.atomic_file import atomic_write_text
from tests.cli_helpers import invoke
from tests.run_helpers import train

LONG = "n" * (paths.NAME_MAX_BYTES + 1)
SPARSE_BYTES = 3 * 2**30


def one_line_exit_2(result, named: str) -> str:
    """Exit code 2, exactly one line on stderr naming `named`, no traceback; the line."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert len(lines) == 1, result.stderr
    assert named in lines[0] and lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.output and "internal error" not in result.output
    return lines[0]


def identity(path: Path) -> tuple:
    """What must not change about a special file the commands were pointed at."""
    s = os.stat(path)
    return stat.S_IFMT(s.st_mode), s.st_ino, s.st_rdev, s.st_dev


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    summary, _ = train(tmp_path_factory.mktemp("paths") / "runs")
    return Path(summary["run_dir"])


def specials(tmp: Path) -> dict[str, Path]:
    """A FIFO, a link to a character device, the device itself, and a folder."""
    os.mkfifo(tmp / "fifo")
    (tmp / "null-link").symlink_to("/dev/null")
    (tmp / "folder").mkdir()
    return {"fifo": tmp / "fifo", "null-link": tmp / "null-link", "/dev/null": Path("/dev/null"),
            "folder": tmp / "folder"}


def sparse(path: Path) -> Path:
    with open(path, "wb") as f:
        f.truncate(SPARSE_BYTES)  # a hole: no disk used, 3 GiB if read whole
    return path


# ----------------------------------------------------------------------------- outputs

OUTPUTS = {
    "export -o": lambda run, out: ["export", run, "-o", out],
    "project --out": lambda run, out: ["project", "--out", out],
    "project --calibration": lambda run, out: ["project", "--calibration", out],
    "screenshot -o": lambda run, out: ["screenshot", "-o", out],
}


@pytest.mark.parametrize("target", ["fifo", "null-link", "/dev/null", "folder"])
@pytest.mark.parametrize("command", OUTPUTS)
def test_an_output_that_is_not_a_regular_file_is_refused_and_left_as_it_was(command, target, run_dir,
                                                                            in_tmp):
    out = specials(in_tmp)[target]
    before = identity(out)
    result = invoke(*OUTPUTS[command](run_dir, out))
    line = one_line_exit_2(result, str(out))
    assert ("a folder" if target == "folder" else "not a regular file") in line
    assert identity(out) == before  # still the FIFO / the character device / the folder
    assert sorted(p.name for p in in_tmp.iterdir()) == ["fifo", "folder", "null-link"]  # no temp left


def test_export_still_replaces_a_regular_file(run_dir, in_tmp):
    (in_tmp / "m.npz").write_bytes(b"old")
    result = invoke("export", run_dir, "-o", in_tmp / "m.npz")
    assert result.exit_code == 0, result.output
    assert (in_tmp / "m.npz").read_bytes()[:2] == b"PK"  # an .npz is a zip archive


@pytest.mark.parametrize("target", ["fifo", "null-link"])
def test_every_atomic_write_refuses_a_special_file(target, in_tmp):
    """The last line of defence for writers with no check of their own (sweep export-best --force,
    presets save, calibration files): atomic_file itself."""
    out = specials(in_tmp)[target]
    before = identity(out)
    with pytest.raises(paths.PathError, match="not a regular file"):
        atomic_write_text(out, "text")
    assert identity(out) == before


# ----------------------------------------------------------------------------- inputs

def test_data_path_reads_only_max_chars_of_a_huge_file(in_tmp):
    big = sparse(in_tmp / "big.txt")
    tracemalloc.start()
    try:
        text = read_text(big, max_chars=20_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text == "\0" * 20_000
    assert peak < 16 * 2**20, peak  # read whole it would be 3 GiB of bytes, then more as text


def test_data_path_max_chars_spans_a_folder_as_before(in_tmp):
    (in_tmp / "corpus").mkdir()
    (in_tmp / "corpus" / "a.txt").write_text("abcdef")
    (in_tmp / "corpus" / "b.txt").write_text("ghijkl")
    assert read_text(in_tmp / "corpus", max_chars=9) == "abcdef\ngh"
    assert read_text(in_tmp / "corpus", max_chars=0) == "abcdef\nghijkl"


@pytest.mark.parametrize("target", ["fifo", "null-link", "/dev/zero"])
def test_data_path_refuses_what_is_not_a_regular_file(target, in_tmp):
    path = Path("/dev/zero") if target == "/dev/zero" else specials(in_tmp)[target]
    with pytest.raises(DataError, match=r"data.path: .*not a regular file"):
        read_text(path, max_chars=1000)


def test_a_fifo_in_a_corpus_folder_is_refused_not_waited_on(in_tmp):
    (in_tmp / "corpus").mkdir()
    os.mkfifo(in_tmp / "corpus" / "pipe.txt")
    with pytest.raises(DataError, match="pipe.txt: is a FIFO"):
        read_text(in_tmp / "corpus", max_chars=1000)


def test_training_on_a_fifo_ends_in_one_line_and_does_not_hang(in_tmp):
    """A subprocess with a deadline: before the check, open() on the FIFO waited for a writer forever."""
    os.mkfifo(in_tmp / "fifo")
    done = subprocess.run([sys.executable, "-m", "nanodist_tui.cli", "run", "--set", "data.kind=text",
                           "--set", f"data.path={in_tmp / 'fifo'}", "--set", "data.max_chars=1000"],
                          capture_output=True, text=True, timeout=120, cwd=in_tmp)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "data.path" in lines[0] and "is a FIFO" in lines[0], done.stderr


@pytest.mark.parametrize("args", [["run", "--preset", "{f}"], ["presets", "show", "{f}"],
                                  ["project", "--cluster", "{f}"]], ids=lambda a: " ".join(a[:2]))
def test_a_huge_toml_file_is_refused_unread(args, in_tmp):
    big = sparse(in_tmp / "big.toml")
    result = invoke(*[a.format(f=big) for a in args])
    line = one_line_exit_2(result, str(big))
    assert f"{SPARSE_BYTES} bytes" in line and str(paths.MAX_CONFIG_BYTES) in line


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_a_preset_that_is_not_a_regular_file_is_refused(target, in_tmp):
    if target == "fifo":
        os.mkfifo(in_tmp / "p.toml")
    path = in_tmp / "p.toml" if target == "fifo" else Path("/dev/zero")
    one_line_exit_2(invoke("presets", "show", path), "not a regular file")


def test_a_user_config_that_is_a_fifo_is_refused(in_tmp, monkeypatch):
    from nanodist_tui.user_config import UserConfigError, load_user_config
    os.mkfifo(in_tmp / "config.toml")
    with pytest.raises(UserConfigError, match="is a FIFO"):
        load_user_config([], environ={"NANODIST_CONFIG": str(in_tmp / "config.toml")})


# ----------------------------------------------------------------------------- names too long

# each of these was an internal error (OSError ENAMETOOLONG, exit 1) before engine.paths
TOO_LONG = {
    "run --preset name": ["run", "--preset", LONG],
    "run --preset path": ["run", "--preset", "{tmp}/" + LONG + ".toml"],
    "run data.path": ["run", "--set", "data.kind=text", "--set", "data.path={tmp}/" + LONG],
    "memory --preset": ["memory", "--preset", LONG],
    "bench step --preset": ["bench", "step", "--preset", LONG],
    "resume": ["resume", "{tmp}/" + LONG, "--no-ui"],
    "export run": ["export", "{tmp}/" + LONG],
    "export -o": ["export", "{run}", "-o", "{tmp}/" + LONG + ".npz"],
    "sample": ["sample", "{tmp}/" + LONG],
    "serve": ["serve", "{tmp}/" + LONG],
    "replay": ["replay", "{tmp}/" + LONG, "--no-ui"],
    "compare": ["compare", "{tmp}/" + LONG, "{run}"],
    "runs --out-dir": ["runs", "--out-dir", "{tmp}/" + LONG],
    "project --cluster name": ["project", "--cluster", LONG],
    "project --cluster path": ["project", "--cluster", "{tmp}/" + LONG + ".toml"],
    "project --out": ["project", "--out", "{tmp}/" + LONG + ".json"],
    "screenshot -o": ["screenshot", "-o", "{tmp}/" + LONG + ".svg"],
    "presets show name": ["presets", "show", LONG],
    "presets show path": ["presets", "show", "{tmp}/" + LONG + ".toml"],
    "presets diff": ["presets", "diff", LONG, "quickstart"],
}


@pytest.mark.parametrize("case", TOO_LONG)
def test_a_name_too_long_is_one_line_naming_the_path_and_the_limit(case, run_dir, in_tmp):
    if case == "serve":  # without its extra, serve says so first (one line too, but about the extra)
        needs("fastapi", "serve", "serve checks its run folder once its server can start")
    args = [a.format(tmp=in_tmp, run=run_dir) for a in TOO_LONG[case]]
    line = one_line_exit_2(invoke(*args), LONG)
    assert str(paths.NAME_MAX_BYTES) in line, line


def test_the_name_limit_counts_bytes_not_characters():
    paths.check_name("é" * (paths.NAME_MAX_BYTES // 2))  # 254 bytes
    with pytest.raises(paths.PathError, match="256 bytes"):
        paths.check_name("é" * 128)
