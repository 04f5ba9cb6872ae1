"""`?`: the workbench's own help — every key (as remapped by the user's keymap) and what each part of the
screen means — written from the bindings and the pane list, so it cannot fall behind them."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Markdown

from nanodist_tui.panes import PANES
from nanodist_tui.user_config import config_path
from nanodist_tui.widgets.footer import WorkbenchFooter

HEADER = """\
## The header
- **state**: starting, running, pausing (asked; ranks hold after their step), paused, stopping (every rank
  finishes its step, evaluates and saves a checkpoint), stopped (checkpoint kept: `nanodist-tui resume RUN`
  continues it), finished, failed (the cause is in the notification and the log, once).
- **ranks on backend · ZeRO stage · precision · checkpointing**: the run's shape.
- **step n/total**, **loss** (this step's, averaged over ranks) and **val** (the last evaluation),
  **tok/s** (tokens per second over the last 20 steps), **ETA** (the remaining steps at that pace),
  **peak** (the highest memory any rank has held), **scale** (fp16's loss scale); other panes add theirs
  (a sweep's best trial).
"""

MARKS = """\
## Marks, units and columns
- Bytes are MB = 10^6 bytes (kB 10^3, GB 10^9), as `nanodist-tui memory` and the README print them;
  rates are GB/s = 10^9 bytes a second; times are ms.
- **per-step bytes** (sent/step, the ring's link labels): payload bytes sent in the last step alone, not a
  running total; frame headers and acknowledgements are not counted.
- **wait / wait %**: time the training thread sat blocked until its communication finished (exposed
  communication); **comm**: the time the sends themselves took, much of it hidden behind backward.
- **run-peak mark** (the bar on a memory bar): the highest total this rank reached so far in the run.
- **est vs measured**: `est` is what the estimator predicts from the config alone (before the run), the
  percentage how far the ledger's measurement is above (+) or below (-) it.
- **x** on the loss-scale plot: an overflow (the step was skipped); **straggler**: a rank whose compute took
  1.25 times the others' median or more; **slow link** (red): under half the median rate.
"""


class HelpScreen(Screen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "Close help", id="help-close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Markdown(help_markdown(self.app))
        yield WorkbenchFooter()


def _keys_table(app) -> str:
    keymap = getattr(app, "_keymap", {})
    rows = ["| key | does | id (for [keymap]) |", "|---|---|---|"]
    for binding in app.BINDINGS:
        if not isinstance(binding, Binding) or binding.id is None:
            continue
        keys = keymap.get(binding.id, binding.key)
        shown = binding.key_display if binding.id not in keymap and binding.key_display else keys
        rows.append(f"| `{shown}` | {binding.description} | `{binding.id}` |")
    rows.append("| `ctrl+p` | command palette: every action and pane by name | |")
    rows.append("| `tab` / `shift+tab` | move the focus from pane to pane (the focused one scrolls) | |")
    return "\n".join(rows)


def help_markdown(app) -> str:
    panes = "\n".join(f"- **{spec.title}**: {spec.help}" for spec in PANES)
    return f"""\
# nanoDist workbench

Training runs on a background thread; the panes show its events live. Keys 1-9 switch tabs: 1 is the
overview (what fits on one screen), then one tab per pane this run has.

## Keys
{_keys_table(app)}

Keys can be remapped: put `[keymap]` with `id = "key"` lines in `{config_path()}`
(for example `stop = "x"`). Textual's own key list: ctrl+p, then "Keys".

{HEADER}
## Panes
{panes}

{MARKS}"""
