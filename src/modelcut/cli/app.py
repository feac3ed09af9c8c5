"""The typer application every command module registers on."""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from ..core.errors import ModelcutError

#: The order ``modelcut --help`` lists the commands in: the model's answers first, then the pipeline
#: simulator, the inputs, fitting and cross-checking, the web app (a command not named here last).
ORDER = ("predict", "explore", "validate", "mesh", "simulate", "bubble-table", "from-megatron",
         "from-torchtitan", "list", "calibrate", "crosscheck", "report", "serve")


class _Ordered(TyperGroup):
    """The command group, listing its commands in :data:`ORDER`."""

    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))


app = typer.Typer(
    cls=_Ordered,
    name="modelcut",
    help="Cut a large model across many accelerators: pipeline simulation, training-systems model, "
         "layout explorer.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def fail(message: str) -> None:
    """Raise the one-line error every face uses."""
    raise ModelcutError(message)
