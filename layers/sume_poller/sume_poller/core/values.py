"""Dataclasses that a cold start creates without compiling code.

``dataclasses.dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` as source text and compiles it when the class's module is
imported: about 4 million instructions (0.4 ms of CPU) a class on Python 3.13, shipped bytecode or
not - the largest part of what the functions' cold starts paid beyond the import floor (bench
figure 4). :func:`value` makes the same class from methods written once, here, and compiled with
the layer. The class is a dataclass - its fields and ``field(...)`` options are dataclasses' own,
and ``dataclasses.fields``, ``replace`` and ``asdict`` work on it - and its instances behave as the
generated methods would: the same ``repr``, equality (the compared fields in order, the same class
only), hash (a frozen class's: of the hashed fields), :class:`~dataclasses.FrozenInstanceError` on
assignment or deletion, defaults and factories, ``__post_init__``, pickling of frozen slots.

Supported: ``frozen`` (the default), ``slots``, ``kw_only``; ``field(default=, default_factory=,
init=, repr=, compare=, hash=, kw_only=, metadata=)``; inheritance between classes made here. Not
``InitVar``, ``order``, ``unsafe_hash`` or ``eq=False`` (a class needing them stays a plain
dataclass). The differences: the constructor's run-time signature is ``(*args, **kwargs)`` (type
checkers see the fields, through ``dataclass_transform``) and a wrong call's ``TypeError`` is
raised here; ``__dataclass_params__`` reads ``eq`` and ``frozen`` as False (``dataclasses`` does
not write those methods), so a plain ``@dataclass`` must not derive from such a class, nor it from
a plain one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import MISSING, Field, FrozenInstanceError
from reprlib import recursive_repr
from typing import Any, TypeVar, cast, dataclass_transform, overload

T = TypeVar("T", bound=type)

_set = object.__setattr__


class _Spec:
    """What the shared methods need of one class, worked out once when it is made."""

    __slots__ = ("compared", "frozen", "hashed", "missing", "name", "names", "order", "positional", "post_init",
                 "shown", "takes")

    def __init__(self, cls: type, frozen: bool) -> None:
        fields = dataclasses.fields(cls)
        self.name, self.frozen = cls.__qualname__, frozen
        self.names = frozenset(f.name for f in fields)
        self.positional = tuple(f.name for f in fields if f.init and not f.kw_only)
        self.takes = frozenset(f.name for f in fields if f.init)
        #: (name, default, factory, init) of every field, in field order (as the generated __init__ sets them).
        self.order = tuple((f.name, f.default, f.default_factory, f.init) for f in fields)
        self.missing = tuple(f.name for f in fields if f.init and f.default is MISSING
                             and f.default_factory is MISSING)
        self.shown = tuple(f.name for f in fields if f.repr)
        self.compared = tuple(f.name for f in fields if f.compare)
        self.hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        self.post_init = hasattr(cls, "__post_init__")


def _spec(self: Any) -> _Spec:
    spec: _Spec = type(self).__value_spec__
    return spec


def _init(self: Any, /, *args: Any, **kwargs: Any) -> None:
    spec = _spec(self)
    if len(args) > len(spec.positional):
        raise TypeError(f"{spec.name}.__init__() takes {len(spec.positional) + 1} positional arguments "
                        f"but {len(args) + 1} were given")
    given = dict(zip(spec.positional, args, strict=False))
    for name, value in kwargs.items():
        if name not in spec.takes:
            raise TypeError(f"{spec.name}.__init__() got an unexpected keyword argument {name!r}")
        if name in given:
            raise TypeError(f"{spec.name}.__init__() got multiple values for argument {name!r}")
        given[name] = value
    if absent := [name for name in spec.missing if name not in given]:
        raise TypeError(f"{spec.name}.__init__() missing {len(absent)} required argument"
                        f"{'s' if len(absent) > 1 else ''}: {', '.join(map(repr, absent))}")
    put = _set if spec.frozen else setattr
    for name, default, factory, init in spec.order:
        if init and name in given:
            put(self, name, given[name])
        elif factory is not MISSING:
            put(self, name, factory())
        elif default is not MISSING:
            put(self, name, default)
    if spec.post_init:
        self.__post_init__()


@recursive_repr()
def _repr(self: Any) -> str:
    fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _spec(self).shown)
    return f"{self.__class__.__qualname__}({fields})"


def _eq(self: Any, other: Any) -> Any:
    if self is other:
        return True
    if other.__class__ is not self.__class__:
        return NotImplemented
    same: Any = True
    for name in _spec(self).compared:  # ``a == b and c == d``: the first false comparison, else the last
        same = getattr(self, name) == getattr(other, name)
        if not same:
            return same
    return same


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, name) for name in _spec(self).hashed))


def _frozen_methods(cls: type) -> tuple[Callable[..., None], Callable[..., None]]:
    owner: Any = cls  # (mypy reads super(cls, self) with a type variable as a non-type)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in _spec(self).names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(owner, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in _spec(self).names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(owner, self).__delattr__(name)

    return __setattr__, __delattr__


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(dataclasses.fields(self), state, strict=False):
        _set(self, f.name, value)


def _make(cls: T, frozen: bool, slots: bool, kw_only: bool) -> T:
    own = cls.__dict__
    for name in ("__setattr__", "__delattr__") if frozen else ():
        if name in own:
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
    class_hash = own.get("__hash__", MISSING)
    explicit_hash = not (class_hash is MISSING or (class_hash is None and "__eq__" in own))
    # Fields, __match_args__ and slots as dataclass makes them; no method is generated.
    made = cast(T, dataclasses.dataclass(cls, init=False, repr=False, eq=False, slots=slots, kw_only=kw_only))
    made.__value_spec__ = _Spec(made, frozen)  # type: ignore[attr-defined]
    methods: dict[str, Any] = {"__init__": _init, "__repr__": _repr, "__eq__": _eq}
    if frozen:
        methods["__setattr__"], methods["__delattr__"] = _frozen_methods(made)
        if slots:
            methods["__getstate__"], methods["__setstate__"] = _getstate, _setstate
    for name, method in methods.items():
        if name not in made.__dict__:
            setattr(made, name, method)
    if not explicit_hash:  # as dataclass: a frozen class hashes its fields, a mutable one is unhashable
        made.__hash__ = _hash if frozen else None  # type: ignore[assignment]
    return made


@overload
def value(cls: T, /) -> T: ...
@overload
def value(*, frozen: bool = True, slots: bool = True, kw_only: bool = False) -> Callable[[T], T]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, Field))
def value(cls: T | None = None, /, *, frozen: bool = True, slots: bool = True,
          kw_only: bool = False) -> T | Callable[[T], T]:
    """``@dataclass(frozen=True, slots=True)`` (or as the arguments say), its methods not compiled
    at import: see the module's docstring."""
    if cls is None:
        return lambda c: _make(c, frozen, slots, kw_only)
    return _make(cls, frozen, slots, kw_only)


__all__ = ["value"]
