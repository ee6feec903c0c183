"""The one place that knows which database novaque is talking to.

- :mod:`~novaque.dialects.base`: the :class:`Dialect` base (SQL shared by every
  database, overridden where one differs), :class:`ClaimedRow`, the shared
  statements and the :class:`NotifyListener` protocol;
- :mod:`~novaque.dialects.postgres`, :mod:`~novaque.dialects.mysql` (MariaDB a
  named variant of it), :mod:`~novaque.dialects.sqlite`: one class per family;
- :mod:`~novaque.dialects.engines`: engine and pool set-up, and
  :func:`for_engine` / :func:`class_for`, which pick the class from the
  engine's dialect name;
- :mod:`~novaque.dialects.listen`: the PostgreSQL LISTEN client;
- :mod:`~novaque.dialects.watch`: the change watchers of SQLite and
  MySQL/MariaDB, which look often for new deliveries instead.

Nothing outside this package branches on the database.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from novaque.dialects.base import (
    NOTIFY_CHANNEL,
    ClaimedRow,
    Dialect,
    FileSpace,
    NotifyListener,
    on_index,
)
from novaque.dialects.engines import (
    class_for,
    create_engine,
    for_engine,
    normalise_url,
    own_engine,
    pool_size_for,
)
from novaque.dialects.listen import ListenNotDelivered

if TYPE_CHECKING:
    from novaque.dialects.mysql import MySQLDialect
    from novaque.dialects.postgres import PostgresDialect
    from novaque.dialects.sqlite import SQLiteDialect

__all__ = [
    "NOTIFY_CHANNEL",
    "ClaimedRow",
    "Dialect",
    "FileSpace",
    "ListenNotDelivered",
    "MySQLDialect",
    "NotifyListener",
    "PostgresDialect",
    "SQLiteDialect",
    "class_for",
    "create_engine",
    "for_engine",
    "normalise_url",
    "on_index",
    "own_engine",
    "pool_size_for",
]

#: Each database's module is imported when first used: a process loads the
#: SQL of its own database only.
_LAZY = {
    "MySQLDialect": "novaque.dialects.mysql",
    "PostgresDialect": "novaque.dialects.postgres",
    "SQLiteDialect": "novaque.dialects.sqlite",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
