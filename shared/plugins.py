"""Plug-in points: the one shape of every place FleetRL takes an implementation by kind.

A :class:`PluginPoint` maps a *kind* (``"hf"``, ``"grpo"``, ``"tis"`` ...) to

- its **settings model**: a pydantic model whose tag field (``kind``, or ``name`` for algorithms) defaults to
  the kind, validated wherever the settings name the kind (None for points whose kinds take no settings of
  their own), and
- its **implementation**: the object itself, or a lazy ``"package.module:attr"`` import path, loaded on first
  use with :func:`~shared.service_kit.loader.load_object` and checked against the point's base type (every
  point has one: a class, or a runtime-checkable protocol; a callable protocol whose ``__call__`` takes
  ``**settings`` also checks that the implementation accepts its kind's settings fields).

A settings field typed ``point.settings_type()`` accepts every kind registered *when it validates*: a
registered plug-in is also configurable, with its own settings model, and an unknown kind is a validation
error that lists the known ones. Registering happens in Python (a module the operator's settings import, or a
program that builds the settings itself); a request can never name an import path.

Each point's own module says what its implementation must be (an ``Engine`` subclass, a loss function ...)
and how it is called. ``fleetrl plugins`` lists every point, its kinds and each kind's settings. Torch-free.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticCustomError, core_schema

from shared.service_kit.loader import LoadError, load_object, mismatch

__all__ = ["IN_SETTINGS", "POINTS", "Plugin", "PluginPoint", "import_plugins", "kwargs_of", "point_of"]

#: the implementation of a kind whose settings carry the import path of your own (``custom``: ``path``)
IN_SETTINGS = "(your own: the import path in its settings)"

T = TypeVar("T")
_KIND = re.compile(r"^[A-Za-z_][\w.-]*$")

#: every plug-in point created, by name (in creation order): what ``fleetrl plugins`` lists
POINTS: dict[str, PluginPoint[Any]] = {}


@dataclass(frozen=True)
class Plugin(Generic[T]):
    """One registered kind."""

    kind: str
    settings: type[BaseModel] | None  # (an import path until first used, on points whose settings sit elsewhere)
    impl: T | str  # the implementation, or its import path (loaded on first use)
    doc: str = ""

    @property
    def impl_path(self) -> str:
        """Where the implementation lives, as ``module:attr``."""
        if isinstance(self.impl, str):
            return self.impl
        return f"{getattr(self.impl, '__module__', '?')}:{getattr(self.impl, '__qualname__', type(self.impl).__name__)}"


class PluginPoint(Generic[T]):
    """Kinds of one plug-in point; see the module docstring.

    ``name`` names the point (``"engine"``); ``where`` says where the settings choose a kind
    (``"rollout: engine.kind"``); ``tag`` is the field holding the kind in its settings (None: the kind is
    named by a plain string setting and its settings, if any, sit elsewhere); ``base`` is what every
    implementation must be (a class, a runtime-checkable protocol, or the import path of one, for points
    whose base imports heavy modules); ``settings_base``, when set, is the class every settings model must
    subclass (the fields the code around the point reads); ``default`` is the kind of a settings section
    that names none.
    """

    def __init__(self, name: str, *, where: str, doc: str, base: type | str, tag: str | None = "kind",
                 settings_base: type[BaseModel] | None = None, default: str | None = None) -> None:
        if name in POINTS:
            raise ValueError(f"plug-in point {name!r} exists already")
        if not isinstance(base, (type, str)):
            raise TypeError(f"plug-in point {name!r}: base must be a class, a runtime-checkable protocol or the "
                            f"import path of one (what every implementation is), got {base!r}")
        self.name, self.where, self.doc, self.tag = name, where, doc, tag
        self.settings_base, self.default = settings_base, default
        self._base = base
        self._entries: dict[str, Plugin[T]] = {}
        self._loaded: dict[str, T] = {}
        POINTS[name] = self

    # ---- registering -------------------------------------------------------------------------------
    def register(self, kind: str, settings: type[BaseModel] | str | None = None, impl: T | str | None = None, *,
                 doc: str = "", replace: bool = False) -> Any:
        """Add ``kind`` with its settings model and implementation (an object or ``"module:attr"``; on a point
        without a tag the settings model may be an import path too).

        Without ``impl`` it returns a decorator that registers what it decorates. A kind registered already
        is refused unless ``replace``. Returns ``impl``."""
        if impl is None:
            def deco(obj: T) -> T:
                self.register(kind, settings, obj, doc=doc, replace=replace)
                return obj

            return deco
        if not isinstance(kind, str) or not _KIND.match(kind):
            raise ValueError(f"{self.name} kind {kind!r}: use a plain name (letters, digits, _ . -), no ':'")
        if kind in self._entries and not replace:
            raise ValueError(f"{self.name} kind {kind!r} is registered already ({self._entries[kind].impl_path}); "
                             "pass replace=True to replace it")
        self._check_settings(kind, settings)
        if isinstance(impl, str) and ":" not in impl and impl != IN_SETTINGS:
            raise ValueError(f"{self.name} kind {kind!r}: {impl!r} is not an import path 'package.module:attr'")
        shown = settings if not isinstance(settings, str) else impl
        self._entries[kind] = Plugin(kind, settings, impl, doc or _first_line(shown))  # type: ignore[arg-type]
        self._loaded.pop(kind, None)
        return impl

    def unregister(self, kind: str) -> None:
        """Remove ``kind`` (tests put the registry back as they found it)."""
        self._entries.pop(kind, None)
        self._loaded.pop(kind, None)

    def _check_settings(self, kind: str, settings: type[BaseModel] | str | None) -> None:
        if isinstance(settings, str) and self.tag is None:  # an import path, resolved by settings_model()
            return
        if settings is None:
            if self.tag is not None:
                raise ValueError(f"{self.name} kind {kind!r} needs a settings model (its {self.tag!r} field "
                                 "chooses it)")
            return
        if not (isinstance(settings, type) and issubclass(settings, BaseModel)):
            raise TypeError(f"{self.name} kind {kind!r}: settings must be a pydantic model class, got {settings!r}")
        if self.settings_base is not None and not issubclass(settings, self.settings_base):
            raise TypeError(f"{self.name} kind {kind!r}: {settings.__name__} must subclass "
                            f"{self.settings_base.__name__} (the fields every {self.name} has)")
        if self.tag is not None:
            field = settings.model_fields.get(self.tag)
            if field is None or field.default != kind:
                raise ValueError(f"{self.name} kind {kind!r}: {settings.__name__} needs the field "
                                 f"`{self.tag}: Literal[{kind!r}] = {kind!r}`")

    # ---- looking up --------------------------------------------------------------------------------
    def __contains__(self, kind: object) -> bool:
        return kind in self._entries

    def __iter__(self) -> typing.Iterator[str]:
        return iter(list(self._entries))

    def kinds(self) -> list[str]:
        """The registered kinds, in registration order."""
        return list(self._entries)

    def entries(self) -> list[Plugin[T]]:
        return list(self._entries.values())

    def entry(self, kind: str) -> Plugin[T]:
        found = self._entries.get(kind)
        if found is None:
            raise KeyError(self.unknown(kind))
        return found

    def unknown(self, kind: object) -> str:
        """The message of an unknown kind: what was asked and what is known."""
        return f"unknown {self.name} {kind!r}; known: {', '.join(map(repr, self._entries)) or '(none)'}"

    def settings_model(self, kind: str) -> type[BaseModel] | None:
        """The settings model of ``kind`` (one given as an import path is imported now)."""
        entry = self.entry(kind)
        if isinstance(entry.settings, str):
            model = load_object(entry.settings, BaseModel, what=f"settings of {self.name} {kind!r}")
            entry = self._entries[kind] = Plugin(kind, model, entry.impl, entry.doc or _first_line(model))
        return entry.settings

    def load(self, kind: str) -> T:
        """The implementation of ``kind`` (imported and checked against the base on first use)."""
        if kind in self._loaded:
            return self._loaded[kind]
        impl = self.entry(kind).impl
        if impl == IN_SETTINGS:
            raise LoadError(f"{self.name} {kind!r} names its implementation in its settings (an import path)")
        base, keywords = self.base(), self._keywords(kind)
        if isinstance(impl, str):
            impl = load_object(impl, base, what=f"{self.name} {kind!r}", keywords=keywords)
        else:
            problem = mismatch(impl, base, keywords=keywords)
            if problem:
                raise LoadError(f"{self.name} {kind!r}: {problem}")
        self._loaded[kind] = impl
        return impl

    def base(self) -> type:
        """What every implementation of this point is (a base given as an import path is imported now)."""
        if isinstance(self._base, str):
            base = load_object(self._base, what=f"{self.name} base")
            if not isinstance(base, type):
                raise LoadError(f"{self.name} base {self._base!r}: {type(base).__name__} object is not a class")
            self._base = base
        return self._base

    def _keywords(self, kind: str) -> list[str] | None:
        """The fields of ``kind``'s settings model but the tag: the keyword arguments a point whose base takes
        ``**settings`` calls the implementation with (None: no model, the settings are not known here)."""
        model = self.settings_model(kind)
        return None if model is None else [name for name in model.model_fields if name != self.tag]

    # ---- settings ----------------------------------------------------------------------------------
    def validate(self, value: Any) -> BaseModel:
        """``value`` (a mapping with the tag, or a settings object) as its kind's settings model."""
        if self.tag is None:
            raise TypeError(f"the {self.name} point has no tagged settings; use options()")
        if isinstance(value, BaseModel):
            entry = self._entries.get(str(getattr(value, self.tag, None)))
            if entry is not None and entry.settings is not None and isinstance(value, entry.settings):
                return value
            value = value.model_dump()
        if not isinstance(value, dict):
            raise PydanticCustomError("plugin_settings", "{point} settings must be a mapping with `{tag}`, got {got}",
                                      {"point": self.name, "tag": self.tag, "got": type(value).__name__})
        kind = value.get(self.tag, self.default)
        if kind is None:
            raise PydanticCustomError("plugin_kind", "{point} settings need `{tag}` (one of: {known})",
                                      {"point": self.name, "tag": self.tag, "known": ", ".join(map(repr, self._entries))})
        entry = self._entries.get(kind) if isinstance(kind, str) else None
        if entry is None:
            raise PydanticCustomError("plugin_kind", "unknown {point} {tag} {kind}; known: {known}",
                                      {"point": self.name, "kind": repr(kind), "tag": self.tag,
                                       "known": ", ".join(map(repr, self._entries))})
        return entry.settings.model_validate(value)  # type: ignore[union-attr]

    def options(self, kind: str, value: Any) -> BaseModel | None:
        """For points whose kinds are named by a plain string: ``value`` (a mapping, or None) as ``kind``'s
        settings model; None when the kind takes no settings (then ``value`` must be empty)."""
        model = self.settings_model(kind)
        if model is None:
            if value:
                raise ValueError(f"{self.name} {kind!r} takes no settings of its own; got {sorted(value)}")
            return None
        if isinstance(value, model):
            return value
        return model.model_validate(value or {})

    def settings_type(self, name: str) -> Any:
        """The type of a settings field holding one kind's settings (``name`` is how listings show it):
        validated by the kind's own model, whatever kinds are registered when it validates."""
        return type(name, (_KindSettings,), {"__plugin_point__": self, "__module__": __name__})


