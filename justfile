# nanoDist recipes. `just --list` shows them.

# Install nanoDist with its test tools (editable).
setup:
    pip install -e '.[test]'

# Open the workbench on a preset (default: quickstart).
run preset="quickstart":
    nanodist-tui --preset {{preset}}

# Train headless.
headless preset="quickstart":
    nanodist-tui --no-ui --preset {{preset}}

# The test suite (what CI runs).
test:
    python -m pytest -q

# Lint and type-check.
lint:
    ruff check engine nanodist_tui tests
    mypy

# Benchmarks: our step vs PyTorch eager, and our all-reduce vs gloo.
bench:
    nanodist-tui bench step --preset gpt-mini
    nanodist-tui bench step --preset mlp
    nanodist-tui bench allreduce --backend processes --world-size 2 --sizes 16MiB,64MiB --vs-gloo
    nanodist-tui bench allreduce --backend processes --world-size 4 --sizes 16MiB,64MiB --vs-gloo
    nanodist-tui bench techniques --preset gpt-mini --world-size 4
    nanodist-tui bench pruning --preset sweep-lr --trials 20

# What the median pruner saves a 20-trial sweep (sweep-lr twice: without and with it; steps counted).
bench-pruning:
    nanodist-tui bench pruning --preset sweep-lr --trials 20

# A sweep, headless (default: sweep-lr); running it again resumes it.
sweep preset="sweep-lr":
    nanodist-tui sweep --no-ui --preset {{preset}}

# The memory table of the README (seed-table preset, estimated and measured).
memory-table:
    nanodist-tui memory --preset seed-table --compare --measure
