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
try:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError as RedisError
except ImportError:  # pragma: no cover - the extra is not installed
    aioredis = None

    class RedisError(Exception):  # type: ignore[no-redef]
        """Stands for redis-py's error root when redis-py is missing (never raised)."""


_LUA = Path(__file__).with_name("lua")
SCRIPTS = (
    "append", "read", "history", "ensure_run", "set_run", "delete_run", "snapshot", "trim",
    "config", "lock", "lease", "rewrite",
)  # fmt: skip


def lua_source(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return (_LUA / f"{name}.lua").read_text()


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

    Raises:
        BackendError: redis-py is not installed, or it refuses the URL or options.
    """
    if aioredis is None:  # pragma: no cover - the extra is not installed
        raise BackendError("redis", "redis-py is not installed: pip install 'crdtstore[redis]'")
    try:
        return aioredis.Redis.from_url(redis_url, decode_responses=False, **options)
    except (ValueError, TypeError, RedisError) as exc:
        raise BackendError("redis", f"bad URL or options: {exc}") from exc


class Scripts:
    """The Lua scripts registered on one client (``scripts.append(keys=..., args=...)``):
    sent by SHA, loaded again by redis-py when the server lost its script cache (a restart)."""

    def __init__(self, client: Any) -> None:
        self._scripts = {name: client.register_script(lua_source(name)) for name in SCRIPTS}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_scripts"][name]
        except KeyError:
            raise AttributeError(name) from None
