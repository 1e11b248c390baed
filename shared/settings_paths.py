"""Dotted setting paths of a settings class, as a user writes them: every ``section.field`` (members of
discriminated unions included, without their tags), the path of a pydantic error location, and the closest
valid path to a misspelt one. Torch-free; used by every service's settings errors and by the run spec."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel

from shared.plugins import point_of


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X``, ``X | None``, ``list[X]``, unions, ``Annotated``; a
    plug-in point's field: the settings models of the kinds registered now)."""
    point = point_of(annotation)
    if point is not None:
        return [p.settings for p in point.entries() if p.settings is not None]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        for m in models_in(arg):
            if m not in out:
                out.append(m)
    return out


def known_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every dotted setting path of ``model`` (members of discriminated unions included)."""
    out: set[str] = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        out.add(path)
        for sub in models_in(field.annotation):
            out |= known_paths(sub, path + ".")
    return out


def all_field_names(model: type[BaseModel]) -> set[str]:
    return {p.rsplit(".", 1)[-1] for p in known_paths(model)}


def user_path(model: type[BaseModel], loc: tuple) -> str:
    """pydantic's error location as the user wrote it: no union tags, list indices in brackets."""
    names = all_field_names(model)
    parts: list[str] = []
    for i, p in enumerate(loc):
        if isinstance(p, int):
            parts[-1:] = [f"{parts[-1]}[{p}]"] if parts else [f"[{p}]"]
        elif p in names or i == len(loc) - 1:  # the last part may be a key the user made up
            parts.append(str(p))
    return ".".join(parts)


def closest_path(model: type[BaseModel], path: str) -> str | None:
    """The valid setting path nearest to ``path`` (a misspelt key), or None when none is close. Compared within
    the same section first (``optim.actor_lrr`` -> ``optim.actor_lr``), then across the whole class."""
    import re

    bare = re.sub(r"\[\d+\]", "", path)
    paths = sorted(known_paths(model))
    section, _, leaf = bare.rpartition(".")
    siblings = [p.rpartition(".")[2] for p in paths if p.rpartition(".")[0] == section]
    near = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    if near:
        return f"{section}.{near[0]}" if section else near[0]
    near = difflib.get_close_matches(bare, paths, n=1, cutoff=0.6)
    return near[0] if near else None
