"""How Sume's replies are read (sume.py's pure parts): statuses, the terminal flag, rate-limit
headers, Retry-After, job ids in create replies."""

from __future__ import annotations

import pytest

from sume_poller.limits.budget import RateInfo
from sume_poller.sume.client import Retryable, parse_rate, parse_retry_after
from sume_poller.sume.created import extract_job_ids
from sume_poller.sume.status import Pending, Terminal, interpret_status


def test_an_explicit_terminal_false_never_overrides_a_terminal_status() -> None:
    out = interpret_status({"job": {"status": "completed", "terminal": False, "result_ready": True}})
    assert isinstance(out, Terminal) and out.status == "completed"


@pytest.mark.parametrize("hints", [{}, {"terminal": True, "result_ready": True}, {"terminal": True}])
def test_an_unknown_status_is_not_terminal_whatever_terminal_says(hints: dict[str, bool]) -> None:
    """The contract: an unknown status is not terminal - keep reading (the deadline caps it), report it
    loudly. ``terminal: true`` beside it does not make it an outcome (before: completed or failed)."""
    out = interpret_status({"job": {"status": "finalizing", **hints}})
    assert isinstance(out, Pending) and out.unknown_status and out.status == "finalizing"


@pytest.mark.parametrize("body", [None, [], "x", {"job": {"status": ""}}, {"status": 7}])
def test_garbage_is_a_transient_fault(body: object) -> None:
    assert isinstance(interpret_status(body), Retryable)


def test_rate_limit_headers_name_their_window() -> None:
    info = parse_rate({"RateLimit-Limit": "120", "RateLimit-Remaining": "7", "RateLimit-Reset": "21",
                       "RateLimit-Policy": "120;w=60, 10000;w=86400"})
    assert (info.limit, info.remaining, info.reset, info.window()) == (120, 7, 21.0, "m")
    assert info.learned(60) == 120 and info.learned(86_400) == 10_000
    daily = parse_rate({"RateLimit-Limit": "10000", "RateLimit-Remaining": "3", "RateLimit-Reset": "5000"})
    assert daily.window() == "d" and daily.learned(86_400) == 10_000
    assert parse_rate({"RateLimit-Limit": "x", "RateLimit-Remaining": "-3"}) == RateInfo()


def test_a_reply_is_worth_telling_the_budget_only_near_the_edge() -> None:
    assert not RateInfo(limit=120, remaining=100, reset=30).worth_telling(120)
    assert RateInfo(limit=120, remaining=60, reset=30).worth_telling(120)
    assert RateInfo(limit=40, remaining=39, reset=60).worth_telling(120)
    assert RateInfo(retry_after=3.0).worth_telling(120)


def test_retry_after_takes_seconds_or_a_date_and_is_capped() -> None:
    assert parse_retry_after("12") == 12.0
    assert parse_retry_after("Thu, 01 Jan 2099 00:00:00 GMT", now=4_070_908_700.0) == 100.0
    assert parse_retry_after("1e300") == 86_400.0
    assert parse_retry_after("soon") is None


def test_job_ids_come_from_every_documented_shape() -> None:
    assert extract_job_ids({"job": {"id": "job_a"}}) == ("job_a",)
    assert extract_job_ids({"job_id": "job_b"}) == ("job_b",)
    assert extract_job_ids({"job_ids": ["job_c", "job_d", "job_c"]}) == ("job_c", "job_d")
    assert extract_job_ids({"jobs": [{"id": "job_e"}, 5]}) == ("job_e",)
