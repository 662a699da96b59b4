"""core.values.value makes the class a frozen (or mutable) dataclass would be, without compiling its
methods: each behaviour is checked against the same class made by ``dataclasses.dataclass``."""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Callable
from dataclasses import KW_ONLY, MISSING, FrozenInstanceError, dataclass, field
from types import MemberDescriptorType
from typing import Any, ClassVar

import pytest

from sume_poller.core.values import value


def _pair(**options: Any) -> tuple[type, type]:
    """One class body, made by ``value`` and by ``dataclass`` with the same options."""

    def body() -> type:
        class Point:
            """A point."""

            x: int
            y: str = "a"
            tags: tuple[str, ...] = field(default_factory=tuple)
            note: Any = field(default=None, repr=False, compare=False)
            later: int = field(default=7, init=False)

        return Point

    frozen = options.get("frozen", True)
    made = {"frozen": frozen, "slots": options.get("slots", True), "kw_only": options.get("kw_only", False)}
    return value(**made)(body()), dataclass(**made)(body())


MODES = [{}, {"slots": False}, {"kw_only": True}, {"frozen": False, "slots": False}, {"frozen": False}]


def _build(cls: type, kw_only: bool, *args: Any, **kwargs: Any) -> Any:
    if kw_only:
        names = ["x", "y", "tags", "note"][: len(args)]
        return cls(**dict(zip(names, args, strict=True)), **kwargs)
    return cls(*args, **kwargs)


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_a_value_behaves_as_the_dataclass_of_the_same_body(mode: dict[str, Any]) -> None:
    ours, theirs = _pair(**mode)
    kw = mode.get("kw_only", False)
    for args, kwargs in [((1,), {}), ((2, "b"), {"note": "a note"}), ((3, "c", ("t",)), {})]:
        a, b = _build(ours, kw, *args, **kwargs), _build(theirs, kw, *args, **kwargs)
        assert repr(a) == repr(b)
        assert dataclasses.asdict(a) == dataclasses.asdict(b)
        assert [f.name for f in dataclasses.fields(a)] == [f.name for f in dataclasses.fields(b)]
        assert a.later == b.later == 7
        twin = _build(ours, kw, *args, **kwargs)
        assert a == twin and (a != twin) is False and a is not twin
        assert (a == _build(ours, kw, 99)) is False
        assert a.__eq__(b) is NotImplemented  # another class, as the generated __eq__
        if mode.get("frozen", True):
            assert hash(a) == hash(b)
            for f in ("x", "later", "other"):
                with pytest.raises(FrozenInstanceError, match=f"cannot assign to field '{f}'"):
                    setattr(a, f, 1)
            with pytest.raises(FrozenInstanceError, match="cannot delete field 'x'"):
                del a.x
            assert copy.deepcopy(a) == a and copy.copy(a) == a  # a frozen slotted class's state, set back
        else:
            assert ours.__hash__ is theirs.__hash__ is None
            a.x = 5
            assert a.x == 5
        changed = dataclasses.replace(a, y="z")
        assert changed.y == "z" and changed.x == a.x and type(changed) is ours
    assert ours.__match_args__ == theirs.__match_args__
    assert ("__slots__" in ours.__dict__) == ("__slots__" in theirs.__dict__)


def test_defaults_are_fresh_and_post_init_runs() -> None:
    @value
    class Bag:
        """A bag."""

        items: list[int] = field(default_factory=list)
        total: int = field(default=0, init=False)

        def __post_init__(self) -> None:
            object.__setattr__(self, "total", sum(self.items))

    one, two = Bag(), Bag([1, 2])
    assert one.items == [] and one.items is not Bag().items
    assert (one.total, two.total) == (0, 3)


@pytest.mark.parametrize("call", [lambda c: c(), lambda c: c(1, "a", [], None, 5), lambda c: c(1, x=2),
                                  lambda c: c(1, later=2), lambda c: c(1, nope=2)])
def test_a_wrong_call_is_a_type_error_as_with_a_dataclass(call: Callable[[type], Any]) -> None:
    ours, theirs = _pair()
    for cls in (ours, theirs):
        with pytest.raises(TypeError):
            call(cls)


