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

# The quick subset: every test not marked slow (no rank processes, no long training), a few minutes.
test-quick:
    python -m pytest -q -m "not slow"

# Lint and type-check.
lint:
    ruff check engine nanodist_tui tests
    mypy

# Benchmarks: our step vs PyTorch (eager, DDP), 16-bit vs fp32, scaling, the per-op profile, our
# all-reduce vs gloo, the techniques' costs.
bench:
    nanodist-tui bench step --preset gpt-mini --compare-precision
    nanodist-tui bench step --preset gpt-baby --steps 10 --warmup 2
    nanodist-tui bench step --preset mlp
    nanodist-tui bench step --preset gpt-mini -n 2 -b processes
    nanodist-tui bench step --preset gpt-mini -n 4 -b processes
    nanodist-tui bench scaling --preset gpt-mini
    nanodist-tui bench profile --preset gpt-mini
    nanodist-tui bench allreduce --backend processes --world-size 2 --sizes 16MiB,64MiB --vs-gloo
    nanodist-tui bench allreduce --backend processes --world-size 4 --sizes 16MiB,64MiB --vs-gloo
    nanodist-tui bench alltoall --backend processes --world-size 2 --algorithm all --uneven --vs-gloo
    nanodist-tui bench alltoall --backend processes --world-size 4 --algorithm all --uneven --vs-gloo
    nanodist-tui bench techniques --preset gpt-mini --world-size 4
    nanodist-tui bench pruning --preset sweep-lr --trials 20
    nanodist-tui bench ui --preset quickstart
    nanodist-tui bench ui-events

# The workbench's cost: tokens/s with it open vs --no-ui, and a 1 kHz event stream.
bench-ui:
    nanodist-tui bench ui --preset quickstart
    nanodist-tui bench ui-events

# The README's picture of the workbench, drawn from the bundled demo recording.
screenshot:
    nanodist-tui screenshot -o docs/workbench.svg --size 160x50

# Record the demo run again (4 ranks, ZeRO-2, fp16) that screenshots and snapshot tests replay; then
# `just screenshot` and `python -m pytest tests/workbench/test_snapshots.py --snapshot-update`, and look at both.
demo-recording:
    python -m nanodist_tui.demo

# What the median pruner saves a 20-trial sweep (sweep-lr twice: without and with it; steps counted).
bench-pruning:
    nanodist-tui bench pruning --preset sweep-lr --trials 20

# A sweep, headless (default: sweep-lr); running it again resumes it.
sweep preset="sweep-lr":
    nanodist-tui sweep --no-ui --preset {{preset}}

# The memory table of the README (seed-table preset, estimated and measured).
memory-table:
    nanodist-tui memory --preset seed-table --compare --measure

# The projection's validation table of the README (calibrates, then runs 20 held-out configurations).
projection-validate:
    nanodist-tui project --validate --repeats 4

# The validation's pipeline cases alone (docs/projection.md, "Pipeline cases").
projection-validate-pipeline repeats="3":
    python -c 'from engine.config.presets import load_preset; from engine.projection.clusters import load_cluster; from engine.projection.validate import validate; from nanodist_tui.cli.project import print_validation; print_validation(validate(load_preset("gpt-mini", {})[0], load_cluster("this-machine"), repeats={{repeats}}, only="stages"), "gpt-mini")'

# Every parallel layout the engine trains (DP, ZeRO, TP, SP, PP, CP, EP) measured against its projection (docs/projection.md, "Held-out layouts").
projection-validate-layouts repeats="2":
    nanodist-tui project --preset gpt-mini --validate --layouts --repeats {{repeats}}
