"""Commands that other packages add to the ``crdtstore`` CLI, through the ``crdtstore.commands``
entry-point group (``sync`` adds ``serve`` and ``token`` so; crdtstore never imports ``sync``).

An entry point's name is the command's name; its object is a ``typer.Typer`` (a group of
commands, with its callback), or a function typer can make a command of. The names are read
from the installed packages' metadata when a command is not one of crdtstore's own, or when
the commands are listed (``--help``); the object is loaded only then, so that running a
built-in command imports no plugin. A plugin cannot replace a built-in command. One that
fails to load becomes a command that says so (and exits with 1), rather than a CLI that
cannot start.
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import typer
from typer.core import TyperGroup
from typer.main import get_command

__all__ = ["COMMANDS_GROUP", "CommandGroup"]

COMMANDS_GROUP = "crdtstore.commands"


@functools.cache
def _registered() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=COMMANDS_GROUP):
        found.setdefault(ep.name, ep)  # (the same package installed twice: the first)
    return found


def _command(name: str, obj: Any) -> Any:
    """The click command of an entry point's object."""
    if isinstance(obj, typer.Typer):
        cmd = get_command(obj)
    elif callable(obj):
        app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        app.command(name)(obj)
        cmd = get_command(app)
    else:
        raise TypeError(f"not a typer.Typer nor a function: {type(obj).__name__}")
    cmd.name = name
    return cmd


def _broken(name: str, ep: EntryPoint, exc: BaseException) -> Any:
    """A command standing for a plugin that failed to load: running it says why."""
    why = f"{type(exc).__name__}: {exc}"
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    def broken(ctx: typer.Context) -> None:
        typer.echo(
            f"error: the command {name!r} ({ep.value}, entry point group {COMMANDS_GROUP!r}) "
            f"failed to load: {why}",
            err=True,
        )
        raise typer.Exit(1)

    app.command(
        name,
        help=f"(failed to load: {why})",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )(broken)
    return get_command(app)


class CommandGroup(TyperGroup):
    """The ``crdtstore`` app's group: its own commands, then the plugins' (see the module)."""

    def list_commands(self, ctx: Any) -> list[str]:
        own = super().list_commands(ctx)
        return own + sorted(n for n in _registered() if n not in self.commands)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            return cmd
        ep = _registered().get(cmd_name)
        if ep is None:
            return None
        try:
            cmd = _command(cmd_name, ep.load())
        except Exception as exc:  # any failure of the plugin: reported when it is run
            cmd = _broken(cmd_name, ep, exc)
        self.commands[cmd_name] = cmd
        return cmd
