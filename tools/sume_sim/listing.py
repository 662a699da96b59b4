"""The list view (``GET /api/v1/jobs``): query parsing, listable jobs, order, pages and cursors.

The configured :class:`~tools.sume_sim.config.ListMode` picks what a page carries (minimal or full
items, an order that is or is not by time, a cursor or none) and which misses of a real list show
(kinds never listed, only the newest N jobs, a lag before terminal statuses appear).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tools.sume_sim.config import ListMode
from tools.sume_sim.spec import KIND_BY_TYPE, SpecError
from tools.sume_sim.timeline import Job

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


@dataclass(frozen=True)
class ListQuery:
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    kind: str | None = None
    statuses: frozenset[str] | None = None  # lower-cased


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, _, number = text.partition(":")
        if prefix == "offset" and number.isdigit():
            return int(number)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise SpecError("cursor is not a cursor this API returned", "cursor")


def parse_query(query: Mapping[str, list[str]], mode: ListMode) -> ListQuery:
    """Validate ``limit``, ``cursor``, ``type`` and ``status``; raise :class:`SpecError`."""

    def first(name: str) -> str | None:
        values = query.get(name)
        return values[0] if values else None

    raw_limit = first("limit")
    if raw_limit is not None and not (raw_limit.isdigit() and 1 <= int(raw_limit) <= MAX_LIMIT):
        raise SpecError(f"limit must be an integer in [1, {MAX_LIMIT}]", "limit")
    cursor = first("cursor")
    raw_type = first("type")
    if raw_type is not None and raw_type not in KIND_BY_TYPE:
        raise SpecError(f"type must be one of {', '.join(KIND_BY_TYPE)}", "type")
    return ListQuery(
        limit=int(raw_limit) if raw_limit is not None else DEFAULT_LIMIT,
        offset=decode_cursor(cursor) if cursor and mode.cursor else 0,
        kind=None if raw_type is None else KIND_BY_TYPE[raw_type],
        statuses=_statuses(first("status"), mode.multi_status),
    )


def _statuses(raw: str | None, multi: bool) -> frozenset[str] | None:
    if raw is None or not raw.strip():
        return None
    values = frozenset(v.strip().lower() for v in raw.split(",") if v.strip())
    if len(values) > 1 and not multi:
        raise SpecError("status takes exactly one value", "status")
    return values


def listable(jobs: Iterable[Job], now: float, mode: ListMode) -> list[Job]:
    """The jobs a list may show at clock time ``now``: (with ``newest_n``) among the newest N of
    all jobs by creation, and of those the visible ones of this workspace and of a listed kind."""
    reach = list(jobs)
    if mode.newest_n is not None:
        reach = sorted(reach, key=lambda j: j.created, reverse=True)[: mode.newest_n]
    return [
        job for job in reach
        if now >= job.visible_at and not job.spec.forbidden and job.kind not in mode.omit_kinds
    ]


def page(jobs: Iterable[Job], now: float, mode: ListMode, query: ListQuery) -> dict[str, Any]:
    """One page of the list reply (without ``request_id``)."""
    entries = []
    for job in listable(jobs, now, mode):
        item = job.list_item(now, mode.lag, mode.fields == "full")
        if query.kind is not None and job.kind != query.kind:
            continue
        if query.statuses is not None and item["status"].lower() not in query.statuses:
            continue
        entries.append((job, item))
    if mode.order == "newest_first":
        entries.sort(key=lambda e: (e[0].listed_state(now, mode.lag).updated_at, e[0].created), reverse=True)
    else:  # stable, and deliberately not by time
        entries.sort(key=lambda e: hashlib.sha256(e[0].id.encode()).hexdigest())
    end = query.offset + query.limit
    payload: dict[str, Any] = {"jobs": [item for _, item in entries[query.offset : end]]}
    if mode.cursor:
        payload["next_cursor"] = encode_cursor(end) if end < len(entries) else None
    return payload
