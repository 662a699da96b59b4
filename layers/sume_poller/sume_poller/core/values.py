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
assignment or deletion, defaults and factories, ``__post_init__``, pickling of frozen slots. Its
dataclass records (``__dataclass_fields__`` and the rest) are worked out here as ``dataclasses``
works them out (:func:`_dataclass`), which takes half the instructions: ``dataclasses`` compiles a
function for every class it makes, even one it adds no method to.

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

import abc
import copy
import dataclasses
import inspect
import re
import sys
import typing as typing_module
from collections.abc import Callable, Iterator, Mapping
from dataclasses import KW_ONLY, MISSING, Field, FrozenInstanceError, InitVar
from reprlib import recursive_repr
from types import MemberDescriptorType as _MEMBER
from typing import Any, ClassVar, TypeVar, cast, dataclass_transform, overload

T = TypeVar("T", bound=type)

_set = object.__setattr__


class _Spec:
    """What the shared methods need of one class, worked out once when it is made."""

    __slots__ = ("compared", "frozen", "hashed", "missing", "name", "names", "order", "positional", "post_init",
                 "shown", "takes")

    def __init__(self, cls: type, frozen: bool) -> None:
        self.name, self.frozen = cls.__qualname__, frozen
        #: (name, default, factory, init) of every field, in field order (as the generated __init__ sets them).
        order, positional, takes, missing, shown, compared, hashed = [], [], [], [], [], [], []
        for f in dataclasses.fields(cls):
            name = f.name
            order.append((name, f.default, f.default_factory, f.init))
            if f.init:
                takes.append(name)
                if not f.kw_only:
                    positional.append(name)
                if f.default is MISSING and f.default_factory is MISSING:
                    missing.append(name)
            if f.repr:
                shown.append(name)
            if f.compare:
                compared.append(name)
            if f.compare if f.hash is None else f.hash:
                hashed.append(name)
        self.order, self.positional, self.missing = tuple(order), tuple(positional), tuple(missing)
        self.names, self.takes = frozenset(item[0] for item in order), frozenset(takes)
        self.shown, self.compared, self.hashed = tuple(shown), tuple(compared), tuple(hashed)
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


