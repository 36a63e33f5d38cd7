"""What a Redis keeps across a restart, for ``crdtstore serve`` (it logs it, and refuses a
Redis that keeps nothing unless told ``--allow-volatile``) and for operators.

A Redis persists through its append-only file (``appendonly yes``: every write logged, synced
per ``appendfsync``) or RDB snapshots (``save`` rules: a snapshot every so many seconds and
writes, which loses what came after the last one). Neither: a restart loses every journal.
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import anyio

from ._client import RedisError, make_client, mapped
from ._keys import parse_url, redis_options


class Persistence(NamedTuple):
    """The persistence of one Redis server."""

    url: str  # the store URL without its password
    version: str
    aof: bool  # appendonly yes
    appendfsync: str  # always | everysec | no | "" (unknown: CONFIG refused)
    save: str | None  # the RDB save rules ("" none; None unknown)
    waitaof: bool  # Redis 7.2+: durable writes wait for the file to be synced

    @property
    def persistent(self) -> bool:
        """Whether a restart keeps (most of) what was written: an AOF or RDB save rules."""
        return self.aof or bool(self.save)

    def describe(self) -> str:
        """One line for the log."""
        if self.aof:
            how = f"append-only file (appendfsync {self.appendfsync or 'unknown'})"
            how += ", durable writes wait for WAITAOF" if self.waitaof else ""
        elif self.save:
            how = f"RDB snapshots only (save {self.save!r}: a crash loses what came after)"
        elif self.save is None:
            how = "no append-only file; RDB save rules unknown (CONFIG refused)"
        else:
            how = "NO persistence (no append-only file, no RDB save rules)"
        return f"{self.url}: Redis {self.version}, {how}"


async def persistence(url: str, **options: Any) -> Persistence:
    """Ask the Redis of the store URL ``url`` how it persists.

    Raises:
        BackendError: it cannot be reached.
        UnsupportedURL: a bad URL.
    """
    parsed = parse_url(url)
    client = make_client(parsed.redis_url, redis_options(options))
    try:
        with mapped(f"cannot connect to {parsed.shown}"):
            info = await client.info("server")
            pers = await client.info("persistence")
        aof = bool(int(pers.get("aof_enabled", 0)))
        fsync: str = ""
        save: str | None = None
        try:
            got = await client.config_get("appendfsync")
            fsync = _text(got.get("appendfsync", got.get(b"appendfsync", "")))
            got = await client.config_get("save")
            save = _text(got.get("save", got.get(b"save", "")))
        except Exception:  # CONFIG may be disabled (managed Redis): unknown
            pass
    finally:
        await client.aclose()
    version = str(info.get("redis_version", "?"))
    parts = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
    return Persistence(parsed.shown, version, aof, fsync, save, aof and parts >= (7, 2))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


POLL = 0.05  # seconds between two looks at a running rewrite or save


async def rewrite_files(client: Any) -> None:
    """Rewrite the server's files from its data set now and wait for the rewrite to end: the
    append-only file (``BGREWRITEAOF``, after any rewrite already running) and, when the
    server saves RDB snapshots (a ``save`` schedule, or a save made since it started), the
    snapshot file (``BGSAVE``). What a redaction needs so that deleted values leave the
    disk. A file the server no longer writes (a ``dump.rdb`` left from before ``save ""``)
    is outside its reach and ours."""
    with mapped("BGREWRITEAOF"):
        info = await client.info("persistence")
        if int(info.get("aof_enabled", 0)):
            await _idle(client, "aof_rewrite_in_progress", "aof_rewrite_scheduled")
            with contextlib.suppress(RedisError):  # another client's started meanwhile
                await client.bgrewriteaof()
            await _idle(client, "aof_rewrite_in_progress", "aof_rewrite_scheduled")
    with mapped("BGSAVE"):
        if await _saves_rdb(client, info):
            await _idle(client, "rdb_bgsave_in_progress")
            with contextlib.suppress(RedisError):  # another save started meanwhile
                await client.bgsave()
            await _idle(client, "rdb_bgsave_in_progress")


async def _saves_rdb(client: Any, info: dict[str, Any]) -> bool:
    if int(info.get("rdb_saves", 0)) > 0:
        return True
    try:
        schedule = (await client.config_get("save")).get("save", "")
    except RedisError:  # CONFIG renamed away (a managed Redis): only what INFO tells
        return False
    return bool(str(schedule).strip())


async def _idle(client: Any, *flags: str) -> None:
    while True:
        info = await client.info("persistence")
        if not any(int(info.get(flag, 0)) for flag in flags):
            return
        await anyio.sleep(POLL)


async def sync_mode(client: Any, info: dict[Any, Any], persistence: dict[Any, Any]) -> str:
    """How a durable write is made durable on this server: ``waitaof`` (Redis 7.2+ with an
    append-only file), ``always`` (``appendfsync always``) or ``none``."""
    version = tuple(int(x) for x in str(info.get("redis_version", "0")).split(".")[:2])
    if not int(persistence.get("aof_enabled", 0)):
        return "none"
    if version >= (7, 2):
        return "waitaof"
    try:
        got = await client.config_get("appendfsync")
    except Exception:  # CONFIG may be disabled (managed Redis)
        return "none"
    value = got.get(b"appendfsync", got.get("appendfsync", b""))
    return "always" if value in (b"always", "always") else "none"
