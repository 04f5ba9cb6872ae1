"""A sweep's study.db that cannot serve it — random bytes, a real study cut in half, a folder in its place,
read-only, locked by another connection — is one line in plain words with exit code 2, through the real
command line, both for running the sweep (it writes) and for `sweep show` (it reads). Never the storage
library's jargon, never an "internal error"."""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution

from tests.cli_helpers import assert_user_error, invoke
from tests.sweep_helpers import SPACE, sweep_of, write_preset

REPO = Path(__file__).resolve().parents[2]
JARGON = ("sqlalchemy", "sqlite3.", "sqlalche.me", "StorageInternalError", "[SQL:", "internal error")


@pytest.fixture
def study_db(in_tmp) -> Path:
    """A real sweep folder (sweep.json, preset.toml) whose study.db holds 40 finished trials."""
    sweep = sweep_of(write_preset(in_tmp, SPACE))
    study = optuna.load_study(study_name=sweep.study_name, storage=sweep.storage.open(sweep.sweep_dir))
    dists = {"optim.lr": FloatDistribution(1e-3, 3e-2, log=True), "optim.warmup_steps": IntDistribution(0, 4)}
    for n in range(40):
        params = {"optim.lr": 1e-3 + n * 1e-4, "optim.warmup_steps": 1}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=3.0 - n / 100))
    path = sweep.storage.path(sweep.sweep_dir)
    assert path == Path("runs/sweep-cli/study.db") and path.stat().st_size > 64 * 1024
    return path


def run_sweep(in_tmp: Path):
    return invoke("sweep", "--no-ui", "--preset", in_tmp / "tiny.toml", "--trials", "41")


def show():
    return invoke("sweep", "show", "cli")


def plain_user_error(result, *named: str) -> str:
    assert_user_error(result, named[0])
    line = result.output.strip()
    for part in named:
        assert part in line, line
    assert not any(word in line for word in JARGON), line
    return line


def test_the_undamaged_study_shows_its_trials(study_db):
    result = show()
    assert result.exit_code == 0, result.output
    assert sum(line.split()[1:2] == ["complete"] for line in result.output.splitlines()) == 40, result.output


def test_random_bytes_are_not_a_sqlite_database(in_tmp, study_db):
    study_db.write_bytes(os.urandom(study_db.stat().st_size))
    for result in (run_sweep(in_tmp), show()):
        plain_user_error(result, f"{study_db} is not a SQLite database", "move it away", "--study NAME")


def test_a_study_cut_in_half_is_damaged(in_tmp, study_db):
    data = study_db.read_bytes()
    study_db.write_bytes(data[:len(data) // 2])
    for result in (run_sweep(in_tmp), show()):
        plain_user_error(result, f"{study_db} is damaged", "cut short or corrupt", "move it away")


def test_a_folder_in_place_of_the_study(in_tmp, study_db):
    study_db.unlink()
    study_db.mkdir()
    for result in (run_sweep(in_tmp), show()):
        plain_user_error(result, f"{study_db} is a folder", "move it away")


def test_a_study_locked_by_another_connection_says_so(in_tmp, study_db):
    holder = sqlite3.connect(study_db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # what a second sweep of the same study holds while it writes
    try:
        # sqlite waits (5 s) for the lock before it gives up; then the line says who holds it and what to do
        plain_user_error(run_sweep(in_tmp), f"{study_db} is locked by another process", "wait for it")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert show().exit_code == 0  # the lock gone, the same study reads again: nothing was damaged


def _permission_bits_bind(folder: Path) -> bool:
    """Whether this user is refused a write to a 0o444 file (root is not: then chmod proves nothing)."""
    probe = folder / "probe"
    probe.write_text("")
    probe.chmod(0o444)
    try:
        with open(probe, "a"):
            return False
    except PermissionError:
        return True
    finally:
        probe.unlink()


@pytest.mark.parametrize("made_read_only", ["file", "folder"])
def test_a_read_only_study_cannot_take_the_sweep(in_tmp, study_db, made_read_only):
    if not _permission_bits_bind(in_tmp):
        _read_only_mount(in_tmp, study_db if made_read_only == "file" else study_db.parent)
        return
    target = study_db if made_read_only == "file" else study_db.parent
    target.chmod(0o444 if made_read_only == "file" else 0o555)
    try:
        plain_user_error(run_sweep(in_tmp), f"{study_db} cannot be written", "make the file and its folder "
                         "writable")
        assert show().exit_code == 0  # reading a read-only study needs no write: `sweep show` still works
    finally:
        target.chmod(0o644 if made_read_only == "file" else 0o755)


def _read_only_mount(in_tmp: Path, target: Path) -> None:
    """As root, permission bits do not bind: the file or the folder is made a read-only mount instead (in a
    private mount namespace, so nothing outside the command sees it), which refuses root's writes too."""
    unshare = shutil.which("unshare")
    target = target.resolve()
    mount = f"mount --bind {target} {target} && mount -o remount,bind,ro {target}"
    probe = subprocess.run([unshare, "-m", "sh", "-c", f"{mount} && ! test -w {target}"],
                           capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("running as root (permission bits do not bind) on a system that allows no private "
                    "read-only mount (unshare -m): no real read-only study.db can be made here")
    command = [sys.executable, "-m", "nanodist_tui.cli", "sweep", "--no-ui", "--preset",
               str(in_tmp / "tiny.toml"), "--trials", "41"]
    show = [sys.executable, "-m", "nanodist_tui.cli", "sweep", "show", "cli"]
    # reading a read-only study needs no write: `sweep show` still works (else exit 99, which fails below)
    script = (f"{mount} && {{ {' '.join(show)} >/dev/null || exit 99; }} && exec "
              + " ".join(f"'{a}'" for a in command))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([unshare, "-m", "sh", "-c", script], cwd=in_tmp, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"error: {Path('runs/sweep-cli/study.db')} cannot be written"), lines[0]
    assert not any(word in lines[0] for word in JARGON), lines[0]
