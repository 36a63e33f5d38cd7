"""The hub's metrics and health (:class:`HubMetrics`): ``/-/metrics`` in the Prometheus text
format and ``/-/health``, for an operator.

Every hub has its own :class:`HubMetrics` (``hub.metrics``) with its own
``prometheus_client.CollectorRegistry`` (never the process-wide one: several hubs may run in
one process). The counters on the hub's hot paths (one per update, per delivery) are plain
integers, read by a collector when the registry is scraped, so counting costs an addition;
the gauges (connections, runs, tenants, queued frames) are read from the hub at scrape time;
so is the journal commit latency histogram (bucket counts, summed up at scrape time: one
bisect per commit, no lock). The instrumented modules
call this one with one line each.

Both endpoints are for an operator only: on the hub's port with an operator token
(:func:`operator_routes`), or without one on a separate address (:func:`serve_operator`).
``/-/health`` answers 200 ``ok`` only when the store answers a cheap backend call within
``health_timeout`` seconds, else 503 with the reason.
"""

from __future__ import annotations

import hmac
import logging
import weakref
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, urlsplit

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse

from crdtstore import InvalidValue, open_store

if TYPE_CHECKING:
    from crdtstore.backend import LeaseState

    from ._hub import Hub

__all__ = [
    "HEALTH_TIMEOUT",
    "MIN_OPERATOR_TOKEN",
    "HubMetrics",
    "check_operator_token",
    "metrics_of",
    "operator_routes",
    "serve_operator",
]

log = logging.getLogger("sync.hub")