def test_a_subclass_adds_its_fields_after_the_bases() -> None:
    @value(kw_only=True)
    class Base:
        """A base."""

        a: int
        b: int = 2

    @value(kw_only=True)
    class Child(Base):
        """A child."""

        c: int

    child = Child(a=1, c=3)
    assert repr(child) == "test_a_subclass_adds_its_fields_after_the_bases.<locals>.Child(a=1, b=2, c=3)"
    assert child != Base(a=1) and hash(child) == hash((1, 2, 3))
    with pytest.raises(FrozenInstanceError):
        child.a = 5  # type: ignore[misc]


def test_explicit_methods_are_kept_and_frozen_ones_refused() -> None:
    @value
    class Named:
        """Its own repr."""

        name: str

        def __repr__(self) -> str:
            return f"<{self.name}>"

    assert repr(Named("n")) == "<n>"
    with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__"):
        @value
        class Bad:
            """Sets its own attributes."""

            x: int

            def __setattr__(self, name: str, val: Any) -> None:
                pass


def _attribute(found: Any) -> Any:
    """A class attribute, a slot by its name (each class has its own)."""
    return ("slot", found.__name__) if isinstance(found, MemberDescriptorType) else found


def _records(cls: type) -> dict[str, Any]:
    """What ``dataclasses`` records on a class it makes (and ``fields``, ``replace`` and ``asdict`` read)."""
    fields: Any = vars(cls)["__dataclass_fields__"]
    return {
        "fields": [(f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.hash, f.compare, dict(f.metadata),
                    f.kw_only, f._field_type) for f in fields.values()],
        "params": repr(vars(cls)["__dataclass_params__"]),
        "match_args": cls.__dict__.get("__match_args__"),
        "slots": cls.__dict__.get("__slots__"),
        "attributes": {name: _attribute(cls.__dict__.get(name, MISSING)) for name in fields},
        "replace": "__replace__" in cls.__dict__,
        "qualname": cls.__qualname__,
    }


def _bodies() -> list[tuple[str, Callable[[], type]]]:
    """Class bodies with what a value class's fields may hold: class variables (written as the layer writes
    them and module-qualified), fields given as ``field(...)`` with and without a default, a default factory,
    per-field ``kw_only``, a base's fields overridden."""

    def plain() -> type:
        class Plain:
            """Fields of every kind."""

            what: ClassVar[str] = "plain"
            count: typing.ClassVar[int]
            x: int
            y: str = "a"
            tags: tuple[str, ...] = field(default_factory=tuple)
            note: Any = field(repr=False, compare=False, metadata={"var": "NOTE"})
            later: int = field(default=7, init=False, hash=False)
            named: int = field(default=1, kw_only=True)

        return Plain

    def child() -> type:
        @value
        class Base:
            """A base."""

            a: int
            b: int = 2

        class Child(Base):
            """Overrides a base field, adds its own."""

            b: int = 3
            c: int = field(default=4)

        return Child

    return [("plain", plain), ("child", child)]


@pytest.mark.parametrize("options", [{}, {"slots": False}, {"kw_only": True}, {"frozen": False, "slots": False}],
                         ids=str)
@pytest.mark.parametrize("body", _bodies(), ids=lambda b: b[0])
def test_a_value_records_what_dataclasses_records(body: tuple[str, Callable[[], type]],
                                                   options: dict[str, Any]) -> None:
    """``value`` works out the class's dataclass records itself (dataclasses compiles a function for every class
    it makes): they are what ``dataclass(init=False, repr=False, eq=False, ...)`` records for the same body."""
    slots, kw_only = options.get("slots", True), options.get("kw_only", False)
    ours = value(**{"frozen": options.get("frozen", True), "slots": slots, "kw_only": kw_only})(body[1]())
    theirs = dataclass(init=False, repr=False, eq=False, slots=slots, kw_only=kw_only)(body[1]())
    assert _records(ours) == _records(theirs)
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(theirs)]


def test_a_class_of_another_kind_is_made_by_dataclasses() -> None:
    @value
    class Marked:
        """Keyword-only fields after a KW_ONLY marker."""

        a: int
        _: KW_ONLY
        b: int = 2

    assert Marked.__match_args__ == ("a",) and Marked(1, b=3) == Marked(1, b=3)
    with pytest.raises(TypeError):
        Marked(1, 3)  # type: ignore[misc]
    with pytest.raises(ValueError, match="mutable default"):
        @value
        class Mutable:
            """A list as a default."""

            items: list[int] = []
