"""The ``modelcut`` command line. Each module here registers its commands on ``app``.

Errors in the user's input print one line, ``modelcut: error: ...``, and exit 2.
"""

from __future__ import annotations

import sys

import typer
from typer._click import exceptions as click_exc

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


def _register() -> None:
    # Import for their side effect: each module adds commands to ``app``.
    from . import simulate  # noqa: F401
    import importlib
    for mod in ("systems", "memory", "explore", "serve", "crosscheck", "calibrate"):
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as exc:  # a face not built yet
            if exc.name != f"{__name__}.{mod}":
                raise


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status instead of raising."""
    _register()
    try:
        app(args=argv, standalone_mode=False)
    except ModelcutError as exc:
        print(f"modelcut: error: {exc}", file=sys.stderr)
        return 2
    except click_exc.NoArgsIsHelpError as exc:
        print(exc.format_message() if hasattr(exc, "format_message") else exc, file=sys.stderr)
        return 0
    except click_exc.ClickException as exc:
        name = f" ({exc.param_hint if isinstance(exc.param_hint, str) else '/'.join(exc.param_hint)})" \
            if getattr(exc, "param_hint", None) else ""
        print(f"modelcut: error{name}: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code or 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("modelcut: aborted", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("modelcut: interrupted", file=sys.stderr)
        return 130
    except (OSError, UnicodeDecodeError) as exc:
        print(f"modelcut: error: {exc}", file=sys.stderr)
        return 2
    return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
