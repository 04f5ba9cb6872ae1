"""algorithm = "auto": the crossover table (fit, lookup, the tuning file), rank agreement, and the
calibrating bench command that writes what a run then reads."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from engine.comm import auto
from engine.comm.launch import run_ranks
from engine.config import from_dict
from engine.parallel.data.topology import Topology, tables
from nanodist_tui.cli import app

INF = math.inf
runner = CliRunner()


def test_fit_takes_the_fastest_and_switches_between_sizes():
    times = {1024: {"tree": 1.0, "rhd": 2.0, "ring": 3.0},
             4096: {"tree": 1.0, "rhd": 1.5, "ring": 3.0},
             16384: {"tree": 3.0, "rhd": 1.0, "ring": 1.2},
             65536: {"tree": 9.0, "rhd": 2.0, "ring": 1.0}}
    table = auto.fit(times)
    assert table.rules == ((math.sqrt(4096 * 16384), "tree"), (math.sqrt(16384 * 65536), "rhd"),
                           (INF, "ring"))
    assert [table.choose(n) for n in (0, 8191, 8192, 32767, 32768, 10**9)] == \
        ["tree", "tree", "rhd", "rhd", "ring", "ring"]
    assert table.source == "measured"


def test_fit_keeps_a_winner_that_is_within_the_tolerance():
    times = {1: {"ring": 1.00, "rhd": 1.10}, 2: {"ring": 1.03, "rhd": 1.00}, 3: {"ring": 1.20, "rhd": 1.00}}
    assert auto.fit(times).rules == ((math.sqrt(6), "ring"), (INF, "rhd"))  # 3% is noise, 20% is not
    assert auto.fit(times, tolerance=0.0).rules == ((math.sqrt(2), "ring"), (INF, "rhd"))


@pytest.mark.parametrize("rules", [(), ((10.0, "ring"),), ((INF, "ring"), (10.0, "tree")),
                                   ((INF, "carrier-pigeon"),), tuple((float(i), "ring") for i in range(16))
                                   + ((INF, "ring"),)])
def test_crossovers_refuse_tables_that_do_not_cover_every_size(rules):
    with pytest.raises(ValueError):
        auto.Crossovers(rules)


def test_crossovers_travel_as_a_fixed_size_array():
    table = auto.Crossovers(((4096.0, "tree"), (1 << 20, "rhd"), (INF, "hierarchical")), "measured")
    arr = table.to_array()
    assert arr.shape == (2 * auto.MAX_RULES,) and arr.dtype == np.float64
    assert auto.Crossovers.from_array(arr).rules == table.rules


def test_tuning_file_round_trip_and_defaults(tmp_path):
    path = tmp_path / "sub" / "tuning.json"
    assert auto.lookup(path, "processes/n4/g2/real", 4, True) == auto.default(4, True)  # no file yet
    table = auto.Crossovers(((100.0, "tree"), (INF, "hierarchical")), "measured")
    auto.save(path, "processes/n4/g2/real", table, {64: {"tree": 1.0}, 256: {"hierarchical": 1.0}})
    ring = auto.Crossovers(((INF, "ring"),), "measured")
    auto.save(path, "threads/n2/g0/real", ring, {64: {"ring": 1.0}})
    doc = json.loads(path.read_text())
    assert doc["format"] == auto.FORMAT
    assert set(doc["entries"]) == {"processes/n4/g2/real", "threads/n2/g0/real"}
    assert auto.lookup(path, "processes/n4/g2/real", 4, True) == table
    assert auto.lookup(path, "processes/n8/g2/real", 8, True) == auto.default(8, True)  # another key
    for world in range(1, 9):  # one level: never the two-level algorithm; rhd only on powers of two
        rules = [a for _, a in auto.default(world, False).rules]
        assert "hierarchical" not in rules and ("rhd" in rules) == (world & (world - 1) == 0)
    assert [p.name for p in path.parent.iterdir()] == ["tuning.json"]  # written atomically: no leftovers


@pytest.mark.parametrize("content, named", [
    ("{not json", "not a readable tuning file"),
    ('{"format": "something-else", "entries": {}}', "not a nanoDist tuning file"),
    ('{"format": "nanodist-allreduce-tuning", "entries": {"k": {"rules": [[null, "warp"]]}}}', "malformed"),
    ('{"format": "nanodist-allreduce-tuning", "entries": {"k": {"rules": [[null, "hierarchical"]]}}}',
     "on one node"),
])
def test_unusable_tuning_files_are_one_line_errors(tmp_path, content, named):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(auto.TuningError) as err:
        auto.lookup(path, "k", 4, False)
    assert named in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def _agreed(comm, emit, cfg_dict, paths):
    """Each rank points at its own tuning file: the job must still use rank 0's."""
    cfg = from_dict(dict(cfg_dict, parallel=dict(cfg_dict["parallel"], tuning_file=paths[comm.rank])))
    topology = Topology(cfg, comm)
    return [list(topology.crossovers.rules), list(topology.cross_crossovers.rules)]