MIN_OPERATOR_TOKEN: Final = 16
HEALTH_TIMEOUT: Final = 2.0  # seconds the store has to answer a health check
_PROBE_RUN: Final = "health-probe"  # the run a health check asks about (it need not exist)
_REMEMBERED: Final = 65536  # lease ids remembered to count each grant and wait once
_COMMIT_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class HubMetrics:
    """The counters of one hub, and the registry its ``/-/metrics`` serves (``registry``).

    The hub's modules call the methods below (each one line at its place); the gauges are
    read from ``hub`` at scrape time. Without a hub (tests of a module alone) nothing is
    read and the counters just count.
    """

    def __init__(self, hub: Hub | None = None) -> None:
        self._hub = weakref.ref(hub) if hub is not None else None
        self.registry = CollectorRegistry(auto_describe=False)
        self.health_timeout = HEALTH_TIMEOUT
        self.connections = 0
        self.updates_received = 0
        self.updates_broadcast = 0
        self.updates_delivered = 0
        self.writes_denied = 0
        self.commits = 0
        self.committed_entries = 0
        self.refusals: dict[str, int] = {}
        self.queue_overflows = 0
        self.dropped_frames = 0
        self.lease_grants = 0
        self.lease_waits = 0
        self.lease_reaps = 0
        self._granted: dict[str, int | None] = {}  # lease id -> its grant's token
        self._waiting: dict[str, None] = {}  # lease ids counted as waiting
        self._watched: weakref.WeakSet[Any] = weakref.WeakSet()
        # the journal commit latency per path ("loop", "committer"): a count per bucket of
        # _COMMIT_BUCKETS (a commit of exactly a bound counts in it) and one past the last,
        # and the sum of the seconds
        self.commit_buckets: dict[str, list[int]] = {
            path: [0] * (len(_COMMIT_BUCKETS) + 1) for path in ("loop", "committer")
        }
        self.commit_seconds_sum: dict[str, float] = {"loop": 0.0, "committer": 0.0}
        self.registry.register(_Collector(self))

    # -- what the hub's modules call ------------------------------------------------------------

    def connected(self) -> None:
        """A connection was accepted and joined its run (``_hub``)."""
        self.connections += 1

    def refused(self, code: int) -> None:
        """A connection was closed with ``code`` (a 44xx/1011 close), or an upgrade refused
        with that HTTP status (``_hub``, ``_hub_conn``)."""
        key = str(code)
        self.refusals[key] = self.refusals.get(key, 0) + 1

    def update_received(self) -> None:
        """A connection sent a (non-empty) update to apply (``_hub``)."""
        self.updates_received += 1

    def update_broadcast(self, targets: int) -> None:
        """An applied update was relayed to ``targets`` other connections (``_hub``)."""
        self.updates_broadcast += 1
        self.updates_delivered += targets

    def write_denied(self) -> None:
        """A read-only connection's write was answered with permission-denied (``_hub``)."""
        self.writes_denied += 1

    def queue_overflow(self, dropped: int) -> None:
        """A slow consumer's send queue overflowed: it is disconnected and ``dropped`` frames
        (the queued ones and the one that did not fit) are not sent (``_hub_conn``)."""
        self.queue_overflows += 1
        self.dropped_frames += dropped

    def lease_state(self, state: LeaseState) -> None:
        """A lease request or heartbeat was answered with ``state`` (``_ops_leases``): each
        grant (a lease id with its fencing token) and each wait is counted once."""
        lease_id = state.lease_id
        if state.state == "granted":
            if lease_id not in self._granted or self._granted[lease_id] != state.token:
                self.lease_grants += 1
                _remember(self._granted, lease_id, state.token)
            self._waiting.pop(lease_id, None)
        elif lease_id not in self._waiting:
            self.lease_waits += 1
            _remember(self._waiting, lease_id, None)

    def lease_gone(self, lease_id: str) -> None:
        """A lease was released or cancelled (``_ops_leases``): forget it."""
        self._granted.pop(lease_id, None)
        self._waiting.pop(lease_id, None)

    def leases_reaped(self, count: int) -> None:
        """``lease.reap`` removed ``count`` expired requests (``_ops_leases``)."""
        self.lease_reaps += count

    def watch_record(self, rec: Any) -> None:
        """Time the journal commits of a run's record (``_hub``, once the run is loaded; a
        second call for the same record does nothing) through its commit observer
        (``Record.observe_commits``): the group commit on the event loop and the committer's
        appends."""
        if rec in self._watched:
            return
        self._watched.add(rec)
        buckets, sums = self.commit_buckets, self.commit_seconds_sum

        def observed(path: str, entries: int, seconds: float) -> None:
            buckets[path][bisect_left(_COMMIT_BUCKETS, seconds)] += 1
            sums[path] += seconds
            self.commits += 1
            self.committed_entries += entries

        rec.observe_commits(observed)

    # -- the gauges, read from the hub -------------------------------------------------------

    def _gauges(self) -> dict[str, tuple[str, float]]:
        hub = self._hub() if self._hub is not None else None
        conns = runs = tenants = queued = 0
        if hub is not None:
            rooms = list(hub._rooms.values())
            runs = len(rooms)
            tenants = len(hub._stores)
            for room in rooms:
                conns += len(room.conns)
                queued += sum(len(c.queue) for c in room.conns)
        return {
            "crdtstore_hub_connections_open": (
                "Connections open now (accepted, joined to their run).",
                conns,
            ),
            "crdtstore_hub_runs_loaded": ("Runs loaded now (a record each).", runs),
            "crdtstore_hub_tenants_loaded": (
                "Tenants whose store is open now (lingering ones included).",
                tenants,
            ),
            "crdtstore_hub_send_queue_frames": (
                "Frames waiting in the send queues of the connections now.",
                queued,
            ),
        }

    # -- health --------------------------------------------------------------------------------

    async def health(self) -> str | None:
        """None when the store answers within ``health_timeout`` seconds, else why not."""
        hub = self._hub() if self._hub is not None else None
        if hub is None:
            return "no hub"
        try:
            with anyio.fail_after(self.health_timeout):
                for tenant, held in list(hub._stores.items()):
                    await held.store.backend.get_run(tenant, _PROBE_RUN)
                    return None
                async with open_store(hub.store_url, tenant="default") as store:
                    await store.backend.get_run("default", _PROBE_RUN)
                return None
        except TimeoutError:
            return f"the store did not answer within {self.health_timeout:g} s"
        except Exception as exc:  # whatever the backend raises: the store does not answer
            return f"the store does not answer: {type(exc).__name__}: {exc}"


