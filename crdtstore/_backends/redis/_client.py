"""The redis-py asyncio client, its Lua scripts, and the translation of its errors.

redis-py is imported here only, and only when a ``redis://`` store is opened: crdtstore
installs without it (``pip install 'crdtstore[redis]'`` adds it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..._errors import BackendError, CrdtStoreError

aioredis: Any
pack: Any
Retry: Any
try:
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as ConnectionLost
    from redis.exceptions import NoScriptError
    from redis.exceptions import RedisError as RedisError
    from redis.exceptions import ResponseError as ErrorReply
    from redis.exceptions import TimeoutError as ReplyTimeout
except ImportError:  # pragma: no cover - the extra is not installed
    aioredis = Retry = None

    class RedisError(Exception):  # type: ignore[no-redef]
        """Stands for redis-py's error root when redis-py is missing (never raised)."""

    ConnectionLost = ReplyTimeout = NoScriptError = ErrorReply = RedisError  # type: ignore[misc,assignment]
HiredisParser: Any
NOT_ENOUGH_DATA: Any
try:
    from hiredis import pack_command as pack
    from redis._parsers.hiredis import NOT_ENOUGH_DATA
    from redis._parsers.hiredis import _AsyncHiredisParser as HiredisParser
except ImportError:  # pragma: no cover - redis-py packs then (the extra installs hiredis)
    pack = HiredisParser = NOT_ENOUGH_DATA = None


_LUA = Path(__file__).with_name("lua")
SCRIPTS = (
    "append", "read", "history", "ensure_run", "set_run", "delete_run", "snapshot", "trim",
    "config", "lock", "lease", "rewrite",
)  # fmt: skip


