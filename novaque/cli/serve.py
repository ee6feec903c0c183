"""``novaque serve``: the network broker; ``novaque token new``: a token for it."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from novaque.cli._common import CommandError, Context, listening, port_number


def register(commands: Any) -> None:
    """Add ``serve`` and ``token`` to the parser."""
    serve = commands.add_parser(
        "serve",
        help="serve the network broker (HTTP, for services in any language)",
        description="Serve the broker's HTTP API under /v1 with uvicorn (pip install "
        "'novaque[broker]'). Every request but GET /v1/health needs a token of the "
        "--tokens file. Stop with Ctrl-C.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    serve.add_argument("--port", type=port_number, default=8090, help="port (%(default)s; 0: any)")
    serve.add_argument(
        "--tokens",
        metavar="FILE",
        required=True,
        help="the tokens file (TOML: each token's sha256 and scopes; `novaque token new`)",
    )
    serve.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often a waiting receive looks for deliveries that became due by time "
        "(delays, retries); new messages wake it at once (%(default)s)",
    )
    serve.set_defaults(run=run_serve)

    token = commands.add_parser(
        "token",
        help="make a token for the broker",
        description="Print a fresh token on the first line, then the TOML entry to add to the "
        "broker's tokens file (its SHA-256, never the token itself).",
    )
    actions = token.add_subparsers(dest="action", metavar="ACTION", required=True)
    new = actions.add_parser("new", help="print a fresh token and its tokens-file entry")
    new.add_argument(
        "--scope",
        action="append",
        required=True,
        metavar="SCOPE",
        help="publish:<topic glob>, consume:<topic glob>/<channel glob> or admin (repeat it)",
    )
    new.add_argument("--name", default="", help="who holds it (written in the entry)")
    new.set_defaults(run=run_token_new)


def run_token_new(args: argparse.Namespace, context: Context) -> int:
    from novaque.broker._tokens import new_token, parse_scope, token_toml

    for scope in args.scope:
        try:
            parse_scope(scope)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    token = new_token()
    print(token)
    print(token_toml(token, args.scope, args.name), end="")
    return 0


@contextlib.contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM stops the server as Ctrl-C does (in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: The asyncio drivers the broker runs on; a URL naming another driver of the
#: database (the one the other commands use) is served through the first.
_ASYNC_DRIVERS = {
    "postgresql": ("psycopg", "asyncpg"),
    "mysql": ("asyncmy", "aiomysql"),
    "mariadb": ("asyncmy", "aiomysql"),
    "sqlite": ("aiosqlite",),
}


def async_url(url: str) -> str:
    """``url`` with an asyncio driver: the same URL every other command takes
    (``mysql+pymysql://``, ``sqlite:///``...) serves the broker too."""
    import sqlalchemy as sa

    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        return url  # connect() reports it
    backend, plus, driver = parsed.drivername.partition("+")
    backend = "postgresql" if backend == "postgres" else backend
    drivers = _ASYNC_DRIVERS.get(backend)
    if not plus or drivers is None or driver in drivers:
        return url  # no driver named (connect picks the asyncio one), or an asyncio one
    return parsed.set(drivername=f"{backend}+{drivers[0]}").render_as_string(hide_password=False)


def run_serve(args: argparse.Namespace, context: Context) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise CommandError(f"the broker needs {exc.name}: pip install 'novaque[broker]'") from None
    import novaque.aio
    from novaque.broker import Tokens, TokensError, create_app
    from novaque.broker._serve import Managed, Server

    try:
        tokens = Tokens.from_file(args.tokens)
    except TokensError as exc:
        raise CommandError(str(exc)) from None
    if not tokens.entries:
        print(
            f"novaque serve: {args.tokens} holds no token yet: every request but "
            "GET /v1/health is refused (`novaque token new` makes one)",
            file=sys.stderr,
        )
    # Fail now, not on the first request, if the database or its schema is missing.
    context.client().list_topics()
    if not args.poll_interval > 0:
        raise CommandError(
            f"--poll-interval must be a positive number of seconds, got {args.poll_interval}"
        )
    client = novaque.aio.connect(async_url(context.url), poll_interval=args.poll_interval)
    app = Managed(create_app(client, tokens=tokens), client)
    # --debug logs every request too (uvicorn's access log: never a body).
    server = Server(app, args.host, args.port, access_log=bool(args.debug))
    with listening(args.host, args.port):
        server.start()
    try:
        print(f"novaque broker on {server.base_url}/v1/  (Ctrl-C stops)", flush=True)
        with _sigterm_stops():
            while server.alive():
                server.join(0.2)
    except KeyboardInterrupt:
        server.stop()
        print("stopped", file=sys.stderr)
        return 0
    raise CommandError("the broker stopped (see the log above)")
