"""``fleetrl settings learner|rollout|reward|run``: every field of a settings class (nested sections and the
members of discriminated unions too) with its type, default, bounds and one-line description, generated from the
classes themselves so the listing cannot drift from what the services accept.

A section that appears in several places (the same class under every algorithm, say) is listed once; later
places point back to it.
"""

from __future__ import annotations

import enum
import inspect
import typing
from collections.abc import Iterator
from typing import Any, Literal

import annotated_types as at
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from shared.plugins import point_of
from shared.settings_paths import models_in

#: what ``fleetrl settings NAME`` documents: (import path of the class, how its process reads it)
_SERVICE_HOW = ("fleetrl {0} --config FILE (YAML/TOML/JSON); environment FLEETRL_{1}_<FIELD>, sections joined "
                "by __ (FLEETRL_{1}_SECTION__FIELD)")
TARGETS: dict[str, tuple[str, str]] = {
    "learner": ("services.learner.settings:LearnerSettings", _SERVICE_HOW.format("learner", "LEARNER")),
    "rollout": ("services.rollout.settings:RolloutSettings", _SERVICE_HOW.format("rollout", "ROLLOUT")),
    "reward": ("services.reward.settings:RewardSettings", _SERVICE_HOW.format("reward", "REWARD")),
    "run": ("deploy.run.spec:RunSpec", ("the run spec: fleetrl run FILE [--set a.b=c]; a service's own settings "
                                        "go under services.<name> (fleetrl settings learner|rollout|reward)")),
}


def settings_class(target: str) -> type[BaseModel]:
    import importlib

    module, _, name = TARGETS[target][0].partition(":")
    return getattr(importlib.import_module(module), name)


def describe_type(annotation: Any) -> str:
    """A short, readable type: ``float``, ``int | None``, ``'cosine' | 'linear'``, ``list[str]``, a section."""
    point = point_of(annotation)
    if point is not None and isinstance(annotation, type):  # a plug-in point's field: the kinds registered now
        return "one of " + " | ".join(point.kinds()) + f" (by {point.tag})"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return describe_type(args[0])
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        models = models_in(annotation)
        if len(models) > 1:
            tags = [_tag(m) for m in models]
            if all(tags) and len({t[0] for t in tags}) == 1:
                return "one of " + " | ".join(str(t[1]) for t in tags) + f" (by {tags[0][0]})"
            return "one of " + " | ".join(_variant_name(m) for m in models)
        return " | ".join(describe_type(a) for a in args)
    if origin in (list, tuple, dict, set):
        inner = ", ".join(describe_type(a) for a in args) if args else ""
        return f"{origin.__name__}[{inner}]" if inner else origin.__name__
    if annotation is type(None):
        return "None"
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(repr(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def _tag(model: type[BaseModel]) -> tuple[str, str] | None:
    """(discriminator field, value) of a union member: the one field typed as a single Literal."""
    for name in ("name", "kind", "type"):
        f = model.model_fields.get(name)
        if f is not None and typing.get_origin(f.annotation) is Literal and len(typing.get_args(f.annotation)) == 1:
            return name, typing.get_args(f.annotation)[0]
    return None


def _variant_name(model: type[BaseModel]) -> str:
    tag = _tag(model)
    return f"{tag[0]}: {tag[1]}" if tag else model.__name__


def describe_default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:  # a factory that takes the validated data
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        tag = _tag(type(value))
        return f"{tag[0]}: {tag[1]}" if tag else "(section defaults)"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, enum.Enum):
        value = value.value
    return repr(value) if isinstance(value, str) else str(value)


def describe_bounds(field: FieldInfo) -> str:
    marks = {at.Ge: (">=", "ge"), at.Gt: (">", "gt"), at.Le: ("<=", "le"), at.Lt: ("<", "lt")}
    out = []
    for m in field.metadata:
        for kind, (sign, attr) in marks.items():
            if isinstance(m, kind):
                out.append(f"{sign} {getattr(m, attr)}")
        if isinstance(m, at.MinLen) and m.min_length:
            out.append(f"at least {m.min_length} long")
        if isinstance(m, at.MaxLen):
            out.append(f"at most {m.max_length} long")
        pattern = getattr(m, "pattern", None)
        if isinstance(pattern, str):
            out.append(f"matches {pattern}")
    return ", ".join(out)


def first_line(text: str | None) -> str:
    text = inspect.cleandoc(text or "")
    return " ".join(text.split("\n\n", 1)[0].split())


def field_lines(model: type[BaseModel], prefix: str = "", seen: dict[type, str] | None = None,
                printed: set[str] | None = None, tag_field: str | None = None) -> Iterator[str]:
    """The listing of ``model``'s fields under ``prefix`` (``optim.``): one header line per field and its
    description indented under it; sections follow their field. A union member lists only the fields its
    siblings listed differently (the rest are named on its header line)."""
    seen = {} if seen is None else seen
    printed = set() if printed is None else printed
    for name, field in model.model_fields.items():
        if name == tag_field:  # a union member's kind: on its header line
            continue
        path = f"{prefix}{name}"
        models = models_in(field.annotation)
        bounds = describe_bounds(field)
        desc = field.description or (first_line(models[0].__doc__) if len(models) == 1 else "")
        if not desc and len(models) > 1 and (tag := _tag(models[0])):
            desc = f"One of {len(models)} kinds, chosen by {path}.{tag[0]}; each kind's fields follow."
        head = f"{path}: {describe_type(field.annotation)} = {describe_default(field)}"
        head += f"  ({bounds})" if bounds else ""
        entry = f"{head}\n    {desc or '(no description)'}"
        if entry in printed:
            continue
        printed.add(entry)
        yield entry
        for sub in models:
            tag = _tag(sub) if len(models) > 1 else None
            where = f"{path} ({tag[0]}: {tag[1]})" if tag else path
            if sub in seen:
                yield f"  {where}: the same section as {seen[sub]}"
                continue
            seen[sub] = where
            if not tag:
                yield from field_lines(sub, path + ".", seen, printed)
                continue
            own = list(field_lines(sub, path + ".", seen, printed, tag_field=tag[0]))
            listed = {line.split(":", 1)[0].removeprefix(path + ".") for line in own if not line.startswith(" ")}
            shared = [n for n in sub.model_fields if n not in listed and n != tag[0]]
            doc = first_line(sub.__doc__)
            yield f"  {where}{': ' + doc if doc else ''}"
            if shared:
                yield f"  {where} also has, as listed above: {', '.join(shared)}"
            yield from own


def render(target: str, section: str | None = None) -> str:
    """The listing of ``fleetrl settings TARGET [SECTION]``; ValueError names a section that does not exist."""
    cls = settings_class(target)
    module, how = TARGETS[target]
    lines = list(field_lines(cls))
    if section:
        keep, on = [], False
        for line in lines:
            if not line.startswith(" "):
                on = line.startswith((f"{section}:", f"{section}.", f"{section} ("))
            elif line.startswith("  ") and not line.startswith("    "):
                on = line.strip().startswith((f"{section}.", f"{section} ("))
            if on:
                keep.append(line)
        if not keep:
            tops = ", ".join(cls.model_fields)
            raise ValueError(f"{target} settings have no section {section!r} (top-level fields: {tops})")
        lines = keep
    header = [f"# {target} settings: {module.replace(':', '.')}", f"# {how}",
              f"# {first_line(cls.__doc__)}", "# path: type = default  (bounds)", ""]
    return "\n".join(header + lines) + "\n"
