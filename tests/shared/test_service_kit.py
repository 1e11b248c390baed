"""The service kit: the import-path loader, the error envelope, the body limit, the control check, the app
factory's lifespan and its OpenAPI declarations (each service's own routes are tested in its own tree; the
spec of all three against real answers in tests/test_openapi_contract.py)."""

from __future__ import annotations

import abc
from typing import Any, Protocol, runtime_checkable

import pytest

from shared.service_kit.loader import LoadError, load_object


# ---- the loader -------------------------------------------------------------------------------------------
@runtime_checkable
class ThreeArgs(Protocol):
    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], /, **kwargs: Any) -> dict: ...


@runtime_checkable
class ByKeyword(Protocol):
    def __call__(self, *, data_source: str, solution_str: str) -> float: ...


@runtime_checkable
class HasName(Protocol):
    name: str


class Base(abc.ABC):
    @abc.abstractmethod
    def run(self) -> None: ...


class Impl(Base):
    def run(self) -> None: ...


class NotImpl:
    pass


def three(queries, prompts, labels, bonus=0.0):
    return {}


def two(queries, prompts):
    return {}


def keywords(data_source, solution_str, extra=None):
    return 0.0


class Named:
    name = "x"


named = Named()
HERE = __name__


def test_loads_what_the_path_names_and_walks_dotted_attributes():
    assert load_object(f"{HERE}:three") is three
    assert load_object(f"{HERE}:Named.name") == "x"
    assert load_object("json:dumps") is __import__("json").dumps


@pytest.mark.parametrize(("path", "needle"), [
    ("json.dumps", "not an import path; use 'package.module:attribute'"),
    ("json:", "not an import path"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    (f"{HERE}:missing", f"'{HERE}' has no attribute 'missing'"),
    (f"{HERE}:Named.missing", "has no attribute 'missing'"),
])
def test_a_bad_path_is_one_clear_error_naming_it(path, needle):
    with pytest.raises(LoadError, match="reward function") as info:
        load_object(path, what="reward function")
    assert needle in str(info.value) and repr(path) in str(info.value)


def test_a_module_that_fails_to_import_is_reported_with_its_error(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LoadError, match="importing module 'broken_plugin_mod' raised RuntimeError: boom at import"):
        load_object("broken_plugin_mod:f")


def test_callable_protocols_check_the_signature():
    assert load_object(f"{HERE}:three", ThreeArgs) is three
    with pytest.raises(LoadError, match=r"function two\(queries, prompts\) cannot be called as ThreeArgs"):
        load_object(f"{HERE}:two", ThreeArgs)
    assert load_object(f"{HERE}:keywords", ByKeyword) is keywords
    with pytest.raises(LoadError, match="cannot be called as ByKeyword"):
        load_object(f"{HERE}:three", ByKeyword)
    with pytest.raises(LoadError, match="is not a ThreeArgs"):
        load_object(f"{HERE}:named", ThreeArgs)


def test_member_protocols_and_classes():
    assert load_object(f"{HERE}:named", HasName) is named
    with pytest.raises(LoadError, match=r"is not a HasName \(missing: name\)"):
        load_object(f"{HERE}:three", HasName)
    assert load_object(f"{HERE}:Impl", Base) is Impl
    with pytest.raises(LoadError, match="class NotImpl is not a subclass of Base"):
        load_object(f"{HERE}:NotImpl", Base)


def test_a_protocol_that_cannot_be_checked_is_a_programming_error():
    class Plain(Protocol):
        def __call__(self) -> None: ...

    with pytest.raises(TypeError, match="runtime_checkable"):
        load_object(f"{HERE}:three", Plain)
