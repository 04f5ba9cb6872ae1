"""The workbench panes, one widget per file; each takes a `Tick` in `ingest` and draws in `redraw`."""