class _KindSettings(Mapping):
    """Base of the types :meth:`PluginPoint.settings_type` makes (see :func:`point_of`). Never instantiated: a
    ``Mapping`` only so that settings sources read it as a section (``FLEETRL_ROLLOUT_ENGINE__DEVICE=cpu``)."""

    __plugin_point__: PluginPoint[Any]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        point = cls.__plugin_point__
        # the JSON schema shows the kinds registered when the enclosing model was built
        members = [handler.generate_schema(p.settings) for p in point.entries() if p.settings is not None]
        return core_schema.no_info_plain_validator_function(
            point.validate, json_schema_input_schema=core_schema.union_schema(members) if members else None)


def point_of(annotation: Any) -> PluginPoint[Any] | None:
    """The plug-in point of a field typed ``point.settings_type(...)`` (also inside ``list[...]``, ``X | None``
    or ``Annotated``), else None. Lets code that walks settings classes (setting paths, ``fleetrl settings``)
    see the kinds registered now."""
    if isinstance(annotation, type) and issubclass(annotation, _KindSettings):
        return annotation.__plugin_point__
    for arg in typing.get_args(annotation):
        found = point_of(arg)
        if found is not None:
            return found
    return None


_MODULE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def import_plugins(modules: Any, sys_path: Any = ()) -> None:
    """Import the modules an operator's ``plugins`` setting names, so the kinds they register can be configured
    in the same settings; the directories of ``sys_path`` go first on ``sys.path`` (as a python scorer's
    ``sys_path`` does), so a module that is a file of yours imports. ValueError (naming the module) when one is
    not a module name or fails to import."""
    import importlib
    import sys

    if isinstance(sys_path, (list, tuple)):
        for entry in reversed(sys_path):
            if isinstance(entry, str) and entry and entry not in sys.path:
                sys.path.insert(0, entry)
    if not isinstance(modules, (list, tuple)):
        return  # not a list: the field's own validation says so
    for name in modules:
        if not isinstance(name, str) or not _MODULE.match(name):
            raise ValueError(f"plugins: {name!r} is not a module name (e.g. mypkg.fleetrl_plugins)")
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing module or the plug-in's own failure: the same one-line error
            raise ValueError(f"plugins: importing {name!r} raised {type(exc).__name__}: {exc}") from exc


def _first_line(obj: Any) -> str:
    doc = getattr(obj, "__doc__", None) if not isinstance(obj, str) else None
    return " ".join((doc or "").strip().split("\n\n", 1)[0].split())


def kwargs_of(settings: BaseModel, tag: str = "kind") -> dict[str, Any]:
    """A kind's settings as the keyword arguments of its function (every field but the tag), values as they
    are (not dumped)."""
    return {name: getattr(settings, name) for name in type(settings).model_fields if name != tag}

