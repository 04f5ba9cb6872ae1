"""`python -m nanodist_tui.cli ...`: the same as `nanodist-tui ...`, without the console script (the
multi-rank tests start their ranks this way)."""

from nanodist_tui.cli import main

main()