def test_every_rank_uses_rank_0s_crossovers(tmp_path):
    parallel = {"world_size": 4, "ranks_per_node": 2, "zero_stage": 2, "hybrid": True, "algorithm": "auto"}
    cfg = from_dict({"parallel": parallel})
    paths = [str(tmp_path / f"rank{r}.json") for r in range(4)]
    world = auto.Crossovers(((512.0, "tree"), (INF, "hierarchical")), "measured")
    across = auto.Crossovers(((INF, "rhd"),), "measured")
    auto.save(tmp_path / "rank0.json", auto.key("threads", 4, 2), world, {})
    auto.save(tmp_path / "rank0.json", auto.key("threads", 2, 1), across, {})
    assert tables(from_dict({"parallel": dict(parallel, tuning_file=paths[0])})) == (world, across)
    from engine.config import to_dict
    results = run_ranks(4, "threads", _agreed, args=(to_dict(cfg), paths))
    assert results == [[list(world.rules), list(across.rules)]] * 4


def test_calibrate_writes_what_auto_then_reads(tmp_path):
    path = tmp_path / "tuning.json"
    result = runner.invoke(app, ["bench", "allreduce", "-b", "threads", "-n", "4", "--ranks-per-node", "2",
                                 "--calibrate", "--sizes", "1KiB,64KiB", "--iters", "2", "--warmup", "0",
                                 "--tuning-file", str(path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["key"] == "threads/n4/g2/real" and out["path"] == str(path)
    rows = out["rows"]
    assert {(r["size"], r["algorithm"]) for r in rows} == {(s, a) for s in (1024, 65536)
                                                           for a in ("ring", "rhd", "tree", "hierarchical")}
    assert all(r["correct"] for r in rows)
    for size in (1024, 65536):  # the saved rule names the fastest measured at each size (or one within 5%)
        at = {r["algorithm"]: r["time_s"] for r in rows if r["size"] == size}
        table = auto.lookup(path, out["key"], 4, True)
        assert at[table.choose(size)] <= 1.05 * min(at.values())
    compared = json.loads(runner.invoke(app, [
        "bench", "allreduce", "-b", "threads", "-n", "4", "--ranks-per-node", "2", "--algorithm", "all",
        "--sizes", "1KiB,64KiB", "--iters", "2", "--warmup", "0", "--tuning-file", str(path),
        "--json"]).stdout)
    assert compared["crossovers"] == out["crossovers"]
    auto_rows = [r for r in compared["ours"] if r["algorithm"] == "auto"]
    assert [r["chosen"] for r in auto_rows] == [table.choose(1024), table.choose(65536)]
    assert [r["algorithm"] for r in compared["ours"][:5]] == ["ring", "rhd", "tree", "hierarchical", "auto"]


@pytest.mark.parametrize("args, named", [
    (["--algorithm", "halving"], "--algorithm"),
    (["--algorithm", "hierarchical"], "--ranks-per-node"),
    (["--algorithm", "mpi-native"], "--backend mpi"),
    (["--ranks-per-node", "3"], "--ranks-per-node 3"),
])
def test_bench_allreduce_bad_algorithm_options_are_one_line(args, named):
    result = runner.invoke(app, ["bench", "allreduce", "-b", "threads", "-n", "4", "--sizes", "1KiB", *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and named in lines[0], result.output


def test_a_run_with_a_broken_tuning_file_is_refused_before_it_starts(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{")
    result = runner.invoke(app, ["run", "--preset", "ddp-2", "--set", "parallel.algorithm=auto",
                                 "--set", f"parallel.tuning_file={bad}", "--set", "train.steps=1",
                                 "--set", f"run.out_dir={tmp_path / 'runs'}"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and str(bad) in lines[0], result.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