def _remember(table: dict[str, Any], key: str, value: Any) -> None:
    table[key] = value
    if len(table) > _REMEMBERED:
        del table[next(iter(table))]


class _Collector(Collector):
    """Yields the plain counters and the gauges of a :class:`HubMetrics` at scrape time."""

    def __init__(self, metrics: HubMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        counters = (
            ("crdtstore_hub_connections", "Connections accepted.", m.connections),
            (
                "crdtstore_hub_updates_received",
                "Updates (non-empty) received from connections, to apply.",
                m.updates_received,
            ),
            (
                "crdtstore_hub_updates_broadcast",
                "Updates applied and relayed to the other connections of their run.",
                m.updates_broadcast,
            ),
            (
                "crdtstore_hub_updates_delivered",
                "Relayed updates times the connections each was relayed to.",
                m.updates_delivered,
            ),
            (
                "crdtstore_hub_writes_denied",
                "Writes of read-only connections answered with permission-denied.",
                m.writes_denied,
            ),
            ("crdtstore_hub_journal_commits", "Journal commits of the runs.", m.commits),
            (
                "crdtstore_hub_journal_entries",
                "Journal entries committed by those commits.",
                m.committed_entries,
            ),
            (
                "crdtstore_hub_send_queue_overflows",
                "Slow consumers disconnected because their send queue was full (4408).",
                m.queue_overflows,
            ),
            (
                "crdtstore_hub_send_queue_dropped_frames",
                "Frames not sent to a slow consumer when it was disconnected.",
                m.dropped_frames,
            ),
            ("crdtstore_hub_lease_grants", "Lease grants answered.", m.lease_grants),
            ("crdtstore_hub_lease_waits", "Lease requests queued to wait.", m.lease_waits),
            (
                "crdtstore_hub_lease_reaps",
                "Expired lease requests removed by lease.reap.",
                m.lease_reaps,
            ),
        )
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)
        refusals = CounterMetricFamily(
            "crdtstore_hub_refusals",
            "Connections closed with a refusal code (44xx, 1011), or upgrades refused with "
            "an HTTP status, by code.",
            labels=["code"],
        )
        for code, count in sorted(m.refusals.items()):
            refusals.add_metric([code], count)
        yield refusals
        commit_seconds = HistogramMetricFamily(
            "crdtstore_hub_journal_commit_seconds",
            "Time one journal commit of a run's record took (an append of a batch of entries).",
            labels=["path"],
        )
        for path, counts in m.commit_buckets.items():
            cumulative, total = [], 0
            for bound, count in zip((*map(str, _COMMIT_BUCKETS), "+Inf"), counts, strict=True):
                total += count
                cumulative.append((bound, total))
            commit_seconds.add_metric([path], cumulative, m.commit_seconds_sum[path])
        yield commit_seconds
        for name, (doc, gauge) in m._gauges().items():
            yield GaugeMetricFamily(name, doc, value=gauge)


# -- the endpoints ---------------------------------------------------------------------------------


def metrics_of(hub: object) -> HubMetrics:
    """``hub.metrics``, or an unscraped :class:`HubMetrics` for a stand-in without one."""
    metrics = getattr(hub, "metrics", None)
    return metrics if isinstance(metrics, HubMetrics) else _DETACHED


_DETACHED: Final = HubMetrics()


def check_operator_token(token: str) -> str:
    """``token`` if it may be an operator token (at least 16 characters, no whitespace).

    Raises:
        InvalidValue: it may not.
    """
    if len(token) < MIN_OPERATOR_TOKEN or token != "".join(token.split()):
        raise InvalidValue(
            f"an operator token has at least {MIN_OPERATOR_TOKEN} characters and no whitespace"
        )
    return token


def _text(conn: ServerConnection, status: int, text: str, content_type: str) -> HttpResponse:
    response = conn.respond(status, text)
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = content_type
    response.headers["Cache-Control"] = "no-store"
    return response


