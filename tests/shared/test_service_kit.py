"""The service kit: the import-path loader, the error envelope, the body limit, the control check, the app
factory's lifespan and its OpenAPI declarations (each service's own routes are tested in its own tree; the
spec of all three against real answers in tests/test_openapi_contract.py)."""

from __future__ import annotations

import abc
from types import SimpleNamespace
from typing import Annotated, Any, Protocol, runtime_checkable

import pytest
from fastapi import APIRouter, Depends
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, SecretStr

from shared.service_kit.app import create_service_app
from shared.service_kit.deps import ControlDep, get_service
from shared.service_kit.errors import ErrorKind, ServiceError
from shared.service_kit.loader import LoadError, load_object
from shared.service_kit.validation import validation_message
from shared.telemetry import PrometheusText, metrics_response


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


@runtime_checkable
class Awaited(Protocol):
    async def __call__(self, ctx: Any) -> list: ...


@runtime_checkable
class WithSettings(Protocol):
    def __call__(self, x: Any, **settings: Any) -> float: ...


@runtime_checkable
class Made(Protocol):
    def reset(self) -> None: ...

    def step(self) -> None: ...


@runtime_checkable
class MakesMade(Protocol):
    def __call__(self, **args: Any) -> Made: ...


async def awaited(ctx):
    return []


def not_awaited(ctx):
    return []


def scaled(x, scale, shift=0.0):
    return 0.0


class Maker:
    def __init__(self, size: int = 1) -> None: ...

    def reset(self) -> None: ...

    def step(self) -> None: ...


class HalfMaker:
    def __init__(self) -> None: ...

    def reset(self) -> None: ...


def test_an_async_protocol_asks_for_an_async_function():
    assert load_object(f"{HERE}:awaited", Awaited) is awaited
    with pytest.raises(LoadError, match=r"function not_awaited must be async: an Awaited is awaited"):
        load_object(f"{HERE}:not_awaited", Awaited)


def test_a_protocol_taking_settings_checks_the_keywords_it_will_be_called_with():
    assert load_object(f"{HERE}:scaled", WithSettings, keywords=["scale"]) is scaled
    assert load_object(f"{HERE}:scaled", WithSettings) is scaled  # settings unknown: only x is checked
    with pytest.raises(LoadError, match=r"cannot be called as WithSettings \(x, scale=, bias=\).*'bias'"):
        load_object(f"{HERE}:scaled", WithSettings, keywords=["scale", "bias"])
    with pytest.raises(LoadError, match="missing a required argument: 'scale'"):
        load_object(f"{HERE}:scaled", WithSettings, keywords=[])  # its settings have no scale


def test_a_factory_protocol_checks_what_a_class_makes():
    assert load_object(f"{HERE}:Maker", MakesMade, keywords=["size"]) is Maker
    with pytest.raises(LoadError, match=r"class HalfMaker does not make a Made \(its instances lack: step\), so it is "
                                        r"not a MakesMade"):
        load_object(f"{HERE}:HalfMaker", MakesMade)
    with pytest.raises(LoadError, match=r"class Maker\(.*\) cannot be called as MakesMade \(colour=\): got an "
                                        r"unexpected keyword argument 'colour'"):
        load_object(f"{HERE}:Maker", MakesMade, keywords=["colour"])


def test_a_protocol_that_cannot_be_checked_is_a_programming_error():
    class Plain(Protocol):
        def __call__(self) -> None: ...

    with pytest.raises(TypeError, match="runtime_checkable"):
        load_object(f"{HERE}:three", Plain)


