"""The interleaving simulation (tests/sim): a seed replays exactly, the scheduler runs one actor at a
time on its own clock, each invariant catches what it is there to catch, and the in-process fakes
keep the semantics the layer relies on (held to the real services by tests/integration/test_sim_fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from redis.exceptions import NoScriptError, ResponseError
from sim.dynamo_fake import DynamoWorld
from sim.invariants import Checker
from sim.miniredis import Client, Server
from sim.plan import draw
from sim.run import run
from sim.scheduler import Killed, Scheduler, SimExecutor
from sim.world import START, World, deterministic

from sume_poller.store.records import Ending, JobStore


# -- determinism -----------------------------------------------------------------------------------------
def test_a_seed_replays_the_same_run_and_another_seed_does_not() -> None:
    first, again, other = run(3), run(3), run(4)
    assert first.trace == again.trace and first.steps == again.steps
    assert [(v.invariant, v.job, v.detail) for v in first.violations] == \
        [(v.invariant, v.job, v.detail) for v in again.violations]
    assert other.trace != first.trace


def test_a_run_leaves_the_process_as_it_found_it() -> None:
    import random
    import secrets

    from sume_poller.poll import batch

    state, token_hex, deadline = random.getstate(), secrets.token_hex, batch.Deadline
    run(5)
    assert random.getstate() == state and secrets.token_hex is token_hex and batch.Deadline is deadline


# -- the scheduler ---------------------------------------------------------------------------------------
def test_actors_run_one_at_a_time_in_the_order_the_seed_picks() -> None:
    def order(seed: int) -> list[str]:
        sched = Scheduler(seed, 0.0)
        seen: list[str] = []
        inv = sched.invocation("i", 100.0)
        for name in "abc":
            def body(name: str = name) -> None:
                for step in range(3):
                    sched.point(f"{name}{step}")
                    seen.append(f"{name}{step}")
            sched.spawn(name, inv, body)
        assert sched.run(until=lambda: True, max_steps=100, horizon=50.0) == "done"
        return seen

    runs = [order(seed) for seed in range(6)]
    assert runs[0] == order(0)  # the same seed, the same order
    assert len({tuple(r) for r in runs}) > 1  # other seeds, other orders
    for seen in runs:  # each actor's own steps stay in its order
        for name in "abc":
            assert [s for s in seen if s[0] == name] == [f"{name}0", f"{name}1", f"{name}2"]


def test_the_clock_moves_only_when_the_scheduler_moves_it_and_an_invocation_past_its_end_is_killed() -> None:
    sched = Scheduler(1, 1000.0, advance=0.0)
    events: list[tuple[str, float]] = []
    slow = sched.invocation("slow", 10.0)

    def sleeper() -> None:
        sched.sleep(30.0)  # past its invocation's end: it never wakes
        events.append(("woke", sched.now))

    def other() -> None:
        sched.sleep(5.0)
        events.append(("other", sched.now))

    ended: list[BaseException | None] = []
    sched.spawn("sleeper", slow, sleeper, ended.append)
    sched.spawn("other", sched.invocation("other", 60.0), other)
    assert sched.run(until=lambda: all(a.done for a in sched.actors()), max_steps=100, horizon=2000.0) == "done"
    assert events == [("other", 1005.0)]
    assert len(ended) == 1 and isinstance(ended[0], Killed) and slow.killed and slow.reason == "timeout"


def test_a_crash_unwinds_every_actor_of_the_invocation_without_effect() -> None:
    sched = Scheduler(2, 0.0)
    inv = sched.invocation("batch", 30.0)
    effects: list[str] = []
    executor = SimExecutor(sched, lambda: inv, "batch")

    def worker(name: str) -> None:
        sched.point(f"{name} call")
        if name == "w1":
            sched.crash("crash")
        sched.point(f"{name} second call")
        effects.append(name)

    def handler() -> None:
        futures = [executor.submit(worker, n) for n in ("w1", "w2")]
        for f in futures:
            f.result()
        effects.append("handler")

    sched.spawn("batch", inv, handler)
    sched.run(until=lambda: all(a.done for a in sched.actors()), max_steps=100, horizon=100.0)
    assert "handler" not in effects and "w1" not in effects and inv.killed
    assert all(a.done for a in inv.actors)


# -- the invariants: each can fail ------------------------------------------------------------------------
@pytest.fixture
def world() -> Any:
    sched = Scheduler(9, START, advance=0.0)
    with deterministic(9, sched):
        world = World(draw(9), sched)
        world.faults.enabled = False
        yield world


def test_a_terminal_record_that_changes_is_caught(world: World) -> None:
    checker = Checker(world)
    store = JobStore("jobs", 1, ddb=world.ddb.client)
    job = world.model.seed_job("image", {"duration": 1}, age=10.0)
    store.put_pending(job, "image", now=world.sched.now, deadline_at=int(world.sched.now) + 60)
    assert store.record_terminal(job, Ending("completed", result={"result_json": "{}"}), now=world.sched.now).won
    world.ddb.client.update_item(TableName="jobs", Key={"job_id": {"S": job}}, UpdateExpression="SET #s = :s",
                                 ExpressionAttributeNames={"#s": "status"},
                                 ExpressionAttributeValues={":s": {"S": "failed"}})
    assert [v.invariant for v in checker.violations] == ["one-record"]


def test_an_outcome_sume_never_stated_is_caught(world: World) -> None:
    checker = Checker(world)
    store = JobStore("jobs", 1, ddb=world.ddb.client)
    running = world.model.seed_job("video", {"duration": 600})
    failed = world.model.seed_job("image", {"duration": 1, "outcome": "failed"}, age=10.0)
    for job in (running, failed):
        store.put_pending(job, "image", now=world.sched.now, deadline_at=int(world.sched.now) + 60)
    store.record_terminal(running, Ending("failed"), now=world.sched.now)
    store.record_terminal(failed, Ending("completed"), now=world.sched.now)
    found = {(v.invariant, v.job) for v in checker.violations}
    assert ("sume-said", running) in found and ("sume-said", failed) in found
    assert ("result", failed) in found  # completed, and no result recorded


def test_two_reads_of_one_job_in_flight_are_caught_unless_redis_lost_its_data_between_their_holds(
        world: World) -> None:
    checker = Checker(world)
    sched = world.sched
    first, second = (sched.spawn(n, sched.invocation(n, 30.0), lambda: None) for n in ("a", "b"))
    checker.holds[(id(first), "job_x")] = sched.now
    checker.holds[(id(second), "job_x")] = sched.now
    checker._read("start", "status", "job_x", first)
    checker._read("start", "status", "job_x", second)
    assert [v.invariant for v in checker.violations] == ["one-read"]
    checker.violations.clear()
    world.redis.losses.append(sched.now + 1)
    checker.holds[(id(second), "job_x")] = sched.now + 2
    checker._read("start", "result", "job_x", second)
    assert checker.violations == []


def test_a_second_event_is_caught_unless_a_putevents_outcome_was_unknown(world: World) -> None:
    from sim.events_fake import Accepted, Call

    checker = Checker(world)
    store = JobStore("jobs", 1, ddb=world.ddb.client)
    job = world.model.seed_job("image", {"duration": 1}, age=10.0)
    store.put_pending(job, "image", now=world.sched.now, deadline_at=int(world.sched.now) + 60)
    store.record_terminal(job, Ending("completed", result={"result_json": "{}"}), now=world.sched.now)
    store.clear_outbox(job, now=world.sched.now)
    one, two = (world.sched.spawn(n, world.sched.invocation(n, 30.0), lambda: None) for n in ("a", "b"))
    world.step_ends[one] = world.step_ends[two] = "ok"
    detail = {"job_id": job, "status": "completed"}
    world.events.calls += [Call(1, one, job, 1, 1, "ok"), Call(2, two, job, 1, 1, "ok")]
    world.events.accepted += [Accepted(job, "e1", detail, "a", 1, 0.0), Accepted(job, "e2", detail, "b", 2, 0.0)]
    checker._events(dict(world.ddb.tables["jobs"].items))
    assert [v.invariant for v in checker.violations] == ["one-event"]
    checker.violations.clear()
    world.events.calls[1].outcome = "error"  # its caller saw a timeout: the outcome was unknown
    checker._events(dict(world.ddb.tables["jobs"].items))
    assert checker.violations == []


def test_a_job_sume_created_and_nobody_recorded_and_a_dead_letter_are_caught(world: World) -> None:
    checker = Checker(world)
    world.model.seed_job("image", {"duration": 1})
    world.sqs.put(world.poll_dlq, '{"job_id": "job_z"}', 0.0)
    world.poll_dlq.dead.append(world.poll_dlq.messages.popitem()[1])
    checker.finish("done")
    assert sorted(v.invariant for v in checker.violations) == ["deadline", "dlq"]


# -- the fakes' own semantics -----------------------------------------------------------------------------
def test_miniredis_expires_on_its_clock_and_runs_scripts_atomically_with_redis_conversions() -> None:
    clock = [100.0]
    client = Client(Server(lambda: clock[0]))
    assert client.set("k", "v", px=1000) is True and client.set("k", "w", nx=True) is None
    clock[0] += 1.0
    assert client.get("k") == "v"  # Redis expires a key once the clock is past its expiry
    clock[0] += 0.001
    assert client.get("k") is None
    script = client.register_script("redis.call('HSET', KEYS[1], 'n', ARGV[1] * 1.5)\n"
                                    "return {redis.call('HGET', KEYS[1], 'n'), redis.call('GET', 'missing'), 7.9}")
    assert script(keys=["h"], args=[3]) == ["4.5", None, 7]  # redis.call's numbers: Redis's %.17g
    with pytest.raises(NoScriptError):
        client.evalsha("0" * 40, 0)
    client.set("s", "x")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        client.hget("s", "f")


def test_the_dynamodb_fake_keeps_conditions_old_items_and_refuses_unused_values() -> None:
    sched = Scheduler(1, 0.0)
    from sim.plan import Faults

    ddb = DynamoWorld(sched, Faults(sched.rng, {}, {}), "jobs").client
    ddb.put_item(TableName="jobs", Item={"job_id": {"S": "j"}, "n": {"N": "1"}})
    with pytest.raises(ClientError) as failed:
        ddb.update_item(TableName="jobs", Key={"job_id": {"S": "j"}}, UpdateExpression="SET n = n + :one",
                        ConditionExpression="n > :one", ExpressionAttributeValues={":one": {"N": "1"}},
                        ReturnValuesOnConditionCheckFailure="ALL_OLD")
    assert failed.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    assert failed.value.response["Item"]["n"] == {"N": "1"}
    with pytest.raises(ClientError, match="unused"):
        ddb.get_item(TableName="jobs", Key={"job_id": {"S": "j"}}) and ddb.update_item(
            TableName="jobs", Key={"job_id": {"S": "j"}}, UpdateExpression="SET n = :a",
            ExpressionAttributeValues={":a": {"N": "2"}, ":b": {"N": "3"}})
