"""The command-line side of the hub: ``crdtstore token``, ``crdtstore token revoke`` and
``crdtstore serve`` (added to crdtstore's CLI through the ``crdtstore.commands`` entry-point
group: :data:`token_app`, :func:`serve_command`), and ``python -m sync``.

Revocation: ``crdtstore token`` prints the token's id (``jti``) above the token; ``crdtstore
token revoke --jti ID --store URL`` appends it to the store's revocation file (for
``sqlite:///path/store.db``: ``path/store.db.revoked``; or the file given by
``--revoked-file``), which a hub serving that store re-reads within ``revocation_poll``
(0.5 s): new connections with the token are refused (closed with 4403 at once, or HTTP 403
with ``--refuse-with http``), open ones closed (4403).
A file, not a table of the store: revocation is per signing secret rather than per tenant,
and a file works whatever the store's backend, costs the hub one ``stat`` per poll, and can be
written by the operator without the hub or the store's schema knowing a new table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import anyio
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from crdtstore import CrdtStoreError, InvalidValue

from ._hub import Hub, HubLimits
from ._logs import configure as configure_logging
from ._metrics import check_operator_token, serve_operator
from ._tokens import (
    TokenClaims,
    append_revoked,
    check_jti,
    default_revoked_file,
    load_secret,
    mint,
    new_jti,
)

__all__ = [
    "issue_token",
    "main",
    "mint_token",
    "revoke_token",
    "serve_command",
    "serve_hub",
    "token_app",
]

DEFAULT_TTL = 3600.0


def mint_token(
    *,
    tenant: str,
    run: str,
    agent: str,
    rw: bool,
    ttl: float = DEFAULT_TTL,
    secret_file: Path | None = None,
    now: float | None = None,
) -> str:
    """A token for ``agent`` on ``run`` (or a run prefix ending with ``*``) of ``tenant``,
    valid for ``ttl`` seconds, signed with the secret of ``secret_file`` or
    ``CRDTSTORE_SECRET``, with a fresh ``jti``.

    Raises:
        SecretMissing: no secret, or too short.
        InvalidValue: a bad name or ttl.
    """
    return issue_token(
        tenant=tenant, run=run, agent=agent, rw=rw, ttl=ttl, secret_file=secret_file, now=now
    )[1]


def issue_token(
    *,
    tenant: str,
    run: str,
    agent: str,
    rw: bool,
    ttl: float = DEFAULT_TTL,
    secret_file: Path | None = None,
    now: float | None = None,
    redact: bool = False,
) -> tuple[TokenClaims, str]:
    """As :func:`mint_token`, with the claims (``claims.jti`` is the id to revoke it by)."""
    if not ttl > 0:
        raise InvalidValue(f"ttl must be > 0 seconds, not {ttl!r}")
    secret = load_secret(secret_file)
    start = time.time() if now is None else now
    try:
        claims = TokenClaims(
            tenant=tenant,
            run=run,
            agent=agent,
            mode="rw" if rw else "ro",
            exp=int(start + ttl),
            jti=new_jti(),
            redact=redact,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidValue(f"{where}: {first['msg']}") from None
    return claims, mint(secret, claims)


def revoke_token(
    jti: str, *, store: str | None = None, revoked_file: Path | None = None, note: str = ""
) -> Path:
    """Add ``jti`` to the revocation file (``revoked_file``, else the default one of the store
    at ``store``); returns the file's path.

    Raises:
        InvalidValue: a bad ``jti``, or no file given and the store has no default one.
        RevocationFileError: the file cannot be written.
    """
    check_jti(jti)
    path = revoked_file
    if path is None and store is not None:
        path = default_revoked_file(store)
    if path is None:
        raise InvalidValue(
            "give --revoked-file, or --store sqlite:///path/store.db (its revocation file is "
            "path/store.db.revoked)"
        )
    append_revoked(path, jti, note or f"revoked at {int(time.time())}")
    return path


def raise_open_files_limit(want: int = 65536) -> int:
    """Raise this process's soft limit of open files towards its hard limit (at most
    ``want``), as servers do: every connection is a descriptor, and the usual soft limit
    (1,024) is far below what a hub may hold. Returns the soft limit now in force (logged).
    The hub's library API (:class:`Hub`) leaves the process's limits alone; this is for
    ``crdtstore serve``."""
    log = logging.getLogger("sync.hub")
    try:
        import resource
    except ImportError:  # not on POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(hard, want)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d: %s", soft, exc)
    log.info("open files limit: %d", soft)
    return int(soft)


def check_redis(store: str, *, allow_volatile: bool) -> None:
    """Log the Redis of ``store`` and how it persists.

    Raises:
        InvalidValue: it has no append-only file and no RDB save rules (a restart loses
            every journal), and not ``allow_volatile``.
        BackendError: it cannot be reached.
    """
    from crdtstore.backend import redis_persistence as persistence

    found = anyio.run(persistence, store)
    log = logging.getLogger("sync.hub")
    log.info("store %s", found.describe())
    if not found.persistent:
        if not allow_volatile:
            raise InvalidValue(
                f"{found.describe()}: a restart of it loses every journal; configure "
                "appendonly yes (or RDB save rules), or pass --allow-volatile"
            )
        log.warning("serving on a Redis without persistence (--allow-volatile)")
    elif not found.aof:
        log.warning("the Redis keeps RDB snapshots only: a crash loses what came after")


def serve_hub(
    store: str,
    host: str,
    port: int,
    secret_file: Path | None = None,
    revoked_file: Path | None = None,
    refuse_with: str = "close",
    journal_window: float | None = None,
    store_linger: float | None = None,
    allow_volatile: bool = False,
    *,
    sweep_interval: float | None = None,
    log_format: str = "text",
    operator_token_file: Path | None = None,
    metrics_address: str | None = None,
    limits: HubLimits | None = None,
) -> None:
    """Run the hub until interrupted. The secret is loaded first: no secret, no hub.
    On a ``redis://`` store, the Redis and how it persists are logged, and a Redis that
    keeps nothing across a restart is refused unless ``allow_volatile`` (see
    :func:`check_redis`).
    ``refuse_with``: how a bad token is refused (see :class:`Hub`); ``journal_window``,
    ``store_linger``: :attr:`HubLimits.journal_window`, :attr:`HubLimits.store_linger`
    (seconds; None: the default); ``sweep_interval``: :attr:`HubLimits.sweep_interval`
    (seconds; 0: no retention sweeps; None: the default, 60); ``log_format``: ``"text"`` or
    ``"json"`` (one JSON object per line with tenant, run and agent, see :mod:`sync._logs`);
    ``operator_token_file``: a file holding the operator token that ``/-/metrics`` and
    ``/-/health`` ask for on the hub's port; ``metrics_address``: ``host:port`` serving
    them without a token (see :mod:`sync._metrics`); ``limits``: the hub's limits (the
    options above replace theirs).

    Raises:
        SecretMissing: no secret, or too short.
        InvalidValue: ``refuse_with`` is neither ``"close"`` nor ``"http"``, or
            ``journal_window`` or ``store_linger`` is negative or not finite, or
            ``log_format``, the operator token or ``metrics_address`` is not valid.
    """
    secret = load_secret(secret_file)
    if refuse_with not in ("close", "http"):
        raise InvalidValue(f"--refuse-with must be 'close' or 'http', not {refuse_with!r}")
    if log_format not in ("text", "json"):
        raise InvalidValue(f"--log-format must be 'text' or 'json', not {log_format!r}")
    operator_token = None
    if operator_token_file is not None:
        try:
            operator_token = check_operator_token(operator_token_file.read_text().strip())
        except OSError as exc:
            raise InvalidValue(f"cannot read the operator token file: {exc}") from None
    operator_at = _address(metrics_address) if metrics_address is not None else None
    limits = limits or HubLimits()
    if journal_window is not None:
        limits = dataclasses.replace(limits, journal_window=journal_window)
    if store_linger is not None:
        limits = dataclasses.replace(limits, store_linger=store_linger)
    if sweep_interval is not None:
        limits = dataclasses.replace(
            limits, sweep_interval=None if sweep_interval == 0 else sweep_interval
        )
    hub = Hub(
        store,
        secret,
        limits=limits,
        revoked_file=revoked_file,
        refuse_with="http" if refuse_with == "http" else "close",
        operator_token=operator_token,
    )
    configure_logging("json" if log_format == "json" else "text")
    if store.split("://", 1)[0].lower() in ("redis", "rediss"):
        check_redis(store, allow_volatile=allow_volatile)
    raise_open_files_limit()

    async def run() -> None:
        # SIGINT and SIGTERM stop the hub gracefully: connections are closed with 1001 and
        # every loaded run is flushed to the journal before the process exits
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                bound = await tg.start(hub.serve, host, port)
                if operator_at is not None:
                    at = await tg.start(serve_operator, hub, *operator_at)
                    print(
                        f"crdtstore hub metrics on http://{operator_at[0]}:{at}/-/metrics",
                        file=sys.stderr,
                        flush=True,
                    )
                print(
                    f"crdtstore hub listening on ws://{host}:{bound}", file=sys.stderr, flush=True
                )
                async for signum in signals:
                    logging.getLogger("sync.hub").info("stopping on signal %d", signum)
                    tg.cancel_scope.cancel()
                    break

    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(run)


def _address(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a pair.

    Raises:
        InvalidValue: it is not one.
    """
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidValue(f"--metrics-address must be host:port, not {text!r}")
    return host, int(port)


