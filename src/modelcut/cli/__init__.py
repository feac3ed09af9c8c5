"""The ``modelcut`` command line. Each module here registers its commands on ``app`` (:mod:`.app`);
they call the service and format what it returns.

Errors in the user's input print one line, ``modelcut: error: ...``, and exit 2.
"""

from __future__ import annotations

import sys

import typer
from typer._click import exceptions as click_exc

from ..core.errors import ModelcutError
from .app import app

# Each module registers its commands on ``app`` when imported.
from . import calibrate, crosscheck, explore, listing, mesh, serve, simulate, systems  # noqa: E402,F401


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status instead of raising."""
    try:
        app(args=argv, standalone_mode=False)
    except ModelcutError as exc:
        print(f"modelcut: error: {exc}", file=sys.stderr)
        return 2
    except click_exc.NoArgsIsHelpError as exc:
        print(exc.format_message(), file=sys.stderr)
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
