"""The fault suite, many Sume keys (issue 23): two keys beside the default one, each with its own
API key at the simulator (its own workspace and read limits) and an entry in the key configuration
secret - a key rotated mid-run, one key refused while the others read, a key removed from the
configuration while its jobs are pending, and two keys with different limits each inside its own
budget - on the whole system, compressed clock (TimeScale 0.02)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
from invariants import check
from scenario import FAULT_SCALE, NO_CREATE_BUDGET, SAFE_LEASES, remove_key, rotate_key, run, stack_fixtures, submit

from bench.fig_budget import most_in_a_minute  # the figure's own count
from sume_poller.config.keys import MAX_AGE
from sume_poller.poll.keycheck import KEY_PAUSE
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

#: Read limits per clock minute (the simulator enforces them; the key configuration states them):
#: small enough that a dozen jobs' reads bind them. No day limits: on this clock a day's budget
#: is paced over half an hour.
KEYS = {"acme": {"read_budget": {"per_minute": 10}}, "globex": {"read_budget": {"per_minute": 20}}}
PARAMETERS = {**NO_CREATE_BUDGET, "NotFoundGraceSeconds": 300, "ReadsPerDay": 0, "Sweeps": "false"}
#: The key configuration's cache of the second stack (real seconds): a removal is seen this soon.
SHORT_CACHE = 2.0

#: Budgets on this 50x clock: a read granted half a real second early (the limiter's allowance
#: for queueing lag) lands 25 clock seconds early, in the window before; at 10x, 5 seconds.
BUDGET_SCALE = 0.1

module_stack, stack = stack_fixtures(FAULT_SCALE, PARAMETERS, SAFE_LEASES, keys=KEYS)
module_short, short = stack_fixtures(FAULT_SCALE, PARAMETERS, {**SAFE_LEASES, "SUME_KEYS_MAX_AGE": f"{SHORT_CACHE:g}"},
                                     name="short", keys=KEYS)
module_budgets, budgets = stack_fixtures(BUDGET_SCALE, PARAMETERS, SAFE_LEASES, name="budgets", keys=KEYS)


def workspace(stack: InProcessStack, key_id: str) -> dict[str, Any]:
    """The simulator's counters of a key's workspace (its reads: attempts, served, rate_limited)."""
    return stack.sim.stats()["keys"][key_id]  # type: ignore[no-any-return]


def all_read(stack: InProcessStack, ids: list[str]) -> bool:
    """Every one of ``ids`` has been read at least once (its chain runs)."""
    jobs = stack.sim.stats()["jobs"]
    return all(jobs.get(j, {}).get("status_reads", 0) >= 1 for j in ids)


def detection_delays(stack: InProcessStack, ids: list[str]) -> list[float]:
    """Clock seconds from Sume's terminal time to the poller seeing it, per job."""
    delays = []
    for job_id in ids:
        info, record = stack.sim.job_info(job_id), stack.record(job_id)
        assert info is not None and record is not None
        delays.append(float(record["seen_terminal_at"]) - datetime.fromisoformat(info["terminal_at"]).timestamp())
    return delays


def busiest_minute(stack: InProcessStack, key_id: str) -> int:
    """The most reads the simulator took from a key in one of its minute windows."""
    return max((w["attempts"] for w in stack.sim.budget_stats()["keys"][key_id]["reads"]["60"]), default=0)


def test_two_keys_with_different_limits_each_stay_inside_their_own_budget(
        budgets: InProcessStack, grants: dict[str, list[float]]) -> None:
    """Each key's reads are granted within its own limit (counted where its limiter grants them: the
    ``grants`` fixture says why not at Sume), and no read reaches Sume without a grant."""
    stack = budgets
    spec = {"duration": 60, "steps": 3, "hints": False}  # no hints: each job asks for reads often
    ids = {key: submit(stack, 12, spec, key=key) for key in ("acme", "globex")}
    default = submit(stack, 4, spec)
    run(stack, [*ids["acme"], *ids["globex"], *default], timeout=120)
    granted = {key: next(times for budget, times in grants.items() if budget.endswith(f"{{reads:{key}}}"))
               for key in ids}
    most = {key: most_in_a_minute(granted[key]) for key in ids}
    for key, jobs in ids.items():
        limit = KEYS[key]["read_budget"]["per_minute"]
        reads = workspace(stack, key)["reads"]
        check(stack, jobs, scenario=f"key {key} at {limit} reads/min beside another key and the default one",
              expected="completed", allowance=100, notes=f"{reads['served']} reads, at most {most[key]} granted "
              f"in a minute, at most {busiest_minute(stack, key)} in one of Sume's, {reads['rate_limited']} 429s")
        assert {r["key"] for r in stack.records(jobs)} == {key}
        assert most[key] <= limit and reads["attempts"] <= len(granted[key]), (reads, most, len(granted[key]))
        assert stack.metric_totals(key)["BudgetExhausted"] > 0, "the key's budget never bound: the row tests nothing"
    # Its own budget: globex was granted more in a minute than acme's whole limit (not held to acme's).
    assert most["globex"] > KEYS["acme"]["read_budget"]["per_minute"], most
    check(stack, default, scenario="the default key beside two others", expected="completed", allowance=100)
    assert all(r.get("key") in (None, "default") for r in stack.records(default))
    assert workspace(stack, "default")["reads"]["rate_limited"] == 0
    # Each key's reads went to its own workspace: none was refused as another workspace's job.
    assert all(workspace(stack, w)["forbidden"] == 0 for w in ("default", "acme", "globex"))


