"""novaque's network broker: publish and consume over HTTP, from any language.

::

    import novaque.aio
    from novaque.broker import create_app

    client = novaque.aio.connect("postgresql+psycopg://app:secret@localhost/app")
    app = create_app(client, tokens="tokens.toml")   # an ASGI application

JSON over HTTP under ``/v1``: publish, receive (with a long poll), settle,
renew, deferred deliveries, channel settings, dead letters, cancel, a health
check and an OpenAPI 3.1 document (``GET /v1/openapi.json``). Requests carry
``Authorization: Bearer <token>``; the tokens file holds the SHA-256 of each
token and its scopes. ``novaque serve`` runs it with uvicorn. Install with
``pip install 'novaque[broker]'``; see docs/how-to/broker.md.
"""

from __future__ import annotations

import os
from typing import Any

try:
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra not installed
    raise ImportError(f"novaque.broker needs {exc.name}: pip install 'novaque[broker]'") from None

from novaque.aio import AsyncClient
from novaque.broker import _app
from novaque.broker._app import BrokerApp
from novaque.broker._tokens import (
    Scope,
    Token,
    Tokens,
    TokensError,
    hash_token,
    new_token,
    parse_scope,
    token_toml,
)
from novaque.errors import InvalidOption

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "Scope",
    "Token",
    "Tokens",
    "TokensError",
    "create_app",
    "hash_token",
    "new_token",
    "parse_scope",
    "token_toml",
]

#: The largest request body :func:`create_app` reads unless told otherwise (16 MiB):
#: a larger one is refused with 413 ``too_large``.
DEFAULT_MAX_REQUEST_BYTES = _app.DEFAULT_MAX_REQUEST_BYTES


def create_app(
    client: AsyncClient,
    *,
    tokens: Tokens | str | os.PathLike[str],
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> Any:
    """The broker for ``client`` (a :class:`novaque.aio.AsyncClient`) as an ASGI
    application (Starlette), for uvicorn or any ASGI server.

    ``tokens`` is the path of the tokens file (TOML; read now, and again
    whenever it changes) or a :class:`Tokens`. ``max_request_bytes`` bounds a
    request's body (413 above it); messages are bounded by the client's
    ``Options.max_body_bytes``.

    The application does not start or shut the client down: run ``await
    client.start()`` (maintenance: the lease reaper, TTL purge, stats) in the
    server's startup, or let ``novaque serve`` do it.
    """
    if not isinstance(client, AsyncClient):
        raise TypeError(
            f"create_app needs a novaque.aio.AsyncClient, got {type(client).__name__} "
            "(novaque.aio.connect(url) makes one)"
        )
    if isinstance(tokens, (str, os.PathLike)):
        tokens = Tokens.from_file(tokens)
    elif not isinstance(tokens, Tokens):
        raise TypeError(f"tokens must be a file path or a Tokens, got {type(tokens).__name__}")
    if isinstance(max_request_bytes, bool) or not isinstance(max_request_bytes, int):
        raise InvalidOption(f"max_request_bytes must be an integer, got {max_request_bytes!r}")
    if max_request_bytes < 1024:
        raise InvalidOption(f"max_request_bytes must be at least 1024, got {max_request_bytes}")
    return BrokerApp(client, tokens, max_request_bytes).app
