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

from novaque.client import Client, connect
from novaque.consumer import Consumer
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
)
from novaque.options import Backoff, Options

__version__ = "0.1.0"

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
    "SchemaOutOfDate",
    "Snooze",
    "TopicNotFound",
    "UnsupportedDatabase",
    "__version__",
    "connect",
]
