"""Redis key names and ``redis://`` URLs: the only place where a tenant or run becomes a key.

A name is escaped (``%``, ``:``, ``{`` and ``}`` percent-encoded) before it goes into a key, so
the components of a key never contain its separator or a hash-tag brace: two different
(tenant, run) pairs can never name the same key, and no tenant or run name (nor the URL's
``prefix``, which may contain none of them) can reach another tenant's keys.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..._errors import InvalidValue, UnsupportedURL
from ..._names import check_name

# The keys (``P``: the URL's ``prefix``; names escaped by :func:`escape`; ``{T}`` is a hash tag,
# so every key of a tenant is in one cluster slot):
#
#   P:{T}:runs        sorted set  run name -> creation time (us); list_runs' order
#   P:{T}:r:R         hash        created, head, snap, parent, state, delete_after, config
#   P:{T}:r:R:j       stream      the journal: entry ID "<seq>-0"; fields a (agent), s (source),
#                                 c (client id), w (wall time), u (update), e (effect JSON),
#                                 k (CRC-32), o (origin), l (call), x (its key-index members)
#   P:{T}:r:R:k       sorted set  key index of history(): "collection NUL key NUL <seq, 20
#                                 digits>", all at score 0 (lexicographic)
#   P:{T}:r:R:s       hash        the snapshot: seq, upd, state, created
#   P:{T}:r:R:lock    string      the run's authority lock (a token, with a TTL)
#   P:{T}:lease:q     hash        lease requests: rank -> JSON (see lua/lease.lua)
#   P:{T}:lease:n     hash        lease counters: rank, token (never go back)
#   P:{T}:lease:ev    stream      lease hand-offs, for waiters in other processes
DEFAULT_PREFIX = "crdtstore"
DEFAULT_LOCK_TTL = 10.0  # seconds an authority lock lives without being used (see _authority)
_PREFIX = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_OURS = ("prefix", "lock_ttl")  # query parameters of the URL that crdtstore takes, not redis-py

_ESCAPES = str.maketrans({"%": "%25", ":": "%3A", "{": "%7B", "}": "%7D"})


@lru_cache(maxsize=4096)
def escape(name: str) -> str:
    """``name`` with ``%``, ``:``, ``{`` and ``}`` percent-encoded (injective)."""
    return name.translate(_ESCAPES)


@dataclass(frozen=True)
class RedisURL:
    """A parsed ``redis://`` or ``rediss://`` URL.

    ``redis_url`` is what redis-py gets (host, port, db, credentials and its own query
    options, TLS for ``rediss://``); ``prefix`` and ``lock_ttl`` are crdtstore's.
    """

    redis_url: str
    prefix: str
    lock_ttl: float
    shown: str  # the URL without its password, for messages and logs


def _lock_ttl(value: object) -> float:
    try:
        ttl = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        ttl = math.nan
    if isinstance(value, bool) or not math.isfinite(ttl) or not 0.1 <= ttl <= 3600:
        raise InvalidValue(f"lock_ttl must be between 0.1 and 3600 seconds, not {value!r}")
    return ttl


def parse_url(url: str, *, prefix: str | None = None, lock_ttl: object = None) -> RedisURL:
    """Split a ``redis[s]://[[user]:password@]host[:port][/db][?options]`` URL.

    ``prefix`` (default ``crdtstore``) names the key space of the store; ``lock_ttl`` the
    seconds an authority lock outlives a silent holder. Either may come from the URL's query
    or from the keyword arguments (which must not contradict the URL).

    Raises:
        UnsupportedURL: not a redis URL, or no host.
        InvalidValue: a bad prefix or lock_ttl.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:
        raise UnsupportedURL(url, str(exc)) from None
    if parts.scheme.lower() not in ("redis", "rediss"):
        raise UnsupportedURL(url, "expected redis://host:port/db or rediss://...")
    if not host:
        raise UnsupportedURL(url, "no host")
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _OURS}
    theirs = [(k, v) for k, v in query if k not in _OURS]
    if len(ours) != sum(1 for k, _ in query if k in _OURS):
        raise UnsupportedURL(url, "an option is given twice")
    for name, given in (("prefix", prefix), ("lock_ttl", lock_ttl)):
        if given is not None and name in ours and str(given) != ours[name]:
            raise InvalidValue(f"{name}={given!r} contradicts {name}={ours[name]!r} in the URL")
    pfx = prefix if prefix is not None else ours.get("prefix", DEFAULT_PREFIX)
    if not isinstance(pfx, str) or not _PREFIX.fullmatch(pfx):
        raise InvalidValue(f"redis key prefix must be 1 to 64 of A-Z a-z 0-9 _ . -, not {pfx!r}")
    ttl = _lock_ttl(lock_ttl if lock_ttl is not None else ours.get("lock_ttl", DEFAULT_LOCK_TTL))
    redis_url = urlunsplit(parts._replace(query=urlencode(theirs)))
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    shown = urlunsplit(parts._replace(netloc=netloc, query=""))
    return RedisURL(redis_url, pfx, ttl, shown)


