"""A live broker for tests: uvicorn on a free port, over an AsyncClient of the
test's backend, with a few tokens of different scopes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

import novaque
import novaque.aio
from novaque.broker import Scope, Token, Tokens, create_app, hash_token, parse_scope
from novaque.broker._serve import Managed, Server
from tests._twin import async_url

#: The tests' tokens and their scopes.
TOKENS: dict[str, tuple[str, ...]] = {
    "admin": ("admin",),
    "publisher": ("publish:orders",),
    "billing": ("consume:orders/billing",),
    "worker": ("publish:orders", "consume:orders/*"),
    "other": ("consume:other-*/*", "publish:other-*"),
}


def token_of(name: str) -> str:
    return f"nvq_test-token-{name}"


def tokens() -> Tokens:
    return Tokens(
        Token(hash_token(token_of(name)), tuple(parse_scope(s) for s in scopes), name)
        for name, scopes in TOKENS.items()
    )


@dataclass
class Live:
    """A broker serving on ``base_url``; ``client`` is its AsyncClient."""

    base_url: str
    client: novaque.aio.AsyncClient
    server: Server
    opened: list[httpx.Client] = field(default_factory=list)

    def http(self, name: str | None = "admin", **kwargs: Any) -> httpx.Client:
        """An HTTP client sending the token ``name`` (None: no token)."""
        headers = {} if name is None else {"Authorization": f"Bearer {token_of(name)}"}
        made = httpx.Client(base_url=self.base_url, headers=headers, timeout=60, **kwargs)
        self.opened.append(made)
        return made


@contextmanager
def live_broker(backend_name: str, url: str, **options: Any) -> Iterator[Live]:
    client = novaque.aio.connect(async_url(backend_name, url), **options)
    app = create_app(client, tokens=tokens())
    server = Server(Managed(app, client)).start()
    live = Live(server.base_url, client, server)
    try:
        yield live
    finally:
        for made in live.opened:
            made.close()
        server.stop()


__all__ = ["TOKENS", "Live", "Scope", "live_broker", "token_of", "tokens"]
