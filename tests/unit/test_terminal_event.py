"""The terminal event's detail names the job's Sume key: a platform serving many workspaces routes
each finished job to its customer from the event alone (records from before keys name none)."""

from __future__ import annotations

from sume_poller.store.events import terminal_event


def test_the_terminal_event_names_the_jobs_key() -> None:
    record = {"kind": "image", "status": "completed", "key": "acme", "result_json": "{}", "terminal_at": 5, "reads": 2}
    detail = terminal_event("job_1", record)
    assert detail["key"] == "acme"
    assert (detail["event_id"], detail["result_location"], detail["reads"]) == ("job_1:terminal", "table", 2)
    assert "api_key" not in detail and all("sume_live" not in str(v) for v in detail.values())


def test_a_record_from_before_keys_gives_no_key_the_default_one() -> None:
    assert terminal_event("job_1", {"kind": "image", "status": "failed"})["key"] is None
