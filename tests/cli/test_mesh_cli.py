"""`nanodist-tui mesh`: the table and the JSON of a layout, written out by hand here; every degree accepted
(it only describes), impossible layouts refused in one line with exit code 2; and a training command given a
degree this release does not train, refused in one line."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import assert_user_error, invoke

WORLD_4_TP_2 = """\
gpt-mini: 4 rank(s) = dp 2 x pp 1 x cp 1 x tp 2; ep 1, carved out of dp x cp
order tp-cp-ep-dp-pp: innermost (adjacent ranks) first

      coordinates           groups
rank  dp  pp  cp  tp  ep    tp   cp   dp   pp   ep   dpcp   edp
   0   0   0   0   0   0    tp0  cp0  dp0  pp0  ep0  dpcp0  edp0
   1   0   0   0   1   0    tp0  cp1  dp1  pp1  ep1  dpcp1  edp1
   2   1   0   0   0   0    tp1  cp2  dp0  pp2  ep2  dpcp0  edp0
   3   1   0   0   1   0    tp1  cp3  dp1  pp3  ep3  dpcp1  edp1

groups (ranks in group order)
  tp: split each layer's weights
    tp0 [0, 1]   tp1 [2, 3]
  cp: split each sequence
    cp0..cp3: one rank each
  dp: same weights, other data
    dp0 [0, 2]   dp1 [1, 3]
  pp: successive stages
    pp0..pp3: one rank each
  ep: split the experts (all-to-all)
    ep0..ep3: one rank each
  dpcp: same weights: the gradient reduce and the loss average
    dpcp0 [0, 2]   dpcp1 [1, 3]
  edp: same experts: their gradient reduce
    edp0 [0, 2]   edp1 [1, 3]
"""


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Only the shipped presets."""


def test_the_table_of_world_4_as_dp2_tp2():
    result = invoke("mesh", "--preset", "gpt-mini", "-n", 4, "--set", "parallel.tensor=2")
    assert result.exit_code == 0, result.output
    assert result.output == WORLD_4_TP_2


