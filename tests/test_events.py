"""Every file in events/ runs through the Docker-free `sam local invoke` stand-in
(python -m tools.local_invoke), in a fresh process, against the local services."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.localrun import LocalSystem

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
EVENT_FILES = sorted(p.name for p in (ROOT / "events").glob("*.json"))


def invoke(system: LocalSystem, function: str, event: str, tmp_path: Path) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    env_vars = tmp_path / "env.json"
    env_vars.write_text(json.dumps({"Parameters": {
        "JOBS_TABLE": system.table, "POLL_QUEUE_URL": system.queue_url,
        "REDIS_URL": system.specs["PollFunction"].environment["REDIS_URL"],
        "SUME_BASE_URL": system.sume_base_url, "LEASE_MARGIN_SECONDS": "2", "CLAIM_TTL_SECONDS": "2"}}))
    proc = subprocess.run(
        [sys.executable, "-m", "tools.local_invoke", function, "-e", f"events/{event}", "--env-vars", str(env_vars)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    payload = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, payload, proc.stderr


def test_every_event_file_is_covered() -> None:
    assert set(EVENT_FILES) == {"fanout_tick.json", "poll_malformed.json", "poll_message.json",
                                "submit_image.json", "submit_register.json"}


def test_events_run_through_the_template_handlers_in_a_fresh_process(system: LocalSystem, tmp_path: Path) -> None:
    registered = json.loads((ROOT / "events/submit_register.json").read_text())["job_id"]
    system.sim_seed("video", {"duration": 30}, job_id=registered)

    code, reply, err = invoke(system, "SubmitFunction", "submit_image.json", tmp_path)
    assert code == 0, err
    assert reply["status"] == "submitted" and reply["idempotency_key"] == "example-image-0001"
    assert system.sim_stats()["creates"] == 1

    code, reply, err = invoke(system, "SubmitFunction", "submit_register.json", tmp_path)
    assert (code, reply["status"], reply["job_ids"]) == (0, "registered", [registered]), err

    code, reply, err = invoke(system, "PollFunction", "poll_message.json", tmp_path)
    assert (code, reply) == (0, {"batchItemFailures": []}), err
    assert system.sim_job(registered)["status_reads"] == 1  # read once, re-queued

    code, reply, err = invoke(system, "PollFunction", "poll_malformed.json", tmp_path)
    assert code == 0, err
    assert reply == {"batchItemFailures": [{"itemIdentifier": "2e1424d4-f796-459a-8184-9c92662be6da"}]}
    assert "malformed poll message" in err

    code, reply, err = invoke(system, "FanOutFunction", "fanout_tick.json", tmp_path)
    assert code == 0, err
    assert reply["pending_seen"] == 2 and reply["redis_unavailable"] is False