async def _metrics_response(hub: Hub, conn: ServerConnection) -> HttpResponse:
    body = generate_latest(hub.metrics.registry).decode()
    return _text(conn, 200, body, CONTENT_TYPE_LATEST)


async def _health_response(hub: Hub, conn: ServerConnection) -> HttpResponse:
    problem = await hub.metrics.health()
    if problem is not None:
        log.warning("health check: %s", problem)
        return _text(conn, 503, f"unavailable: {problem}\n", "text/plain; charset=utf-8")
    return _text(conn, 200, "ok\n", "text/plain; charset=utf-8")


_ENDPOINTS: Final[dict[str, Callable[[Hub, ServerConnection], Awaitable[HttpResponse]]]] = {
    "metrics": _metrics_response,
    "health": _health_response,
}


def _presented_token(request: HttpRequest) -> str | None:
    authorization = request.headers.get("Authorization")
    if authorization is not None:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    tokens = parse_qs(urlsplit(request.path).query).get("token")
    return tokens[0] if tokens else None


def operator_routes(
    token: str,
) -> dict[str, Callable[[Hub, ServerConnection, HttpRequest], Awaitable[HttpResponse]]]:
    """``Hub.http_routes`` entries serving ``/-/metrics`` and ``/-/health`` to requests that
    carry the operator ``token`` (bearer or ``?token=``); others get HTTP 401.

    **Access.** Both endpoints are for an operator only. Either the hub is given an operator
    token (``Hub(..., operator_token=...)``, ``crdtstore serve --operator-token-file``: a secret
    string of at least 16 characters, not a signed agent token): then ``/-/metrics`` and
    ``/-/health`` on the hub's own port answer a request that carries it as ``Authorization:
    Bearer <token>`` or as the ``token`` query parameter, and refuse any other with HTTP 401
    (nothing is served without one configured: 404). Or they are served on a separate address
    (:func:`serve_operator`, ``crdtstore serve --metrics-address host:port``), without a token:
    whoever can reach that address (a loopback or a private interface) is the operator.
    """
    expected = check_operator_token(token).encode()

    def guarded(
        endpoint: Callable[[Hub, ServerConnection], Awaitable[HttpResponse]],
    ) -> Callable[[Hub, ServerConnection, HttpRequest], Awaitable[HttpResponse]]:
        async def route(hub: Hub, conn: ServerConnection, request: HttpRequest) -> HttpResponse:
            presented = _presented_token(request)
            if presented is None or not hmac.compare_digest(presented.encode(), expected):
                hub.metrics.refused(401)
                response = conn.respond(401, "OPERATOR_TOKEN: an operator token is needed\n")
                response.headers["WWW-Authenticate"] = 'Bearer realm="crdtstore-operator"'
                return response
            return await endpoint(hub, conn)

        return route

    return {name: guarded(endpoint) for name, endpoint in _ENDPOINTS.items()}


async def serve_operator(
    hub: Hub,
    host: str,
    port: int,
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/-/metrics`` and ``/-/health`` of ``hub`` on ``host:port`` without a token (the
    address is the access control) until cancelled; ``task_status.started`` gets the port.
    Every other path is 404; nothing is upgraded to a WebSocket."""

    async def answer(conn: ServerConnection, request: HttpRequest) -> HttpResponse:
        parts = urlsplit(request.path).path.split("/")
        endpoint = _ENDPOINTS.get(parts[2]) if len(parts) >= 3 and parts[1] == "-" else None
        if endpoint is None:
            return conn.respond(404, "only /-/metrics and /-/health here\n")
        return await endpoint(hub, conn)

    server = await serve(
        _never,
        host,
        port,
        process_request=answer,
        logger=logging.getLogger("sync.hub.operator"),
    )
    try:
        bound = server.sockets[0].getsockname()[1]
        log.info("operator endpoints on http://%s:%d/-/metrics and /-/health", host, bound)
        task_status.started(bound)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            server.close()
            await server.wait_closed()


async def _never(conn: ServerConnection) -> None:  # (process_request answers every request)
    await conn.close()
