"""The plug-in point mechanism itself (shared/plugins.py): kinds registered with a settings model and an
implementation, settings fields that validate whatever is registered when they validate, clear errors."""

from __future__ import annotations

from abc import ABC
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.plugins import POINTS, PluginPoint, kwargs_of, point_of
from shared.service_kit.loader import LoadError
from shared.settings_paths import closest_path, known_paths


class Shape(ABC):
    def __init__(self, settings) -> None:
        self.settings = settings


class Square(Shape):
    pass


class Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    size: int = Field(default=1, ge=1)


class SquareSettings(Base):
    kind: Literal["square"] = "square"


class CircleSettings(Base):
    kind: Literal["circle"] = "circle"
    radius: float = 1.0


@pytest.fixture
def point():
    p = PluginPoint("test shape", where="test: shape.kind", doc="Shapes.", base=Shape, settings_base=Base,
                    default="square")
    p.register("square", SquareSettings, Square)
    yield p
    POINTS.pop("test shape")


def holder(p):
    class Holder(BaseModel):
        model_config = ConfigDict(extra="forbid")
        shape: p.settings_type("ShapeSettings") = Field(default_factory=SquareSettings)
        shapes: list[p.settings_type("ShapeSettings")] = Field(default_factory=list)

    return Holder


def test_a_kind_registered_after_the_settings_class_is_configurable(point):
    Holder = holder(point)
    with pytest.raises(ValidationError, match=r"unknown test shape kind 'circle'; known: 'square'"):
        Holder(shape={"kind": "circle"})

    class Circle(Shape):
        pass

    point.register("circle", CircleSettings, Circle)
    got = Holder(shape={"kind": "circle", "radius": 2}, shapes=[{"kind": "square", "size": 3}])
    assert isinstance(got.shape, CircleSettings) and got.shape.radius == 2.0
    assert isinstance(got.shapes[0], SquareSettings)
    assert point.load(got.shape.kind) is Circle
    assert Holder.model_validate(got.model_dump()).model_dump() == got.model_dump()  # round trip keeps kinds
    assert got.model_dump(mode="json")["shape"] == {"size": 1, "kind": "circle", "radius": 2.0}


def test_errors_of_a_kind_keep_their_location_and_the_default_kind_applies(point):
    Holder = holder(point)
    with pytest.raises(ValidationError) as err:
        Holder(shape={"kind": "square", "size": 0})
    assert err.value.errors()[0]["loc"] == ("shape", "size")
    assert isinstance(Holder(shape={"size": 2}).shape, SquareSettings)  # no kind: the point's default


def test_setting_paths_and_listings_see_the_registered_kinds(point):
    Holder = holder(point)
    point.register("circle", CircleSettings, "tests.shared.test_plugins:Square")
    assert {"shape.radius", "shape.size", "shapes.radius"} <= known_paths(Holder)
    assert closest_path(Holder, "shape.radius_") == "shape.radius"
    assert point_of(Holder.model_fields["shapes"].annotation) is point


def test_registering_checks_the_settings_model_and_refuses_a_second_registration(point):
    with pytest.raises(ValueError, match="registered already"):
        point.register("square", SquareSettings, Square)
    point.register("square", SquareSettings, Square, replace=True)

    class Untagged(Base):
        pass

    with pytest.raises(ValueError, match=r"needs the field `kind: Literal\['round'\] = 'round'`"):
        point.register("round", Untagged, Square)

    class Elsewhere(BaseModel):
        kind: Literal["odd"] = "odd"

    with pytest.raises(TypeError, match="must subclass Base"):
        point.register("odd", Elsewhere, Square)
    with pytest.raises(ValueError, match="plain name"):
        point.register("pkg:odd", SquareSettings, Square)


def test_an_implementation_is_checked_against_the_base_when_loaded(point):
    class Tri(Base):
        kind: Literal["tri"] = "tri"

    point.register("tri", Tri, "tests.shared.test_plugins:Base")  # not a Shape
    with pytest.raises(LoadError, match=r"test shape 'tri'.*not a subclass of Shape"):
        point.load("tri")
    point.register("tri", Tri, int, replace=True)
    with pytest.raises(LoadError, match="not a subclass of Shape"):
        point.load("tri")
    with pytest.raises(KeyError, match="unknown test shape 'hex'; known: 'square', 'tri'"):
        point.load("hex")


def test_points_named_by_a_string_take_their_settings_as_options():
    p = PluginPoint("test named", where="test: name", doc="Named.", tag=None, base=Shape)
    try:
        p.register("plain", None, "tests.shared.test_plugins:Square")
        p.register("sized", Base, "tests.shared.test_plugins:Square")
        assert p.options("plain", {}) is None
        with pytest.raises(ValueError, match="takes no settings of its own"):
            p.options("plain", {"size": 2})
        assert p.options("sized", {"size": 2}) == Base(size=2)
        with pytest.raises(ValidationError):
            p.options("sized", {"size": 0})
        assert kwargs_of(SquareSettings(size=4)) == {"size": 4}
    finally:
        POINTS.pop("test named")
