"""`nanodist-tui project` through typer's runner: the table, the plot and the JSON file for a shipped cluster,
this machine from a calibration fixture (nothing measured), the cluster list, the nccl-tests fit, and every
mistake as one line with exit code 2. One slow test runs a quick validation end to end on a tiny model."""

from __future__ import annotations

import json

import pytest
from projection_helpers import fixture_calibration, nccl_table, small_config, small_preset
from typer.testing import CliRunner

from nanodist_tui.cli import app

runner = CliRunner()


@pytest.fixture
def preset(in_tmp, monkeypatch):
    """The SMALL config as a preset file, a calibration fixture for it, nothing else on the search path."""
    monkeypatch.delenv("NANODIST_CLUSTERS", raising=False)
    monkeypatch.setenv("NANODIST_CALIBRATION", str(in_tmp / "calibration.json"))
    fixture_calibration(in_tmp / "calibration.json")
    return small_preset(in_tmp / "small.toml")


def invoke(*args):
    return runner.invoke(app, ["project", *args])


def assert_user_error(result, named: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in result.output, result.output


def test_json_rows_for_a_shipped_cluster(preset, in_tmp):
    out = invoke("--preset", preset, "--cluster", "h100-ndr", "--world-sizes", "8,64,512", "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["cluster"] == "8x H100 nodes, NVLink + NDR InfiniBand" and report["scaling"] == "weak"
    rows = report["rows"]
    assert [r["world_size"] for r in rows] == [8, 64, 512]
    for r in rows:
        assert r["step_s"] == pytest.approx(r["compute_s"] + r["exposed_s"] + r["interference_s"])
        assert r["comm_share"] == pytest.approx(r["exposed_s"] / r["step_s"])
        assert r["tokens_per_s"] == pytest.approx(r["global_batch"] * 32 / r["step_s"])
        assert set(r["memory"]) >= {"parameters", "gradients", "adam_m", "activations"} and r["fits"] is True
    written = in_tmp / "runs" / "projections" / "small-on-h100-ndr.json"
    assert json.loads(written.read_text()) == report  # the same report, written to a file


def test_the_table_and_the_plot(preset, in_tmp):
    out = invoke("--preset", preset, "--cluster", "a100-hdr", "--world-sizes", "1,8,64", "--out",
                 str(in_tmp / "p.json"))
    assert out.exit_code == 0, out.output
    text = out.stdout
    assert "small on 8x A100 nodes, HDR InfiniBand" in text
    assert "step ms" in text and "MFU" in text and "tokens/s by ranks" in text
    assert "per-rank memory, MB" in text and f"JSON written to {in_tmp / 'p.json'}" in text
    assert "\x1b[" not in text  # no colour codes when stdout is not a terminal


def test_this_machine_from_its_calibration(preset):
    out = invoke("--preset", preset, "--world-sizes", "1,2,4", "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["rows"]
    assert [r["world_size"] for r in rows] == [1, 2, 4]
    assert rows[0]["comm_s"] == 0 and rows[1]["comm_s"] > 0


def test_strong_scaling_leaves_out_what_does_not_split(preset):
    out = invoke("--preset", preset, "--cluster", "a100-hdr", "--world-sizes", "2,64", "--scaling", "strong",
                 "--json")
    report = json.loads(out.stdout)
    assert [r["world_size"] for r in report["rows"]] == [2]
    assert report["skipped"][0]["world_size"] == 64


def test_the_cluster_list():
    out = invoke("--clusters")
    assert out.exit_code == 0
    for name in ("this-machine", "cpu-100gbe", "a100-hdr", "h100-ndr"):
        assert name in out.stdout


def test_nccl_tests_fit(in_tmp):
    table = in_tmp / "allreduce.txt"
    table.write_text(nccl_table(10e-6, 1 / 200e9, 8, [8 << k for k in range(0, 25, 3)]))
    out = invoke("--nccl-tests", str(table))
    assert out.exit_code == 0, out.output
    assert "8 ranks" in out.stdout and "latency_us = 10.0" in out.stdout
    assert "bandwidth_gbs = 200.0" in out.stdout


@pytest.mark.parametrize("args, named", [
    (["--world-sizes", "8,lots"], "--world-sizes"),
    (["--world-sizes", "0"], "--world-sizes"),
    (["--scaling", "sideways"], "--scaling"),
    (["--cluster", "a100-hrd"], "did you mean a100-hdr"),
    (["--set", "optim.lrr=1"], "optim.lrr"),
])
def test_mistakes_are_one_line(preset, args, named):
    assert_user_error(invoke("--preset", preset, *args), named)


def test_unreadable_inputs_are_one_line(preset, in_tmp):
    assert_user_error(invoke("--nccl-tests", str(in_tmp / "missing.txt")), "--nccl-tests")
    garbage = in_tmp / "garbage.txt"
    garbage.write_text("no table here")
    assert_user_error(invoke("--nccl-tests", str(garbage)), "no nccl-tests rows")
    (in_tmp / "calibration.json").write_text("{oops")
    assert_user_error(invoke("--preset", preset), "not a readable calibration")


@pytest.mark.slow
def test_a_quick_validation_end_to_end(in_tmp, monkeypatch):
    """Calibrate, predict and run the quick cases on a tiny model: a full report, memory exact (the
    estimator against the ledger, byte for byte); the error figures are whatever this loaded box gives."""
    from engine.projection.clusters import load_cluster
    from engine.projection.validate import validate
    cfg = small_config(model={"n_layer": 1, "n_embd": 32, "n_head": 2}, train={"global_batch": 8})
    monkeypatch.setenv("NANODIST_CALIBRATION", str(in_tmp / "calibration.json"))
    report = validate(cfg, load_cluster("this-machine"), quick=True, repeats=1, steps=3, warmup=1)
    assert len(report["cases"]) == 4 and report["memory_exact"] is True
    for case in report["cases"]:
        assert case["predicted_s"] > 0 and case["measured_s"] > 0 and 0 <= case["measured_comm_share"] <= 1
    assert -1 <= report["kendall_tau"] <= 1 and report["mape"] >= 0
    assert not (in_tmp / "calibration.json").exists()  # each case calibrates into a file of its own


def test_calibrate_prints_what_it_measured(preset, in_tmp, monkeypatch):
    """--calibrate (the measurement faked: the fixture, plus CPU figures and κ) names every figure the
    projection will use: the transport's α β γ in wall-clock and in CPU time, per busy-rank level the
    step's compute, the ranks' imbalance, κ and what time-slicing costs, and how late time-sliced ranks
    meet."""
    import engine.projection.calibrate as calibrate_module
    cal = fixture_calibration(in_tmp / "measured.json", dtypes=("fp32",))
    cal.data["transport"]["cpu"] = {"alpha": 25e-6, "beta": 1 / 8e9, "gamma": 1 / 5e9}
    cal.data["meeting_lag_s"] = 4.5e-3
    for level in cal.data["models"].values():
        level["fp32"]["2"].update(interference=1.5, interference_cpu_s=0.8e-3, interference_bytes=2**20,
                                  slicing_overhead=1.047)
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *args, **kwargs: cal)
    out = invoke("--preset", preset, "--calibrate")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert "alpha 60.0 us, beta 4.00 GB/s, gamma 6.00 GB/s" in lines[2]  # the fixture's ALPHA, BETA, GAMMA
    assert lines[3] == "  its CPU time per collective: alpha 25.0 us, beta 8.00 GB/s, gamma 5.00 GB/s"
    # forward + backward = 3 x the forward's 20 (1 rank) and 30 (2 ranks) us per token, at 1,024 tokens
    assert lines[4] == "  small, fp32, 1 rank(s) busy: forward + backward 61.4 ms at 1,024 tokens"
    assert lines[5] == ("  small, fp32, 2 rank(s) busy: forward + backward 92.2 ms at 1,024 tokens; "
                        "imbalance 4.0% of compute; kappa 1.50 (an all-reduce of 1.00 MiB beside compute "
                        "took 0.80 ms of CPU); time-sliced 2 per core, 1.05x its share of a core")
    assert lines[6] == "  ranks time-sliced 2 per core reach each collective 4.5 ms late"
