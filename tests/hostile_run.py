"""A recorded run folder someone else handed you: the bundled demo recording with terminal control sequences
(clear the screen, write the clipboard through OSC 52, a C1 CSI, DEL, a bidi override, a line break) and
Rich/Textual markup put into every text field a display shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.app_helpers import demo_run_folder

PAYLOAD = "\x1b]52;c;aGk=\x07\x1b[2J\x9b31m\x7f\u202eevil\u2066[bold]x[/bold][link=https://e.x]y[/link]\r\nz"
# what a person sees instead, written out by hand: every control character as a visible escape, the markup
# as it was typed
SHOWN = r"\x1b]52;c;aGk=\x07\x1b[2J\x9b31m\x7f\u202eevil\u2066[bold]x[/bold][link=https://e.x]y[/link]\r\nz"

FOLDER = "evil\x1b[2J\u202e\x07"  # a run folder's own name (Linux allows any byte but / and NUL)
FOLDER_SHOWN = r"evil\x1b[2J\u202e\x07"

# Control characters (C0 but the newline, DEL, C1) and the bidi embeddings, overrides and isolates.
_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def unsafe(text: str) -> list[str]:
    """The characters in `text` a terminal would obey, or reorder the line by."""
    return _UNSAFE.findall(text)


def hostile_run_folder(root: Path) -> Path:
    """runs/<FOLDER>: the demo recording with PAYLOAD as its run id, preset, network, a log message, a sweep
    parameter's name, its links' phase, group and algorithm names and its failure; its summary's status,
    preset and parent PAYLOAD too (its numbers stay numbers: a wrong-typed one is a damaged summary, shown as
    such, tests/run/test_damaged_summary.py)."""
    demo = demo_run_folder(root)
    run = demo.rename(demo.parent / FOLDER)
    lines = []
    for line in (run / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "run_started":
            event.update(run_id=PAYLOAD, preset=PAYLOAD, network=PAYLOAD)
            lines.append(json.dumps(event))
            lines.append(json.dumps({"kind": "log", "level": "warning", "message": PAYLOAD}))
            lines.append(json.dumps({"kind": "trial_started", "number": 0, "params": {PAYLOAD: 0.5}}))
        elif event["kind"] == "traffic":  # the phase, group and algorithm names the traffic pane shows
            for link in event["links"]:
                link.update(phase=PAYLOAD, group=PAYLOAD, algorithm=PAYLOAD)
            lines.append(json.dumps(event))
        elif event["kind"] == "run_finished":
            lines.append(json.dumps({"kind": "run_failed", "message": PAYLOAD, "rank": 1}))
        else:
            lines.append(line)
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    summary = json.loads((run / "summary.json").read_text())
    summary.update(status=PAYLOAD, preset=PAYLOAD, parent=PAYLOAD, resumed_at=7)
    (run / "summary.json").write_text(json.dumps(summary))
    return run
