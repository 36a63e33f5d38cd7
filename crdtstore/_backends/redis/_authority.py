"""The authority of a run on Redis: the exclusive journal transaction of guarded writes.

SQLite's authority is its write lock; Redis has no transaction that stays open while the
client thinks (MULTI only queues commands, a script cannot wait for the client). So:

- the authority takes the run's **lock** (``SET lock token NX PX lock_ttl``; waiting with a
  short growing pause while another process holds it) and reads the head it guards;
- every plain append is one script that is **refused while the lock is held** by anyone
  (the appender waits and tries again: a plain append never interleaves with an open
  authority), and so are run state changes and ``delete_run``;
- the authority's appends are **buffered** in the client, numbered from the head it read:
  nothing is visible to others until it ends, and leaving it with an error drops them;
- it **commits** with the same append script, which writes the buffer only if the caller
  still holds the lock and the head is still the one it read, and drops the lock in the same
  step. A holder silent for longer than ``lock_ttl`` loses the lock to the next writer; its
  commit is then refused (``BackendError``), so a late commit never lands behind a newer one.

Every read inside the authority extends the lock, so an authority that keeps working keeps
it. A killed holder blocks the run's writers for at most ``lock_ttl`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from ..._errors import BackendError, RunClosed
from ..._journal import Authority, NewEntry, Row
from ._keys import RunKeys

if TYPE_CHECKING:
    from ._journal import RedisJournal

BUSY_TIMEOUT = 30.0  # seconds a writer waits for another's authority before BackendError
RETRY_FIRST = 0.0002  # seconds before the first retry (doubling) ...
RETRY_MAX = 0.005  # ... up to this


class Backoff:
    """Pauses between tries of a step refused because a run is locked."""

    def __init__(self, what: str, timeout: float = BUSY_TIMEOUT) -> None:
        self.what = what
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.delay = RETRY_FIRST

    async def wait(self) -> None:
        """Sleep before the next try.

        Raises:
            BackendError: the run stayed locked for ``timeout`` seconds.
        """
        if time.monotonic() >= self.deadline:
            raise BackendError(
                "redis", f"{self.what}: the run was locked by an authority for {self.timeout:g} s"
            )
        await anyio.sleep(self.delay)
        self.delay = min(self.delay * 2, RETRY_MAX)


class RedisAuthority(Authority):
    """An open authority (see the module docstring); made by ``RedisJournal.authority``."""

    def __init__(
        self,
        journal: RedisJournal,
        tenant: str,
        run: str,
        keys: RunKeys,
        token: str,
        head: int,
        state: str,
    ) -> None:
        self._j = journal
        self._tenant = tenant
        self._run = run
        self._keys = keys
        self.token = token
        self.head = head  # the head when the lock was taken: nobody else appends past it
        self._state = state
        self.pending: list[NewEntry] = []

    async def read(self, after: int) -> list[Row]:
        rows = await self._j._read_rows(self._keys, after, 1 << 62, -1, lock_token=self.token)
        first = self.head + 1
        rows.extend(Row(first + i, *e) for i, e in enumerate(self.pending) if first + i > after)
        return rows

    async def append(self, entries: Sequence[NewEntry]) -> list[int]:
        if self._state != "open":
            raise RunClosed(self._tenant, self._run, self._state)
        first = self.head + len(self.pending) + 1
        self.pending.extend(entries)
        return list(range(first, first + len(entries)))
