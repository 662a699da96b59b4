"""Sweeps on list routes that do not behave as the sweeps assume (in-process stack, TimeScale 0.02,
test_sweeps_system.py's parameters): whatever a page shows, only Sume's own routes decide an outcome.
A module of its own so that its eight runs (about two minutes) and the other sweeps tests go to two
test processes side by side (``--dist loadfile``)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from invariants import check
from scenario import found_by, run, stack_fixtures, submit
from test_sweeps_system import ENV, LIST_CAPABLE, PARAMETERS

from sume_poller.discovery import sweep
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

module_stack, stack = stack_fixtures(0.02, PARAMETERS, ENV)


#: Jobs of every outcome, finishing over 100-290 clock seconds: sweeps see each kind of listing.
OUTCOMES = ("completed", "completed", "completed", "failed", "canceled", "expired")


def mixed_jobs(stack: InProcessStack, n: int = 20) -> dict[str, str]:
    """``n`` jobs of mixed outcomes; job id -> the status Sume will report for it."""
    outcomes = [OUTCOMES[i % len(OUTCOMES)] for i in range(n)]
    ids = submit(stack, n, lambda i: {"duration": 100 + 10 * i, "steps": 2, "outcome": outcomes[i]})
    return dict(zip(ids, outcomes, strict=True))


@pytest.mark.parametrize(("name", "mode", "broken"), [
    ("a list that ignores status=", {"status_filter": "ignored"}, True),
    ("other terminal statuses on a filtered page", {"status_filter": "loose"}, True),
    ("items without a status", {"item_status": False}, True),
    ("ids never submitted here", {"foreign": 3}, False),
    # No order to stop by: paging follows the cursor until it comes back (an ordered list stops at
    # the previous sweep or the oldest pending job first, and never meets the repeat).
    ("a cursor that repeats", {"cursor_repeat": True, "order": "any"}, False),
    ("5xx on a page", {"faults": ["ok", "503", "ok", "500"]}, False),
    ("pages newest created first (paging stops at the oldest pending job)", {"order": "newest_created"}, False),
    ("pages out of created order (the bound is not used)", {"order": "any"}, False),
])
def test_a_list_that_does_not_behave_as_assumed_never_decides_an_outcome(
        stack: InProcessStack, name: str, mode: dict[str, Any], broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the list route shows, every job is recorded once with the status Sume's own
    routes report (a list only brings a read forward); a route that does not filter as assumed
    is marked broken for that status (SweepRouteBroken) and chains keep the normal schedule."""
    monkeypatch.setattr(sweep, "PAGE_SIZE", 4)  # pages enough for cursors and page faults to matter
    history = submit(stack, 8, {"duration": 1, "steps": 1})  # the workspace's past: lists page from the start
    run(stack, history)
    stack.sim.configure(list={**LIST_CAPABLE, **mode})
    expected = mixed_jobs(stack)
    ids = list(expected)
    stack.fanout()  # counts the pending jobs the sweep's cost rule needs
    # One sweep while every job is pending, whatever the machine's speed (in a loaded CI run the scheduled
    # sweeps met the repeated cursor only once the jobs were done, and stopped before it): no back-off from
    # the history's sweeps.
    redis.Redis.from_url(stack.redis_url).delete("sume:poll:!sweeps")
    swept = stack.invoke("SweepFunction", {"source": "aws.events"})
    assert swept["ran"], swept
    run(stack, ids, timeout=90)
    check(stack, ids, scenario=f"list route: {name}", expected=expected, allowance=2,
          notes=f"found by {dict(found_by(stack, ids))}")
    totals = stack.metric_totals()
    assert totals["SweepReads"] > 0, totals  # the sweeps did read the list
    assert (totals["SweepRouteBroken"] > 0) is broken, totals
    if broken:
        assert totals["Outcome_stretched"] == 0
    else:
        # A repeated cursor or a failed page leaves the sweep incomplete (it proves nothing).
        assert totals["SweepIncomplete"] > 0 or not ({"cursor_repeat", "faults"} & set(mode)), totals
