"""The command palette's entries (ctrl+p): every action the workbench has, and every pane of the run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from textual.app import SystemCommand

if TYPE_CHECKING:
    from nanodist_tui.app import NanoDistApp

# action -> (title, help), each action once; one that does not fit the run right now (the app's action_fits:
# stop with no training running) is left out
ACTIONS = {
    "stop_training": ("Stop training", "every rank stops after the same step and keeps a checkpoint"),
    "toggle_pause": ("Pause or resume training", "every rank holds after its step (a replay holds too)"),
    "toggle_freeze": ("Freeze or unfreeze the display", "training goes on; the panes stop redrawing"),
    "new_run": ("New run", "pick a preset, edit it, check that it fits, save it, start it"),
    "open_replay": ("Replay a recorded run", "play a run folder back into the panes, at any speed"),
    "compare": ("Compare two runs", "loss curves overlaid, memory and traffic side by side"),
    "projection": ("Projection", "this run on a cluster you do not have: step time, scaling, calibration"),
    "plan": ("Plan a layout", "the best layouts of N ranks on a cluster and why the rest lose; s starts one"),
    "replay_speed(1)": ("Replay faster", "double the replay speed"),
    "replay_speed(-1)": ("Replay slower", "halve the replay speed"),
    "seek(1)": ("Seek forward", "jump ahead a tenth of the run"),
    "seek(-1)": ("Seek back", "jump back a tenth of the run (the panes are rebuilt)"),
    "next_pipeline": ("Next pipeline", "the pipeline tab shows the next replica's pipeline"),
    "sweeps": ("Sweep results", "a stored sweep's trials and best (sweep show); e exports the best"),
    "serve": ("Serve a run's model", "a trained GPT over HTTP on loopback, as `nanodist-tui serve` does"),
    "stop_serving": ("Stop serving", "end the model server the palette started"),
    "help": ("Help", "every key, and what each pane, bar, column and mark means"),
    "quit": ("Quit", "asks first while a run trains; it stops (checkpoint kept), then the workbench quits"),
}


def workbench_commands(app: NanoDistApp) -> Iterator[SystemCommand]:
    for action, (title, help_text) in ACTIONS.items():
        name, _, args = action.partition("(")
        # Not check_action: the palette is a screen of its own, over which the app's keys are refused.
        if app.action_fits(name) is False:
            continue
        yield SystemCommand(title, help_text, lambda action=action: app.run_action(action))
    if app.workspace is not None:
        for number, tab in enumerate(app.workspace.tab_ids, 1):
            title = tab.removeprefix("tab-")
            yield SystemCommand(f"Show {title}", f"the {title} pane (key {number})",
                                lambda number=number: app.action_show_tab(number))