class Keys:
    """The key names of one store (one prefix). See the package docstring for the schema."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._runs: dict[tuple[str, str], RunKeys] = {}  # (every read and append asks)

    def tenant(self, tenant: str) -> str:
        """The base of every key of ``tenant``: ``<prefix>:{<tenant>}`` (a hash tag, so that a
        tenant's keys share one cluster slot and a script may touch several)."""
        return f"{self.prefix}:{{{escape(check_name('tenant', tenant))}}}"

    def runs(self, tenant: str) -> str:
        return f"{self.tenant(tenant)}:runs"

    def run(self, tenant: str, run: str) -> str:
        """The run's hash (head, state, config, ...); its other keys add a suffix."""
        return f"{self.tenant(tenant)}:r:{escape(check_name('run', run))}"

    def run_keys(self, tenant: str, run: str) -> RunKeys:
        got = self._runs.get((tenant, run))
        if got is None:
            base = self.run(tenant, run)
            got = RunKeys(tenant, run, base, f"{base}:j", f"{base}:k", f"{base}:s", f"{base}:lock")
            if len(self._runs) >= 4096:
                self._runs.clear()
            self._runs[(tenant, run)] = got
        return got

    def leases(self, tenant: str) -> LeaseKeys:
        """The keys of the tenant's lease table (see ``lua/lease.lua``)."""
        return _lease_keys(self.tenant(tenant))


class LeaseKeys(NamedTuple):
    """The keys of one tenant's leases, in the order ``lua/lease.lua`` takes them."""

    requests: str  # hash: request id -> the request
    counters: str  # hash: next rank, next token (never go back), clock boot
    events: str  # stream: hand-offs, for waiters in other processes
    holders: str  # hash: resource -> id of the request holding it
    queues: str  # sorted set: the waiters of each resource, in rank order
    deadlines: str  # sorted set: request id -> deadline
    by_key: str  # hash: owner, step, attempt -> request id


@lru_cache(maxsize=1024)
def _lease_keys(base: str) -> LeaseKeys:
    b = f"{base}:lease"
    return LeaseKeys(f"{b}:q", f"{b}:n", f"{b}:ev", f"{b}:h", f"{b}:w", f"{b}:x", f"{b}:k")


@dataclass(frozen=True)
class RunKeys:
    tenant: str
    run: str
    meta: str
    stream: str
    index: str
    snapshot: str
    lock: str

    def all(self) -> list[str]:
        return [self.meta, self.stream, self.index, self.snapshot, self.lock]


def redis_options(options: dict[str, Any]) -> dict[str, Any]:
    """Keyword options for redis-py, refusing the ones that belong to other backends."""
    if "token" in options:
        raise InvalidValue("redis:// takes no token (the URL carries the credentials)")
    return options