def _frozen_methods() -> tuple[Callable[..., None], Callable[..., None], Callable[[type], None]]:
    """A frozen class's ``__setattr__`` and ``__delattr__``, and what tells them their class once it is made."""
    owner: Any = None

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is owner or name in _spec(self).names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(owner, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is owner or name in _spec(self).names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(owner, self).__delattr__(name)

    def bind(cls: type) -> None:
        nonlocal owner
        owner = cls

    return __setattr__, __delattr__, bind


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(dataclasses.fields(self), state, strict=False):
        _set(self, f.name, value)


@dataclasses.dataclass(init=False, repr=False, eq=False)
class _Made:
    """What ``dataclasses`` records on a class it makes, read off this one (:func:`_dataclass` records the same)."""

    plain: int
    shared: ClassVar[int]


_MADE: Any = vars(_Made)
#: The marks ``dataclasses`` gives a field and a class variable (``Field._field_type``: ``fields()`` reads it).
_FIELD = _MADE["__dataclass_fields__"]["plain"]._field_type
_CLASS_VAR = _MADE["__dataclass_fields__"]["shared"]._field_type
#: ``copy.replace`` support (Python 3.13; absent before).
_REPLACE = _MADE.get("__replace__")
_GENERIC_ALIAS = type(ClassVar[int])
#: How ``dataclasses`` reads a string annotation: its first name, maybe after a module's (re's cache has it).
_ANNOTATION_NAME = re.compile(r"^(?:\s*(\w+)\s*\.)?\s*(\w+)")
_params: dict[tuple[bool, bool], Any] = {}
#: A string annotation's (module, name) as :data:`_ANNOTATION_NAME` reads it (the layer repeats a few dozen).
_named: dict[str, tuple[Any, ...]] = {}


def _params_of(kw_only: bool, slots: bool) -> Any:
    """The ``__dataclass_params__`` of ``dataclass(init=False, repr=False, eq=False, kw_only=, slots=)`` (one
    object per options, shared by the classes made with them; Python 3.11 records neither option)."""
    params = _params.get((kw_only, slots))
    if params is None:
        params = _params[kw_only, slots] = copy.copy(_MADE["__dataclass_params__"])
        for name, setting in (("kw_only", kw_only), ("slots", slots)):
            if hasattr(params, name):
                setattr(params, name, setting)
    return params


def _kind(annotation: Any, module: Mapping[str, Any]) -> Any:
    """What ``dataclasses`` makes of an annotation: :data:`_FIELD`, :data:`_CLASS_VAR`, or None for an
    ``InitVar`` or ``KW_ONLY`` (left to ``dataclasses``). A string (``from __future__ import annotations``)
    is read as ``dataclasses`` reads it: its first name in the class's module, or ``typing.X`` /
    ``dataclasses.X`` when written so - not evaluated."""
    target = annotation
    if isinstance(annotation, str):
        named = _named.get(annotation)
        if named is None:
            match = _ANNOTATION_NAME.match(annotation)
            named = _named[annotation] = match.groups() if match else ()
        if not named:
            return _FIELD
        owner, name = named
        if owner is None:
            target = module.get(name)
        elif module.get(owner) is typing_module or module.get(owner) is dataclasses:
            target = vars(module[owner]).get(name)
        else:
            return _FIELD
    if target is ClassVar or (type(target) is _GENERIC_ALIAS and getattr(target, "__origin__", None) is ClassVar):
        return _CLASS_VAR
    if target is InitVar or type(target) is InitVar or target is KW_ONLY:
        return None
    return _FIELD


def _slots_of(base: type) -> Iterator[str]:
    """The names ``base`` itself declares in ``__slots__`` (as ``dataclasses`` reads them)."""
    slots = base.__dict__.get("__slots__")
    if slots is None:
        return
    if isinstance(slots, str):
        yield slots
    elif hasattr(slots, "__next__"):
        raise TypeError(f"Slots of '{base.__name__}' cannot be determined")
    else:
        yield from slots


def _dataclass(cls: T, slots: bool, kw_only: bool, members: dict[str, Any]) -> T:
    """``dataclasses.dataclass(cls, init=False, repr=False, eq=False, slots=slots, kw_only=kw_only)``: the
    same fields, ``__dataclass_fields__``, ``__dataclass_params__``, ``__match_args__``, class attributes and
    slots, worked out here for the classes of this layer - without the function ``dataclasses`` compiles
    for every class (even one it adds no method to) or its regular-expression look-ups of each string
    annotation, 3 a field: together about 0.5 M instructions a class on Python 3.13. A class of another
    kind (an ``InitVar`` or ``KW_ONLY`` among its annotations, no docstring, a frozen dataclass base) is
    made by ``dataclasses`` itself. ``members`` (the methods) are added to the class made (to the namespace
    the slotted class is created with: no attribute set on a class after it is made)."""
    own = cls.__dict__
    annotations = inspect.get_annotations(cls)
    module = sys.modules.get(cls.__module__)
    names = vars(module) if module is not None else {}
    kinds = [_kind(annotation, names) for annotation in annotations.values()]
    bases = [(getattr(b, "__dataclass_fields__", None), getattr(b, "__dataclass_params__", None))
             for b in cls.__mro__[-1:0:-1]]
    if None in kinds or not cls.__doc__ or any(p is not None and p.frozen for f, p in bases if f is not None):
        plain: Any = dataclasses.dataclass(cls, init=False, repr=False, eq=False, slots=slots, kw_only=kw_only)
        for name, member in members.items():
            setattr(plain, name, member)
        return cast(T, plain)
    fields: dict[str, Any] = {}
    for inherited, _ in bases:
        if inherited is not None:
            fields.update((f.name, f) for f in inherited.values())
    made: list[Any] = []  # this class's own fields and class variables
    attributes: dict[str, Any] = {}  # the class attribute of a field given as field(...): its default, or none
    for (name, annotation), kind in zip(annotations.items(), kinds, strict=True):
        default = getattr(cls, name, MISSING)
        if isinstance(default, Field):
            f: Any = default
            attributes[name] = f.default
        else:
            f = dataclasses.field(default=MISSING if isinstance(default, _MEMBER) else default)
        f.name, f.type, f._field_type = name, annotation, kind
        if kind is _CLASS_VAR:
            if f.default_factory is not MISSING:
                raise TypeError(f"field {name} cannot have a default factory")
            if f.kw_only is not MISSING:
                raise TypeError(f"field {name} is a ClassVar but specifies kw_only")
        else:
            if f.kw_only is MISSING:
                f.kw_only = kw_only
            if f.default.__class__.__hash__ is None:
                raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: "
                                 "use default_factory")
        made.append(f)
    for f in made:
        fields[f.name] = f
    for name, attribute in own.items():
        if isinstance(attribute, Field) and name not in annotations:
            raise TypeError(f"{name!r} is a field but has no type annotation")
    added = {"__dataclass_params__": _params_of(kw_only, slots), "__dataclass_fields__": fields}
    if _REPLACE is not None and "__replace__" not in own:
        added["__replace__"] = _REPLACE
    if "__match_args__" not in own:
        added["__match_args__"] = tuple(f.name for f in fields.values()
                                        if f._field_type is _FIELD and f.init and not f.kw_only)
    if not slots:
        for name, attribute in attributes.items():
            if attribute is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, attribute)
        for name, attribute in (*added.items(), *members.items()):
            setattr(cls, name, attribute)
        abc.update_abstractmethods(cls)
        return cls
    if "__slots__" in own:
        raise TypeError(f"{cls.__name__} already specifies __slots__")
    namespace = dict(own)
    for name, attribute in attributes.items():
        if attribute is MISSING:
            namespace.pop(name, None)
        else:
            namespace[name] = attribute
    namespace.update(added)
    namespace.update(members)
    field_names = tuple(f.name for f in fields.values() if f._field_type is _FIELD)
    inherited_slots = {slot for base in cls.__mro__[1:-1] for slot in _slots_of(base)}
    namespace["__slots__"] = tuple(name for name in field_names if name not in inherited_slots)
    for name in (*field_names, "__dict__", "__weakref__"):
        namespace.pop(name, None)
    namespace["__qualname__"] = cls.__qualname__
    slotted: T = type(cls)(cls.__name__, cls.__bases__, namespace)
    abc.update_abstractmethods(slotted)
    return slotted


def _make(cls: T, frozen: bool, slots: bool, kw_only: bool) -> T:
    own = cls.__dict__
    for name in ("__setattr__", "__delattr__") if frozen else ():
        if name in own:
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
    class_hash = own.get("__hash__", MISSING)
    explicit_hash = not (class_hash is MISSING or (class_hash is None and "__eq__" in own))
    methods: dict[str, Any] = {"__init__": _init, "__repr__": _repr, "__eq__": _eq}
    bind = None
    if frozen:
        methods["__setattr__"], methods["__delattr__"], bind = _frozen_methods()
        if slots:
            methods["__getstate__"], methods["__setstate__"] = _getstate, _setstate
    members = {name: method for name, method in methods.items() if name not in own}
    if not explicit_hash:  # as dataclass: a frozen class hashes its fields, a mutable one is unhashable
        members["__hash__"] = _hash if frozen else None
    # Fields, __match_args__ and slots as dataclass makes them, and the methods; no method is generated.
    made = _dataclass(cls, slots, kw_only, members)
    if bind is not None:
        bind(made)
    made.__value_spec__ = _Spec(made, frozen)  # type: ignore[attr-defined]
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
