"""DynamoDB in process: the job table with its sparse ``pending`` index, as the layer's boto3 client sees it.

The calls the layer makes (``put_item``, ``update_item``, ``get_item``, ``batch_get_item``,
``query``, ``transact_write_items``, ``delete_item``) take and return the low-level shapes boto3's
client does (typed attribute values, ``ClientError`` with the service's codes). What is kept of
DynamoDB's semantics (and held to moto server by ``tests/integration/test_sim_fakes.py``):

* condition and update expressions (a parser of the expression language: comparisons, ``BETWEEN``,
  ``IN``, ``AND``/``OR``/``NOT``, ``attribute_exists``, ``attribute_not_exists``, ``begins_with``,
  ``contains``, ``size``; ``SET`` with ``+``/``-``, ``if_not_exists`` and ``list_append``,
  ``REMOVE``, ``ADD``, ``DELETE``), checked and applied atomically; names and values the
  expression does not use are refused, as DynamoDB refuses them;
* ``ReturnValues`` and ``ReturnValuesOnConditionCheckFailure`` (the item as it was, in the error);
* reads are strongly consistent on the table; the index is a projection (keys, ``kind``,
  ``profile``, ``deadline_at``, ``submitted_at``, ``chain_due_at``) that may lag the table (the
  scheduler chooses by how much: DynamoDB's index reads are eventually consistent), paged with
  ``Limit`` and ``LastEvaluatedKey`` as DynamoDB pages them;
* a transaction is all or nothing, with its cancellation reasons.

Every call is a scheduler point, and may be throttled (the scheduler's choice): the layer's client
retries a throttle once (standard mode, 2 attempts), so a throttle here is two in a row.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from botocore.exceptions import ClientError

Item = dict[str, Any]  # attribute name -> typed value ({"S": ...}, {"N": ...}, ...)

INDEX = "pending"
INDEX_HASH, INDEX_RANGE = "pending_shard", "job_id"
INDEX_PROJECTION = ("kind", "profile", "deadline_at", "submitted_at", "chain_due_at")
MAX_ITEM_BYTES = 400 * 1024


def error(code: str, message: str, operation: str, **extra: Any) -> ClientError:
    response: Any = {"Error": {"Code": code, "Message": message}, **extra}
    return ClientError(response, operation)


# ---------------------------------------------------------------------------------------------------
# The expression language

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+)|(?P<name>#[A-Za-z0-9_]+)|(?P<value>:[A-Za-z0-9_]+)"
                    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<op><>|<=|>=|[=<>(),.+\-\[\]]))")
_KEYWORDS = {"AND", "OR", "NOT", "BETWEEN", "IN", "SET", "REMOVE", "ADD", "DELETE"}


class ExpressionError(ValueError):
    pass


_TOKENS: dict[str, list[tuple[str, str]]] = {}


def tokens(text: str) -> list[tuple[str, str]]:
    cached = _TOKENS.get(text)
    if cached is None:
        cached = _TOKENS[text] = _tokens(text)
    return cached


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if not match:
            raise ExpressionError(f"Invalid expression near {text[pos:pos + 20]!r}")
        kind = match.lastgroup or ""
        value = match.group(kind)
        if kind == "ident" and value.upper() in _KEYWORDS:
            kind, value = "kw", value.upper()
        out.append((kind, value))
        pos = match.end()
    return out


class Parser:
    """Parses one expression into nested tuples; records the names and values it uses."""

    def __init__(self, text: str, names: dict[str, str], values: dict[str, Any]) -> None:
        self.toks = tokens(text)
        self.i = 0
        self.names = names
        self.values = values
        self.used_names: set[str] = set()
        self.used_values: set[str] = set()

    def peek(self, offset: int = 0) -> tuple[str, str]:
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else ("end", "")

    def take(self, kind: str | None = None, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if (kind and tok[0] != kind) or (value and tok[1] != value):
            raise ExpressionError(f"Syntax error: expected {value or kind}, got {tok[1] or 'end'}")
        self.i += 1
        return tok

    def done(self) -> None:
        if self.peek()[0] != "end":
            raise ExpressionError(f"Syntax error: unexpected {self.peek()[1]!r}")

    # paths and operands
    def path(self) -> tuple[str, ...]:
        parts = [self._segment()]
        while self.peek() == ("op", "."):
            self.take()
            parts.append(self._segment())
        return tuple(parts)

    def _segment(self) -> str:
        kind, value = self.take()
        if kind == "name":
            if value not in self.names:
                raise ExpressionError(f"An expression attribute name used in the document path is not defined; "
                                      f"attribute name: {value}")
            self.used_names.add(value)
            return self.names[value]
        if kind == "ident":
            return value
        raise ExpressionError(f"Syntax error: a path expected, got {value!r}")

    def value(self) -> tuple[str, Any]:
        _, name = self.take("value")
        if name not in self.values:
            raise ExpressionError(f"An expression attribute value used in expression is not defined; "
                                  f"attribute value: {name}")
        self.used_values.add(name)
        return ("value", name)

    def operand(self) -> tuple[Any, ...]:
        kind, _ = self.peek()
        if kind == "value":
            return self.value()
        if kind == "ident" and self.peek(1) == ("op", "("):
            return self.function()
        return ("path", self.path())

    def function(self) -> tuple[Any, ...]:
        _, name = self.take("ident")
        self.take("op", "(")
        args: list[Any] = []
        while self.peek() != ("op", ")"):
            args.append(self.update_value() if name in ("if_not_exists", "list_append") else self.operand())
            if self.peek() == ("op", ","):
                self.take()
        self.take("op", ")")
        return ("call", name, tuple(args))

    # conditions
    def condition(self) -> tuple[Any, ...]:
        left = self._and()
        while self.peek() == ("kw", "OR"):
            self.take()
            left = ("or", left, self._and())
        return left

    def _and(self) -> tuple[Any, ...]:
        left = self._not()
        while self.peek() == ("kw", "AND"):
            self.take()
            left = ("and", left, self._not())
        return left

    def _not(self) -> tuple[Any, ...]:
        if self.peek() == ("kw", "NOT"):
            self.take()
            return ("not", self._not())
        return self._primary()

    def _primary(self) -> tuple[Any, ...]:
        if self.peek() == ("op", "("):
            self.take()
            inner = self.condition()
            self.take("op", ")")
            return inner
        left = self.operand()
        if left[0] == "call" and left[1] in ("attribute_exists", "attribute_not_exists", "begins_with", "contains",
                                             "attribute_type"):
            return left
        kind, op = self.peek()
        if kind == "op" and op in ("=", "<>", "<", "<=", ">", ">="):
            self.take()
            return ("cmp", op, left, self.operand())
        if (kind, op) == ("kw", "BETWEEN"):
            self.take()
            low = self.operand()
            self.take("kw", "AND")
            return ("between", left, low, self.operand())
        if (kind, op) == ("kw", "IN"):
            self.take()
            self.take("op", "(")
            options = [self.operand()]
            while self.peek() == ("op", ","):
                self.take()
                options.append(self.operand())
            self.take("op", ")")
            return ("in", left, tuple(options))
        raise ExpressionError(f"Syntax error near {op!r}")

    # updates
    def update(self) -> list[tuple[Any, ...]]:
        actions: list[tuple[Any, ...]] = []
        seen: set[str] = set()
        while self.peek()[0] != "end":
            _, clause = self.take("kw")
            if clause in seen:
                raise ExpressionError(f"The \"{clause}\" section can only be used once in an update expression")
            seen.add(clause)
            while True:
                path = self.path()
                if clause == "SET":
                    self.take("op", "=")
                    actions.append(("set", path, self.update_value()))
                elif clause == "REMOVE":
                    actions.append(("remove", path))
                elif clause in ("ADD", "DELETE"):
                    actions.append((clause.lower(), path, self.value()))
                else:
                    raise ExpressionError(f"unknown clause {clause}")
                if self.peek() != ("op", ","):
                    break
                self.take()
        paths = [a[1] for a in actions]
        for i, p in enumerate(paths):
            for q in paths[i + 1:]:
                if p[:len(q)] == q or q[:len(p)] == p:
                    raise ExpressionError(f"Two document paths overlap with each other: {'.'.join(p)}")
        return actions

    def resolved(self, node: tuple[str, Any]) -> Any:
        return self.values[node[1]]

    def update_value(self) -> tuple[Any, ...]:
        left = self.operand()
        if self.peek() in (("op", "+"), ("op", "-")):
            _, op = self.take()
            return ("arith", op, left, self.operand())
        return left


def _number(av: Any) -> Decimal | None:
    return Decimal(av["N"]) if isinstance(av, dict) and "N" in av else None


def _get(item: Item, path: tuple[str, ...]) -> Any:
    value: Any = item.get(path[0])
    for part in path[1:]:
        if not isinstance(value, dict) or "M" not in value:
            return None
        value = value["M"].get(part)
    return value


#: The values of the expression being evaluated (set by :func:`evaluate` and :func:`apply_update`'s callers).
_VALUES: list[dict[str, Any]] = [{}]


def _operand(item: Item, node: tuple[Any, ...]) -> Any:
    if node[0] == "value":
        return _VALUES[-1][node[1]]
    if node[0] == "path":
        return _get(item, node[1])
    if node[0] == "call" and node[1] == "size":
        value = _operand(item, node[2][0])
        if value is None:
            return None
        (kind, raw), = value.items()
        size = len(raw.encode()) if kind == "S" else len(raw)
        return {"N": str(size)}
    raise ExpressionError(f"Invalid function in this context: {node[1]}")


def _compare(op: str, left: Any, right: Any) -> bool:
    if left is None or right is None:
        return op == "<>" and not (left is None and right is None)
    (lk, lv), = left.items()
    (rk, rv), = right.items()
    if lk != rk:
        return op == "<>"
    if lk == "N":
        a: Any
        b: Any
        a, b = Decimal(lv), Decimal(rv)
    elif lk in ("S", "B"):
        a, b = (lv.encode(), rv.encode()) if lk == "S" else (lv, rv)
    else:
        if op not in ("=", "<>"):
            raise ExpressionError(f"Invalid operator for type {lk}")
        a, b = _canonical(left), _canonical(right)
    return bool({"=": a == b, "<>": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op])


def _canonical(av: Any) -> Any:
    (kind, raw), = av.items()
    if kind == "N":
        return ("N", Decimal(raw))
    if kind in ("SS", "BS"):
        return (kind, frozenset(raw))
    if kind == "NS":
        return (kind, frozenset(Decimal(x) for x in raw))
    if kind == "M":
        return ("M", tuple(sorted((k, _canonical(v)) for k, v in raw.items())))
    if kind == "L":
        return ("L", tuple(_canonical(v) for v in raw))
    return (kind, raw)


def evaluate(item: Item, node: tuple[Any, ...]) -> bool:
    kind = node[0]
    if kind == "or":
        return evaluate(item, node[1]) or evaluate(item, node[2])
    if kind == "and":
        return evaluate(item, node[1]) and evaluate(item, node[2])
    if kind == "not":
        return not evaluate(item, node[1])
    if kind == "cmp":
        return _compare(node[1], _operand(item, node[2]), _operand(item, node[3]))
    if kind == "between":
        value = _operand(item, node[1])
        return _compare(">=", value, _operand(item, node[2])) and _compare("<=", value, _operand(item, node[3]))
    if kind == "in":
        value = _operand(item, node[1])
        return any(_compare("=", value, _operand(item, o)) for o in node[2])
    if kind == "call":
        name, args = node[1], node[2]
        if name == "attribute_exists":
            return _operand(item, args[0]) is not None
        if name == "attribute_not_exists":
            return _operand(item, args[0]) is None
        if name == "begins_with":
            value, prefix = _operand(item, args[0]), _operand(item, args[1])
            if value is None or prefix is None:
                return False
            (vk, vv), = value.items()
            (pk, pv), = prefix.items()
            return vk == pk and vk in ("S", "B") and vv.startswith(pv)
        if name == "contains":
            value, part = _operand(item, args[0]), _operand(item, args[1])
            if value is None or part is None:
                return False
            (vk, vv), = value.items()
            (_, pv), = part.items()
            if vk == "S":
                return isinstance(pv, str) and pv in vv
            if vk in ("SS", "NS", "BS"):
                return pv in vv
            if vk == "L":
                return any(_canonical(x) == _canonical(part) for x in vv)
            return False
        if name == "attribute_type":
            value, wanted = _operand(item, args[0]), _operand(item, args[1])
            return value is not None and wanted is not None and next(iter(value)) == wanted["S"]
    raise ExpressionError(f"Invalid condition: {kind}")


def _update_value(item: Item, node: tuple[Any, ...]) -> Any:
    if node[0] == "arith":
        left, right = _update_value(item, node[2]), _update_value(item, node[3])
        a, b = _number(left), _number(right)
        if a is None or b is None:
            raise ExpressionError("An operand in the update expression has an incorrect data type")
        return {"N": _decimal_text(a + b if node[1] == "+" else a - b)}
    if node[0] == "call" and node[1] == "if_not_exists":
        current = _get(item, node[2][0][1])
        return current if current is not None else _update_value(item, node[2][1])
    if node[0] == "call" and node[1] == "list_append":
        left, right = _update_value(item, node[2][0]), _update_value(item, node[2][1])
        return {"L": [*left["L"], *right["L"]]}
    value = _operand(item, node)
    if value is None:
        raise ExpressionError("The provided expression refers to an attribute that does not exist in the item")
    return value


def _decimal_text(d: Decimal) -> str:
    text = format(d.normalize(), "f")
    return text


def _set(item: Item, path: tuple[str, ...], value: Any) -> None:
    if len(path) == 1:
        item[path[0]] = value
        return
    parent = _get(item, path[:-1])
    if not isinstance(parent, dict) or "M" not in parent:
        raise ExpressionError("The document path provided in the update expression is invalid for update")
    parent["M"] = {**parent["M"], path[-1]: value}


def _remove(item: Item, path: tuple[str, ...]) -> None:
    if len(path) == 1:
        item.pop(path[0], None)
        return
    parent = _get(item, path[:-1])
    if isinstance(parent, dict) and "M" in parent:
        parent["M"] = {k: v for k, v in parent["M"].items() if k != path[-1]}


def apply_update(item: Item, actions: list[tuple[Any, ...]]) -> Item:
    """A new item: ``actions`` applied to (a copy of) ``item``; values are evaluated against the
    item as it was, as DynamoDB does."""
    new = _copy(item)
    for action in actions:
        kind, path = action[0], action[1]
        if kind == "set":
            _set(new, path, _copy_value(_update_value(item, action[2])))
        elif kind == "remove":
            _remove(new, path)
        elif kind == "add":
            current, operand = _get(new, path), _VALUES[-1][action[2][1]]
            if current is None:
                _set(new, path, _copy_value(operand))
            elif "N" in current and "N" in operand:
                _set(new, path, {"N": _decimal_text(Decimal(current["N"]) + Decimal(operand["N"]))})
            else:
                (kind_c, raw_c), = current.items()
                (kind_o, raw_o), = operand.items()
                if kind_c != kind_o or kind_c not in ("SS", "NS", "BS"):
                    raise ExpressionError("An operand in the update expression has an incorrect data type")
                _set(new, path, {kind_c: list(dict.fromkeys([*raw_c, *raw_o]))})
        elif kind == "delete":
            current, operand = _get(new, path), _VALUES[-1][action[2][1]]
            if current is not None:
                (kind_c, raw_c), = current.items()
                left = [x for x in raw_c if x not in set(next(iter(operand.values())))]
                if left:
                    _set(new, path, {kind_c: left})
                else:
                    _remove(new, path)
    return new


def _copy_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_value(v) for v in value]
    return value


def _copy(item: Item) -> Item:
    return {k: _copy_value(v) for k, v in item.items()}


# ---------------------------------------------------------------------------------------------------
# The table

class Table:
    """The job table: items by ``job_id``, and the ``pending`` index (a lagging projection)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.items: dict[str, Item] = {}
        #: The index as readers see it: (pending_shard, job_id) -> projected item.
        self.index: dict[tuple[str, str], Item] = {}
        #: Index updates not yet visible: (visible at, job_id, old key, new key, projected item).
        self.index_lag: list[tuple[float, str, tuple[str, str] | None, tuple[str, str] | None, Item | None]] = []