def test_the_json_of_world_8_as_dp2_pp2_tp2():
    result = invoke("mesh", "--preset", "gpt-mini", "-n", 8, "--set", "parallel.tensor=2",
                    "--set", "parallel.pipeline=2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["preset"] == "gpt-mini" and report["world_size"] == 8 and not report["sequence_parallel"]
    assert report["order"] == "tp-cp-ep-dp-pp"
    assert report["degrees"] == {"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 2}
    assert report["groups"]["tp"] == {"tp0": [0, 1], "tp1": [2, 3], "tp2": [4, 5], "tp3": [6, 7]}
    assert report["groups"]["dp"] == {"dp0": [0, 2], "dp1": [1, 3], "dp2": [4, 6], "dp3": [5, 7]}
    assert report["groups"]["pp"] == {"pp0": [0, 4], "pp1": [1, 5], "pp2": [2, 6], "pp3": [3, 7]}
    assert report["groups"]["dpcp"] == {"dpcp0": [0, 2], "dpcp1": [1, 3], "dpcp2": [4, 6], "dpcp3": [5, 7]}
    assert report["ranks"][6] == {"rank": 6, "coords": {"dp": 1, "pp": 1, "cp": 0, "tp": 0, "ep": 0},
                                  "groups": {"tp": "tp3", "cp": "cp6", "dp": "dp2", "pp": "pp2", "ep": "ep6",
                                             "dpcp": "dpcp2", "edp": "edp2"}}


def test_every_degree_and_sequence_parallelism_are_described():
    result = invoke("mesh", "--preset", "gpt-mini", "-n", 16, "--set", "parallel.tensor=2",
                    "--set", "parallel.context=2", "--set", "parallel.expert=4", "--set",
                    "parallel.sequence_parallel=true", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["degrees"] == {"tp": 2, "cp": 2, "ep": 4, "dp": 4, "pp": 1} and report["sequence_parallel"]
    assert report["groups"]["ep"] == {"ep0": [0, 2, 4, 6], "ep1": [1, 3, 5, 7], "ep2": [8, 10, 12, 14],
                                      "ep3": [9, 11, 13, 15]}
    text = invoke("mesh", "--preset", "gpt-mini", "-n", 16, "--set", "parallel.tensor=2", "--set",
                  "parallel.context=2", "--set", "parallel.expert=4", "--set",
                  "parallel.sequence_parallel=true").output
    assert text.startswith("gpt-mini: 16 rank(s) = dp 4 x pp 1 x cp 2 x tp 2, sequence parallel; ep 4, ")
    assert "    ep0 [0, 2, 4, 6]   ep1 [1, 3, 5, 7]   ep2 [8, 10, 12, 14]   ep3 [9, 11, 13, 15]\n" in text


def test_a_wide_world_keeps_its_lines_short():
    result = invoke("mesh", "--preset", "gpt-mini", "-n", 128, "--set", "parallel.tensor=4")
    assert result.exit_code == 0, result.output
    assert max(map(len, result.output.splitlines())) <= 120
    assert "    dp0 [0, 4, ..., 124]   dp1 [1, 5, ..., 125]   dp2 [2, 6, ..., 126]   dp3 [3, 7, ..., 127]\n" \
        in result.output


@pytest.mark.parametrize("args, line", [
    (["-n", 8, "--set", "parallel.tensor=3"],
     "--world-size 8: parallel.world_size: 8 is not a multiple of tensor 3 x pipeline 1 x context 1 = 3; "
     "use a world_size that is a multiple of 3 (e.g. 6 or 9)"),
    (["--set", "parallel.pipeline=2"],  # gpt-mini: one rank
     "--set parallel.pipeline=2: parallel.world_size: 1 is not a multiple of tensor 1 x pipeline 2 x "
     "context 1"),
    (["-n", 8, "--set", "parallel.tensor=8"],
     "--set parallel.tensor=8: parallel.tensor: 8 does not divide model.n_head 4: each tensor-parallel rank "
     "holds whole attention heads; use a divisor of 4: 1, 2, 4"),
    (["-n", 8, "--set", "parallel.pipeline=8"],
     "--set parallel.pipeline=8: parallel.pipeline: 8 stages for 4 layers: every stage needs at least one; "
     "use at most 4"),
    (["-n", 8, "--set", "parallel.tensor=2", "--set", "parallel.expert=3"],
     "--set parallel.expert=3: parallel.expert: 3 does not divide the 4 data x context ranks"),
    (["--set", "parallel.order=tp-dp"],
     '--set parallel.order=tp-dp: parallel.order: "tp-dp" is not an axis order: it leaves out cp, ep, pp; '
     'name tp, cp, ep, dp, pp once each, innermost first, e.g. "tp-cp-ep-dp-pp"'),
    (["--set", "parallel.sequence_parallel=true"],
     "parallel.sequence_parallel: splits the sequence over the tensor-parallel ranks, but "
     "parallel.tensor = 1"),
    (["--set", "parallel.tensor=0"], "parallel.tensor: 0 is out of range"),
    (["--set", "parallel.tensr=2"], "parallel.tensr: unknown key; did you mean parallel.tensor?"),
])
def test_an_impossible_layout_is_one_line_and_exit_code_2(args, line):
    assert_user_error(invoke("mesh", "--preset", "gpt-mini", *args), line)


def test_a_missing_preset_is_one_line():
    result = invoke("mesh", "--preset", "no-such-preset")
    assert_user_error(result, "no-such-preset: no preset with this name")


@pytest.mark.parametrize("key, name", [("context", "context"), ("expert", "expert")])
def test_training_with_a_degree_not_built_yet_is_refused(monkeypatch, key, name):
    """Every axis trains in this release; an axis taken out of IMPLEMENTED_AXES (as one is before its
    parallelism is built) is refused in one line by training and memory, and still described by mesh."""
    from engine.config import rules_layout as rules
    monkeypatch.setattr(rules, "IMPLEMENTED_AXES", frozenset({"dp", "tp", "pp"}))
    line = (f"--set parallel.{key}=2: parallel.{key}: {name} parallelism ({key} = 2) is not implemented yet "
            f"in this release; set parallel.{key} = 1 (`nanodist-tui mesh` shows the layout it would make)")
    assert_user_error(invoke("--no-ui", "--preset", "gpt-mini", "-n", 4, "--set", f"parallel.{key}=2"), line)
    assert_user_error(invoke("memory", "--preset", "gpt-mini", "-n", 4, "--set", f"parallel.{key}=2"), line)
    assert invoke("mesh", "--preset", "gpt-mini", "-n", 4, "--set", f"parallel.{key}=2").exit_code == 0


def test_mesh_has_help():
    result = invoke("mesh", "--help")
    assert result.exit_code == 0 and "--preset" in result.output and "--json" in result.output
