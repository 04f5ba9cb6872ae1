"""Network emulation on the socket transport: the link shapes and the pacer's arithmetic against Hockney's
α + n/B written out by hand, the latency and bandwidth emulated links really deliver (measured by `bench
allreduce` on the processes backend), virtual nodes, the config's one-line errors, and the run record that
marks an emulated run."""

from __future__ import annotations

import json

import pytest
from comm_helpers import slow_sendrecv
from run_helpers import train
from typer.testing import CliRunner

from engine.bench.allreduce import bench_allreduce
from engine.comm.emulation import EMULATION_KEYS, LinkShape, NetworkEmulation, Pacer
from engine.comm.launch import run_ranks
from engine.config import ConfigError, EmulateConfig, from_dict, network_emulation
from nanodist_tui.cli import app


def test_config_section_and_emulation_share_their_keys():
    assert tuple(EmulateConfig.__dataclass_fields__) == EMULATION_KEYS


def test_link_shapes_follow_the_node_grid():
    net = NetworkEmulation(latency_us=50, bandwidth_gbps=8, inter_latency_us=400, inter_bandwidth_gbps=0.8,
                           ranks_per_node=2)
    assert net.shape(0, 1) == LinkShape(50e-6, 1e9)       # same node: 8 Gbit/s = 1e9 bytes/s
    assert net.shape(1, 2) == LinkShape(400e-6, 1e8)      # ranks 1 and 2 sit on nodes 0 and 1
    assert net.shape(3, 0) == LinkShape(400e-6, 1e8)
    only_inter = NetworkEmulation(inter_latency_us=100, ranks_per_node=2)
    assert only_inter.shape(0, 1) is None                 # within a node: the real link
    assert only_inter.shape(0, 2) == LinkShape(100e-6, 0.0)
    # inter_* = 0 means "as within a node"
    assert NetworkEmulation(latency_us=7, ranks_per_node=1).shape(0, 5) == LinkShape(7e-6, 0.0)
    assert not NetworkEmulation().active and NetworkEmulation().describe() == ""


def test_describe_names_every_emulated_figure():
    assert NetworkEmulation(50, 10).describe() == "emulated network: 50 us latency, 10 Gbit/s per link"
    text = NetworkEmulation(0, 0, 3000, 0, 2).describe()
    assert text.startswith("emulated network: real links within nodes of 2 ranks; 3000 us latency")


def test_pacer_releases_bytes_as_hockney_says():
    pacer = Pacer(LinkShape(latency_s=1e-3, bytes_per_s=1e6))
    start = pacer.begin(2000, now=10.0)
    assert start == 10.0
    assert pacer.release_at(start, 0) == pytest.approx(10.001)            # the header: latency only
    assert pacer.release_at(start, 2000) == pytest.approx(10.001 + 0.002)  # α + n/B
    # a message sent while the link still carries the previous one queues behind it; latency pipelines
    second = pacer.begin(1000, now=10.0005)
    assert second == pytest.approx(10.002)
    assert pacer.release_at(second, 1000) == pytest.approx(10.002 + 0.001 + 0.001)
    assert pacer.report() == {"messages": 2, "bytes": 3000, "wire_s": pytest.approx(0.002 + 0.001 + 2e-3)}


@pytest.mark.parametrize("settings, key", [
    ({"emulate": {"latency_us": 5}}, "emulate.latency_us"),  # threads backend: nothing to pace
    ({"parallel": {"backend": "processes", "world_size": 2}, "emulate": {"inter_latency_us": 5}},
     "emulate.inter_latency_us"),  # no second node
    ({"parallel": {"backend": "processes", "world_size": 2, "ranks_per_node": 2},
      "emulate": {"inter_bandwidth_gbps": 1}}, "emulate.inter_bandwidth_gbps"),
    ({"emulate": {"bandwidth_gbps": -1}}, "emulate.bandwidth_gbps"),
])
def test_config_mistakes_are_one_line_naming_the_key(settings, key):
    with pytest.raises(ConfigError) as err:
        from_dict(settings)
    assert err.value.key == key and "\n" not in str(err.value)


def test_config_builds_the_emulation():
    cfg = from_dict({"parallel": {"backend": "processes", "world_size": 4, "ranks_per_node": 2},
                     "emulate": {"latency_us": 20, "inter_bandwidth_gbps": 2}})
    assert network_emulation(cfg) == NetworkEmulation(20, 0, 0, 2, 2)
    assert network_emulation(from_dict({})) is None


# ----------------------------------------------------------------------------- delivered on real links

@pytest.mark.slow
def test_emulated_links_deliver_the_latency_and_bandwidth_asked_for():
    """Two ranks: an all-reduce of S bytes is 2 messages of S/2 (reduce-scatter, all-gather), so on links
    of latency L and bandwidth B it takes 2(L + S/2/B). The pacer never releases a byte earlier, so that
    is a floor at every size; above it come the real transport's own time for the message (measured in
    the same test) and a few milliseconds of scheduling noise on a loaded 2-core box (the fastest of three
    runs is taken, as load only adds). The slope between the smallest and the largest size is the
    delivered bandwidth."""
    latency, gbps = 10e-3, 0.5
    sizes = [256, 1 << 19, 1 << 20, 1 << 21]
    real = [r["time_s"] for r in bench_allreduce("processes", 2, sizes, iters=5, warmup=1)]
    network = NetworkEmulation(latency_us=latency * 1e6, bandwidth_gbps=gbps)
    runs = [bench_allreduce("processes", 2, sizes, iters=5, warmup=1, network=network) for _ in range(3)]
    assert all(row["correct"] for rows in runs for row in rows)
    # other jobs on the box only ever slow a run down: each size's fastest of three runs
    rows = [min(at_size, key=lambda row: row["time_s"]) for at_size in zip(*runs)]
    per_byte = 8 / (gbps * 1e9)
    for size, row, alone in zip(sizes, rows, real):
        asked = 2 * (latency + size / 2 * per_byte)
        assert asked * 0.999 <= row["time_s"] <= asked + 2 * alone + 6e-3, (size, row["time_s"], asked, alone)
    slope = (rows[-1]["time_s"] - rows[0]["time_s"]) / (sizes[-1] - sizes[0])
    assert 0.85 * per_byte <= slope <= 1.15 * per_byte + (real[-1] - real[0]) / (sizes[-1] - sizes[0]) * 2


