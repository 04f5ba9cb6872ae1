"""The house rules on imports, read from the source: no import cycles between modules, the engine never
imports the UI stack, the spine (engine's top-level modules: autograd, ops, models, optimizer, ...) and the
speed layer never import communication, parallel or any other room's code, torch is imported only by the
benchmark room, and no test module imports another. Function-level imports count too (they are still
dependencies). Every list is derived from the folders, so a new file is covered the day it is added."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "nanodist_tui")
UI_STACK = ("textual", "typer", "rich", "nanodist_tui", "textual_plotext", "plotext")
# The one top-level module that joins the spine to the rooms: the per-rank loop drives communication,
# parallelism, checkpoints and memory. Every other module at engine's top level is the spine.
JOINS_THE_ROOMS = ("engine.trainer",)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_modules() -> dict[str, Path]:
    return {module_name(f): f for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(path: Path, known: set[str], name: str | None = None) -> set[str]:
    """Every module `path` (module `name`) imports, absolute or relative, except under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    typing_only = {id(node) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                   for stmt in block.body for node in ast.walk(stmt)}
    here = (name or module_name(path)).split(".")
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_package else here[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            subs = {f"{module}.{alias.name}" for alias in node.names} & known
            found |= subs if len(subs) == len(node.names) else {module} | subs
    return found


def import_graph() -> dict[str, set[str]]:
    modules = source_modules()
    known = set(modules)
    return {m: imports_of(f, known) for m, f in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), inside the graph only."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v] & graph.keys():
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def top(name: str) -> str:
    return name.split(".")[0]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_engine_never_imports_the_ui_stack():
    bad = [(m, t) for m, targets in import_graph().items() if top(m) == "engine"
           for t in targets if top(t) in UI_STACK]
    assert bad == []


def spine_and_speed_layer() -> set[str]:
    """engine's top-level modules (less the one that joins the rooms) and everything under engine/fast/."""
    top_level = {module_name(f) for f in (ROOT / "engine").glob("*.py") if f.name != "__init__.py"}
    fast = {m for m in source_modules() if m.startswith("engine.fast.")}
    return (top_level - set(JOINS_THE_ROOMS)) | fast


def rooms_reached(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, target) for every import from the spine or the speed layer into another engine room."""
    allowed = spine_and_speed_layer() | {"engine", "engine.fast"}
    return [(m, t) for m in sorted(spine_and_speed_layer()) for t in sorted(graph[m])
            if top(t) == "engine" and t not in allowed]


def test_the_spine_and_the_speed_layer_import_no_other_room():
    """Model code never knows it is distributed: tensor, ops, nn, optim, ... and engine/fast/ import
    nothing from comm/, parallel/ or any other folder of the engine."""
    assert len(spine_and_speed_layer()) >= 12  # the derivation found the spine (tensor, ops, nn, ...)
    assert {"engine.tensor", "engine.ops", "engine.nn", "engine.optim", "engine.fast.kernels"} <= \
        spine_and_speed_layer()
    assert rooms_reached(import_graph()) == []


def test_model_code_never_imports_communication_or_parallel_code():
    bad = [(m, t) for m, targets in import_graph().items() if m in spine_and_speed_layer()
           for t in targets if t.startswith(("engine.comm", "engine.parallel"))]
    assert bad == []


OPTIONAL_ROOMS = {  # an optional extra's libraries, and the one room that may import them
    "tensorboard": "engine.sinks", "wandb": "engine.sinks", "mlflow": "engine.sinks",
    "fastapi": "nanodist_tui.serve", "uvicorn": "nanodist_tui.serve", "starlette": "nanodist_tui.serve",
    "h11": "nanodist_tui.serve", "anyio": "nanodist_tui.serve"}  # uvicorn's and starlette's own, in serve/


def test_optional_libraries_are_imported_only_in_their_room():
    """The sinks' libraries only in engine/sinks/, the web stack only in nanodist_tui/serve/ (so the engine
    never imports it): without an extra, everything else imports and runs."""
    bad = [(m, t) for m, targets in import_graph().items() for t in targets
           if top(t) in OPTIONAL_ROOMS and not m.startswith(OPTIONAL_ROOMS[top(t)])]
    assert bad == []


def test_torch_is_imported_only_by_the_benchmark_room():
    bad = [(m, t) for m, targets in import_graph().items() for t in targets
           if top(t) == "torch" and not m.startswith("engine.bench")]
    assert bad == []


@pytest.mark.parametrize("source, rule", [
    ("import textual\n", "ui"), ("from engine.comm.collectives import all_reduce\n", "model"),
    ("def f():\n    import torch\n", "torch")])
def test_the_rules_see_what_they_forbid(tmp_path, source, rule):
    """The checks above would notice a break: a module with a forbidden import is caught."""
    graph = import_graph()
    module = {"ui": "engine.trainer", "model": "engine.nn", "torch": "engine.trainer"}[rule]
    fake = tmp_path / "fake.py"
    fake.write_text(source)
    graph[module] = graph[module] | imports_of(fake, set(graph), module)
    if rule == "ui":
        assert any(top(t) in UI_STACK for t in graph[module])
    elif rule == "model":
        assert ("engine.nn", "engine.comm.collectives") in rooms_reached(graph)
    else:
        assert any(top(t) == "torch" for t in graph[module])


def test_a_new_top_level_module_is_spine_from_the_day_it_is_added(tmp_path, monkeypatch):
    """The spine is read from the folder, not from a list: a file added at engine's top level is held to
    the spine's rule without anyone editing this test."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "engine" / "fast").mkdir(parents=True)
    for name in ("__init__.py", "newcomer.py", "trainer.py", "fast/__init__.py", "fast/k.py"):
        (tmp_path / "engine" / name).write_text("")
    assert spine_and_speed_layer() == {"engine.newcomer", "engine.fast.k"}


def all_test_files() -> list[Path]:
    """Every test module and helper under tests/, by path."""
    return sorted(p for p in (ROOT / "tests").rglob("*.py"))


def test_no_test_module_imports_another():
    """Shared code lives in the helpers (tests/*_helpers.py), never in a test module another one imports:
    moving or deleting a test must not break a second."""
    bad = []
    for path in all_test_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [(path.name, n) for n in names if n.split(".")[-1].startswith("test_")]
    assert len(all_test_files()) > 80 and bad == []


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
