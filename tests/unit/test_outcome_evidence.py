"""Every outcome path records only what Sume said (poller.py): a key check without an answer proves
nothing. Through the poller's real state machine over the unit tier's fakes."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import refused, retry
from test_poller import Rig

from sume_poller.sume import Listing, Retryable


@pytest.fixture
def rig() -> Rig:
    return Rig()


def record(rig: Rig, job_id: str = "job_a") -> dict[str, Any]:
    return rig.store.records[job_id]


# == the key check =================================================================================
@pytest.mark.parametrize("no_answer", [retry(503), retry(429, retry_after=5.0),
                                       Retryable("transport:ReadTimeoutError")])
def test_a_key_check_without_an_answer_is_no_evidence_asks_again_later_and_is_not_kept(
        rig: Rig, no_answer: Retryable) -> None:
    """Before: a list read that answered 5xx/429/nothing counted as "the key is fine": the job was
    recorded failed, and so was every 403 in the container for the next minute (cached)."""
    rig.sume.status["job_f"] = [refused("forbidden", 403)]
    rig.sume.status["job_g"] = [refused("forbidden", 403)]
    rig.sume.listing = [no_answer, no_answer, Listing(({"id": "job_x"},), None, False)]
    first = rig.run(rig.submit("job_f"))
    assert first.name == "transient" and record(rig, "job_f")["status"] == "pending"
    other_job = rig.run(rig.submit("job_g"))  # nothing was kept: this 403 asks the list again
    assert other_job.name == "transient" and rig.sume.reads("list") == 2
    rig.clock.advance(60)
    out = rig.run(rig.next_of(first))
    assert out.status == "failed" and rig.sume.reads("list") == 3  # an answer: only this job is refused
    assert record(rig, "job_f")["error"]["code"] == "forbidden"
