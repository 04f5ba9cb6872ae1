"""The workbench's keys: each binding with an id (so the user's [keymap] can move it), in the footer's
order, and the groups of actions the app asks about (those of a training run, of a replay, those that work
over every screen). What each key does is in nanodist_tui/actions.py."""

from __future__ import annotations

from textual.binding import Binding

SEEK_SHARE = 0.1  # [ and ] move a replay by this share of the run


def _bindings() -> list[Binding]:
    # In the footer's order: what the moment needs first (where they do not all fit, the footer shows the
    # first). A replay's speed and seek keys are one entry each ("+- Speed"), so a replay's keys fit in 80.
    speed, seek = Binding.Group("Speed", compact=True), Binding.Group("Seek", compact=True)
    keys = [
        Binding("s", "stop_training", "Stop", id="stop"),
        Binding("p", "toggle_pause", "Pause", id="pause"),
        Binding("x", "finish_sweep", "Finish sweep", id="finish-sweep"),  # sweeps only
        Binding("plus", "replay_speed(1)", "Faster", id="replay-faster", key_display="+",
                group=speed),
        Binding("minus", "replay_speed(-1)", "Slower", id="replay-slower", key_display="-",
                group=speed),
        Binding("left_square_bracket", "seek(-1)", "Seek -10%", id="seek-back", key_display="[",
                group=seek),
        Binding("right_square_bracket", "seek(1)", "Seek +10%", id="seek-forward", key_display="]",
                group=seek),
        # the pipeline tab only, where the run has several pipelines (data or tensor parallelism beside)
        Binding("g", "next_pipeline", "Next pipeline", id="next-pipeline"),
        Binding("question_mark", "help", "Help", key_display="?", id="help"),
        Binding("q", "quit", "Quit", id="quit"),
        Binding("f", "toggle_freeze", "Freeze", id="freeze"),
        Binding("n", "new_run", "New run", id="new-run"),
        Binding("o", "open_replay", "Replay", id="open-replay"),
        Binding("c", "compare", "Compare", id="compare"),
        Binding("j", "projection", "Projection", id="projection"),
        # priority: it works from every screen and dialog (a modal screen otherwise takes every key)
        Binding("ctrl+c", "stop_and_quit", "Stop (checkpoint kept) and quit, from any screen", show=False,
                id="stop-and-quit", priority=True),
    ]
    return keys + WORKSPACE_KEYS


def _workspace_keys() -> list[Binding]:
    """The keys of a run's tabs: a digit shows a tab, the arrows and pages scroll the pane on show. The
    workbench has them, and so does every screen with a workspace of its own (a replay over a run), with
    the same ids, so the user's keymap moves them everywhere."""
    keys = [Binding(str(n), f"show_tab({n})", f"Show tab {n}", show=False, id=f"tab-{n}")
            for n in range(1, 10)]
    # The pane on show scrolls with these whatever has the focus (the tab strip has it, and takes only
    # left/right); a focused table or log takes them itself first.
    keys += [Binding(key, f"scroll_pane('{how}')", f"Scroll the pane: {how.replace('_', ' ')}", show=False,
                     id=f"scroll-{how.replace('_', '-')}", key_display=shown)
             for key, how, shown in (("up", "up", "↑"), ("down", "down", "↓"), ("pageup", "page_up", "PgUp"),
                                     ("pagedown", "page_down", "PgDn"), ("home", "home", "Home"),
                                     ("end", "end", "End"))]
    return keys


WORKSPACE_KEYS = _workspace_keys()
BINDINGS = _bindings()
BINDING_IDS = tuple(b.id for b in BINDINGS if b.id)
WORKBENCH_ACTIONS = {b.action.partition("(")[0] for b in BINDINGS}
RUN_ACTIONS = ("stop_training", "toggle_pause")
ANY_SCREEN = ("quit", "stop_and_quit", "help")  # the app's keys that work over its other screens too
REPLAY_ACTIONS = ("replay_speed", "seek")
