"""Will it fit: the estimator's peak per rank times the ranks on this machine, plus their synthetic data,
plus what each rank costs before it holds a byte (a rank process's interpreter, a rank thread's stack),
against the memory available; refused with one line naming run.check_memory, which turns it off."""
from __future__ import annotations

import time

import pytest
from cli_helpers import assert_user_error, invoke

from engine.comm import child
from engine.config import ConfigError, replace
from engine.config.presets import load_preset
from engine.memory.capacity import (
    RANK_PROCESS_BYTES,
    RANK_THREAD_BYTES,
    SHARED_CODE_BYTES,
    available_memory,
    check_data_fits,
    check_fits,
    data_bytes,
    local_ranks,
)
from engine.memory.estimator import estimate


@pytest.fixture
def ddp4():
    return load_preset("ddp-4")[0]


def need_of(cfg) -> int:
    """What four rank threads of the preset take at their peak: the estimator's peak, data and stacks."""
    return (sum(estimate(cfg).peak()[1].values()) + data_bytes(cfg) + RANK_THREAD_BYTES) * 4


def test_a_run_that_fits_starts_and_one_that_does_not_is_one_line(ddp4):
    need = need_of(ddp4)
    check_fits(ddp4, available=need)  # exactly enough
    with pytest.raises(ConfigError) as err:
        check_fits(ddp4, available=need - 1)
    text = str(err.value)
    assert "\n" not in text and "run.check_memory" in text and "4 rank threads" in text
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


def quickstart(ranks: int, backend: str):
    return load_preset("quickstart", [f"parallel.world_size={ranks}", f"parallel.backend={backend}",
                                      f"train.global_batch={ranks}"])[0]


@pytest.mark.parametrize("available_gb", [16, 64])
def test_rank_processes_count_an_interpreter_each(available_gb):
    """1024 rank processes: their interpreters alone (90 MB each, measured; see capacity.py) exceed 16 or
    64 GB, however small the model; the line names the count, the cost per rank and the way out. As
    threads the same ranks share the launcher's interpreter and fit."""
    available = available_gb * 10**9
    assert available < RANK_PROCESS_BYTES * 1024
    with pytest.raises(ConfigError) as err:
        check_fits(quickstart(1024, "processes"), available=available)
    text = str(err.value)
    assert "\n" not in text
    assert "1024 rank processes would need" in text and "90 MB interpreter each" in text
    assert f"this machine has {available_gb} GB available" in text
    assert "fewer ranks (-n), or the threads backend" in text
    check_fits(quickstart(1024, "threads"), available=available)


def test_the_fixed_cost_is_counted_once_per_rank_and_the_code_once():
    """The need, by hand: each rank process's interpreter and estimated peak, plus the shared code pages once;
    one byte less than that is refused."""
    cfg = quickstart(8, "processes")
    peak = sum(estimate(cfg, 65).peak()[1].values())  # 65: the stdlib corpus's characters
    need = 8 * (RANK_PROCESS_BYTES + peak) + SHARED_CODE_BYTES
    check_fits(cfg, 65, available=need)
    with pytest.raises(ConfigError, match="8 rank processes"):
        check_fits(cfg, 65, available=need - 1)
    threads = replace(cfg, "parallel.backend", "threads")
    check_fits(threads, 65, available=8 * (RANK_THREAD_BYTES + peak))
    with pytest.raises(ConfigError, match="8 rank threads"):
        check_fits(threads, 65, available=8 * (RANK_THREAD_BYTES + peak) - 1)
    tcp = replace(cfg, "parallel.backend", "tcp")  # started by its own launcher: interpreters already loaded
    check_fits(tcp, 65, available=local_ranks(tcp) * peak)


def test_too_many_rank_processes_are_refused_before_any_starts(monkeypatch):
    """The command line, on this machine's real memory: enough rank processes that their interpreters alone
    exceed what is available (1024 here, more on a bigger machine) exit 2 in one line, fast, and no rank
    process is ever spawned."""
    ranks = 1024
    while RANK_PROCESS_BYTES * ranks <= (available_memory() or 0):
        ranks *= 2
    spawned = []
    monkeypatch.setattr(child.ChildProcess, "__init__", lambda self, *a, **k: spawned.append(a))
    start = time.monotonic()
    result = invoke("--no-ui", "--preset", "quickstart", "-n", ranks, "-b", "processes",
                    "--set", f"train.global_batch={ranks}")
    assert_user_error(result, f"{ranks} rank processes would need")
    assert "interpreter each" in result.output and spawned == []
    assert time.monotonic() - start < 30
