"""The per-job Redis lease.

* acquire: ``SET key value NX PX ttl`` (a free lease only);
* renew: a Lua script that, only while the key still holds the expected value, stores the
  new value and *replaces* the TTL (returns 0 when the lease is lost);
* release: a Lua script that deletes the key only while it holds the expected value.

The value is ``"<token>:<seq>"``: a random 128-bit token per chain plus the sequence of the
one message allowed to act next. The lease saves Sume reads; it is not what makes the outcome
exactly-once (that is the conditional write in :mod:`sume_poller.aws`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

if TYPE_CHECKING:
    import redis

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

LeaseUnavailable = RedisError
"""Raised by every method when Redis cannot be reached or answers with an error."""


def new_token() -> str:
    """A non-guessable chain token: 16 random bytes as 32 hex characters."""
    return secrets.token_hex(16)


class LeaseStore:
    def __init__(self, client: redis.Redis, prefix: str = "sume:poll:") -> None:
        self._r = client
        self._prefix = prefix
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)
        self.auth_pause_key = f"{prefix}!auth-paused"

    def key(self, job_id: str) -> str:
        return self._prefix + job_id

    def acquire(self, job_id: str, value: str, ttl_ms: int) -> bool:
        """Take the lease if nobody holds it."""
        return bool(self._r.set(self.key(job_id), value, nx=True, px=ttl_ms))

    def renew(self, job_id: str, expected: str, new_value: str, ttl_ms: int) -> bool:
        """Replace value and TTL while the lease still holds ``expected``; False: lease lost."""
        return bool(self._renew(keys=[self.key(job_id)], args=[expected, new_value, ttl_ms]))

    def acquire_unless_paused(self, job_id: str, value: str, ttl_ms: int) -> bool | None:
        """One pipelined round trip: is Sume auth paused, and ``SET NX`` the lease.

        True: taken. False: held by another chain. None: auth is paused (nothing is held).
        """
        pipe = self._r.pipeline(transaction=False)
        pipe.exists(self.auth_pause_key)
        pipe.set(self.key(job_id), value, nx=True, px=ttl_ms)
        paused, taken = pipe.execute()
        if paused:
            if taken:
                self.release(job_id, value)
            return None
        return bool(taken)

    def release(self, job_id: str, expected: str) -> bool:
        """Delete the lease while it still holds ``expected``; never deletes another chain's."""
        return bool(self._release(keys=[self.key(job_id)], args=[expected]))

    def live(self, job_ids: Sequence[str]) -> tuple[bool, list[bool]]:
        """One pipelined round trip: is Sume auth paused, and which of ``job_ids`` hold a lease."""
        pipe = self._r.pipeline(transaction=False)
        pipe.exists(self.auth_pause_key)
        for job_id in job_ids:
            pipe.exists(self.key(job_id))
        replies = pipe.execute()
        return bool(replies[0]), [bool(n) for n in replies[1:]]

    def pause_auth(self, seconds: int) -> None:
        """Set the auth breaker: fan-out sends nothing while it lives."""
        self._r.set(self.auth_pause_key, "1", ex=seconds)
