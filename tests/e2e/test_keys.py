"""Two Sume keys deployed into ministack (tests/e2e/conftest.py): jobs submitted to the default key
and to ``acme`` both finish through the deployed functions, each record and terminal event names
its key, and the simulator counts each key's reads in its own workspace - none refused."""

from __future__ import annotations

import uuid

import pytest

from tools.stack.deployed import DeployedStack

pytestmark = pytest.mark.e2e


def submit(stack: DeployedStack, key: str | None) -> str:
    event = {"kind": "image", "params": {"prompt": f"e2e {uuid.uuid4().hex}", "sim": {"duration": 60, "steps": 2}},
             **({"key": key} if key else {})}
    reply = stack.submit(event)
    assert reply["status"] == "submitted" and reply["key"] == (key or "default"), reply
    (job_id,) = reply["job_ids"]
    return str(job_id)


def test_jobs_of_two_keys_each_finish_on_their_own_key(stack: DeployedStack) -> None:
    jobs = {key: [submit(stack, None if key == "default" else key) for _ in range(3)] for key in ("default", "acme")}
    every = [j for ids in jobs.values() for j in ids]
    stack.drive(lambda: stack.settled(every) and set(every) <= {e["job_id"] for e in stack.events()}, timeout=120)
    records = stack.table.get_many(every)
    events = {e["job_id"]: e for e in stack.events()}
    workspaces = stack.sim.stats()["keys"]
    for key, ids in jobs.items():
        assert {(records[j]["status"], records[j]["key"]) for j in ids} == {("completed", key)}
        assert {events[j]["key"] for j in ids} == {key}
        reads = workspaces[key]["reads"]
        # Each key read its own jobs, in its own workspace (the other key's job would be a 403).
        assert reads["served"] >= sum(int(records[j]["reads"]) for j in ids) > 0, (key, reads)
        assert reads["rate_limited"] == 0 and workspaces[key]["forbidden"] == 0, (key, workspaces[key])
    assert workspaces["acme"]["read_budget"]["per_minute"] == 20
    stack.drive(lambda: stack.metric_totals("acme")["SumeReads"] > 0, timeout=60)  # the per-key metric, from the logs