def test_a_key_rotated_mid_run_keeps_its_jobs_finishing_after_one_forced_reread(stack: InProcessStack) -> None:
    acme = submit(stack, 10, {"duration": 600, "steps": 4}, key="acme")
    stack.drive(lambda: all_read(stack, acme), 30, fanout_every=1.0)
    old = stack.keys["acme"]
    rotated_at = time.monotonic()
    rotate_key(stack, "acme")
    assert stack.key_secrets()["sume-poller/keys/api-keys/acme"] != old
    run(stack, acme, timeout=MAX_AGE - 10)  # well before the configuration's cache would have expired
    took = time.monotonic() - rotated_at
    refused = stack.sim.stats()["unauthorized"]
    check(stack, acme, scenario="a key rotated mid-run (simulator first, then the configuration)",
          expected="completed", allowance=1, notes=f"{refused} reads refused with the old key; done {took:.0f} s "
          f"after the rotation (cache {MAX_AGE:g} s)")
    assert stack.metric_totals("acme")["SumeAuthFailed"] >= 1  # the 401 that forced the re-read
    assert 1 <= refused <= 10  # at most what was in flight when the key went: the pause stops the rest
    assert stack.metric_totals("globex")["SumeAuthFailed"] == 0


def test_one_keys_401_pauses_that_key_while_the_others_keep_reading(stack: InProcessStack) -> None:
    spec = {"duration": 400, "steps": 4}
    acme, globex = submit(stack, 8, spec, key="acme"), submit(stack, 8, spec, key="globex")
    stack.drive(lambda: all_read(stack, acme + globex), 30, fanout_every=1.0)
    stack.sim.remove_key(stack.keys["acme"])  # revoked at Sume; still in the key configuration
    revoked_at = stack.clock.now()
    run(stack, globex, timeout=60)
    pauses = 1 + int((stack.clock.now() - revoked_at) // KEY_PAUSE)  # acme reads again after each pause
    delays = detection_delays(stack, globex)
    check(stack, globex, scenario="one key refused (401) while this key keeps reading", expected="completed",
          notes=f"detected at most {max(delays):.0f} clock s after Sume finished (the refused key's pause: "
          f"{KEY_PAUSE:g} s)")
    acme_metrics, globex_metrics = stack.metric_totals("acme"), stack.metric_totals("globex")
    assert acme_metrics["SumeAuthFailed"] >= 1 and acme_metrics["KeyPaused"] >= 1, acme_metrics
    # On schedule: a step of globex never waited out acme's pause (acme is refused again after each one) -
    # no globex step was re-queued for a paused key. (Its detection delays, in the figures' notes, are
    # not asserted: on a busy machine the single-threaded event source alone stretched them past 200
    # clock s, a third of a real second a step at 50x.)
    assert globex_metrics["SumeAuthFailed"] == 0 and globex_metrics["KeyPaused"] == 0, globex_metrics
    # acme's jobs wait, keeping their place: none recorded since the revocation, none lost (a slow
    # machine's first reads may find one done before it: a CI run under load recorded one then).
    after = [r for r in stack.records(acme) if r["status"] != "pending" and float(r["updated_at"]) >= revoked_at]
    assert not after and len(stack.records(acme)) == len(acme), after
    # Each pause stops acme's readers: per pause, at most the reads in flight when it began.
    assert stack.sim.stats()["unauthorized"] <= (len(acme) + 2) * pauses, pauses


def test_a_key_revoked_and_removed_fails_its_pending_jobs_key_removed(stack: InProcessStack) -> None:
    acme = submit(stack, 6, {"duration": 600, "steps": 4}, key="acme")
    globex = submit(stack, 6, {"duration": 300, "steps": 3}, key="globex")
    stack.drive(lambda: all_read(stack, acme), 30, fanout_every=1.0)
    remove_key(stack, "acme", at_sume=True)  # the 401 reads the configuration again at once
    run(stack, acme + globex, timeout=MAX_AGE - 10)
    check(stack, acme, scenario="a key removed (configuration and Sume) while its jobs are pending",
          expected="failed", allowance=1)
    check(stack, globex, scenario="beside a removed key", expected="completed")
    assert {r["error"]["code"] for r in stack.records(acme)} == {"key_removed"}
    assert stack.metric_totals("acme")["KeyRemoved"] == len(acme)
    assert stack.metric_totals("globex")["KeyRemoved"] == 0


def test_a_key_removed_from_the_configuration_fails_its_pending_jobs_key_removed(short: InProcessStack) -> None:
    stack = short
    acme = submit(stack, 6, {"duration": 3000, "steps": 4}, key="acme")  # a minute of real time
    stack.drive(lambda: all_read(stack, acme), 30, fanout_every=1.0)
    remove_key(stack, "acme")  # Sume would still take it: the configuration's cache expiring shows it
    removed_at = time.monotonic()
    run(stack, acme, timeout=30)
    took = time.monotonic() - removed_at
    check(stack, acme, scenario="a key removed from the configuration while its jobs are pending",
          expected="failed", notes=f"recorded key_removed {took:.1f} s after (cache {SHORT_CACHE:g} s)")
    assert {r["error"]["code"] for r in stack.records(acme)} == {"key_removed"}
    assert stack.metric_totals("acme")["KeyRemoved"] == len(acme)
    assert stack.sim.stats()["unauthorized"] == 0  # never refused: the key left the configuration only
    assert not any(stack.sim.job_info(j)["terminal"] for j in acme)  # type: ignore[index]  # still running at Sume
