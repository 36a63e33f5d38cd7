"""The command-line side of the hub: ``crdtstore token``, ``crdtstore serve`` and
``python -m sync`` call into here (``crdtstore.cli`` imports this module lazily)."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import anyio
import typer
from pydantic import ValidationError

from crdtstore import CrdtStoreError, InvalidValue

from ._hub import Hub
from ._tokens import TokenClaims, load_secret, mint

__all__ = ["main", "mint_token", "serve_hub"]

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
    ``CRDTSTORE_SECRET``.

    Raises:
        SecretMissing: no secret, or too short.
        InvalidValue: a bad name or ttl.
    """
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
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidValue(f"{where}: {first['msg']}") from None
    return mint(secret, claims)


def serve_hub(store: str, host: str, port: int, secret_file: Path | None = None) -> None:
    """Run the hub until interrupted. The secret is loaded first: no secret, no hub.

    Raises:
        SecretMissing: no secret, or too short.
    """
    secret = load_secret(secret_file)
    hub = Hub(store, secret)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    async def run() -> None:
        # SIGINT and SIGTERM stop the hub gracefully: connections are closed with 1001 and
        # every loaded run is flushed to the journal before the process exits
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                bound = await tg.start(hub.serve, host, port)
                print(
                    f"crdtstore hub listening on ws://{host}:{bound}", file=sys.stderr, flush=True
                )
                async for signum in signals:
                    logging.getLogger("sync.hub").info("stopping on signal %d", signum)
                    tg.cancel_scope.cancel()
                    break

    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(run)


StoreOpt = Annotated[str, typer.Option("--store", help="Store URL, e.g. sqlite:///runs/store.db.")]
HostOpt = Annotated[str, typer.Option("--host", help="Interface to listen on.")]
PortOpt = Annotated[int, typer.Option("--port", help="TCP port (0: any free port).")]
SecretFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--secret-file",
        help="File holding the token signing secret (default: $CRDTSTORE_SECRET).",
    ),
]


def serve_command(
    store: StoreOpt,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8765,
    secret_file: SecretFileOpt = None,
) -> None:
    """Start the sync hub: agents connect to ws://HOST:PORT/<tenant>/<run>?token=..."""
    try:
        serve_hub(store, host, port, secret_file)
    except CrdtStoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def main() -> None:
    """``python -m sync``: start the hub."""
    typer.run(serve_command)
