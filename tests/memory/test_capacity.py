"""Will it fit: the estimator's peak per rank times the ranks on this machine, plus their synthetic data,
against the memory available; refused with one line naming run.check_memory, which turns it off."""
from __future__ import annotations

import pytest

from engine.config import ConfigError, replace
from engine.config.presets import load_preset
from engine.memory.capacity import available_memory, check_data_fits, check_fits, data_bytes, local_ranks
from engine.memory.estimator import estimate


@pytest.fixture
def ddp4():
    return load_preset("ddp-4")[0]


def need_of(cfg) -> int:
    """What four ranks of the preset take at their peak, read from the estimator."""
    return sum(estimate(cfg).peak()[1].values()) * cfg.parallel.world_size + data_bytes(cfg) * 4


def test_a_run_that_fits_starts_and_one_that_does_not_is_one_line(ddp4):
    need = need_of(ddp4)
    check_fits(ddp4, available=need)  # exactly enough
    with pytest.raises(ConfigError) as err:
        check_fits(ddp4, available=need - 1)
    text = str(err.value)
    assert "\n" not in text and "run.check_memory" in text and "4 ranks" in text
    assert "--set run.check_memory=false" in text
    check_fits(replace(ddp4, "run.check_memory", False), available=1)  # the override


def test_every_rank_of_this_machine_counts(ddp4):
    assert local_ranks(ddp4) == 4
    assert local_ranks(replace(ddp4, "parallel.backend", "tcp")) == 1
    two_per_node = replace(replace(ddp4, "parallel.backend", "tcp"), "parallel.ranks_per_node", 2)
    assert local_ranks(two_per_node) == 2


def test_synthetic_data_is_checked_before_it_is_built():
    cfg = load_preset("mlp", ["data.n_samples=1000000000"])[0]
    with pytest.raises(ConfigError, match="data.n_samples"):
        check_data_fits(cfg, available=10**9)
    check_data_fits(load_preset("mlp")[0], available=10**9)


def test_this_machine_reports_its_memory():
    available = available_memory()
    assert available is None or 10**6 < available < 10**15
