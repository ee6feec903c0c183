"""``novaque admin``: serve the admin UI."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from novaque.cli._common import Context, listening, port_number

PASSWORD_ENV = "NOVAQUE_ADMIN_PASSWORD"


def register(commands: Any) -> None:
    """Add ``admin`` to the parser."""
    admin = commands.add_parser(
        "admin",
        help="serve the admin UI",
        description="Serve the admin UI and its JSON API (waitress if installed, else the "
        "standard library's wsgiref). With --user, every request needs basic auth with the "
        f"password from ${PASSWORD_ENV}. Stop with Ctrl-C.",
    )
    admin.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    admin.add_argument("--port", type=port_number, default=8080, help="port (%(default)s; 0: any)")
    admin.add_argument("--prefix", default="/admin", help="URL prefix (%(default)s)")
    admin.add_argument("--user", help=f"require basic auth as USER (password: ${PASSWORD_ENV})")
    admin.set_defaults(run=run_admin)


def run_admin(args: argparse.Namespace, context: Context) -> int:
    from novaque.admin import create_app, serve

    credentials = None
    if args.user:
        password = os.environ.get(PASSWORD_ENV)
        if not password:
            raise ValueError(f"--user needs the password in the {PASSWORD_ENV} variable")
        credentials = (args.user, password)
    client = context.client()
    client.list_topics()  # fail now, not on the first page view, if the schema is missing
    client.start()  # maintenance loops: lease reaper, TTL purge, stats flush
    app = create_app(client, prefix=args.prefix, basic_auth=credentials)

    def ready(base_url: str, server: str) -> None:
        print(f"novaque admin ({server}) on {base_url}{args.prefix}/  (Ctrl-C stops)", flush=True)

    try:
        with listening(args.host, args.port):
            serve(app, args.host, args.port, on_ready=ready)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    return 0
