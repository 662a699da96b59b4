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


def test_the_terminal_event_names_the_callers_idempotency_key_in_version_2() -> None:
    """A caller answered "queued" has no job id to match the event on: the event carries the
    submission's idempotency key (each job of a multi-job create the same one). Version 2 only adds
    the field, so a consumer of version 1 reads it unchanged."""
    from sume_poller.store.events import EVENT_VERSION

    record = {"kind": "face_swap", "status": "completed", "key": "acme", "idempotency_key": "order-7", "reads": 1}
    first, second = terminal_event("job_1", record), terminal_event("job_2", record)
    assert EVENT_VERSION == 2 and first["version"] == 2
    assert first["idempotency_key"] == second["idempotency_key"] == "order-7"
    assert terminal_event("job_3", {"kind": "image", "status": "failed"})["idempotency_key"] is None  # registered
    assert sorted(first) == sorted(["version", "event_id", "job_id", "key", "idempotency_key", "kind", "status",
                                    "sume_status", "error", "result_available", "result_location", "terminal_at",
                                    "reads"])
