"""``load_object("pkg.module:attr", protocol=...)``: the one way FleetRL imports a plug-in by path.

It imports the module, walks the (possibly dotted) attribute, and checks what it found against a typed
protocol, so a wrong path or a wrong signature fails when the plug-in is loaded, in one error that names
the path and what is wrong, instead of as an ``AttributeError`` or ``TypeError`` at the first call:

- a runtime-checkable ``typing.Protocol``: ``isinstance`` (the members exist); when the protocol is a
  callable one (it defines ``__call__``), the object's signature must also accept that call's parameters
  (and, when that call takes ``**settings``, the ``keywords`` the caller passes: a plug-in's settings fields),
  an ``async`` ``__call__`` asks for an ``async`` function, and a ``__call__`` returning a protocol makes it a
  *factory* protocol: a class is checked as what it makes (its instances' members must exist);
- a class (an ABC such as ``Engine``): a class must be a subclass of it, anything else an instance.

Torch-free and FastAPI-free: the learner, the engines and the reward scorers use it too.
"""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from collections.abc import Iterable
from typing import Any

_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class LoadError(ValueError):
    """An import path cannot be loaded, or what it names does not fit the protocol asked for."""


def load_object(path: str, protocol: type | None = None, *, what: str = "object",
                keywords: Iterable[str] | None = None) -> Any:
    """The object ``path`` (``"package.module:attr"``, ``attr`` may be dotted) names, checked against ``protocol``.

    ``what`` names the plug-in in the error (``"reward function"``, ``"engine"`` ...); ``keywords``: the keyword
    arguments it will be called with besides the protocol's (its settings). Raises :class:`LoadError`.
    """
    if not isinstance(path, str) or not _PATH.match(path):
        raise LoadError(f"{what} {path!r}: not an import path; use 'package.module:attribute'")
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise LoadError(f"{what} {path!r}: cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:  # the module itself failed while importing (a user plug-in's bug)
        raise LoadError(f"{what} {path!r}: importing module {module_name!r} raised "
                        f"{type(exc).__name__}: {exc}") from exc
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            raise LoadError(f"{what} {path!r}: {owner!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if protocol is not None:
        problem = mismatch(obj, protocol, keywords=keywords)
        if problem:
            raise LoadError(f"{what} {path!r}: {problem}")
    return obj


def mismatch(obj: Any, protocol: type, *, keywords: Iterable[str] | None = None) -> str | None:
    """Why ``obj`` does not fit ``protocol``, or None when it does (``keywords``: see the module docstring)."""
    name = getattr(protocol, "__name__", repr(protocol))
    if getattr(protocol, "_is_protocol", False):
        if not getattr(protocol, "_is_runtime_protocol", False):
            raise TypeError(f"{name} must be decorated with @runtime_checkable to check plug-ins against it")
        if not isinstance(obj, protocol):
            missing = sorted(m for m in _protocol_members(protocol) if not hasattr(obj, m))
            return f"{_describe(obj)} is not a {name} (missing: {', '.join(missing) or 'its members'})"
        call = protocol.__dict__.get("__call__")
        if call is not None:
            given = None if keywords is None else tuple(keywords)
            return (_signature_mismatch(obj, call, name, given) or _async_mismatch(obj, call, name)
                    or _product_mismatch(obj, protocol, call, name))
        return None
    if inspect.isclass(obj):
        return None if issubclass(obj, protocol) else f"class {obj.__qualname__} is not a subclass of {name}"
    return None if isinstance(obj, protocol) else f"{_describe(obj)} is not a {name}"


def _async_mismatch(obj: Any, call: Any, name: str) -> str | None:
    """A protocol whose ``__call__`` is ``async`` asks for an ``async`` function (or an object with an ``async``
    ``__call__``), never a plain one returning something else."""
    if not inspect.iscoroutinefunction(call) or inspect.isclass(obj):
        return None
    target = obj if inspect.isfunction(obj) or inspect.ismethod(obj) else getattr(obj, "__call__", None)  # noqa: B004
    if inspect.iscoroutinefunction(target):
        return None
    return f"{_describe(obj)} must be async: {_a(name)} is awaited (`async def`)"


def _product_mismatch(obj: Any, protocol: type, call: Any, name: str) -> str | None:
    """A factory protocol (its ``__call__`` returns a protocol): a class must make what it returns."""
    if not inspect.isclass(obj):
        return None  # a function: what it returns is checked where it is called
    try:
        made = typing.get_type_hints(call).get("return")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: nothing to check
        return None
    if not (isinstance(made, type) and getattr(made, "_is_protocol", False)):
        return None
    missing = sorted(m for m in _protocol_members(made) if not hasattr(obj, m))
    if missing:
        return (f"class {obj.__qualname__} does not make {_a(made.__name__)} (its instances lack: "
                f"{', '.join(missing)}), so it is not {_a(name)}")
    return None


def _protocol_members(protocol: type) -> set[str]:
    members = getattr(protocol, "__protocol_attrs__", None)  # Python >= 3.12
    if members is None:
        from typing import _get_protocol_attrs  # type: ignore[attr-defined]  # Python < 3.12

        members = _get_protocol_attrs(protocol)
    return set(members)


def _signature_mismatch(obj: Any, call: Any, name: str, keywords: tuple[str, ...] | None) -> str | None:
    """``obj`` must accept the parameters ``call`` (the protocol's ``__call__``, ``self`` first) declares. When
    that call takes ``**settings`` (a plug-in's settings fields, as keyword arguments), ``obj`` must accept
    ``keywords`` too; with ``keywords`` None (settings unknown until it is called) only what it takes besides
    them is checked."""
    expected = list(inspect.signature(call).parameters.values())[1:]
    args = [p.name for p in expected if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kwargs = {p.name: p.name for p in expected if p.kind is p.KEYWORD_ONLY}
    takes_settings = any(p.kind is p.VAR_KEYWORD for p in expected)
    if takes_settings and keywords is not None:
        kwargs.update({k: k for k in keywords if k not in args})
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to compare
        return None
    try:
        if takes_settings and keywords is None:
            signature.bind_partial(*args, **kwargs)
        else:
            signature.bind(*args, **kwargs)
    except TypeError as exc:
        shown = ", ".join([*args, *(f"{k}=" for k in kwargs)])
        try:  # shown with its annotations evaluated, where they resolve
            signature = inspect.signature(obj, eval_str=True)
        except Exception:  # noqa: BLE001, S110 - a name only a type checker sees: show the text
            pass
        params = signature.replace(return_annotation=inspect.Signature.empty)
        return f"{_describe(obj)}{params} cannot be called as {name} ({shown}): {exc}"
    return None


def _a(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _describe(obj: Any) -> str:
    if inspect.isclass(obj):
        return f"class {obj.__qualname__}"
    if callable(obj) and hasattr(obj, "__qualname__"):
        return f"{'async ' if inspect.iscoroutinefunction(obj) else ''}function {obj.__qualname__}"
    return f"{type(obj).__name__} object"
