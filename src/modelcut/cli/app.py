"""The typer application every command module registers on."""

from __future__ import annotations

import typer

from ..core.errors import ModelcutError

app = typer.Typer(
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
