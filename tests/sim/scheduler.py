"""The simulation's scheduler: every actor a greenlet, one runs at a time, a seeded RNG picks who is next.

An *actor* is one thread of the system: a poll invocation's handler thread, each record of its batch
(the batch adapter's worker threads), a fan-out tick, a sweep, a webhook delivery, a submission, a
drain step. Actors run the layer's real code; every call into a fake service starts with
:meth:`Scheduler.point`, which hands control back to the scheduler. The scheduler then picks the next
step with its RNG among the actors waiting at a point and what the environment offers now (an SQS
batch to deliver, a schedule tick, ...): between two points an actor's Python code runs alone, so the
order of every service call is the scheduler's choice and nothing else's.

Time is the scheduler's clock (:attr:`Scheduler.now`, clock seconds): it moves only when the
scheduler advances it, to the next due time (a message becoming visible, a timer, an invocation's
end), either because nothing can run now or because the RNG chose to - so an actor can find itself
paused across time, as a slow Lambda is. An invocation whose end passes is *killed*: each of its
actors raises :class:`Killed` at its next switch, and any service call it makes while unwinding
raises again without effect (a Lambda frozen at its timeout does nothing more).

Greenlets, not threads: a switch costs under a microsecond (a thread hand-off about 30), and a run
has no OS-level concurrency at all, so a seed replays exactly.
"""

from __future__ import annotations

import hashlib
import heapq
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import greenlet  # type: ignore[import-untyped]


class Killed(BaseException):
    """The invocation ended (a Lambda timeout or crash): raised in each of its actors."""


class Invocation:
    """One Lambda invocation (or any group of actors that dies together): its actors and its end."""

    def __init__(self, name: str, end: float) -> None:
        self.name = name
        self.end = end
        self.actors: list[Actor] = []
        self.killed = False
        self.reason = ""
        #: Whether the scheduler may inject faults into it (not into the last tries of a message or event).
        self.faultable = True


@dataclass(eq=False)
class Actor:
    name: str
    invocation: Invocation
    glet: greenlet.greenlet | None = None
    label: str = "start"
    done: bool = False
    started: float = 0.0
    #: Its priority when the scheduler runs by priorities (PCT-like): the highest runnable goes first.
    priority: float = 0.0
    #: What it was spawned to do (the batch adapter's record, for reports).
    task: Any = None
    #: The job ids this actor's current work is about (for traces).
    error: BaseException | None = None

    @property
    def killed(self) -> bool:
        return self.invocation.killed


@dataclass(order=True)
class _Timer:
    due: float
    seq: int
    actor: Actor | None = field(compare=False)
    call: Callable[[], None] | None = field(compare=False, default=None)