# -- the commands: ``crdtstore serve``, ``crdtstore token [revoke]`` (registered in the
# ``crdtstore.commands`` entry-point group, see pyproject.toml) and ``python -m sync`` ----------

_err_console = Console(stderr=True, highlight=False)


def _fail(message: str, code: int = 1) -> typer.Exit:
    _err_console.print(Text.assemble(("error: ", "bold red"), message))
    return typer.Exit(code)


def _path_url(path: Path) -> str:
    return f"sqlite:///{path.expanduser().resolve()}"


StoreOpt = Annotated[
    str, typer.Option("--store", help="Store URL (sqlite:///path/store.db, redis://host/0).")
]
HostOpt = Annotated[str, typer.Option("--host", help="Interface to listen on.")]
PortOpt = Annotated[int, typer.Option("--port", help="TCP port (0: any free port).")]
SecretFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--secret-file",
        help="File holding the token signing secret (default: $CRDTSTORE_SECRET).",
    ),
]
RevokedFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--revoked-file",
        help="Revocation list, one token id per line "
        "(default for sqlite:///path/store.db: path/store.db.revoked).",
    ),
]

RefuseWithOpt = Annotated[
    str,
    typer.Option(
        "--refuse-with",
        help="How a bad token is refused: 'close' (upgrade, then close 4401/4403: final "
        "for y-websocket clients) or 'http' (HTTP 401/403 at the upgrade).",
    ),
]

