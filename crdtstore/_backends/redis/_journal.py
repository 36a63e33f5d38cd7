"""The journal backend behind ``redis://`` and ``rediss://`` URLs (see the package docstring)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal
from urllib.parse import unquote

import anyio

from ..._errors import BackendError, InvalidValue, UnknownRun
from ..._guarded_append import Guard
from ..._journal import Authority, JournalBackend, NewEntry, Row, RunRow, SnapshotRow
from ._authority import Backoff, RedisAuthority
from ._client import Scripts, make_client, mapped, require_asyncio
from ._guarded import append_guarded_at
from ._keys import Keys, RunKeys, parse_url, redis_options
from ._persistence import rewrite_files, sync_mode
from ._rows import entry_args, first_appended, row_of, run_row
from ._tail import Tail

log = logging.getLogger("crdtstore.redis")

TRIM_CHUNK = 1000  # journal entries removed per script call below a snapshot
TRIM_GRACE = 1.0  # seconds between a snapshot and the trim of the entries below it
WAITAOF_TIMEOUT_MS = 10_000  # how long a durable write waits for the append-only file

_HOST = socket.gethostname()
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _mark(entry: NewEntry) -> tuple[int, float, int]:
    """What names an entry to ``lua/reappend.lua`` (with its update bytes)."""
    return (entry.client_id, float(entry.wall_time), entry.checksum)


class RedisJournal(JournalBackend):
    """A journal on a Redis server, shared by every process (on any machine) that opens it.

    Args:
        url: ``redis://[[user]:password@]host[:port][/db][?options]`` or ``rediss://...``
            (TLS); redis-py reads the credentials, the database and its options
            (``ssl_ca_certs``, ``ssl_cert_reqs``, ``socket_timeout``, ...) from it.
            crdtstore's own: ``prefix`` (the key space, default ``crdtstore``) and
            ``lock_ttl`` (seconds an authority lock outlives a silent holder, default 10).
        prefix, lock_ttl: the same as keyword arguments (``open_store(url, prefix=...)``).
        trim_grace: seconds a compaction with ``drop_journal`` waits between storing the
            snapshot and trimming the entries below it (default 1).
        options: further keyword arguments for ``redis.asyncio.Redis.from_url``.
    """

    name = "redis"

    compaction_lease = True  # many processes share it: one compactor per run (Store.compact)

    def __init__(
        self,
        url: str,
        *,
        prefix: str | None = None,
        lock_ttl: float | None = None,
        trim_grace: float = TRIM_GRACE,
        **options: Any,
    ) -> None:
        self.url = parse_url(url, prefix=prefix, lock_ttl=lock_ttl)
        if (
            isinstance(trim_grace, bool)
            or not isinstance(trim_grace, int | float)
            or not (0 <= trim_grace <= 3600)
        ):
            raise InvalidValue(f"trim_grace must be between 0 and 3600 seconds, not {trim_grace!r}")
        self.trim_grace = float(trim_grace)
        self.keys = Keys(self.url.prefix)
        self._options = redis_options(options)
        self._client: Any = None
        self._scripts: Any = None
        self._tail: Tail | None = None
        self._uncertain: dict[tuple[int, float, int], None] = {}  # see uncertain()
        self._wake: Callable[[str, str], None] = lambda tenant, run: None
        self._locks: dict[tuple[str, str], anyio.Lock] = {}  # this store's open authorities
        self._attached: dict[int, str] = {}  # id(record) -> the stream it is watched on
        self._sync = "none"  # how a durable write is made durable: waitaof | always | none
        self.reads_kept = 0  # tail reads answered from the stream read's entries (tests)
        self._warned_sync = False

    def __repr__(self) -> str:
        return f"<RedisJournal {self.url.shown} prefix={self.url.prefix!r}>"

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        if self._client is not None:
            return
        require_asyncio()
        client = make_client(self.url.redis_url, self._options)
        try:
            with mapped(f"cannot connect to {self.url.shown}"):
                await client.ping()
                info = await client.info("server")
                persistence = await client.info("persistence")
            self._sync = await sync_mode(client, info, persistence)
        except BaseException:
            await client.aclose()
            raise
        self._client = client
        self._scripts = Scripts(client)

        def connect() -> Any:
            return make_client(
                self.url.redis_url, {**self._options, "single_connection_client": True}
            )

        self._tail = Tail(connect, client, self._wake)
        self._tail.start()

    async def aclose(self) -> None:
        tail, self._tail = self._tail, None
        client, self._client = self._client, None
        self._scripts = None
        with anyio.CancelScope(shield=True):
            if tail is not None:
                await tail.aclose()
            if client is not None:
                try:
                    await client.aclose()
                except Exception as exc:  # closing: nothing left to report it to
                    log.debug("closing the redis client: %s", exc)

    def bind(self, wake: Callable[[str, str], None]) -> None:
        self._wake = wake

    def attach(self, tenant: str, run: str, record: Any) -> None:
        if self._tail is None:
            return
        keys = self.keys.run_keys(tenant, run)
        self._attached[id(record)] = keys.stream
        seen = getattr(record, "applied_seq", 0)
        client = getattr(getattr(record, "replica", None), "client_id", None)
        self._tail.watch_run(keys.stream, keys.meta, tenant, run, int(seen or 0), client)

    def detach(self, tenant: str, run: str, record: Any) -> None:
        stream = self._attached.pop(id(record), None)
        if stream is not None and self._tail is not None:
            self._tail.unwatch_run(stream)

    def changes(self) -> int | None:
        # moves only when the stream read reconnected: the tail wakes readers itself
        return None if self._tail is None else self._tail.reconnects

    def heads(self, tenant: str, runs: Sequence[str]) -> dict[str, int] | None:
        if self._tail is None:
            return None
        return self._tail.seen({self.keys.run_keys(tenant, r).stream: r for r in runs})

    guard_in_append = True  # the authority is a lock (see AtomicGuardedAppend)

    def hosts_leases(self, leases: object) -> bool:
        """Whether the append script can check fences of ``leases``: a lease backend on this
        very journal (see :class:`~crdtstore._guarded_append.AtomicGuardedAppend`)."""
        from ._leases import RedisLeases

        return isinstance(leases, RedisLeases) and leases.journal is self

    async def append_guarded_at(
        self,
        tenant: str,
        run: str,
        entries: Sequence[NewEntry],
        guard: Guard,
        *,
        durable: bool,
    ) -> list[int]:
        """Check ``guard`` and append, in one script (see ``_guarded.py``)."""
        args = entry_args(entries)
        return await append_guarded_at(self, tenant, run, entries, args, guard, durable=durable)

    def lease_backend(self) -> Any:
        """The lease backend of this store (leases in the same Redis)."""
        from ._leases import RedisLeases

        return RedisLeases(self)

    # -- plumbing -----------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The redis-py client. Raises ``BackendError`` when the store is not open."""
        if self._client is None:
            raise BackendError("redis", "store is not open")
        return self._client

    @property
    def scripts(self) -> Any:
        if self._scripts is None:
            raise BackendError("redis", "store is not open")
        return self._scripts

    @property
    def tail(self) -> Tail | None:
        return self._tail

    async def _durable(self) -> None:
        """Wait until what this client wrote is in the append-only file on disk."""
        if self._sync == "waitaof":
            with mapped("WAITAOF"):
                local, _ = await self.client.execute_command("WAITAOF", 1, 0, WAITAOF_TIMEOUT_MS)
            if int(local) < 1:
                raise BackendError("redis", "the append-only file was not synced in time")
        elif self._sync == "none" and not self._warned_sync:
            self._warned_sync = True
            log.warning(
                "%s: durable writes are only as durable as this Redis's persistence "
                "(no append-only file with appendfsync always, and no WAITAOF)",
                self.url.shown,
            )

    def _lock(self, tenant: str, run: str) -> anyio.Lock:
        lock = self._locks.get((tenant, run))
        if lock is None:
            lock = self._locks[(tenant, run)] = anyio.Lock()
        return lock

    # -- runs -----------------------------------------------------------------------------------

    async def ensure_run(
        self, tenant: str, run: str, *, create: bool, parent: str | None = None
    ) -> RunRow:
        keys = self.keys.run_keys(tenant, run)
        pmeta = self.keys.run(tenant, parent) if parent is not None else keys.meta
        with mapped("ensure_run"):
            got = await self.scripts.ensure_run(
                keys=[self.keys.runs(tenant), keys.meta, pmeta],
                args=[run, parent or "", "1" if create else "0"],
            )
        kind = got[0]
        if kind == b"unknown":
            raise UnknownRun(tenant, got[1].decode())
        if kind == b"parent":
            have = got[1].decode() or None
            raise InvalidValue(f"run {run!r} exists with parent {have!r}, not {parent!r}")
        return run_row(tenant, run, got[1:])

    async def set_run(
        self,
        tenant: str,
        run: str,
        *,
        state: str | None = None,
        delete_after: float | Literal["keep"] | None = "keep",
    ) -> RunRow:
        keys = self.keys.run_keys(tenant, run)
        mode, value = "keep", ""
        if delete_after != "keep":
            mode = "none" if delete_after is None else "set"
            value = "" if delete_after is None else repr(float(delete_after))
        backoff = Backoff("set_run")
        while True:
            with mapped("set_run"):
                got = await self.scripts.set_run(
                    keys=[keys.meta, keys.lock], args=[state or "", mode, value]
                )
            if got[0] == b"unknown":
                raise UnknownRun(tenant, run)
            if got[0] != b"locked":
                break
            await backoff.wait()
        await self._durable()
        row = await self.get_run(tenant, run)
        if row is None:
            raise UnknownRun(tenant, run)
        return row

    _RUN_FIELDS = ("created", "head", "snap", "parent", "state", "delete_after")

    async def get_run(self, tenant: str, run: str) -> RunRow | None:
        with mapped("get_run"):
            v = await self.client.hmget(self.keys.run(tenant, run), self._RUN_FIELDS)
        return None if v[0] is None else run_row(tenant, run, v)

    async def tenants(self) -> list[str]:
        """Every tenant with a run: the ``runs`` index keys of this prefix (``SCAN``; a
        tenant whose last run was deleted has none)."""
        head, tail = f"{self.keys.prefix}:{{", "}:runs"
        found: set[str] = set()
        with mapped("tenants"):
            async for key in self.client.scan_iter(match=f"{head}*{tail}", count=1000):
                found.add(unquote(key.decode()[len(head) : -len(tail)]))
        return sorted(found)

    async def list_runs(self, tenant: str) -> list[RunRow]:
        with mapped("list_runs"):
            names = await self.client.zrange(self.keys.runs(tenant), 0, -1)
            pipe = self.client.pipeline(transaction=False)
            runs = [n.decode() for n in names]
            for run in runs:
                pipe.hmget(self.keys.run(tenant, run), self._RUN_FIELDS)
            values = await pipe.execute() if runs else []
        return [run_row(tenant, r, v) for r, v in zip(runs, values, strict=True) if v[0]]

    async def delete_run_if_due(self, tenant: str, run: str, now: float) -> bool:
        return await self._delete_run(tenant, run, [repr(float(now))])

    async def delete_run(self, tenant: str, run: str) -> bool:
        return await self._delete_run(tenant, run, [])

    async def _delete_run(self, tenant: str, run: str, due: list[str]) -> bool:
        backoff = Backoff("delete_run")
        while True:
            with mapped("delete_run"):
                args = [self.keys.tenant(tenant), run, *(due or [""])]
                got = await self.scripts.call(
                    "delete_run", [self.keys.runs(tenant)], args, resend_args=[*args, "1"]
                )
            if got[0] != b"locked":
                break
            await backoff.wait()
        if got[0] in (b"missing", b"live"):
            return False
        await self._durable()
        return True

    async def get_config(self, tenant: str, run: str) -> dict[str, Any]:
        with mapped("get_config"):
            raw = await self.client.hget(self.keys.run(tenant, run), "config")
        if raw is None:
            raise UnknownRun(tenant, run)
        return dict(json.loads(raw))

    async def update_config(
        self, tenant: str, run: str, update: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        meta = self.keys.run(tenant, run)
        while True:  # compare and set: a concurrent update makes this one try again
            with mapped("update_config"):
                raw = await self.client.hget(meta, "config")
            if raw is None:
                raise UnknownRun(tenant, run)
            new = update(json.loads(raw))
            with mapped("update_config"):
                got = await self.scripts.config(keys=[meta], args=[raw, _dumps(new)])
            if got == b"unknown":
                raise UnknownRun(tenant, run)
            if got == b"ok":
                await self._durable()
                return new

    # -- journal --------------------------------------------------------------------------------

    async def append(
        self, tenant: str, run: str, entries: Sequence[NewEntry], *, durable: bool
    ) -> list[int]:
        if not entries:
            return []
        keys = self.keys.run_keys(tenant, run)
        local = self._locks.get((tenant, run))
        if local is not None and local.locked():
            async with local:  # wait for this store's own open authority to end
                pass
        args = ["", "", len(entries), "", *entry_args(entries)]
        backoff = Backoff("append")
        head = _mark(entries[0])
        may_have_run = head in self._uncertain
        while True:
            try:
                with mapped("append"):
                    got = await self.scripts.call(
                        "append", self._append_keys(keys), args, may_have_run=may_have_run
                    )
            except BackendError:
                self.uncertain(entries[0])  # (it may have run: the next try looks first)
                raise
            if got[0] != b"locked":
                break
            await backoff.wait()
        self._uncertain.pop(head, None)
        if got[0] == b"part":  # the first entries were appended by an earlier send
            first, done = int(got[1]), int(got[2])
            if self._tail is not None:
                self._tail.wrote(keys.stream, first, entries[:done])
            self.uncertain(entries[done])
            rest = await self.append(tenant, run, entries[done:], durable=durable)
            return [*range(first, first + done), *rest]
        first = self._appended(tenant, run, keys, got)
        if self._tail is not None:
            self._tail.wrote(keys.stream, first, entries)
        if durable:
            await self._durable()
        return list(range(first, first + len(entries)))

    def uncertain(self, entry: NewEntry) -> None:
        """Note that an append starting with ``entry`` may have run without this store
        learning it (its connection was lost, it timed out): the next append starting with
        it looks for it in the journal first (``lua/reappend.lua``) and appends nothing
        twice."""
        self._uncertain[_mark(entry)] = None
        while len(self._uncertain) > 1024:  # (an old one was appended again or given up)
            del self._uncertain[next(iter(self._uncertain))]

    def _append_keys(self, keys: RunKeys) -> list[str]:
        return [
            keys.meta,
            keys.stream,
            keys.index,
            keys.lock,
            self.keys.leases(keys.tenant).requests,
        ]

    def _appended(self, tenant: str, run: str, keys: RunKeys, got: Sequence[bytes]) -> int:
        """The first position of an append script's answer (or its refusal, raised)."""
        return first_appended(tenant, run, got, self.url.lock_ttl)

    async def _read_rows(
        self, keys: RunKeys, after: int, limit: int, skip_client: int, lock_token: str = ""
    ) -> list[Row]:
        with mapped("read"):
            if lock_token:  # inside an authority: the read also extends its lock
                pipe = self.client.pipeline(transaction=False)
                # (a script called with a pipeline queues itself in it)
                await self.scripts.lock(
                    keys=[keys.lock, keys.meta],
                    args=["extend", lock_token, int(self.url.lock_ttl * 1000)],
                    client=pipe,
                )
                await self.scripts.read(
                    keys=[keys.stream, keys.meta], args=[after, limit, ""], client=pipe
                )
                extended, raw = await pipe.execute()
                if extended[0] != b"ok":
                    raise BackendError("redis", "the authority lost its lock (silent too long)")
            else:
                skip = str(skip_client) if skip_client >= 0 else ""
                raw = await self.scripts.call(
                    "read", [keys.stream, keys.meta], [after, limit, skip]
                )
        if raw == b"unknown":
            raise UnknownRun(keys.tenant, keys.run)
        return [row_of(e) for e in raw]

    async def read(
        self, tenant: str, run: str, after: int, limit: int = 10_000, *, skip_client: int = -1
    ) -> list[Row]:
        keys = self.keys.run_keys(tenant, run)
        if skip_client >= 0 and self._tail is not None:
            # a record's tail read (it reads again on the next wake-up): from the entries
            # the stream read brought, when they continue from `after` (see Tail.cached)
            kept = self._tail.cached(keys.stream, after, limit)
            if kept is not None:
                self.reads_kept += 1
                return kept
        return await self._read_rows(keys, after, limit, skip_client)

    def kept(self, tenant: str, run: str, after: int, limit: int) -> list[Row] | None:
        """A record tail's read answered from the stream read's entries now, without
        waiting (None: not all of them are kept; see :meth:`Tail.cached`)."""
        tail = self._tail
        return (
            None
            if tail is None
            else tail.cached(self.keys.run_keys(tenant, run).stream, after, limit)
        )

    async def head(self, tenant: str, run: str) -> int:
        with mapped("head"):
            raw = await self.client.hget(self.keys.run(tenant, run), "head")
        if raw is None:
            raise UnknownRun(tenant, run)
        return int(raw)

    async def load_snapshot(self, tenant: str, run: str) -> SnapshotRow | None:
        keys = self.keys.run_keys(tenant, run)
        with mapped("load_snapshot"):
            v = await self.client.hmget(keys.snapshot, ("seq", "upd", "state", "created"))
        if v[0] is None:
            if await self.get_run(tenant, run) is None:
                raise UnknownRun(tenant, run)
            return None
        return SnapshotRow(int(v[0]), v[1], json.loads(v[2]), float(v[3]))

    async def save_snapshot(
        self, tenant: str, run: str, snapshot: SnapshotRow, *, drop_journal: bool
    ) -> None:
        keys = self.keys.run_keys(tenant, run)
        with mapped("save_snapshot"):
            got = await self.scripts.snapshot(
                keys=[keys.meta, keys.snapshot],
                args=[
                    snapshot.seq,
                    snapshot.update,
                    _dumps(snapshot.state),
                    repr(float(snapshot.created)),
                ],
            )
        if got[0] == b"unknown":
            raise UnknownRun(tenant, run)
        kept = int(got[1])
        # the new snapshot is stored (or a newer one is there): only now, and after a grace
        # period (a reader woken for entries below it reads them meanwhile), the entries it
        # covers go, by chunks (each chunk one atomic step; readers see a shorter prefix)
        if drop_journal and self.trim_grace:
            await anyio.sleep(self.trim_grace)
        while drop_journal:
            with mapped("save_snapshot"):
                n = await self.scripts.trim(keys=[keys.stream, keys.index], args=[kept, TRIM_CHUNK])
            if int(n) < TRIM_CHUNK:
                break
        await self._durable()

    async def rewrite_entries(self, tenant: str, run: str, rows: Sequence[Row]) -> None:
        """See :meth:`JournalBackend.rewrite_entries`. A stream entry cannot change: the
        script deletes the entries from the lowest rewritten one on and adds them again with
        the same ids. The old bytes stay in the append-only file until :meth:`checkpoint`
        rewrites it (``Store.redact`` does, last)."""
        if not rows:
            return
        keys = self.keys.run_keys(tenant, run)
        args: list[Any] = [len(rows)]
        for r in rows:
            args += [r.seq, r.update, _dumps(r.effect), r.checksum]
        with mapped("rewrite_entries"):
            got = await self.scripts.rewrite(keys=[keys.meta, keys.stream], args=args)
        if int(got) < 0:
            raise UnknownRun(tenant, run)
        await self._durable()

    async def checkpoint(self) -> None:
        """Rewrite the server's files from the data set now (see
        :func:`._persistence.rewrite_files`), so that values deleted or rewritten
        (``Store.redact``) leave them too."""
        await rewrite_files(self.client)

    async def history(self, tenant: str, run: str, collection: str, key: str) -> list[Row]:
        keys = self.keys.run_keys(tenant, run)
        with mapped("history"):
            raw = await self.scripts.history(
                keys=[keys.index, keys.stream], args=[f"{collection}\x00{key}\x00"]
            )
        return [row_of(e) for e in raw]

    # -- the authority ----------------------------------------------------------------------

    @asynccontextmanager
    async def authority(self, tenant: str, run: str, *, durable: bool) -> AsyncIterator[Authority]:
        keys = self.keys.run_keys(tenant, run)
        ttl_ms = int(self.url.lock_ttl * 1000)
        async with self._lock(tenant, run):
            # who holds it, for an operator looking at the key (and unguessable)
            token = f"{_HOST}:{os.getpid()}:{secrets.token_hex(12)}"
            backoff = Backoff("authority")
            while True:
                with mapped("authority"):
                    got = await self.scripts.lock(
                        keys=[keys.lock, keys.meta], args=["acquire", token, ttl_ms]
                    )
                if got[0] == b"unknown":
                    raise UnknownRun(tenant, run)
                if got[0] == b"ok":
                    break
                await backoff.wait()
            auth = RedisAuthority(self, tenant, run, keys, token, int(got[1]), got[2].decode())
            try:
                yield auth
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._unlock(keys, token)
                raise
            with anyio.CancelScope(shield=True):
                await self._commit(tenant, run, keys, auth, durable)

    async def _unlock(self, keys: RunKeys, token: str) -> None:
        try:
            with mapped("authority"):
                await self.scripts.lock(keys=[keys.lock, keys.meta], args=["release", token, 0])
        except BackendError as exc:  # the lock expires by itself
            log.warning("could not release an authority lock (%s); it expires by its TTL", exc)

    async def _commit(
        self, tenant: str, run: str, keys: RunKeys, auth: RedisAuthority, durable: bool
    ) -> None:
        if not auth.pending:
            await self._unlock(keys, auth.token)
            return
        entries = auth.pending
        args = [auth.token, auth.head, len(entries), "", *entry_args(entries)]
        with mapped("authority commit"):
            got = await self.scripts.call("append", self._append_keys(keys), args)
        first = self._appended(tenant, run, keys, got)
        if self._tail is not None:
            self._tail.wrote(keys.stream, first, entries)
        if durable:
            await self._durable()