# ---- the app factory, the envelope, the body limit, the control check, the spec -------------------------------
class ToyService:
    """A service object that records its lifetime."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def start(self) -> None:
        self.events.append("start")

    async def stop(self) -> None:
        self.events.append("stop")


class ToyBusy(ServiceError):
    status = 429
    type = "overloaded"
    retry_after = True


class Foreign(Exception):
    """An exception from code that knows nothing of HTTP."""


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int


def toy_router() -> APIRouter:
    router = APIRouter()

    @router.post("/echo", response_model=Item)
    async def echo(body: Item, service: Annotated[Any, Depends(get_service)]) -> Item:
        service.events.append(f"echo {body.n}")
        if body.n == 7:
            raise ToyBusy("too busy for 7")
        if body.n == 8:
            raise Foreign("the engine is away")
        if body.n == 9:
            raise ServiceError("two things failed", status=502, type="upstream",
                               errors=[{"part": "a", "error": "x"}, {"part": "b", "error": "y"}])
        return body

    @router.post("/control", dependencies=[ControlDep])
    async def control() -> dict:
        return {"ok": True}

    @router.get("/metrics", response_class=PrometheusText)
    async def metrics() -> PrometheusText:
        return metrics_response(CollectorRegistry())

    return router


def toy_app(token: str | None = "t0ken", observe=None) -> tuple[Any, ToyService]:
    settings = SimpleNamespace(control_token=SecretStr(token) if token else None)
    service = ToyService()
    app = create_service_app(title="toy", settings=settings, service=service, routers=[toy_router()],
                             max_body_bytes=2048, retry_after_s=3, observe=observe,
                             translate={Foreign: ErrorKind(503, "engine_unavailable", retry_after=True)})
    return app, service


def envelope(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}, "detail": message}


def test_the_lifespan_starts_and_stops_the_one_service_object():
    app, service = toy_app()
    assert app.state.service is service
    with TestClient(app) as client:
        assert service.events == ["start"]
        assert client.post("/echo", json={"n": 1}).json() == {"n": 1}
    assert service.events == ["start", "echo 1", "stop"]


def test_a_service_object_needs_start_and_stop():
    with pytest.raises(TypeError, match="needs async start"):
        create_service_app(title="x", settings=None, service=object(), routers=[], max_body_bytes=1024)


def test_every_error_is_the_envelope():
    app, _ = toy_app()
    with TestClient(app) as client:
        r = client.post("/echo", json={"n": [1], "extra": 1})
        assert r.status_code == 400
        assert r.json() == envelope(400, "n: Input should be a valid integer; extra: unknown field (not part of this API)",
                                    "invalid_request_error")
        r = client.post("/echo", content=b'{"n": ', headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["detail"].startswith("body is not valid JSON")
        r = client.post("/echo", json={"n": 7})
        assert (r.status_code, r.headers["retry-after"], r.json()) == (429, "3", envelope(429, "too busy for 7", "overloaded"))
        r = client.post("/echo", json={"n": 8})
        assert (r.status_code, r.headers["retry-after"]) == (503, "3")
        assert r.json() == envelope(503, "the engine is away", "engine_unavailable")
        r = client.post("/echo", json={"n": 9})
        assert r.status_code == 502 and r.json()["errors"] == [{"part": "a", "error": "x"}, {"part": "b", "error": "y"}]
        r = client.get("/nowhere")
        assert r.status_code == 404 and r.json() == envelope(404, "Not Found", "not_found")
        r = client.get("/echo")
        assert r.status_code == 405 and r.json()["error"]["type"] == "method_not_allowed"


def test_post_bodies_are_read_as_json_whatever_the_content_type():
    app, _ = toy_app()
    with TestClient(app) as client:
        r = client.post("/echo", content=b'{"n": 2}', headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 200 and r.json() == {"n": 2}


def test_bodies_over_the_limit_are_413_up_front_or_while_read_and_observed():
    seen: list[tuple[str, int]] = []
    app, service = toy_app(observe=lambda path, status, seconds: seen.append((path, status)))
    with TestClient(app) as client:
        r = client.post("/echo", json={"n": 1, "pad": "x" * 4096})
        assert r.status_code == 413 and r.headers["connection"] == "close"
        assert r.json() == envelope(413, "request body of 4112 bytes is over the limit of 2048 bytes (max_body_bytes)",
                                    "request_too_large")

        def chunks():
            yield b'{"n": 1, "pad": "'
            for _ in range(5):
                yield b"y" * 1000
            yield b'"}'

        r = client.post("/echo", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "over the limit of 2048 bytes" in r.json()["detail"]
        assert r.json()["error"]["type"] == "request_too_large"
        assert client.post("/echo", json={"n": 3}).status_code == 200
    assert seen == [("/echo", 413), ("/echo", 413), ("/echo", 200)]
    assert service.events == ["start", "echo 3", "stop"]  # neither oversized body reached the route


@pytest.mark.parametrize(("token", "header", "status"), [
    (None, "Bearer t0ken", 403),
    ("t0ken", None, 401),
    ("t0ken", "Basic t0ken", 401),
    ("t0ken", "Bearer wrong", 401),
    ("t0ken", "Bearer t0ken", 200),
    ("t0ken", "bearer t0ken", 200),
])
def test_control_routes_need_the_token(token, header, status):
    app, _ = toy_app(token)
    with TestClient(app) as client:
        r = client.post("/control", headers={"Authorization": header} if header else {})
        assert r.status_code == status, r.text
        if status == 401:
            assert r.headers["www-authenticate"] == "Bearer" and r.json()["error"]["type"] == "unauthorized"
        if status == 403:
            assert r.json()["error"] == {"message": "control routes are off: no control_token is configured",
                                         "type": "forbidden", "code": 403}


def test_the_spec_declares_what_the_kit_answers():
    app, _ = toy_app()
    spec = TestClient(app).get("/openapi.json").json()
    echo = spec["paths"]["/echo"]["post"]["responses"]
    assert set(echo) == {"200", "400", "413", "500"}  # FastAPI's 422 is gone: validation answers 400
    assert echo["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    control = spec["paths"]["/control"]["post"]
    assert set(control["responses"]) == {"200", "401", "403", "413", "500"}  # no input: no 400
    assert control["security"] == [{"control_token": []}]
    assert set(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert schemas["ErrorResponse"]["required"] == ["error", "detail"]
    assert app.openapi() is app.openapi()  # built once


def test_validation_messages():
    errors = [
        {"type": "missing", "loc": ("body",), "msg": "Field required"},
        {"type": "value_error", "loc": ("body", "items", 0, "x"), "msg": "Value error, x must be > 0"},
        {"type": "string_unicode", "loc": ("body", "items", 1), "msg": "..."},
    ]
    assert validation_message(errors) == ("body: a JSON object is required; items.0.x: x must be > 0; "
                                          "items.1: holds text that is not valid UTF-8 (a lone surrogate, perhaps in a "
                                          "field name)")
    assert validation_message([]) == "invalid request"
