"""Read a run spec: the file, then ``--set a.b=c`` overrides, validated as strictly as the file. Every problem is
one line naming the setting (and, for an unknown key, the closest valid one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from shared import settings_paths
from shared.settings import SettingsError, read_config_file
from shared.settings_paths import closest_path

from .spec import RunSpec, import_spec_plugins, resolve_paths


class SpecError(ValueError):
    """The run spec (or an override) is not valid; the message has one line per problem."""


def parse_set(item: str) -> tuple[list[str], Any]:
    """``"a.b=c"`` -> (["a", "b"], c parsed as YAML: numbers, booleans, null, lists and mappings as written)."""
    key, sep, raw = item.partition("=")
    path = key.strip().split(".")
    if not sep or not all(path):
        raise SpecError(f"--set {item!r}: write it as key.path=value, e.g. --set train.max_steps=20")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise SpecError(f"--set {item}: the value is not valid YAML ({exc.problem})") from exc
    return path, value


def apply_set(raw: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``value`` at ``path`` in ``raw``: a section by its key (made when missing), a list's item by its index
    (``reward.scorers.0.url``). A refusal names the path, never the values there (a scorer's api_key)."""
    node: Any = raw
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                items = f"by its index ({'0' if len(node) == 1 else f'0 to {len(node) - 1}'})" if node else \
                    "(it is empty: write the whole list, --set key='[...]')"
                raise SpecError(f"--set {'.'.join(path)}: {'.'.join(path[:i])} is a list of {len(node)}: name an "
                                f"item {items}")
            part = int(part)  # type: ignore[assignment]
        elif not isinstance(node, dict):
            raise SpecError(f"--set {'.'.join(path)}: {'.'.join(path[:i])} is a {type(node).__name__}, not a section")
        elif not last:
            node.setdefault(part, {})
        if last:
            node[part] = value
        else:
            node = node[part]


def load_spec(file: str | Path, sets: list[str] | tuple[str, ...] = ()) -> RunSpec:
    """The validated spec of ``file`` with ``sets`` applied. Raises SpecError."""
    path = Path(file)
    try:
        raw = read_config_file(path)
    except SettingsError as exc:
        raise SpecError(str(exc)) from exc
    from_set: set[str] = set()
    for item in sets:
        keys, value = parse_set(item)
        apply_set(raw, keys, value)
        from_set.add(".".join(keys))
    raw = resolve_paths(raw, path.resolve().parent)
    try:  # before the sections: they validate against the kinds the plugins register
        import_spec_plugins(raw)
    except ValueError as exc:
        given = sorted(k for k in from_set if k.split(".")[0] in ("plugins", "sys_path"))
        raise SpecError(f"{f'--set {given[0]}' if given else path}: {exc}") from exc
    try:
        return RunSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError("\n".join(describe(err, path, from_set) for err in exc.errors())) from exc


def import_spec_file_plugins(file: str | Path) -> list[str]:
    """Import the ``plugins`` of the spec ``file`` as ``fleetrl run`` would (nothing else of it is validated);
    returns their names. Raises SpecError naming the setting."""
    path = Path(file)
    try:
        raw = resolve_paths(read_config_file(path), path.resolve().parent)
        import_spec_plugins(raw)
    except (SettingsError, ValueError) as exc:
        raise SpecError(str(exc) if isinstance(exc, SettingsError) else f"{path}: {exc}") from exc
    return list(raw.get("plugins") or [])


def describe(err: dict, file: Path, from_set: set[str]) -> str:
    """One line for one validation error: where it came from, the setting, what is wrong."""
    setting = user_path(err["loc"])
    related = [k for k in sorted(from_set) if k == setting or k.startswith(f"{setting}.") or
               setting.startswith(f"{k}.") or not setting]
    source = f"--set {related[0]}" if related else str(file)
    if err["type"] == "extra_forbidden":
        near = closest_path(RunSpec, setting)
        hint = f" (did you mean {near}?)" if near else ""
        return f"{source}: unknown setting {setting}{hint}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{source}: {setting or '<top level>'}: {msg}"


def user_path(loc: tuple) -> str:
    """pydantic's error location as the user wrote it: no union tags, list indices in brackets."""
    return settings_paths.user_path(RunSpec, loc)