class SimEvent:
    """A condition actors wait on (:meth:`Scheduler.wait`); :meth:`set` makes the waiters runnable."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.is_set = False
        self.waiters: list[Actor] = []

    def set(self) -> None:
        self.is_set = True
        for actor in self.waiters:
            self.sched.ready(actor)
        self.waiters.clear()


class Source:
    """Something the environment offers: ``ready()`` says whether it can start something now,
    ``start()`` does (spawns actors), ``due()`` is the next clock time it may become ready (None)."""

    name = "source"
    weight = 1.0

    def ready(self) -> bool:
        return False

    def start(self) -> None:
        raise NotImplementedError

    def due(self) -> float | None:
        return None


class Scheduler:
    """``seed`` drives every choice; ``start`` is the clock's origin; ``advance`` the chance, at each
    step, of moving the clock on while actors could still run."""

    def __init__(self, seed: int, start: float, *, advance: float = 0.02, mode: str = "random") -> None:
        self.rng = random.Random(seed)
        self.now = start
        self.advance = advance
        #: "random": every step picks uniformly among what can run; "priority": each actor has a random
        #: priority, the highest runnable runs (a low one waits while others run to their end: the
        #: deep orderings uniform picks rarely reach), now and then a random pick or a new priority.
        self.mode = mode
        self.main = greenlet.getcurrent()
        #: The one OS thread every actor runs on; a service call from any other (a real thread the layer
        #: started that no shim replaced) cannot be scheduled: it is noted here and fails.
        self.thread = threading.get_ident()
        self.foreign: list[str] = []
        self.current: Actor | None = None
        self._runnable: list[Actor] = []
        #: Actors spawned and not started yet: the scheduler runs each to its first point at once
        #: (what an actor does before its first service call touches nothing shared).
        self._fresh: list[Actor] = []
        self._timers: list[_Timer] = []
        self._seq = 0
        self.sources: list[Source] = []
        self.invocations: list[Invocation] = []
        self.steps = 0
        self.trace = hashlib.sha256()
        #: The last steps, for a failure's report: (clock, actor, label).
        self.recent: list[tuple[float, str, str]] = []
        self.after_step: Callable[[], None] | None = None
        self.on_resume: Callable[[], None] | None = None
        #: Whether the clock may pass a running invocation's end (a Lambda timeout), when asked.
        self.timeout: Callable[[], bool] | None = None
        self.on_kill: Callable[[Invocation], None] | None = None

    # -- the clock -----------------------------------------------------------------------------------
    def clock(self) -> float:
        return self.now

    # -- actors ----------------------------------------------------------------------------------------
    def invocation(self, name: str, timeout: float) -> Invocation:
        inv = Invocation(name, self.now + timeout)
        self.invocations.append(inv)
        self.at(inv.end, lambda: self.kill(inv, "timeout"))
        return inv

    def spawn(self, name: str, invocation: Invocation, body: Callable[[], Any],
              done: Callable[[BaseException | None], None] | None = None) -> Actor:
        """A new actor, runnable at once: ``body`` runs in it; ``done`` is told how it ended (None:
        normally; :class:`Killed`; or the exception that escaped)."""
        actor = Actor(name, invocation, started=self.now, priority=self.rng.random())
        invocation.actors.append(actor)

        def run() -> None:
            error: BaseException | None = None
            try:
                if actor.killed:
                    raise Killed()
                body()
            except BaseException as exc:  # the actor's end, whatever it is, is reported
                error = exc
            actor.done = True
            actor.error = error
            if done is not None:
                done(error)

        actor.glet = greenlet.greenlet(run, parent=self.main)
        self._fresh.append(actor)
        return actor

    def ready(self, actor: Actor) -> None:
        if not actor.done and actor not in self._runnable:
            self._runnable.append(actor)

    def point(self, label: str, crashable: bool = True) -> None:
        """Called by the current actor before every service call: the scheduler picks what runs next
        (and may crash the actor's invocation here: :attr:`on_resume`)."""
        actor = self.current
        if actor is None:  # not inside a run (a test's direct call): nothing to schedule
            return
        if threading.get_ident() != self.thread:
            self.foreign.append(f"{actor.name}: {label}")
            raise RuntimeError(f"{label}: a service call from an OS thread the scheduler does not run")
        if actor.killed:
            raise Killed()
        actor.label = label
        self._runnable.append(actor)
        self.main.switch()
        if actor.killed:
            raise Killed()
        if crashable and self.on_resume is not None:
            self.on_resume()

    def sleep(self, seconds: float, label: str = "sleep") -> None:
        """The current actor waits ``seconds`` of clock time (others run meanwhile)."""
        actor = self.current
        if actor is None:
            self.now += max(0.0, seconds)
            return
        if actor.killed:
            raise Killed()
        actor.label = label
        self.at(self.now + max(0.0, seconds), actor=actor)
        self.main.switch()
        if actor.killed:
            raise Killed()

    def wait(self, event: SimEvent, label: str = "wait") -> None:
        """The current actor waits until ``event`` is set."""
        actor = self.current
        assert actor is not None, "wait outside an actor"
        while not event.is_set:
            if actor.killed:
                raise Killed()
            actor.label = label
            event.waiters.append(actor)
            self.main.switch()
        if actor.killed:
            raise Killed()

    def at(self, due: float, call: Callable[[], None] | None = None, actor: Actor | None = None) -> None:
        """At clock time ``due``: make ``actor`` runnable, or run ``call`` (in the scheduler)."""
        self._seq += 1
        heapq.heappush(self._timers, _Timer(due, self._seq, actor, call))

    def kill(self, inv: Invocation, reason: str) -> None:
        """End an invocation: each of its actors unwinds, its service calls without effect. From an
        actor (a crash it runs into) the rest of the invocation unwinds once that actor has yielded."""
        if inv.killed or all(a.done for a in inv.actors):
            return
        inv.killed = True
        inv.reason = reason
        self._note(f"kill {inv.name} ({reason})")
        if self.on_kill is not None:
            self.on_kill(inv)
        if self.current is None:
            self._unwind(inv)

    def crash(self, reason: str) -> None:
        """The current actor's invocation crashes here."""
        actor = self.current
        assert actor is not None
        self.kill(actor.invocation, reason)
        raise Killed()

    def _unwind(self, inv: Invocation) -> None:
        for actor in list(inv.actors):
            if not actor.done and actor.glet is not None:
                if actor in self._runnable:
                    self._runnable.remove(actor)
                if actor in self._fresh:
                    self._fresh.remove(actor)
                self._switch(actor)

    # -- the loop ----------------------------------------------------------------------------------------
    def _start_fresh(self) -> None:
        while self._fresh:
            actor = self._fresh.pop(0)
            if not actor.done:
                self._note(f"{actor.name} start")
                self._switch(actor)
                if actor.invocation.killed:
                    self._unwind(actor.invocation)

    def _switch(self, actor: Actor) -> None:
        previous = self.current
        self.current = actor
        assert actor.glet is not None
        actor.glet.switch()
        self.current = previous

    def _note(self, text: str) -> None:
        self.trace.update(f"{self.now:.3f} {text}\n".encode())
        self.recent.append((self.now, text, ""))
        if len(self.recent) > 400:
            del self.recent[:200]

    def note_fault(self, text: str) -> None:
        who = self.current.name if self.current is not None else "env"
        self._note(f"fault {text} @ {who}")

    def choose(self, n: int) -> int:
        return self.rng.randrange(n) if n > 1 else 0

    def chance(self, p: float) -> bool:
        return p > 0 and self.rng.random() < p

    def _next_due(self) -> float | None:
        dues = [t.due for t in self._timers[:1]]
        dues += [d for d in (s.due() for s in self.sources) if d is not None and d > self.now]
        return min(dues) if dues else None

    def _may_pass(self, due: float) -> bool:
        """Whether the clock may move to ``due`` while actors could run: not past the end of an
        invocation that could still run (that would time it out) unless the scheduler chooses a
        timeout (:attr:`timeout`)."""
        passed = {a.invocation for a in self._runnable if not a.invocation.killed and a.invocation.end <= due}
        if not passed:
            return True
        return all(inv.faultable for inv in passed) and self.timeout is not None and self.timeout()

    def _advance(self, to: float) -> None:
        self.now = max(self.now, to)
        self._note(f"advance {to:.3f}")
        while self._timers and self._timers[0].due <= self.now:
            timer = heapq.heappop(self._timers)
            if timer.actor is not None:
                self.ready(timer.actor)
            elif timer.call is not None:
                timer.call()

    def run(self, *, until: Callable[[], bool], max_steps: int, horizon: float) -> str:
        """Step until ``until()`` holds ("done"), ``max_steps`` steps ("steps") or the clock passes
        ``horizon`` ("horizon")."""
        while True:
            self._start_fresh()
            self._runnable = [a for a in self._runnable if not a.done]
            ready = [s for s in self.sources if s.ready()]
            choices = len(self._runnable) + len(ready)
            if choices == 0 and until():
                return "done"
            if self.steps >= max_steps:
                return "steps"
            due = self._next_due()
            if choices == 0 or (due is not None and self.chance(self.advance) and self._may_pass(due)):
                if due is None:
                    return "stuck"
                if due > horizon:
                    return "horizon"
                self._advance(due)
                continue
            self.steps += 1
            pick = self._pick(ready, choices)
            if pick < len(self._runnable):
                actor = self._runnable.pop(pick)
                self._note(f"{actor.name} {actor.label}")
                self._switch(actor)
                if actor.invocation.killed:
                    self._unwind(actor.invocation)
            else:
                source = ready[pick - len(self._runnable)]
                self._note(f"env {source.name}")
                source.start()
            if self.after_step is not None:
                self.after_step()

    def _pick(self, ready: list[Source], choices: int) -> int:
        if choices == 1:
            return 0
        if self.mode == "priority" and self.rng.random() > 0.1:
            if ready and (not self._runnable or self.rng.random() < 0.3):
                return len(self._runnable) + self.rng.randrange(len(ready))
            best = max(range(len(self._runnable)), key=lambda i: self._runnable[i].priority)
            if self.rng.random() < 0.05:
                self._runnable[best].priority = self.rng.random()
            return best
        weights = [1.0] * len(self._runnable) + [s.weight for s in ready]
        return self.rng.choices(range(choices), weights)[0]

    def unwind(self) -> None:
        """At the end of a run: kill what still runs, so no greenlet is left suspended."""
        for inv in self.invocations:
            if not all(a.done for a in inv.actors):
                self.kill(inv, "end of run")
                self._unwind(inv)

    def actors(self) -> Iterator[Actor]:
        for inv in self.invocations:
            yield from inv.actors


class SimFuture:
    """What :class:`SimExecutor` hands back: ``result()`` waits (as a scheduler wait) for the actor."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.event = SimEvent(sched)
        self.value: Any = None
        self.error: BaseException | None = None

    def result(self, timeout: float | None = None) -> Any:
        self.sched.wait(self.event, "batch-wait")
        if self.error is not None:
            raise self.error
        return self.value


class SimExecutor:
    """Stands in for the layer's ``ThreadPoolExecutor`` (the batch adapter's workers, fan-out's sender):
    each task is an actor of the same invocation (a worker thread of the same Lambda)."""

    def __init__(self, sched: Scheduler, invocation: Callable[[], Invocation], name: str,
                 report: Callable[[Actor, Any, BaseException | None], None] | None = None) -> None:
        self.sched = sched
        self.invocation = invocation
        self.name = name
        self.tasks = 0
        self.report = report

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> SimFuture:
        future = SimFuture(self.sched)
        self.tasks += 1

        def body() -> None:
            future.value = fn(*args, **kwargs)

        def done(error: BaseException | None) -> None:
            future.error = error
            future.event.set()
            if self.report is not None:
                self.report(actor, future.value, error)

        inv = self.invocation()
        actor = self.sched.spawn(f"{inv.name}/w{self.tasks}", inv, body, done)
        actor.task = args
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


class SimSemaphore:
    """A semaphore whose waits are the scheduler's: the layer's locks and semaphores, built while a run
    is active (:func:`tests.sim.world.deterministic`), are these - a real lock held by an actor across a
    service call would block the one OS thread every actor runs on."""

    def __init__(self, sched: Scheduler, value: int = 1) -> None:
        self.sched = sched
        self.value = value
        self.freed = SimEvent(sched)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        while self.value <= 0:
            if not blocking:
                return False
            if self.sched.current is None:
                raise RuntimeError("a simulated lock contended outside an actor")
            if self.freed.is_set:
                self.freed = SimEvent(self.sched)
            self.sched.wait(self.freed, "lock")
        self.value -= 1
        return True

    def release(self) -> None:
        self.value += 1
        self.freed.set()

    def locked(self) -> bool:
        return self.value <= 0

    def __enter__(self) -> SimSemaphore:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class SimRLock(SimSemaphore):
    """A reentrant lock: its owner (an actor) may take it again."""

    def __init__(self, sched: Scheduler) -> None:
        super().__init__(sched, 1)
        self.owner: Any = None
        self.depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = self.sched.current
        if self.depth and self.owner is me:
            self.depth += 1
            return True
        if not super().acquire(blocking, timeout):
            return False
        self.owner, self.depth = me, 1
        return True

    def release(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.owner = None
            super().release()


class SimThreading:
    """What the layer's modules see as :mod:`threading` during a run: locks and semaphores that wait
    on the scheduler; everything else the real module's."""

    def __init__(self, sched: Scheduler, real: Any) -> None:
        self._sched = sched
        self._real = real

    def Lock(self) -> SimSemaphore:
        return SimSemaphore(self._sched, 1)

    def RLock(self) -> SimRLock:
        return SimRLock(self._sched)

    def Semaphore(self, value: int = 1) -> SimSemaphore:
        return SimSemaphore(self._sched, value)

    BoundedSemaphore = Semaphore

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)
