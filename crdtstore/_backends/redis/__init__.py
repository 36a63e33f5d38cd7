"""The Redis backend behind ``redis://`` and ``rediss://`` URLs: journal and leases.

``open_store("redis://host:6379/0")`` stores every run's journal in one Redis, shared by
processes on any number of machines. Requires Redis 7.0 or later, redis-py (``pip install
'crdtstore[redis]'``) and an asyncio event loop (redis-py's client is asyncio only).

Keys (``P``: the URL's ``prefix``, default ``crdtstore``; names escaped by ``_keys.escape``;
``{T}`` is a hash tag, so every key of a tenant is in one cluster slot)::

    P:{T}:runs          sorted set   run name -> creation time (us); list_runs' order
    P:{T}:r:R           hash         created, head, snap, parent, state, delete_after, config
    P:{T}:r:R:j         stream       the journal: entry ID "<seq>-0"; fields a (agent),
                                     s (source), c (client id), w (wall time), u (update),
                                     e (effect JSON), k (CRC-32), o (origin), l (call),
                                     x (its key-index members)
    P:{T}:r:R:k         sorted set   key index of history(): "collection NUL key NUL
                                     <seq, 20 digits>", all at score 0 (lexicographic)
    P:{T}:r:R:s         hash         the snapshot: seq, upd, state, created
    P:{T}:r:R:lock      string       the run's authority lock (a token, with a TTL)
    P:{T}:lease:q       hash         lease requests: rank -> JSON (see lua/lease.lua)
    P:{T}:lease:n       hash         lease counters: rank, token (never go back)
    P:{T}:lease:ev      stream       lease hand-offs, for waiters in other processes

- **Appends** are one script (``lua/append.lua``) that takes the next dense positions from
  the run's ``head``, adds the stream entries and key-index members, and moves the head, in
  one atomic step: positions, versions and ``changes_since`` mean what they mean on SQLite.
- **Guarded and fenced writes** are decided by the same append script (``_guarded``, see
  ``crdtstore._guarded_append``): it appends only if no entry after the writer's position
  touches the guarded key or scope and the fencing lease is still granted with its token (the
  lease table read in the same script, on the server's clock). No lock is held.
- **The authority** (``_authority``; what the record falls back to when a key keeps moving,
  and what ``Store.authority`` users get): a lock that plain appends respect, buffered
  appends, and a commit refused unless the lock and the head are still the ones it took.
- **Snapshots** are written before the journal below them is trimmed, by chunks, with
  ``XDEL`` (never ``DEL`` of a live stream, which would restart its IDs).
- ``delete_run`` removes every key of the run and its nested runs in one script.
- **Wake-ups**: one blocking ``XREAD`` per store (``_tail``).
- **Durability**: ``batched`` returns once Redis has applied the append; ``durable`` also
  waits for the append-only file to be fsynced (``WAITAOF``, Redis 7.2+); on an older Redis
  a durable write is as durable as its ``appendfsync`` setting (``always``: synced before the
  answer; ``everysec``: the last second may be lost by a crash of the machine).
"""

from ._journal import RedisJournal as RedisJournal
from ._leases import RedisLeases as RedisLeases
from ._persistence import Persistence as Persistence
from ._persistence import persistence as persistence

__all__ = ["Persistence", "RedisJournal", "RedisLeases", "persistence"]
