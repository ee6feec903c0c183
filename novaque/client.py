"""The synchronous client, and :func:`connect` for users without an engine."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from novaque import dialects
from novaque._operate import OperatingClient
from novaque._runtime import RuntimeClient
from novaque.options import Options

__all__ = ["Client", "connect"]


class Client(RuntimeClient, OperatingClient):
    """A handle on novaque's tables in the database behind ``engine``.

    ``Client(engine, options=None)`` touches no database. The first call that
    does checks once that the migrations were applied
    (:class:`~novaque.SchemaOutOfDate` otherwise). A client is safe to share
    between threads; create one per process.

    On SQLite novaque runs its own transactions on a second engine opened on
    the same file, so that it can take the write lock up front (``BEGIN
    IMMEDIATE``) without changing how the application's engine behaves.
    """


def connect(url: str | sa.URL, **option_fields: Any) -> Client:
    """A client on a new engine for ``url``, set up the way novaque runs best.

    Keyword arguments are :class:`Options` fields. SQLite gets WAL, a busy
    timeout and ``BEGIN IMMEDIATE`` writes; PostgreSQL and MySQL get a pool
    sized for the consumers' worker threads whose connections are pinged
    before use after a second idle. MySQL/MariaDB connections run in READ
    COMMITTED (also for the application's own work on ``client.engine``) and
    are rolled back on return to the pool only when a transaction is open.
    """
    options = Options(**option_fields)
    pool_size = max(5, options.max_in_flight + 4)
    client = Client(dialects.create_engine(url, pool_size=pool_size), options)
    client._owns_engine = True  # closed by client.shutdown()
    return client
