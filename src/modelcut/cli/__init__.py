"""The ``modelcut`` command line. Each module here registers its commands on ``app`` (:mod:`.app`);
they call the service and format what it returns.

Errors in the user's input print one line, ``modelcut: error: ...``, and exit 2.
"""

from __future__ import annotations

import os
import sys

import typer
from typer._click import exceptions as click_exc

from ..core.errors import ModelcutError
from .app import app

# Each module registers its commands on ``app`` when imported.
from . import calibrate, crosscheck, explore, launch, listing, mesh, serve, simulate, systems  # noqa: E402,F401


#: The exit status of an internal error (sysexits.h EX_SOFTWARE); bad input exits 2.
INTERNAL_ERROR = 70


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status instead of raising."""
    try:
        # outside standalone mode click hands a command's typer.Exit back as its exit code
        rc = app(args=argv, standalone_mode=False)
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
    except Exception as exc:     # a bug, not the input: one line and EX_SOFTWARE, the traceback on request
        if os.environ.get("MODELCUT_TRACEBACK"):
            raise
        text = " ".join(str(exc).split())[:300]
        print(f"modelcut: internal error (a bug in modelcut; MODELCUT_TRACEBACK=1 shows where): "
              f"{type(exc).__name__}: {text}", file=sys.stderr)
        return INTERNAL_ERROR
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