class DynamoWorld:
    """The fake service: its table(s), the scheduler, and what observes every write."""

    def __init__(self, sched: Any, faults: Any, table: str) -> None:
        self.sched = sched
        self.faults = faults
        self.tables = {table: Table(table)}
        #: Called after every write with (table name, key, old item or None, new item or None).
        self.observers: list[Callable[[str, str, Item | None, Item | None], None]] = []
        #: Called at every update_item with (job id, attributes it sets, whether its condition held).
        self.update_observers: list[Callable[[str, frozenset[str], bool], None]] = []
        self.client = DynamoClient(self)

    def table(self, name: str, operation: str) -> Table:
        table = self.tables.get(name)
        if table is None:
            raise error("ResourceNotFoundException", "Requested resource not found", operation)
        return table

    def call(self, operation: str, label: str) -> None:
        self.sched.point(f"ddb {operation} {label}")
        if self.faults.take("ddb_throttle"):
            self.sched.note_fault(f"ddb throttled {operation}")
            raise error("ProvisionedThroughputExceededException", "The level of configured provisioned throughput "
                        "for the table was exceeded (simulated, twice in a row)", operation)

    def write(self, table: Table, key: str, new: Item | None) -> None:
        old = table.items.get(key)
        if new is None:
            table.items.pop(key, None)
        else:
            if _size(new) > MAX_ITEM_BYTES:
                raise error("ValidationException", "Item size has exceeded the maximum allowed size", "write")
            table.items[key] = new
        self._index(table, key, old, new)
        for observer in self.observers:
            observer(table.name, key, old, new)

    def _index(self, table: Table, key: str, old: Item | None, new: Item | None) -> None:
        old_key = _index_key(old)
        new_key = _index_key(new)
        projected = _project(new) if new_key is not None and new is not None else None
        lag = self.faults.index_lag()
        if lag <= 0 and not any(entry[1] == key for entry in table.index_lag):
            _apply_index(table, old_key, new_key, projected)
        else:
            table.index_lag.append((self.sched.now + max(lag, 0.0), key, old_key, new_key, projected))

    def settle_index(self, table: Table) -> None:
        """Index updates whose time has come become visible, in order."""
        while table.index_lag and table.index_lag[0][0] <= self.sched.now:
            _, _, old_key, new_key, projected = table.index_lag.pop(0)
            _apply_index(table, old_key, new_key, projected)

    def index_due(self) -> float | None:
        dues = [t.index_lag[0][0] for t in self.tables.values() if t.index_lag]
        return min(dues) if dues else None


