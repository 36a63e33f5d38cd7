"""The ``crdtstore`` command: a multi-process demo, and tools to look into a store.

::

    crdtstore demo [--agents 4] [--writes 50] [--store demo-store/store.db] [--run NAME]
    crdtstore journal URL [--run R] [--json] [--after N] [--limit N]
    crdtstore inspect URL --run R [--json]
    crdtstore history URL --run R --collection C --key K [--json]
    crdtstore compact URL --run R [--drop-journal]
    crdtstore token --tenant T --run R --agent A [--rw | --ro] [--ttl SECONDS]
    crdtstore token revoke --jti ID (--store URL | --revoked-file F)
    crdtstore serve --store URL [--host H] [--port P] [--secret-file F] [--revoked-file F]
                    [--journal-window SECONDS]

``URL`` is a store URL (``sqlite:///path/store.db``) or simply the path of a SQLite store file.
Only the public API is used here. The commands live in ``_cli_*`` modules (``_cli_inspect``:
journal, inspect, history, compact; ``_cli_demo``; ``_cli_leases``; ``_cli_flow``; ``_cli_tools``);
this module builds the app and registers them, in the order ``--help`` lists them.
"""

from __future__ import annotations

import typer

from ._cli_demo import DEMO_HELP, demo
from ._cli_flow import flow_app
from ._cli_inspect import compact, history, inspect, journal
from ._cli_leases import leases_command
from ._cli_plugins import CommandGroup
from ._cli_tools import register as register_tool_commands

app = typer.Typer(
    name="crdtstore",
    cls=CommandGroup,  # + the commands of crdtstore.commands entry points (sync: serve, token)
    help="One shared, journaled CRDT working record per run, for concurrent AI agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    """Entry point of the ``crdtstore`` console script."""
    app()


app.command("leases")(leases_command)
app.add_typer(flow_app, name="flow")  # flow run, flow status
register_tool_commands(app)  # get, put, append, edit, changes, claim, mcp

for command in (journal, inspect, history, compact):
    app.command()(command)
app.command(help=DEMO_HELP)(demo)


if __name__ == "__main__":
    main()