JournalWindowOpt = Annotated[
    float | None,
    typer.Option(
        "--journal-window",
        help="Seconds a plain Yjs client's update may wait to be journaled, so that "
        "updates arriving together share a commit (default 0.02; 0: every event-loop "
        "iteration).",
    ),
]

SweepIntervalOpt = Annotated[
    float | None,
    typer.Option(
        "--sweep-interval",
        help="Seconds between retention sweeps, which delete (and log) the runs whose "
        "retention deadline passed (default 60; 0: no sweeps).",
    ),
]
StoreLingerOpt = Annotated[
    float | None,
    typer.Option(
        "--store-linger",
        help="Seconds a tenant's store stays open after its last run is unloaded "
        "(default 5; 0: closed at once).",
    ),
]


AllowVolatileOpt = Annotated[
    bool,
    typer.Option(
        "--allow-volatile",
        help="Serve a redis:// store on a Redis without persistence (no append-only file, "
        "no RDB save rules): a restart of it loses every journal.",
    ),
]

LogFormatOpt = Annotated[
    str,
    typer.Option(
        "--log-format",
        help="'text' or 'json' (one JSON object per line, with tenant, run and agent).",
    ),
]

OperatorTokenFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--operator-token-file",
        help="File holding the operator token (16+ characters) that /-/metrics and "
        "/-/health ask for on the hub's port (Authorization: Bearer, or ?token=).",
    ),
]

MetricsAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--metrics-address",
        help="host:port serving /-/metrics and /-/health without a token (the address is "
        "the access control: bind it to loopback or a private interface).",
    ),
]


PingIntervalOpt = Annotated[
    float | None,
    typer.Option("--ping-interval", help="Seconds between keepalive pings (default 20)."),
]

PingTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--ping-timeout",
        help="Seconds a ping waits for its pong before the connection is closed as dead "
        "(default 20).",
    ),
]


def _keepalive(interval: float | None, timeout: float | None) -> HubLimits:
    limits = HubLimits()
    if interval is not None:
        limits = dataclasses.replace(limits, ping_interval=interval)
    if timeout is not None:
        limits = dataclasses.replace(limits, ping_timeout=timeout)
    return limits


def serve_command(
    store: StoreOpt,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8765,
    secret_file: SecretFileOpt = None,
    revoked_file: RevokedFileOpt = None,
    refuse_with: RefuseWithOpt = "close",
    journal_window: JournalWindowOpt = None,
    store_linger: StoreLingerOpt = None,
    allow_volatile: AllowVolatileOpt = False,
    sweep_interval: SweepIntervalOpt = None,
    log_format: LogFormatOpt = "text",
    operator_token_file: OperatorTokenFileOpt = None,
    metrics_address: MetricsAddressOpt = None,
    ping_interval: PingIntervalOpt = None,
    ping_timeout: PingTimeoutOpt = None,
) -> None:
    """Start the sync hub: agents connect to ws://HOST:PORT/<tenant>/<run>?token=...;
    tokens listed in the revocation file are refused (it is re-read when it changes).
    Several hubs may serve one redis:// store (clients: open_store([url1, url2]))."""
    try:
        serve_hub(
            store,
            host,
            port,
            secret_file,
            revoked_file,
            refuse_with,
            journal_window,
            store_linger,
            allow_volatile,
            sweep_interval=sweep_interval,
            log_format=log_format,
            operator_token_file=operator_token_file,
            metrics_address=metrics_address,
            limits=_keepalive(ping_interval, ping_timeout),
        )
    except CrdtStoreError as exc:
        raise _fail(str(exc)) from None


token_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@token_app.callback(invoke_without_command=True)
def token(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Tenant the token is for.")] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="Run name, or a run prefix ending with '*'.")
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Agent id its writes are attributed to.")
    ] = None,
    rw: Annotated[
        bool, typer.Option("--rw/--ro", help="Allow writes (--rw) or only reads (--ro).")
    ] = False,
    ttl: Annotated[float, typer.Option("--ttl", help="Seconds the token stays valid.")] = 3600.0,
    redact: Annotated[
        bool,
        typer.Option("--redact", help="Also allow store.redact through the hub (needs --rw)."),
    ] = False,
    secret_file: SecretFileOpt = None,
) -> None:
    """Mint a token for the sync hub (--tenant, --run and --agent are required): its id
    (jti, to revoke it by) is printed first, the token itself on the last line.
    'crdtstore token revoke' revokes one."""
    if ctx.invoked_subcommand is not None:
        return
    if tenant is None or run is None or agent is None:
        missing = [
            n for n, v in (("--tenant", tenant), ("--run", run), ("--agent", agent)) if v is None
        ]
        raise _fail(f"missing option(s) {', '.join(missing)}", 2)
    try:
        claims, minted = issue_token(
            tenant=tenant,
            run=run,
            agent=agent,
            rw=rw,
            ttl=ttl,
            secret_file=secret_file,
            redact=redact,
        )
    except CrdtStoreError as exc:
        raise _fail(str(exc)) from None
    print(f"jti: {claims.jti}")
    print(minted)


@token_app.command("revoke")
def token_revoke(
    jti: Annotated[str, typer.Option("--jti", help="Id of the token (printed by 'token').")],
    store: Annotated[
        str | None,
        typer.Option("--store", help="Store URL (or path) whose revocation file to add it to."),
    ] = None,
    revoked_file: RevokedFileOpt = None,
) -> None:
    """Revoke a token: a hub serving the store refuses it within a second (4403, or HTTP 403)
    and closes the connections using it (4403)."""
    url = store if store is None or "://" in store else _path_url(Path(store))
    try:
        path = revoke_token(jti, store=url, revoked_file=revoked_file)
    except CrdtStoreError as exc:
        raise _fail(str(exc)) from None
    print(f"revoked {jti} (in {path})")


def main() -> None:
    """``python -m sync``: start the hub."""
    typer.run(serve_command)
