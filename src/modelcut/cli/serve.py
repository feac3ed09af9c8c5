"""``modelcut serve``: the local web app (pipeline animation, layout explorer, published runs)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Optional

import typer

from ..core.errors import ModelcutError
from ..service.limits import WEB
from .app import app


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (loopback unless told otherwise)"),
    port: int = typer.Option(8000, "--port", help="TCP port (0 picks a free one)", min=0, max=65535),
    max_ops: Optional[int] = typer.Option(None, "--max-ops", help=f"ops one simulation may hold (default "
                                                                   f"{WEB.max_ops:,})", show_default=False),
    max_layouts: Optional[int] = typer.Option(None, "--max-layouts", help=f"layouts one search may cover (default "
                                                                           f"{WEB.max_layouts:,})", show_default=False),
    workers: Optional[int] = typer.Option(None, "--workers", help="searches run at once, each in a worker process "
                                                                  "(default: the cores but one)", show_default=False),
    queue: Optional[int] = typer.Option(None, "--queue", help="searches that may wait for a worker (default twice "
                                                              "the workers); beyond, the server answers 429",
                                        show_default=False),
) -> None:
    """Start the web app: pipeline animation, layout explorer and published runs. Needs no network."""
    import uvicorn   # the server and the app load only when one is started: every other command starts faster

    from ..web.app import create_app

    caps = WEB.raised(max_ops=max_ops, max_layouts=max_layouts)
    for name, val in (("--workers", workers), ("--queue", queue)):
        if val is not None and val < (1 if name == "--workers" else 0):
            raise ModelcutError(f"{name} must be at least {1 if name == '--workers' else 0}, got {val}")

    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ModelcutError(f"cannot resolve host {host!r}: {exc.strerror}") from None
    sock = socket.socket(info[0], socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(info[4])
    except OSError as exc:
        sock.close()
        raise ModelcutError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"modelcut: serving on http://{shown}:{bound}/  (Ctrl-C to stop)", flush=True)
    if not _loopback(host):
        print("modelcut: note: listening beyond loopback; other machines can reach this server", flush=True)
    app = create_app(max_ops=caps.max_ops, max_layouts=caps.max_layouts, workers=workers, queue=queue)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
