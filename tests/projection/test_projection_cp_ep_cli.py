"""`nanodist-tui project` with context and expert parallelism, through typer's runner: the shipped presets
cp-2-long and moe-4 and `--set parallel.context=...` / `--set parallel.expert=...` are projected (no longer
refused); the JSON rows carry the `cp` and `ep` terms, the table their lines; `--expert-imbalance` reaches the
EP term, and a value under 1 is one line with exit code 2."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from nanodist_tui.cli import app

runner = CliRunner()


def invoke(preset: str, *args):
    return runner.invoke(app, ["project", "--preset", preset, "--cluster", "h100-ndr", *args])


def test_context_parallel_rows_and_lines(in_tmp):
    out = invoke("cp-2-long", "--set", "parallel.context_layout=contiguous", "--world-sizes", "2,3,16",
                 "--out", str(in_tmp / "p.json"))
    assert out.exit_code == 0, out.output
    assert "context 2 (contiguous)" in out.stdout and "3 ranks left out" in out.stdout
    assert "context parallel 2 (contiguous) at 2 ranks" in out.stdout and "beside the blocks" in out.stdout
    assert "busiest/mean 1.33" in out.stdout  # 2c/(c + 1) at c = 2
    rows = json.loads((in_tmp / "p.json").read_text())["rows"]
    assert [r["world_size"] for r in rows] == [2, 16]
    for r in rows:
        assert r["cp"]["degree"] == 2 and r["cp"]["layout"] == "contiguous" and r["cp_s"] > 0
        assert r["cp"]["kv_bytes"] == 2 * 4 * 512 * 64 * 4  # 4 rows of 512 tokens a rank, K and V, fp32
        assert r["ep"] == {} and r["ep_s"] == 0.0


def test_context_degree_set_on_a_dense_preset(in_tmp):
    out = invoke("cp-2-long", "--set", "parallel.context=4", "--set", "parallel.world_size=4",
                 "--world-sizes", "4", "--json", "--out", str(in_tmp / "p.json"))
    assert out.exit_code == 0, out.output
    cp = json.loads(out.stdout)["rows"][0]["cp"]
    assert (cp["degree"], cp["layout"], cp["busiest_over_mean"]) == (4, "zigzag", 1.0)


def test_expert_parallel_rows_lines_and_imbalance(in_tmp):
    out = invoke("moe-4", "--set", "parallel.expert=2", "--world-sizes", "2,3,4", "--expert-imbalance", "1.5",
                 "--out", str(in_tmp / "p.json"))
    assert out.exit_code == 0, out.output
    assert "expert parallel 2 at 2 ranks" in out.stdout and "1.50x the mean (given" in out.stdout
    rows = json.loads((in_tmp / "p.json").read_text())["rows"]
    assert [r["world_size"] for r in rows] == [2, 4]
    assert [r["ep"]["edp"] for r in rows] == [1, 2]
    assert all(r["ep"]["imbalance"] == 1.5 and r["ep_s"] > 0 for r in rows)


def test_world_sizes_the_experts_do_not_fold_into_are_left_out(in_tmp):
    out = invoke("moe-4", "--world-sizes", "2,4", "--json", "--out", str(in_tmp / "p.json"))
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert [r["world_size"] for r in report["rows"]] == [4]
    why = "expert 4 does not divide the 2 data x context ranks"
    assert report["skipped"] == [{"world_size": 2, "why": why}]


def test_an_imbalance_under_one_is_one_line(in_tmp):
    out = invoke("moe-4", "--expert-imbalance", "0.5", "--out", str(in_tmp / "p.json"))
    assert out.exit_code == 2
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--expert-imbalance" in lines[0] and "Traceback" not in out.output