@pytest.mark.slow
def test_virtual_nodes_put_the_slow_link_between_them():
    """Four ranks, two nodes of two, 3 ms only between nodes: every ring step waits for the slowest of its
    links, so an all-reduce of 4 elements per rank takes 2(N-1) = 6 steps of >= 3 ms."""
    size = 64  # 16 float32: every rank's shard holds 4 elements, so every ring step sends a message
    net = NetworkEmulation(inter_latency_us=3000, ranks_per_node=2)
    (emulated,) = bench_allreduce("processes", 4, [size], iters=5, warmup=1, network=net)
    (real,) = bench_allreduce("processes", 4, [size], iters=5, warmup=1)
    assert emulated["correct"]
    assert 6 * 3e-3 <= emulated["time_s"] <= 6 * 3e-3 + 3 * real["time_s"] + 4e-3


@pytest.mark.slow
def test_bench_allreduce_cli_reports_the_emulation():
    out = CliRunner().invoke(app, ["bench", "allreduce", "-n", "2", "--sizes", "64KiB", "--iters", "2",
                                   "--warmup", "0", "--latency-us", "500", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["network"] == "emulated network: 500 us latency, uncapped bandwidth per link"
    assert report["ours"][0]["time_s"] >= 2 * 500e-6


def test_bench_allreduce_cli_refuses_emulation_it_cannot_do():
    runner = CliRunner()
    out = runner.invoke(app, ["bench", "allreduce", "-b", "threads", "--latency-us", "5"])
    assert out.exit_code == 2 and "needs --backend processes" in out.output
    out = runner.invoke(app, ["bench", "allreduce", "-n", "2", "--inter-latency-us", "5"])
    assert out.exit_code == 2 and "--ranks-per-node" in out.output


@pytest.mark.slow
def test_an_emulated_run_is_marked_in_its_record(tmp_path):
    sets = ('parallel.backend="processes"', "parallel.world_size=2", "train.steps=2",
            "checkpoint.every=0", "emulate.latency_us=200")
    summary, events = train(tmp_path, *sets)
    line = "emulated network: 200 us latency, uncapped bandwidth per link"
    assert summary["network"] == line
    (started,) = [e for e in events if e.kind == "run_started"]
    assert started.network == line
    recorded = json.loads((tmp_path / next(p.name for p in tmp_path.iterdir()) / "summary.json").read_text())
    assert recorded["network"] == line
    # metered: rank 0's link to rank 1 held every message it sent, each for at least the latency
    (link,) = summary["links"]
    assert link["peer"] == 1 and link["messages"] > 0 and link["wire_s"] >= link["messages"] * 200e-6
    real, _ = train(tmp_path / "real", *sets[:-1])
    assert real["network"] == "" and real["links"] == []


@pytest.mark.slow
def test_a_held_message_is_not_a_silent_peer():
    """256 KiB at 0.004 Gbit/s spends ~0.5 s on the wire, longer than the 0.2 s timeout: holding bytes back
    for the emulation must not count as a peer that stopped answering."""
    nbytes, gbps = 1 << 18, 0.004
    times = run_ranks(2, "processes", slow_sendrecv, (nbytes, 0.2),
                      network=NetworkEmulation(bandwidth_gbps=gbps))
    assert min(times) >= nbytes / (gbps * 1e9 / 8)


def test_the_headless_summary_and_the_log_say_the_network_was_emulated():
    from engine.events import RunStarted
    from nanodist_tui.describe import describe
    from nanodist_tui.headless import summary_lines
    line = NetworkEmulation(50, 10).describe()
    summary = {"steps": 1, "initial_val_loss": 2.0, "final_val_loss": 1.0, "tokens_per_s": 10.0,
               "wall_s": 1.0, "network": line}
    assert f"network        {line}" in summary_lines(summary)
    assert not any(s.startswith("network") for s in summary_lines({**summary, "network": ""}))
    started = RunStarted(run_id="r", preset="p", config={}, n_params=1, world_size=2, total_steps=1,
                         network=line)
    assert describe(started).text.endswith(line)


def test_memory_measure_of_an_emulated_preset_runs_on_threads():
    """Memory does not depend on the network: `memory --measure` (threads backend) ignores [emulate]."""
    from engine.bench.memory import measure
    cfg = from_dict({"data": {"kind": "synthetic-lm", "n_samples": 256}, "train": {"global_batch": 4},
                     "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 8, "vocab_size": 20},
                     "parallel": {"backend": "processes", "world_size": 2}, "emulate": {"latency_us": 100}})
    assert measure(cfg, steps=1)["steps"] == 1