def _apply_index(table: Table, old_key: tuple[str, str] | None, new_key: tuple[str, str] | None,
                 projected: Item | None) -> None:
    if old_key is not None and old_key != new_key:
        table.index.pop(old_key, None)
    if new_key is not None and projected is not None:
        table.index[new_key] = projected


def _index_key(item: Item | None) -> tuple[str, str] | None:
    if item is None:
        return None
    shard = item.get(INDEX_HASH)
    if not isinstance(shard, dict) or "S" not in shard:
        return None
    return (shard["S"], item["job_id"]["S"])


def _project(item: Item) -> Item:
    keep = ("job_id", INDEX_HASH, *INDEX_PROJECTION)
    return {k: item[k] for k in keep if k in item}


def _size(item: Item) -> int:
    return len(repr(item))


class DynamoClient:
    """The low-level client's calls the layer makes."""

    def __init__(self, world: DynamoWorld) -> None:
        self.world = world

    # -- helpers -----------------------------------------------------------------------------------
    @staticmethod
    def _key(key: Item, operation: str) -> str:
        if set(key) != {"job_id"} or "S" not in key["job_id"]:
            raise error("ValidationException", "The provided key element does not match the schema", operation)
        return str(key["job_id"]["S"])

    _cache: dict[Any, tuple[Any, Any, Any, frozenset[str], frozenset[str]]] = {}

    @classmethod
    def _parse(cls, operation: str, names: dict[str, str] | None, values: dict[str, Any] | None,
               condition: str | None = None, update: str | None = None,
               key_condition: str | None = None) -> tuple[Any, Any, Any]:
        """The parsed expressions (cached: the values are looked up when they are evaluated, in
        :data:`_VALUES`, which this sets to ``values``)."""
        names, values = names or {}, values or {}
        key = (condition, update, key_condition, tuple(sorted(names.items())), frozenset(values))
        cached = cls._cache.get(key)
        if cached is None:
            cached = cls._cache[key] = cls._parse_new(operation, names, values, condition, update, key_condition)
        _VALUES[-1] = values
        return cached[0], cached[1], cached[2]

    @staticmethod
    def _parse_new(operation: str, names: dict[str, str], values: dict[str, Any], condition: str | None,
                   update: str | None, key_condition: str | None) -> tuple[Any, Any, Any, frozenset[str],
                                                                           frozenset[str]]:
        parsed_condition = parsed_update = parsed_key = None
        used_names: set[str] = set()
        used_values: set[str] = set()
        try:
            for text, what in ((condition, "condition"), (update, "update"), (key_condition, "key")):
                if text is None:
                    continue
                parser = Parser(text, names, values)
                tree: Any = parser.update() if what == "update" else parser.condition()
                parser.done()
                used_names |= parser.used_names
                used_values |= parser.used_values
                if what == "condition":
                    parsed_condition = tree
                elif what == "update":
                    parsed_update = tree
                else:
                    parsed_key = tree
        except ExpressionError as exc:
            raise error("ValidationException", f"Invalid expression: {exc}", operation) from None
        if unused := sorted(set(names) - used_names):
            raise error("ValidationException", f"Value provided in ExpressionAttributeNames unused in expressions: "
                        f"keys: {{{', '.join(unused)}}}", operation)
        if unused := sorted(set(values) - used_values):
            raise error("ValidationException", f"Value provided in ExpressionAttributeValues unused in expressions: "
                        f"keys: {{{', '.join(unused)}}}", operation)
        return parsed_condition, parsed_update, parsed_key, frozenset(used_names), frozenset(used_values)

    def _check(self, condition: Any, item: Item | None, operation: str, old_on_failure: str | None) -> None:
        if condition is None:
            return
        try:
            ok = evaluate(item or {}, condition)
        except ExpressionError as exc:
            raise error("ValidationException", f"Invalid ConditionExpression: {exc}", operation) from None
        if not ok:
            extra = {"Item": _copy(item)} if old_on_failure == "ALL_OLD" and item is not None else {}
            raise error("ConditionalCheckFailedException", "The conditional request failed", operation, **extra)

    # -- the calls --------------------------------------------------------------------------------------
    def put_item(self, *, TableName: str, Item: Item, ConditionExpression: str | None = None,
                 ExpressionAttributeNames: dict[str, str] | None = None,
                 ExpressionAttributeValues: dict[str, Any] | None = None,
                 ReturnValuesOnConditionCheckFailure: str | None = None, **_: Any) -> dict[str, Any]:
        key = self._key({"job_id": Item["job_id"]}, "PutItem")
        self.world.call("PutItem", key)
        table = self.world.table(TableName, "PutItem")
        condition, _, _ = self._parse("PutItem", ExpressionAttributeNames, ExpressionAttributeValues,
                                      ConditionExpression)
        self._check(condition, table.items.get(key), "PutItem", ReturnValuesOnConditionCheckFailure)
        self.world.write(table, key, _copy(Item))
        return {}

    def update_item(self, *, TableName: str, Key: Item, UpdateExpression: str, ConditionExpression: str | None = None,
                    ExpressionAttributeNames: dict[str, str] | None = None,
                    ExpressionAttributeValues: dict[str, Any] | None = None, ReturnValues: str = "NONE",
                    ReturnValuesOnConditionCheckFailure: str | None = None, **_: Any) -> dict[str, Any]:
        key = self._key(Key, "UpdateItem")
        self.world.call("UpdateItem", key)
        table = self.world.table(TableName, "UpdateItem")
        condition, actions, _ = self._parse("UpdateItem", ExpressionAttributeNames, ExpressionAttributeValues,
                                            ConditionExpression, UpdateExpression)
        old = table.items.get(key)
        sets = frozenset(a[1][0] for a in actions if a[0] == "set")
        try:
            self._check(condition, old, "UpdateItem", ReturnValuesOnConditionCheckFailure)
        except ClientError:
            for observer in self.world.update_observers:
                observer(key, sets, False)
            raise
        for observer in self.world.update_observers:
            observer(key, sets, True)
        try:
            new = apply_update(old or {"job_id": {"S": key}}, actions)
        except ExpressionError as exc:
            raise error("ValidationException", f"Invalid UpdateExpression: {exc}", "UpdateItem") from None
        if "job_id" not in new or new["job_id"] != {"S": key}:
            raise error("ValidationException", "Cannot update attribute job_id. This attribute is part of the key",
                        "UpdateItem")
        self.world.write(table, key, new)
        if ReturnValues == "ALL_NEW":
            return {"Attributes": _copy(new)}
        if ReturnValues == "ALL_OLD":
            return {"Attributes": _copy(old)} if old else {}
        if ReturnValues in ("UPDATED_NEW", "UPDATED_OLD"):
            touched = {a[1][0] for a in actions}
            source = new if ReturnValues == "UPDATED_NEW" else (old or {})
            return {"Attributes": {k: _copy_value(v) for k, v in source.items() if k in touched}}
        return {}

    def get_item(self, *, TableName: str, Key: Item, ConsistentRead: bool = False, **_: Any) -> dict[str, Any]:
        key = self._key(Key, "GetItem")
        self.world.call("GetItem", key)
        item = self.world.table(TableName, "GetItem").items.get(key)
        return {"Item": _copy(item)} if item is not None else {}

    def batch_get_item(self, *, RequestItems: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.world.call("BatchGetItem", str(sum(len(r["Keys"]) for r in RequestItems.values())))
        responses: dict[str, list[Item]] = {}
        for name, request in RequestItems.items():
            if len(request["Keys"]) > 100:
                raise error("ValidationException", "Too many items requested for the BatchGetItem call",
                            "BatchGetItem")
            table = self.world.table(name, "BatchGetItem")
            found = [_copy(i) for k in request["Keys"] if (i := table.items.get(self._key(k, "BatchGetItem")))]
            if "ProjectionExpression" in request:  # top-level names, each a #name of ExpressionAttributeNames
                names = request.get("ExpressionAttributeNames", {})
                fields = [names.get(f.strip(), f.strip()) for f in request["ProjectionExpression"].split(",")]
                found = [{f: item[f] for f in fields if f in item} for item in found]
            responses[name] = found
        return {"Responses": responses, "UnprocessedKeys": {}}

    def query(self, *, TableName: str, KeyConditionExpression: str, IndexName: str | None = None,
              ExpressionAttributeValues: dict[str, Any] | None = None,
              ExpressionAttributeNames: dict[str, str] | None = None, Limit: int | None = None,
              ExclusiveStartKey: Item | None = None, Select: str | None = None, ScanIndexForward: bool = True,
              ProjectionExpression: str | None = None, **_: Any) -> dict[str, Any]:
        self.world.call("Query", f"{IndexName}")
        if IndexName != INDEX:
            raise error("ValidationException", "The table does not have the specified index", "Query")
        table = self.world.table(TableName, "Query")
        self.world.settle_index(table)
        _, _, key_condition = self._parse("Query", ExpressionAttributeNames, ExpressionAttributeValues,
                                          key_condition=KeyConditionExpression)
        shard = _hash_of(key_condition)
        entries = sorted((k, v) for k, v in table.index.items() if k[0] == shard)
        matched = [(k, v) for k, v in entries if evaluate(v, key_condition)]
        if not ScanIndexForward:
            matched.reverse()
        if ExclusiveStartKey:
            start = (ExclusiveStartKey[INDEX_HASH]["S"], ExclusiveStartKey["job_id"]["S"])
            matched = [(k, v) for k, v in matched if (k > start if ScanIndexForward else k < start)]
        page = matched if Limit is None else matched[:Limit]
        reply: dict[str, Any] = {"Count": len(page), "ScannedCount": len(page)}
        if Select != "COUNT":
            reply["Items"] = [_copy(v) for _, v in page]
            if ProjectionExpression is not None:  # plain attribute names (no #name, no paths)
                fields = [f.strip() for f in ProjectionExpression.split(",")]
                reply["Items"] = [{f: item[f] for f in fields if f in item} for item in reply["Items"]]
        if Limit is not None and len(page) == Limit and page:
            last = page[-1][0]
            reply["LastEvaluatedKey"] = {INDEX_HASH: {"S": last[0]}, "job_id": {"S": last[1]}}
        return reply

    def transact_write_items(self, *, TransactItems: list[dict[str, Any]], **_: Any) -> dict[str, Any]:
        self.world.call("TransactWriteItems", str(len(TransactItems)))
        plans: list[tuple[Table, str, Item]] = []
        reasons: list[dict[str, str]] = []
        failed = False
        for entry in TransactItems:
            (kind, request), = entry.items()
            if kind != "Put":
                raise error("ValidationException", f"simulated DynamoDB supports Put in transactions, not {kind}",
                            "TransactWriteItems")
            table = self.world.table(request["TableName"], "TransactWriteItems")
            key = self._key({"job_id": request["Item"]["job_id"]}, "TransactWriteItems")
            condition, _, _ = self._parse("TransactWriteItems", request.get("ExpressionAttributeNames"),
                                          request.get("ExpressionAttributeValues"), request.get("ConditionExpression"))
            ok = condition is None or evaluate(table.items.get(key) or {}, condition)
            reasons.append({"Code": "None"} if ok else {"Code": "ConditionalCheckFailed",
                                                         "Message": "The conditional request failed"})
            failed = failed or not ok
            plans.append((table, key, request["Item"]))
        if len({(t.name, k) for t, k, _ in plans}) != len(plans):
            raise error("ValidationException", "Transaction request cannot include multiple operations on one item",
                        "TransactWriteItems")
        if failed:
            raise error("TransactionCanceledException", "Transaction cancelled, please refer cancellation reasons "
                        "for specific reasons [" + ", ".join(r["Code"] for r in reasons) + "]",
                        "TransactWriteItems", CancellationReasons=reasons)
        for table, key, item in plans:
            self.world.write(table, key, _copy(item))
        return {}

    def delete_item(self, *, TableName: str, Key: Item, ReturnValues: str = "NONE", **_: Any) -> dict[str, Any]:
        key = self._key(Key, "DeleteItem")
        self.world.call("DeleteItem", key)
        table = self.world.table(TableName, "DeleteItem")
        old = table.items.get(key)
        if old is not None:
            self.world.write(table, key, None)
        return {"Attributes": _copy(old)} if old is not None and ReturnValues == "ALL_OLD" else {}


def _hash_of(node: Any) -> str:
    """The partition a key condition names (``pending_shard = :p``, alone or AND-ed with a range condition)."""
    if node[0] == "and":
        for side in (node[1], node[2]):
            try:
                return _hash_of(side)
            except ExpressionError:
                continue
    if node[0] == "cmp" and node[1] == "=" and node[2] == ("path", (INDEX_HASH,)) and node[3][0] == "value":
        return str(_VALUES[-1][node[3][1]]["S"])
    raise ExpressionError("Query condition missed key schema element: pending_shard")
