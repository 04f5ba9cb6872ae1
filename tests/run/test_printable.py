"""engine.run.printable against hand-written escapes: every control and bidi character visible, the rest as it
was."""

from __future__ import annotations

from engine.run.printable import printable


def test_controls_are_escaped_visibly():
    assert printable("a\x00b\x1b[2J\x07\x7f") == r"a\x00b\x1b[2J\x07\x7f"  # C0, ESC, BEL, DEL
    assert printable("\x85\x9b31m\x9d") == r"\x85\x9b31m\x9d"  # C1: NEL, CSI, OSC
    assert printable("x\ny\rz\t") == r"x\ny\rz\t"


def test_bidi_separators_and_lone_surrogates_are_escaped():
    assert printable("\u202aa\u202eb\u2066c\u2069\u200f\u061c") == r"\u202aa\u202eb\u2066c\u2069\u200f\u061c"
    assert printable("\u2028\u2029\udc80") == r"\u2028\u2029\udc80"


def test_printable_text_is_unchanged():
    for text in ("", "run 20261201 · ZeRO-2 × 4 → 3.14", "[bold]x[/bold] C:\\runs", "日本語 é 🙂"):
        assert printable(text) == text


def test_newlines_are_kept_when_asked():
    assert printable("a\x1b\nb\r\n", newlines=True) == "a\\x1b\nb\\r\n"
