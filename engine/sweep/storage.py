"""Where a study lives, and the sweep folder's own record of it (sweep.json).

By default the study is an SQLite database in the sweep's folder (study.db), which optuna-dashboard
opens as it is. SQLite suits one process writing at a time, so `--jobs J` > 1 uses a journal file there
instead (journal.log: appends under a file lock, safe for many processes). Any Optuna storage URL (a
server database shared by many hosts) or a journal file path may be named instead. A folder keeps the
storage it started with: a rerun finds it in sweep.json and resumes the same study.

Interrupted trials: a process killed mid-trial (SIGKILL, a power cut) leaves its trial RUNNING in the
storage for ever. Each trial records the host and process that runs it (the pid, and the process's start
time, since a container soon hands the same pid to a new process); `fail_orphans` marks as failed the
RUNNING trials whose process on this host is gone, so a rerun neither counts nor waits for them.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from engine.run.atomic_file import atomic_write_text
from engine.sweep.errors import SweepError

RECORD = "sweep.json"
SQLITE_FILE = "study.db"
JOURNAL_FILE = "journal.log"


@dataclass(frozen=True)
class StorageSpec:
    kind: str  # "sqlite" | "journal" | "url"
    where: str  # a file name inside the sweep folder, a journal path, or a URL

    def describe(self, sweep_dir: Path) -> str:
        """How a user names it (optuna-dashboard takes this)."""
        if self.kind == "url":
            return self.where
        path = self.path(sweep_dir)
        return f"sqlite:///{path}" if self.kind == "sqlite" else str(path)

    def path(self, sweep_dir: Path) -> Path:
        return sweep_dir / self.where if not Path(self.where).is_absolute() else Path(self.where)

    def open(self, sweep_dir: Path) -> BaseStorage:
        if self.kind == "url":
            return RDBStorage(self.where)
        if self.kind == "sqlite":
            return RDBStorage(f"sqlite:///{self.path(sweep_dir)}")
        return JournalStorage(JournalFileBackend(str(self.path(sweep_dir))))


def choose_storage(sweep_dir: Path, url: str | None, jobs: int) -> StorageSpec:
    """The storage of a sweep run: the one sweep.json names, else `url`, else the default for `jobs`."""
    recorded = read_record(sweep_dir).get("storage") if (sweep_dir / RECORD).is_file() else None
    asked = _spec_from_user(url) if url else None
    if recorded is not None:
        spec = StorageSpec(recorded["kind"], recorded["where"])
        if asked is not None and asked != spec:
            raise SweepError(f"{sweep_dir / RECORD}: this sweep's study lives in "
                               f"{spec.describe(sweep_dir)}, not {url}; drop --storage to resume it, or give "
                               "the sweep another study name (--study NAME)")
    elif asked is not None:
        spec = asked
    else:
        spec = StorageSpec("journal", JOURNAL_FILE) if jobs > 1 else StorageSpec("sqlite", SQLITE_FILE)
    if spec.kind == "sqlite" and jobs > 1:
        raise SweepError(f"{spec.path(sweep_dir)}: an SQLite file is not safe for --jobs {jobs} processes "
                           "writing at once; run this sweep with --jobs 1, or start a new one (--study NAME) "
                           "with --jobs")
    return spec


def _spec_from_user(url: str) -> StorageSpec:
    if "://" in url:
        return StorageSpec("url", url)
    return StorageSpec("journal", str(Path(url).expanduser().resolve()))


def read_record(sweep_dir: Path) -> dict[str, Any]:
    path = Path(sweep_dir) / RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SweepError(f"{sweep_dir}: not a sweep folder (no {RECORD}); `nanodist-tui sweep --preset P` "
                           "makes one") from None
    except (OSError, ValueError) as exc:
        raise SweepError(f"{path}: unreadable ({exc}); it names the sweep's study and storage") from None
    if not isinstance(record, dict) or not {"study", "storage"} <= record.keys():
        raise SweepError(f"{path}: missing the study or storage entry")
    return record


def write_record(sweep_dir: Path, study: str, spec: StorageSpec, metrics: list, directions: list) -> None:
    record = {"study": study, "storage": {"kind": spec.kind, "where": spec.where}, "metrics": metrics,
              "directions": directions}
    atomic_write_text(Path(sweep_dir) / RECORD, json.dumps(record, indent=2) + "\n")


def claim(trial: optuna.Trial) -> None:
    """Record which process runs the trial, so that a later run can tell an orphan from a live trial."""
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr("process_start", _process_start(os.getpid()))


def fail_orphans(study: optuna.Study) -> list[int]:
    """Mark RUNNING trials whose process on this host is gone as failed; their numbers."""
    host, orphans = socket.gethostname(), []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = t.user_attrs.get("pid")
        if t.user_attrs.get("host") != host or not isinstance(pid, int) or _alive(pid, t.user_attrs):
            continue
        storage = study._storage  # the public Study API cannot end another process's trial
        storage.set_trial_user_attr(t._trial_id, "outcome", "failed")
        storage.set_trial_user_attr(t._trial_id, "reason", "interrupted: its sweep process ended before "
                                    "the trial finished")
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        orphans.append(t.number)
    return orphans


def _alive(pid: int, attrs: dict) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process holds the pid now, or ours under another user: alive
    started = attrs.get("process_start")
    return started is None or _process_start(pid) in (None, started)


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux /proc), or None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])  # field 22; the name before ")" may hold spaces
