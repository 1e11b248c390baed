"""``fleetrl plugins``: every plug-in point, its kinds and each kind's settings, read from the registries
themselves (``shared/plugins.py``), so the listing cannot drift from what the services accept.

A point whose kinds share a settings base lists the shared fields once; each kind lists its own.
"""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from deploy.run.settings_doc import describe_default, describe_type
from shared.plugins import POINTS, PluginPoint

#: the modules that create the plug-in points (in the order they are listed)
POINT_MODULES = (
    "services.rollout.engines.settings",
    "services.reward.scorer_config",
    "services.rollout.worker.functions",
    "services.rollout.agents.environments",
    "services.learner.algorithms.algorithm_settings",
    "services.learner.algorithms.policy_loss_settings",
    "services.learner.algorithms.correction_settings",
    "services.rollout.weights.settings",
    "services.learner.weights.transport",
)


def points(extra_modules: tuple[str, ...] = ()) -> list[PluginPoint[Any]]:
    """Every plug-in point, after importing the modules that create them (and ``extra_modules``: your own
    registrations, as a service's ``plugins`` setting would import them)."""
    from shared.plugins import import_plugins

    for module in POINT_MODULES:
        importlib.import_module(module)
    import_plugins(list(extra_modules))
    return list(POINTS.values())


def _field(name: str, field: FieldInfo) -> dict[str, str]:
    return {"name": name, "type": describe_type(field.annotation), "default": describe_default(field),
            "description": " ".join((field.description or "").split())}


def _fields(model: type[BaseModel] | None, skip: set[str]) -> list[dict[str, str]]:
    if model is None:
        return []
    return [_field(n, f) for n, f in model.model_fields.items() if n not in skip]


def _shared_bases(point: PluginPoint[Any]) -> dict[type[BaseModel], list[str]]:
    """Settings classes (other than the point's base) that two or more kinds' models derive from, with the
    kinds deriving from each: their fields are listed once."""
    models = {k: point.settings_model(k) for k in point.kinds()}
    found: dict[type[BaseModel], list[str]] = {}
    for kind, model in models.items():
        for cls in (model.__mro__[1:] if model is not None else ()):
            if (isinstance(cls, type) and issubclass(cls, BaseModel) and cls not in (BaseModel, point.settings_base)
                    and cls.model_fields):
                found.setdefault(cls, []).append(kind)
                break
    return {cls: kinds for cls, kinds in found.items() if len(kinds) > 1}


def catalogue(extra_modules: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The listing as data (``fleetrl plugins --json``)."""
    out = []
    for point in points(extra_modules):
        base = point.settings_base
        common = set(base.model_fields) if base is not None else set()
        tag = {point.tag} if point.tag else set()
        shared = _shared_bases(point)
        kinds = []
        for kind in point.kinds():
            model = point.settings_model(kind)
            entry = point.entry(kind)
            parent = next((cls for cls in shared if model is not None and issubclass(model, cls)), None)
            # a field the shared parent has is listed there, unless this kind changes its default
            same = {n for n, f in (parent.model_fields.items() if parent else ())
                    if describe_default(f) == describe_default(model.model_fields[n])}
            kinds.append({"kind": kind, "implementation": entry.impl_path, "doc": entry.doc,
                          "settings": model.__name__ if model is not None else None,
                          "also": parent.__name__ if parent else None,
                          "fields": _fields(model, common | tag | same)})
        out.append({"point": point.name, "where": point.where, "doc": point.doc, "tag": point.tag,
                    "common_fields": _fields(base, set()),
                    "shared": [{"settings": cls.__name__, "kinds": ks, "fields": _fields(cls, tag | common)}
                               for cls, ks in shared.items()],
                    "kinds": kinds})
    return out


def _short(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[:width].rsplit(" ", 1)[0] + " ..."


def render(extra_modules: tuple[str, ...] = ()) -> str:
    """The listing as text: per point its kinds, each with its implementation and its own settings fields."""
    lines = ["# FleetRL plug-in points: kind -> implementation, then the kind's settings (field: type = default)",
             "# write your own: docs/plugins.md; full field descriptions: fleetrl settings learner|rollout|reward", ""]
    for point in catalogue(extra_modules):
        lines.append(f"{point['point']}: {point['doc']}")
        lines.append(f"  chosen by {point['where']}")
        if point["common_fields"]:
            lines.append(f"  every kind has: {', '.join(f['name'] for f in point['common_fields'])}")
        for group in point["shared"]:
            lines.append(f"  {', '.join(group['kinds'])} share {group['settings']}: "
                         f"{', '.join(f['name'] for f in group['fields'])}")
        for kind in point["kinds"]:
            lines.append(f"  {kind['kind']}  ->  {kind['implementation']}")
            if kind["doc"]:
                lines.append(f"      {_short(kind['doc'])}")
            if kind["settings"] is None:
                lines.append("      (no settings of its own)")
            elif kind["also"]:
                lines.append(f"      ({kind['also']}, and:)" if kind["fields"] else f"      ({kind['also']})")
            for f in kind["fields"]:
                lines.append(f"      {f['name']}: {f['type']} = {f['default']}")
        lines.append("")
    return "\n".join(lines)
