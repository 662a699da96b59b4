"""The list view (``GET /api/v1/jobs``): query parsing, listable jobs, order, pages and cursors.

The configured :class:`~tools.sume_sim.config.ListMode` picks what a page carries (minimal or full
items, with or without ``status``, an order that is or is not by time, a cursor or none), which
misses of a real list show (kinds never listed, only the newest N jobs, a lag before terminal
statuses appear) and which liberties an undocumented route may take (a ``status`` filter ignored
or loose, a cursor that repeats, items of jobs the client never created). Its injected faults are
the model's business.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tools.sume_sim.config import ListMode
from tools.sume_sim.spec import DEFAULT_WORKSPACE, KIND_BY_TYPE, SUME_TYPES, TERMINAL_STATUSES, SpecError
from tools.sume_sim.timeline import Job, JobState, iso

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
FOREIGN_PREFIX = "job_foreign_"
#: Statuses of foreign items when the filter names no terminal status (or is not applied).
FOREIGN_STATUSES = ("completed", "failed")
#: Foreign jobs were created this long (clock seconds) before the page is read.
FOREIGN_AGE = 3600.0


@dataclass(frozen=True)
class ListQuery:
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    kind: str | None = None
    statuses: frozenset[str] | None = None  # lower-cased
    cursor: str | None = None  # as asked with (only when the mode has cursors)


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
    with_cursor = bool(cursor) and mode.cursor
    return ListQuery(
        limit=int(raw_limit) if raw_limit is not None else DEFAULT_LIMIT,
        offset=decode_cursor(cursor) if cursor and with_cursor else 0,
        kind=None if raw_type is None else KIND_BY_TYPE[raw_type],
        statuses=_statuses(first("status"), mode.multi_status),
        cursor=cursor if with_cursor else None,
    )


def _statuses(raw: str | None, multi: bool) -> frozenset[str] | None:
    if raw is None or not raw.strip():
        return None
    values = frozenset(v.strip().lower() for v in raw.split(",") if v.strip())
    if len(values) > 1 and not multi:
        raise SpecError("status takes exactly one value", "status")
    return values


def listable(jobs: Iterable[Job], now: float, mode: ListMode, workspace: str = DEFAULT_WORKSPACE) -> list[Job]:
    """The jobs a list may show at clock time ``now``: (with ``newest_n``) among the newest N of
    the workspace's jobs by creation, and of those the visible ones, not ``forbidden``, of a listed kind."""
    reach = [job for job in jobs if job.workspace == workspace]
    if mode.newest_n is not None:
        reach = sorted(reach, key=lambda j: j.created, reverse=True)[: mode.newest_n]
    return [
        job for job in reach
        if now >= job.visible_at and not job.spec.forbidden and job.kind not in mode.omit_kinds
    ]


def passes(state: JobState, statuses: frozenset[str] | None, status_filter: str) -> bool:
    """Whether a job in (listed) ``state`` is on a page asked for ``statuses`` under ``status_filter``:
    ``honoured`` lists the named statuses only, ``ignored`` every job, ``loose`` the named ones and
    every terminal one besides."""
    if statuses is None or status_filter == "ignored":
        return True
    return state.status.lower() in statuses or (status_filter == "loose" and state.terminal)


def foreign_items(mode: ListMode, query: ListQuery, now: float) -> list[dict[str, Any]]:
    """The ``foreign`` items of one page: well-formed items of terminal jobs never created through
    this API (``job_foreign_<hex>``, stable per page offset and position). Their status is one the
    filter names (terminal ones, in turn) or, without a filter or with it ignored, completed and
    failed in turn; a filter naming no terminal status gets none (unless it is ignored)."""
    if mode.foreign == 0:
        return []
    statuses: tuple[str, ...] = FOREIGN_STATUSES
    if query.statuses is not None and mode.status_filter != "ignored":
        statuses = tuple(sorted(query.statuses & TERMINAL_STATUSES))
        if not statuses:
            return []
    sume_type = SUME_TYPES[query.kind or "image"]
    stamp = iso(now - FOREIGN_AGE)
    items = []
    for i in range(mode.foreign):
        digest = hashlib.sha256(f"foreign:{query.offset}:{i}".encode()).hexdigest()[:24]
        item: dict[str, Any] = {"id": FOREIGN_PREFIX + digest, "type": sume_type}
        if mode.item_status:
            item["status"] = statuses[i % len(statuses)]
        if mode.fields == "full":
            item.update(created_at=stamp, updated_at=stamp)
        items.append(item)
    return items


def page(jobs: Iterable[Job], now: float, mode: ListMode, query: ListQuery,
         workspace: str = DEFAULT_WORKSPACE) -> dict[str, Any]:
    """One page of the list reply (without ``request_id``) for a key of ``workspace``."""
    entries: list[tuple[Job, JobState]] = []
    for job in listable(jobs, now, mode, workspace):
        if query.kind is not None and job.kind != query.kind:
            continue
        state = job.listed_state(now, mode.lag)
        if passes(state, query.statuses, mode.status_filter):
            entries.append((job, state))
    if mode.order == "newest_first":
        entries.sort(key=lambda e: (e[1].updated_at, e[0].created), reverse=True)
    elif mode.order == "newest_created":
        entries.sort(key=lambda e: (e[0].created, e[0].id), reverse=True)
    else:  # stable, and deliberately not by time
        entries.sort(key=lambda e: hashlib.sha256(e[0].id.encode()).hexdigest())
    end = query.offset + query.limit
    items = [job.list_item(now, mode.lag, mode.fields == "full", mode.item_status)
             for job, _ in entries[query.offset : end]]
    payload: dict[str, Any] = {"jobs": items + foreign_items(mode, query, now)}
    if mode.cursor:
        if mode.cursor_repeat and query.cursor is not None:
            payload["next_cursor"] = query.cursor  # the cursor asked with, again: a loop
        else:
            payload["next_cursor"] = encode_cursor(end) if end < len(entries) else None
    return payload
