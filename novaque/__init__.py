"""novaque: durable topic -> channel message queues in your own relational database.

Quick start::

    import novaque

    client = novaque.connect("sqlite:///app.db")
    client.migrate()
    client.ensure_channel("orders", "mailer")
    client.publish("orders", b'{"id": 1}')
    for msg in client.claim("orders", "mailer"):
        client.ack(msg)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from novaque.errors import (
    ChannelNotFound,
    DatabaseUnavailable,
    DedupConflict,
    Defer,
    InvalidFilter,
    InvalidName,
    InvalidOption,
    LeaseLost,
    MessageNotFound,
    MessageTooLarge,
    NovaqueError,
    Reject,
    ScheduleNotFound,
    SchemaOutOfDate,
    Snooze,
    TopicNotFound,
    UnsupportedDatabase,
)
from novaque.models import (
    Backlog,
    ChannelSettings,
    ConsumerInfo,
    Counters,
    DeadLetter,
    DeliveryInfo,
    Message,
    MessageInfo,
    ScheduleInfo,
)
from novaque.options import Backoff, Options

if TYPE_CHECKING:
    from novaque.client import Client, connect
    from novaque.consumer import Consumer

#: The version of novaque, as installed.
__version__ = "0.1.0"

#: Names imported on first use, and their modules: ``import novaque`` stays
#: cheap (a CLI call, a module that only names novaque's errors), and the
#: client, its database dialects and SQLAlchemy's are loaded by the first
#: ``novaque.Client`` or ``novaque.connect``. Alembic comes only with a
#: migration, the admin, kombu, Django and OpenTelemetry integrations only
#: when imported.
_LAZY = {
    "Client": "novaque.client",
    "Consumer": "novaque.consumer",
    "connect": "novaque.client",
}

__all__ = [
    "Backlog",
    "Backoff",
    "ChannelNotFound",
    "ChannelSettings",
    "Client",
    "Consumer",
    "ConsumerInfo",
    "Counters",
    "DatabaseUnavailable",
    "DeadLetter",
    "DedupConflict",
    "Defer",
    "DeliveryInfo",
    "InvalidFilter",
    "InvalidName",
    "InvalidOption",
    "LeaseLost",
    "Message",
    "MessageInfo",
    "MessageNotFound",
    "MessageTooLarge",
    "NovaqueError",
    "Options",
    "Reject",
    "ScheduleInfo",
    "ScheduleNotFound",
    "SchemaOutOfDate",
    "Snooze",
    "TopicNotFound",
    "UnsupportedDatabase",
    "__version__",
    "connect",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # found directly from now on
        return value
    if not name.startswith("__"):
        # A submodule used as an attribute (``novaque.schema`` after ``import
        # novaque``), as it was while the package imported them all.
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
