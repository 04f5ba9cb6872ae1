"""The command line under typer's test runner, shared by the CLI test modules."""
from __future__ import annotations

from typer.testing import CliRunner

from nanodist_tui.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_user_error(result, named: str) -> None:
    """Exit code 2 and one line naming `named`: result.output holds stdout and stderr together
    (Click >= 8.2), so "one line" covers both."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert named in lines[0] and "Traceback" not in result.output


def bench_step(*args: str) -> str:
    """`nanodist-tui bench step ARGS`'s stdout, the command having succeeded."""
    result = invoke("bench", "step", *args)
    assert result.exit_code == 0, result.output
    return result.stdout
