"""The Redis backend behind ``redis://`` and ``rediss://`` URLs: journal and leases.

``open_store("redis://host:6379/0")`` stores every run's journal in one Redis, shared by
processes on any number of machines. Requires Redis 7.0 or later, redis-py (``pip install
'crdtstore[redis]'``) and an asyncio event loop (redis-py's client is asyncio only). The key
layout is drawn in :mod:`._keys`; every key of a tenant shares one hash tag (one cluster slot).

Why it is shaped so: Redis has no transaction that stays open while the client thinks, so
everything that must be atomic is one Lua script decided on the server.

- **Appends** (``lua/append.lua``) take the next dense positions from the run's ``head`` in
  one step, so positions, versions and ``changes_since`` mean what they mean on SQLite;
  guarded and fenced writes are decided by the same script (``_guarded``), no lock held.
- **The authority** (``_authority``): a lock that plain appends respect, buffered appends,
  and a commit refused unless the lock and the head are still the ones it took.
- **Snapshots** are written before the journal below them is trimmed (``XDEL``, never ``DEL``
  of a live stream, which would restart its IDs); ``delete_run`` is one script.
- **Wake-ups**: one blocking ``XREAD`` per store (``_tail``). **Durability**: ``batched``
  returns once Redis applied the append; ``durable`` also waits for the AOF fsync
  (``WAITAOF``, Redis 7.2+; older: as durable as ``appendfsync``).
"""

from ._journal import RedisJournal as RedisJournal
from ._leases import RedisLeases as RedisLeases
from ._persistence import Persistence as Persistence
from ._persistence import persistence as persistence

__all__ = ["Persistence", "RedisJournal", "RedisLeases", "persistence"]
