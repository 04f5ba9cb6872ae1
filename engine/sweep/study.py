"""A sweep's folder and its study: where it lives, what it records, and the study created or loaded.

`prepare_sweep` makes the folder and records what a rerun, a --jobs process, `sweep show` and
`sweep export-best` need: sweep.json (the study's name and storage) and preset.toml (the preset as swept,
overrides applied). `open_study` creates the study or loads it to resume, with the preset's sampler and
pruner, and refuses a stored study that scores other metrics.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna
import tomlkit
from optuna.study import StudyDirection

from engine.config import Config, presets
from engine.config.vocabulary import directions_of, metrics_of
from engine.sweep.algorithms import make_pruner, make_sampler
from engine.sweep.errors import SweepError
from engine.sweep.storage import RECORD, StorageSpec, choose_storage, read_record, write_record
from engine.sweep.storage_errors import storage_errors

PRESET_COPY = "preset.toml"


@dataclass(frozen=True)
class Sweep:
    cfg: Config  # the swept preset, validated (cfg.sweep is set)
    doc: tomlkit.TOMLDocument  # its document: trials and export-best write their values into copies
    sweep_dir: Path
    study_name: str
    storage: StorageSpec

    @property
    def metrics(self) -> list[str]:
        assert self.cfg.sweep is not None
        return list(metrics_of(self.cfg.sweep))

    @property
    def directions(self) -> list[str]:
        assert self.cfg.sweep is not None
        return list(directions_of(self.cfg.sweep))


def sweep_dir_of(cfg: Config) -> Path:
    assert cfg.sweep is not None
    return Path(cfg.run.out_dir) / f"sweep-{cfg.sweep.study or cfg.name}"


def prepare_sweep(cfg: Config, doc: tomlkit.TOMLDocument, storage: str | None = None, jobs: int = 1) -> Sweep:
    """The sweep of a preset with a [sweep] section: its folder made, its storage chosen, its study
    created (or found: a rerun resumes it), its record written. SweepError when the storage asked for
    cannot serve it or holds a study of other metrics."""
    if cfg.sweep is None:
        raise SweepError(f"preset {cfg.name} has no [sweep] section: add one with a [sweep.space] (see "
                           "presets/sweep-lr.toml), or train it with `nanodist-tui run`")
    swept = cfg.sweep.space.get("parallel.backend")
    if outside := sorted({cfg.parallel.backend, *(swept.choices or () if swept else ())} & {"tcp", "mpi"}):
        raise SweepError(f"preset {cfg.name}: a sweep starts its trials' ranks itself, which the "
                         f"{' and '.join(outside)} backend leaves to you; use parallel.backend = "
                         '"threads" or "processes"')
    sweep_dir = sweep_dir_of(cfg)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    spec = choose_storage(sweep_dir, storage, jobs)
    sweep = Sweep(cfg, doc, sweep_dir, cfg.sweep.study or cfg.name, spec)
    open_study(sweep)  # created, or found and checked against the preset, before anything runs
    write_record(sweep_dir, sweep.study_name, spec, sweep.metrics, sweep.directions)
    presets.save_preset(doc, sweep_dir / PRESET_COPY)
    return sweep


def load_sweep(sweep_dir: str | Path) -> Sweep:
    """A sweep from its folder (sweep.json and preset.toml): for --jobs processes, show and export-best."""
    sweep_dir = Path(sweep_dir)
    record = read_record(sweep_dir)
    cfg, doc, _ = presets.load_preset(sweep_dir / PRESET_COPY)
    spec = StorageSpec(record["storage"]["kind"], record["storage"]["where"])
    return Sweep(cfg, doc, sweep_dir, record["study"], spec)


def quiet_optuna() -> None:
    """Optuna's own log lines and warnings would write over the workbench and repeat what our events say."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.logging.disable_default_handler()
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def open_study(sweep: Sweep, job: int = 0) -> optuna.Study:
    """The sweep's study, created or loaded, with its sampler (seeded for what the study holds and for
    `job`: engine.sweep.algorithms) and pruner; SweepError when the stored study scores other metrics
    than the preset, or when its storage cannot serve it (damaged, locked, read-only)."""
    quiet_optuna()
    with storage_errors(sweep.storage, sweep.sweep_dir):  # a damaged, locked or read-only study.db: one line
        return _open_study(sweep, job)


def _open_study(sweep: Sweep, job: int) -> optuna.Study:
    study = optuna.create_study(storage=sweep.storage.open(sweep.sweep_dir), study_name=sweep.study_name,
                                directions=[StudyDirection[d.upper()] for d in sweep.directions],
                                pruner=make_pruner(sweep.cfg), load_if_exists=True)
    study.sampler = make_sampler(sweep.cfg, len(study.get_trials(deepcopy=False)), job)
    stored = study.user_attrs.get("metrics")
    if stored is None:
        study.set_user_attr("metrics", sweep.metrics)
    directions = [d.name.lower() for d in study.directions]
    if (stored is not None and stored != sweep.metrics) or directions != sweep.directions:
        raise SweepError(f"{sweep.sweep_dir}: study {sweep.study_name} scores {stored or sweep.metrics} "
                           f"({', '.join(directions)}), the preset asks for {sweep.metrics} "
                           f"({', '.join(sweep.directions)}); give this sweep another name (--study NAME)")
    return study


def find_sweep_dir(name_or_dir: str | Path, out_dir: str | Path = "runs") -> Path:
    """A sweep folder given as a path, or by study name (<out_dir>/sweep-<name>); SweepError if none."""
    path = Path(name_or_dir)
    if (path / RECORD).is_file():
        return path
    named = Path(out_dir) / f"sweep-{name_or_dir}"
    if (named / RECORD).is_file():
        return named
    found = sorted(p.name.removeprefix("sweep-") for p in Path(out_dir).glob("sweep-*")
                   if (p / RECORD).is_file())
    known = f"sweeps in {out_dir}: {', '.join(found)}" if found else f"no sweeps in {out_dir} yet"
    raise SweepError(f"{name_or_dir}: no sweep folder or study of this name ({known}); pass a sweep "
                     "folder, or --out-dir where the sweeps are")


def load_study(sweep: Sweep) -> optuna.Study:
    """The stored study of a sweep, to read (show, export-best); SweepError when the storage has none, or
    cannot serve it (damaged, locked, read-only). Its trials are read once here, so that a file damaged
    past its first page fails here, in one line, rather than in whatever reads them next."""
    quiet_optuna()
    with storage_errors(sweep.storage, sweep.sweep_dir):
        try:
            storage = sweep.storage.open(sweep.sweep_dir)
            study = optuna.load_study(study_name=sweep.study_name, storage=storage)
        except KeyError:
            raise SweepError(f"{sweep.storage.describe(sweep.sweep_dir)}: no study named {sweep.study_name} "
                             "(the sweep has not started a trial yet?)") from None
        study.get_trials(deepcopy=False)
    return study
