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

from engine import presets
from engine.config import Config
from engine.sweep.algorithms import make_pruner, make_sampler
from engine.sweep.settings import directions_of, metrics_of
from engine.sweep.storage import SweepError, StorageSpec, choose_storage, read_record, write_record

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
    """The sweep of a preset with a [sweep] section: its folder made, its storage chosen, its record
    written. SweepError when the storage asked for cannot serve it."""
    if cfg.sweep is None:
        raise SweepError(f"preset {cfg.name} has no [sweep] section: add one with a [sweep.space] (see "
                           "presets/sweep-lr.toml), or train it with `nanodist-tui run`")
    sweep_dir = sweep_dir_of(cfg)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    spec = choose_storage(sweep_dir, storage, jobs)
    sweep = Sweep(cfg, doc, sweep_dir, cfg.sweep.study or cfg.name, spec)
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


def open_study(sweep: Sweep) -> optuna.Study:
    """The sweep's study, created or loaded, with its sampler and pruner; SweepError when the stored
    study scores other metrics than the preset."""
    quiet_optuna()
    study = optuna.create_study(storage=sweep.storage.open(sweep.sweep_dir), study_name=sweep.study_name,
                                directions=sweep.directions, sampler=make_sampler(sweep.cfg),
                                pruner=make_pruner(sweep.cfg), load_if_exists=True)
    stored = study.user_attrs.get("metrics")
    if stored is None:
        study.set_user_attr("metrics", sweep.metrics)
    directions = [d.name.lower() for d in study.directions]
    if (stored is not None and stored != sweep.metrics) or directions != sweep.directions:
        raise SweepError(f"{sweep.sweep_dir}: study {sweep.study_name} scores {stored or sweep.metrics} "
                           f"({', '.join(directions)}), the preset asks for {sweep.metrics} "
                           f"({', '.join(sweep.directions)}); give this sweep another name (--study NAME)")
    return study
