"""`nanodist-tui presets ...`: list, show, create one from another (comments kept), compare two."""

from __future__ import annotations

from typing import Annotated

import typer

from engine.run.printable import printable
from nanodist_tui.cli.errors import fail, user_errors
from nanodist_tui.cli.options import SetOpt

app = typer.Typer(help="Presets: list, show, create from another, compare.", no_args_is_help=True)

@app.command("list")
def list_presets() -> None:
    """Every preset by name, where it comes from (user, ./presets, repo, package) and what it is for."""
    from engine.config.presets import list_presets as found
    infos = found()
    if not infos:
        fail("no presets found; set NANODIST_PRESETS or create ./presets")
    width = max(len(p.name) for p in infos)
    for p in infos:
        about = f"unreadable: {p.error}" if p.error else p.description
        print(printable(f"{p.name:<{width}}  {p.origin:<7}  {about}"))


@app.command("show")
def show(name: Annotated[str, typer.Argument(help="preset name or path to a .toml file")],
         resolved: Annotated[bool, typer.Option("--resolved", help="also list every default it relies on")]
         = False) -> None:
    """Print a preset as written, comments included (or with every default filled in)."""
    from engine.config import presets
    with user_errors():
        path = presets.find_preset(name)
        doc = presets.read_document(path)
        if resolved:
            presets.apply_overrides(doc, (), source=str(path))  # validates first: one line if it is wrong
            doc = presets.resolved_document(doc)
    print(printable(doc.as_string(), newlines=True), end="")  # a preset may come from a run folder


@app.command("new")
def new(name: Annotated[str, typer.Argument(help="name of the new preset (./presets/NAME.toml)")],
        source: Annotated[str, typer.Option("--from", help="the preset to start from")],
        sets: SetOpt = None,
        force: Annotated[bool, typer.Option("--force", help="overwrite ./presets/NAME.toml")] = False
        ) -> None:
    """Copy a preset to ./presets/NAME.toml with overrides applied; comments and numbers stay as written."""
    from engine.config import presets
    with user_errors():
        path = presets.find_preset(source)
        try:
            target = presets.save_as(presets.read_document(path), name, sets or [], force=force,
                                     source=str(path))
        except OSError as e:
            fail(f"presets/{name}.toml: cannot write it ({e.strerror or e}); ./presets must be a folder you "
                 "can write to")
    print(f"wrote {target} (from {path}{', with ' + ', '.join(sets) if sets else ''})")


@app.command("diff")
def diff(a: Annotated[str, typer.Argument(help="first preset (name or path)")],
         b: Annotated[str, typer.Argument(help="second preset (name or path)")]) -> None:
    """Settings that differ between two presets, defaults included."""
    from engine.config import toml_repr
    from engine.config.presets import diff_presets
    with user_errors():
        rows = diff_presets(a, b)
    if not rows:
        print(printable(f"{a} and {b} have the same settings"))
        return
    cells = [(key, "(absent)" if x is None else toml_repr(x), "(absent)" if y is None else toml_repr(y))
             for key, x, y in rows]
    wk = max(len(c[0]) for c in [*cells, ("setting", "", "")])
    wa = max(len(c[1]) for c in [*cells, ("", a, "")])
    print(printable(f"{'setting':<{wk}}  {a:<{wa}}  {b}"))
    for key, x, y in cells:
        print(printable(f"{key:<{wk}}  {x:<{wa}}  {y}"))
