"""``crdtstore view``: the address of a run's page in the hub's record viewer (:mod:`sync._viewer`),
with a fresh read-only token in its fragment (registered in the ``crdtstore.commands``
entry-point group, see pyproject.toml).

::

    $ crdtstore view --store ws://127.0.0.1:8765 --run r1 --tenant acme
    http://127.0.0.1:8765/-/view/acme/r1#token=eyJ0ZW5h...

The token is minted here with the hub's secret (``--secret-file`` or ``CRDTSTORE_SECRET``), as
``crdtstore token --ro`` would; a read-write token is never made. The address is opened in a
browser only when asked (``--open``), or when standard output is a terminal and a browser is
known to Python's ``webbrowser``: never in a script or a test.
"""

from __future__ import annotations

import sys
import webbrowser
from pathlib import Path
from typing import Annotated
from urllib.parse import quote, urlsplit

import typer
from rich.console import Console

from crdtstore import CrdtStoreError, InvalidValue
from crdtstore.backend import check_name

from ._cli import DEFAULT_TTL, SecretFileOpt, _fail, issue_token
from ._viewer import PREFIX

__all__ = ["view_command", "view_url"]

DEFAULT_TENANT = "default"
_SCHEMES = {"ws": "http", "wss": "https", "http": "http", "https": "https"}


def view_url(
    store: str,
    run: str,
    *,
    tenant: str | None = None,
    agent: str = "viewer",
    ttl: float = DEFAULT_TTL,
    secret_file: Path | None = None,
) -> str:
    """The viewer's address for ``run`` (or, for a prefix ending with ``*``, the index of the
    runs it covers) on the hub at ``store`` (``ws://host:port[/tenant]``, or ``http://``),
    with a fresh read-only token for ``agent`` valid ``ttl`` seconds.

    Raises:
        InvalidValue: ``store`` is not a hub URL, or names another tenant than ``tenant``.
        InvalidName: a bad tenant or run name.
        SecretMissing: no secret, or too short.
    """
    url = urlsplit(store)
    scheme = _SCHEMES.get(url.scheme)
    if scheme is None or not url.netloc:
        raise InvalidValue(f"--store must be the hub's URL (ws://host:port), not {store!r}")
    in_url = url.path.strip("/")
    if in_url and tenant is not None and in_url != tenant:
        raise InvalidValue(f"--store names tenant {in_url!r}, --tenant {tenant!r}")
    tenant = check_name("tenant", tenant or in_url or DEFAULT_TENANT)
    _, token = issue_token(
        tenant=tenant, run=run, agent=agent, rw=False, ttl=ttl, secret_file=secret_file
    )
    page = "" if run.endswith("*") else quote(run, safe="")
    return f"{scheme}://{url.netloc}{PREFIX}{quote(tenant, safe='')}/{page}#token={token}"


def _open(url: str, wanted: bool | None) -> bool:
    if wanted is False or (wanted is None and not sys.stdout.isatty()):
        return False
    try:
        webbrowser.get()
    except webbrowser.Error:
        if wanted:
            Console(stderr=True).print("no browser found; open the address above")
        return False
    return webbrowser.open(url)


def view_command(
    store: Annotated[
        str,
        typer.Option("--store", help="The hub's URL: ws://HOST:PORT, or ws://HOST:PORT/TENANT."),
    ],
    run: Annotated[str, typer.Option("--run", help="Run name (a prefix ending with '*': index).")],
    tenant: Annotated[
        str | None, typer.Option("--tenant", help=f"Tenant (default: {DEFAULT_TENANT}).")
    ] = None,
    agent: Annotated[
        str, typer.Option("--agent", help="Agent name of the read-only token.")
    ] = "viewer",
    ttl: Annotated[
        float, typer.Option("--ttl", help="Seconds the token stays valid.")
    ] = DEFAULT_TTL,
    secret_file: SecretFileOpt = None,
    open_browser: Annotated[
        bool | None,
        typer.Option("--open/--no-open", help="Open it in a browser (default: on a terminal)."),
    ] = None,
) -> None:
    """Print the address of the run's live page in the hub's viewer, with a fresh read-only
    token (the last line of output)."""
    try:
        url = view_url(store, run, tenant=tenant, agent=agent, ttl=ttl, secret_file=secret_file)
    except CrdtStoreError as exc:
        raise _fail(str(exc)) from None
    print(url, flush=True)
    _open(url, open_browser)