def lua_source(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return (_LUA / f"{name}.lua").read_text()


def resend_source(name: str) -> str:
    """The script a resend of ``name`` runs: ``lua/re<name>.lua`` (which answers as the
    first send did when that one ran) and then ``lua/<name>.lua``."""
    return lua_source(f"re{name}") + "\n" + lua_source(name)


@contextmanager
def mapped(what: str) -> Iterator[None]:
    """Translate redis-py's errors (and socket errors) raised inside into ``BackendError``."""
    try:
        yield
    except CrdtStoreError:
        raise
    except (TimeoutError, RedisError, OSError) as exc:
        raise BackendError("redis", f"{what}: {type(exc).__name__}: {exc}") from exc


def require_asyncio() -> None:
    """Raises ``BackendError`` unless an asyncio event loop runs this task (redis-py's client
    is asyncio only: a ``redis://`` store cannot be used under trio)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise BackendError(
            "redis", "redis:// stores run on asyncio only (redis-py's asyncio client)"
        ) from None


def make_client(redis_url: str, options: dict[str, Any]) -> Any:
    """A redis-py asyncio client for ``redis_url`` (bytes in, bytes out).

    A command whose connection was lost (the server closed it: ``CLIENT KILL``, a timeout of
    idle clients, a restart) is sent once more on a new connection, as :class:`Direct` does
    for the hot commands (``from_url`` alone gives redis-py's connections no retry at all);
    a ``retry`` option replaces this.

    Raises:
        BackendError: redis-py is not installed, or it refuses the URL or options.
    """
    if aioredis is None:  # pragma: no cover - the extra is not installed
        raise BackendError("redis", "redis-py is not installed: pip install 'crdtstore[redis]'")
    if "retry" not in options:
        options = {**options, "retry": Retry(NoBackoff(), 1, (ConnectionLost,))}
    try:
        return aioredis.Redis.from_url(redis_url, decode_responses=False, **options)
    except (ValueError, TypeError, RedisError) as exc:
        raise BackendError("redis", f"bad URL or options: {exc}") from exc


async def send(conn: Any, args: tuple[Any, ...]) -> Any:
    """Send one command on redis-py connection ``conn`` (packed by hiredis, written at once)
    and read its reply (see :func:`reply`; an error reply is raised)."""
    packed = pack(args)
    writer = getattr(conn, "_writer", None)
    if writer is None or not conn.is_connected:
        await conn.send_packed_command(packed, check_health=False)
    else:
        writer.write(packed)  # (drained when the socket's buffer is full)
        if writer.transport.get_write_buffer_size() > 65536:
            await conn.send_packed_command(b"", check_health=False)
    return await reply(conn)


async def reply(conn: Any) -> Any:
    """The next reply on ``conn``: from its hiredis reader, fed from its stream, under the
    connection's socket timeout kept by one timer (redis-py's ``read_response`` enters an
    ``asyncio.timeout`` per reply: under cProfile, its enter and exit cost as much as the
    read itself); push messages (RESP3) go to redis-py's parser as its own read does; where
    the parser is not hiredis's, redis-py reads."""
    parser = conn._parser
    reader = getattr(parser, "_reader", None)
    stream = getattr(parser, "_stream", None)
    if (
        type(parser) is not HiredisParser
        or reader is None
        or stream is None
        or not getattr(parser, "_connected", False)
    ):  # (also a redis-py whose parser lacks what this reads: its own read then)
        return await conn.read_response()
    push = getattr(parser, "_hiredis_PushNotificationType", None)
    while True:
        got = reader.gets()
        if got is NOT_ENOUGH_DATA:
            got = await _read(conn, stream, reader)
        if push is None or not isinstance(got, push):
            break
        await parser.handle_push_response(got)  # (e.g. maintenance notices)
    if isinstance(got, ErrorReply | ConnectionLost):  # (an error reply, as redis-py raises)
        raise got
    if type(got) is list and got and isinstance(got[0], ConnectionLost):
        raise got[0]
    return got


async def _read(conn: Any, stream: Any, reader: Any) -> Any:
    timer, expired = None, False
    timeout = conn.socket_timeout
    if timeout is not None:

        def expire() -> None:
            nonlocal expired
            expired = True
            writer = conn._writer
            if writer is not None:
                writer.transport.abort()  # (the read below ends)

        timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        while True:
            data = await stream.read(65536)
            if not data:
                raise ConnectionLost("Connection closed by server.")
            reader.feed(data)
            got = reader.gets()
            if got is not NOT_ENOUGH_DATA:
                return got
    except BaseException as exc:  # (as redis-py: the connection is not reusable)
        await conn.disconnect(nowait=True)
        if expired:
            raise ReplyTimeout("Timeout reading from the server") from exc
        if isinstance(exc, OSError):
            raise ConnectionLost(f"Error while reading: {exc}") from exc
        raise
    finally:
        if timer is not None:
            timer.cancel()


class Direct:
    """The hot commands of a store (appends, lease transitions, the stream read) on
    connections of the client's pool that this object keeps: packed by hiredis in one call
    and written to the socket at once, the reply read by the connection's parser, without
    redis-py's per-command machinery (pool checkout and health check, a retry wrapper, a
    task per write for its timeout, observability hooks): a third of a lease transition's
    client CPU. A connection that fails is left disconnected (redis-py reconnects it on its
    next use); a command whose connection was lost is sent once more on it, connected anew
    (unless ``retry`` is False), and a timeout is raised (the command may have run)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._pool = client.connection_pool
        self._free: list[Any] = []

    async def __call__(
        self, *args: Any, retry: bool = True, again: tuple[Any, ...] | None = None
    ) -> Any:
        """Send ``args``; ``again``: the command to send instead when the connection was lost
        (the first may have run and only its reply been lost: ``again`` recognises that)."""
        if pack is None:  # pragma: no cover - without hiredis
            return await self._client.execute_command(*args)
        free = self._free
        conn = free.pop() if free else await self._pool.get_connection()
        try:
            try:
                return await send(conn, args)
            except (ConnectionLost, OSError):
                if not retry:
                    raise
            # the connection failed (and is disconnected): once more on it, connected anew
            try:
                return await send(conn, args if again is None else again)
            except NoScriptError as exc:
                exc.resent = True  # type: ignore[attr-defined]  # (the first send may have run)
                raise
        finally:
            free.append(conn)  # (disconnected when it failed: it reconnects when used)

    async def evalsha(
        self,
        script: Any,
        keys: list[Any],
        args: list[Any],
        *,
        resend: Any = None,
        resend_args: list[Any] | None = None,
    ) -> Any:
        """Run a registered script (``client.register_script``) by its SHA, loading it
        first when the server does not know it (a restart emptied its script cache).

        A send whose reply was lost with its connection may have run: the resend is
        ``resend`` (a script) with ``resend_args`` where given, which recognise an earlier
        run and answer as it did, also when the resend finds the script cache lost (the
        server restarted, maybe after running the first send).
        """
        n = len(keys)
        cmd = (b"EVALSHA", script.sha, n, *keys, *args)
        alt_script = script if resend is None else resend
        alt = (
            b"EVALSHA",
            alt_script.sha,
            n,
            *keys,
            *(args if resend_args is None else resend_args),
        )
        try:
            return await self(*cmd, again=alt)
        except NoScriptError as exc:
            resent = getattr(exc, "resent", False)
        await self._client.script_load(script.script)
        if alt_script is not script:
            await self._client.script_load(alt_script.script)
        return await self(*(alt if resent else cmd), again=alt)


class Scripts:
    """The Lua scripts registered on one client (``scripts.append(keys=..., args=...)``):
    sent by SHA, loaded again by redis-py when the server lost its script cache (a restart).
    ``scripts.call(name, keys, args)`` sends one through :class:`Direct`."""

    def __init__(self, client: Any) -> None:
        self._scripts = {name: client.register_script(lua_source(name)) for name in SCRIPTS}
        # the resend of an append: the same script behind a prelude that finds its entries
        self._resend = {"append": client.register_script(resend_source("append"))}
        self.direct = Direct(client)

    async def call(
        self,
        name: str,
        keys: list[Any],
        args: list[Any],
        *,
        resend_args: list[Any] | None = None,
        may_have_run: bool = False,
    ) -> Any:
        """Send script ``name`` through :class:`Direct` (``resend_args``: the arguments of a
        resend after a lost connection, where they differ; ``may_have_run``: send the resend
        form at once, as for an append of entries an earlier send may have appended)."""
        resend = self._resend.get(name)
        first = resend if may_have_run and resend is not None else self._scripts[name]
        return await self.direct.evalsha(first, keys, args, resend=resend, resend_args=resend_args)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_scripts"][name]
        except KeyError:
            raise AttributeError(name) from None
