"""Presets: finding, loading, editing and saving TOML run descriptions without losing their comments.

Lookup order for a bare name: $NANODIST_PRESETS (one or more folders, os.pathsep-separated), ./presets,
the repository's presets/ (editable install), then the copy shipped inside the installed package
(nanodist_tui/presets). A name with ".toml" or a folder in it is a path. Documents are tomlkit documents:
load -> save unchanged is byte-identical, and `set_value` rewrites exactly one line, keeping its comment
(a key it adds gets the setting's one-line doc and default as its comment, like the shipped presets).
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import ParseError, TOMLKitError
from tomlkit.items import Float, Item

from engine import config, paths
from engine.config import Config, ConfigError
from engine.config.wording import did_you_mean
from engine.run import atomic_file


@dataclass(frozen=True)
class PresetInfo:
    name: str
    path: Path
    origin: str  # "user" | "cwd" | "repo" | "package": which search folder it came from
    description: str
    error: str | None = None  # set when the file does not parse; the preset is still listed


def search_dirs() -> list[tuple[str, Path]]:
    """Existing preset folders in lookup order, duplicates removed."""
    user = os.environ.get("NANODIST_PRESETS", "")
    candidates = [("user", Path(p).expanduser()) for p in user.split(os.pathsep) if p]
    candidates += [("cwd", Path.cwd() / "presets"), ("repo", Path(__file__).resolve().parents[2] / "presets")]
    candidates += [("package", p) for p in _package_dirs()]
    seen, out = set(), []
    for origin, folder in candidates:
        if folder.is_dir() and (real := folder.resolve()) not in seen:
            seen.add(real)
            out.append((origin, folder))
    return out


def _package_dirs() -> list[Path]:
    # find_spec locates the installed package without importing it (engine never imports the UI stack)
    try:
        spec = importlib.util.find_spec("nanodist_tui")
    except (ImportError, ValueError):
        return []
    return [Path(loc) / "presets" for loc in (spec.submodule_search_locations or [])] if spec else []


def list_presets() -> list[PresetInfo]:
    """Every preset name once (earlier folders shadow later ones), sorted by name."""
    found: dict[str, PresetInfo] = {}
    for origin, folder in search_dirs():
        for path in sorted(folder.glob("*.toml")):
            if path.stem in found:
                continue
            try:
                text = paths.read_small(path).decode("utf-8")
                description, error = str(tomllib.loads(text).get("description", "")), None
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, paths.PathError) as exc:
                description, error = "", " ".join(str(exc).split())
            found[path.stem] = PresetInfo(path.stem, path, origin, description, error)
    return [found[name] for name in sorted(found)]


def find_preset(name_or_path: str | os.PathLike) -> Path:
    """Path of a preset given by name (search folders) or by path; ConfigError if there is none."""
    return find_named_file(name_or_path, [folder for _, folder in search_dirs()], "preset")


def find_named_file(name_or_path: str | os.PathLike, folders: list[Path], what: str) -> Path:
    """A TOML file given by path, or by name: the first `folders` entry holding <name>.toml. ConfigError
    (naming a close name, or the ones there are) when there is none; `what` is "preset", "cluster", ..."""
    path = Path(name_or_path).expanduser()
    by_path = path.suffix == ".toml" or len(path.parts) > 1
    try:  # by name, <name>.toml is what the file system is asked for
        paths.check_name(path if by_path else f"{path.name}.toml")
    except paths.PathError as exc:
        raise ConfigError("", exc.problem, exc.fix, source=str(path)) from None
    if by_path:
        if path.exists():  # a folder, FIFO or device is refused by name when read (read_document)
            return path
        raise ConfigError("", "file not found", f"check the path, or give the name of a {what}",
                          source=str(path))
    for folder in folders:
        if (folder / f"{path.name}.toml").is_file():
            return folder / f"{path.name}.toml"
    names = sorted({p.stem for folder in folders for p in folder.glob("*.toml")})
    close = difflib.get_close_matches(path.name, names, n=1)
    fix = f"did you mean {close[0]}?" if close else "available: " + (", ".join(names) or "none")
    raise ConfigError("", f"no {what} with this name", fix, source=str(path))


def read_document(path: str | os.PathLike) -> tomlkit.TOMLDocument:
    """Parse a TOML file keeping comments and spelling; errors become a one-line ConfigError with the line."""
    path = Path(path)
    try:
        text = paths.read_small(path).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError("", "file not found", "check the path", source=str(path)) from None
    except paths.PathError as exc:
        raise ConfigError("", exc.problem, exc.fix, source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"cannot read: {exc}", "save it as UTF-8 text", source=str(path)) from None
    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        line, problem = getattr(exc, "line", None), re.sub(r" at line \d+ col \d+$", "", str(exc)).rstrip(".")
        if line is None:  # e.g. a duplicate key: tomlkit has no position, the stdlib parser does
            try:
                tomllib.loads(text)
            except tomllib.TOMLDecodeError as std:
                found = re.search(r"\(at line (\d+), column \d+\)", str(std))
                line = int(found.group(1)) if found else None
        raise ConfigError("", f"TOML syntax error: {problem}", "fix the TOML (quotes, brackets, keys)",
                          source=str(path), line=line) from None


def load_preset(name_or_path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()
                ) -> tuple[Config, tomlkit.TOMLDocument, Path]:
    """(validated Config, the tomlkit document with overrides applied, the file's path)."""
    path = find_preset(name_or_path)
    doc = read_document(path)
    return apply_overrides(doc, overrides, source=str(path)), doc, path


class Override(str):
    """A "key=value" override that came from a flag other than --set (--world-size 3 is
    "parallel.world_size=3"): `flag` is what the user typed, so an error it causes names that flag."""

    flag: str

    def __new__(cls, key_value: str, flag: str) -> Override:
        made = super().__new__(cls, key_value)
        made.flag = flag
        return made


def flag_of(raw: str) -> str:
    """How the user spelled an override: its flag (--world-size 3) or --set key=value."""
    return raw.flag if isinstance(raw, Override) else f"--set {raw}"


def apply_overrides(doc: tomlkit.TOMLDocument | dict, overrides: list[str] | tuple[str, ...] = (),
                    source: str = "<preset>") -> Config:
    """Set each "a.b=value" in doc (in place; comments kept) and return the validated Config.

    Values are TOML literals (3e-4, true, [1, 2], "x"); anything that does not parse is taken as a string.
    Errors name the flag of the override they concern ("--set a.b=value", or "--world-size 3" for an
    Override): the override of the key itself (for a sweep parameter: any of its attributes, which are
    checked against each other), else the override without which the error goes away (--world-size 3 makes
    the file's global_batch unsplittable: the flag is the mistake, not the file's line); else `source` and
    the key's line.
    """
    before = doc.as_string() if isinstance(doc, tomlkit.TOMLDocument) else None
    original = copy.deepcopy(doc.unwrap() if isinstance(doc, tomlkit.TOMLDocument) else doc)
    set_keys: dict[str, str] = {}
    for raw in overrides:
        key, eq, text = (part.strip() for part in raw.partition("="))
        where = flag_of(raw)
        if not eq or not key or not text:
            raise ConfigError("", f'"{raw}" is not of the form key=value', "write e.g. --set optim.lr=3e-4",
                              source="--set")
        known = config.setting_keys()
        if key not in known and not key.startswith("sweep.space."):
            raise ConfigError(key, "unknown key", did_you_mean(key, known), source=where)
        value = _parse_literal(text, key)
        if before is not None:
            set_value(doc, key, value)
        else:
            _set_plain(doc, key, value)
        set_keys[key] = where
    plain = doc.unwrap() if isinstance(doc, tomlkit.TOMLDocument) else doc
    try:
        return config.from_dict(plain, source=source)
    except ConfigError as err:
        hit = [k for k in set_keys if err.key in (k, *_parents(k)) or err.key.startswith(k + ".")]
        hit = hit or [k for k in set_keys if (param := _search_param(k)) and
                      (err.key == param or err.key.startswith(param + "."))]
        hit = hit or _cause(original, overrides, err)
        if hit:
            err.source = set_keys[hit[0]]
        elif before is not None:  # the key's line, else its table's (a missing key belongs there)
            lines = (locate_key(before, k) for k in [err.key, *reversed(_parents(err.key))])
            err.line = next(filter(None, lines), None)
        raise


def _cause(original: dict, overrides: list[str] | tuple[str, ...], err: ConfigError) -> list[str]:
    """The overridden keys without which `err` goes away: each override left out in turn, the rest applied
    to the untouched document. A rule that reads several keys (global_batch against world_size) reports
    one of them; this finds which of them the user changed. Empty when the file alone has the error."""
    keys = [k for raw in overrides if (k := raw.partition("=")[0].strip())]
    causes = []
    for skipped in keys:
        trial = copy.deepcopy(original)
        for raw in overrides:
            key, _, text = (part.strip() for part in raw.partition("="))
            if key != skipped:
                _set_plain(trial, key, _parse_literal(text, key))
        try:
            config.from_dict(trial, source="<without one override>")
        except ConfigError as again:
            if (again.key, again.problem) == (err.key, err.problem):
                continue
        causes.append(skipped)
    return causes


def _search_param(key: str) -> str | None:
    """"sweep.space.optim.lr" for "sweep.space.optim.lr.low"; None for a key that is no sweep attribute."""
    parts = config.split_key(key)
    return ".".join(parts[:3]) if len(parts) == 4 and parts[:2] == ("sweep", "space") else None


def _parents(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


def _parse_literal(text: str, key: str) -> Any:
    if config.field_type(key) is str and text[:1] not in "\"'":
        return text  # --set run.out_dir=2024 means the folder "2024", not a number
    try:
        parsed = tomlkit.parse(f"v = {text}\n")
    except ParseError:
        return text
    return parsed["v"] if list(parsed) == ["v"] else text


def _set_plain(d: dict, dotted: str, value: Any) -> None:
    *parents, last = config.split_key(dotted)
    for part in parents:
        d = d.setdefault(part, {})
    d[last] = value.unwrap() if isinstance(value, Item) else value


def set_value(doc: Any, dotted: str, value: Any) -> None:
    """Set one dotted key in a tomlkit document in place: one line changes, its comment and spacing stay.

    A float keeps the file's spelling style (3e-4 stays in exponent form); an equal value is left untouched;
    a missing key or table is added at the end of its table, commented with its doc (`_doc_comment`) unless
    `value` is an item that brings its own comment.
    """
    container, parts = doc, dotted.split(".")
    walked: list[str] = []
    while len(parts) > 1:  # greedy: a table may itself be named with dots ([sweep.space."optim.lr"])
        for n in range(len(parts) - 1, 0, -1):
            name = ".".join(parts[:n])
            if name in container and isinstance(container[name], dict):
                container, parts, walked = container[name], parts[n:], walked + parts[:n]
                break
        else:
            walked.append(parts[0])
            container.add(parts[0], _commented(tomlkit.table(), ".".join(walked)))
            container, parts = container[parts[0]], parts[1:]
    old = container.get(parts[0])
    item = _to_item(value, old)
    if old is None and not item.trivia.comment:
        item = _commented(item, dotted)
    if item is not old:
        container[parts[0]] = item


def _commented(item: Any, dotted: str) -> Any:
    if text := _doc_comment(dotted):
        item.comment(text)
        item.trivia.comment_ws = "  "
    return item


def _doc_comment(dotted: str) -> str | None:
    """The comment the shipped presets give a key or table: "meaning; default value"; None if unknown."""
    parts = config.split_key(dotted)
    if parts[:2] == ("sweep", "space") and len(parts) == 3:
        param = parts[2]
        return f"search over {param}: {config.describe(param)}" if config.field_type(param) else None
    if parts[:2] == ("sweep", "space") and len(parts) == 4:
        attr = next((f for f in dataclasses.fields(config.SearchParam) if f.name == parts[3]), None)
        return _with_default(attr.metadata["doc"], attr.default) if attr is not None else None
    try:
        text = config.describe(dotted)
    except KeyError:
        return None
    return _with_default(text, _defaults().get(dotted))


def _with_default(text: str, default: Any) -> str:
    return text if default is None else f"{text}; default {config.toml_repr(default)}"


def _defaults() -> dict[str, Any]:
    sweep = {f"sweep.{k}": v for k, v in _flat(config.to_dict(config.SweepConfig())).items()}
    return _flat(config.to_dict(config.Config())) | sweep


def _to_item(value: Any, old: Any) -> Any:
    """`old` is what tomlkit returns for the key: an Item, or a plain bool (bools cannot be subclassed)."""
    plain, old_plain = (x.unwrap() if hasattr(x, "unwrap") else x for x in (value, old))
    if old is not None and type(old_plain) is type(plain) and old_plain == plain:
        return old
    if isinstance(value, Item):
        return value
    if isinstance(value, float):
        exponent_style = isinstance(old, Float) and "e" in old.as_string().lower()
        return tomlkit.value(_float_text(value, exponent_style))
    return tomlkit.item(value)


def _float_text(v: float, exponent_style: bool) -> str:
    """Shortest TOML spelling of v; 0.0003 as 3e-4 when the file wrote exponents."""
    if not exponent_style or v == 0 or v != v or v in (float("inf"), float("-inf")):
        return repr(v)
    digits = next(p for p in range(17) if float(f"{v:.{p}e}") == v)
    mantissa, _, exp = f"{v:.{digits}e}".partition("e")
    return f"{mantissa}e{int(exp)}"


def resolved_document(doc: Any) -> tomlkit.TOMLDocument:
    """A copy of a valid preset document with every omitted setting filled in, marked "# default".

    What a run folder keeps: the preset's own lines and comments, plus the defaults it relied on.
    """
    out = tomlkit.parse(doc.as_string())
    present = _flat(out.unwrap())
    for key, value in _flat(config.to_dict(config.from_dict(out.unwrap(), source="<resolved>"))).items():
        if key not in present:
            item = tomlkit.item(value)
            item.comment("default")
            item.trivia.comment_ws = "  "
            set_value(out, key, item)
    return out


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_preset_name(name: str, source: str = "<preset>") -> None:
    """ConfigError unless `name` can name a preset file (letters, digits, '.', '_', '-')."""
    if not _NAME.match(name):
        raise ConfigError("name", f"{name!r} cannot name a preset", "use letters, digits, '.', '_' and '-' "
                          "(e.g. my-gpt)", source=source)


def save_as(doc: tomlkit.TOMLDocument, name: str, overrides: list[str] | tuple[str, ...] = (), *,
            folder: str | os.PathLike = "presets", force: bool = False, source: str = "<preset>") -> Path:
    """Save `doc` with `overrides` applied as the new preset `name` (folder/NAME.toml, its `name` set):
    comments and the spelling of numbers stay as written. ConfigError for a bad name, an existing file
    (unless `force`) or an override that does not validate; `doc` itself is left unchanged."""
    check_preset_name(name, source)
    target = Path(folder) / f"{name}.toml"
    if target.exists() and not force:
        raise ConfigError("name", f"{target} exists", "choose another name (or overwrite it: --force)",
                          source=source)
    copy = tomlkit.parse(doc.as_string())
    apply_overrides(copy, [*overrides, f"name={name}"], source=source)
    save_preset(copy, target)
    return target


def save_preset(doc: Any, path: str | os.PathLike) -> None:
    """Write a document atomically: nobody ever sees a half-written preset."""
    atomic_file.atomic_write_text(path, doc if isinstance(doc, str) else doc.as_string())


_PART = r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[A-Za-z0-9_-]+'
_DOTTED = rf"\s*(?:{_PART})(?:\s*\.\s*(?:{_PART}))*\s*"
_HEADER = re.compile(rf"^\s*\[\[?({_DOTTED})\]\]?\s*(?:#.*)?$")
_ASSIGN = re.compile(rf"^({_DOTTED})=")


def _key_name(dotted_text: str) -> str:
    return ".".join(p[1:-1] if p[0] in "\"'" else p for p in re.findall(_PART, dotted_text))


def locate_key(text: str, key: str) -> int | None:
    """1-based line where a dotted key (or a [section]) is written in TOML text, or None."""
    key = key.strip("[]")
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        if header := _HEADER.match(line):
            table = name = _key_name(header.group(1))
        elif assign := _ASSIGN.match(line):
            name = f"{table}.{_key_name(assign.group(1))}".lstrip(".")
        else:
            continue
        if name == key:
            return number
    return None


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v}
    return out


def diff_presets(a: Config | str | os.PathLike, b: Config | str | os.PathLike) -> list[tuple[str, Any, Any]]:
    """Settings that differ between two configs or presets (with defaults): [(key, a, b)]; None = absent."""
    fa, fb = (_flat(config.to_dict(x if isinstance(x, Config) else load_preset(x)[0])) for x in (a, b))
    order = {k: i for i, k in enumerate(config.setting_keys())}
    keys = sorted(fa.keys() | fb.keys(), key=lambda k: (order.get(k, len(order)), k))
    return [(k, fa.get(k), fb.get(k)) for k in keys if fa.get(k) != fb.get(k)]
