"""Every error novaque raises, in one place.

All of them derive from :class:`NovaqueError`, so ``except novaque.NovaqueError``
catches anything the library raises on purpose. Errors about bad input also
derive from :class:`ValueError` (or :class:`LookupError` for missing things),
so code that already handles those keeps working. Driver errors that are not
translated here pass through unchanged, as SQLAlchemy's ``DBAPIError``.
"""

from __future__ import annotations

from datetime import timedelta

__all__ = [
    "ChannelNotFound",
    "DatabaseUnavailable",
    "DedupConflict",
    "Defer",
    "InvalidFilter",
    "InvalidName",
    "InvalidOption",
    "LeaseLost",
    "MessageNotFound",
    "MessageTooLarge",
    "NovaqueError",
    "Reject",
    "ScheduleNotFound",
    "SchemaOutOfDate",
    "Snooze",
    "TopicNotFound",
    "UnsupportedDatabase",
]


class NovaqueError(Exception):
    """Base class of every error novaque raises on purpose."""


class InvalidName(NovaqueError, ValueError):
    """A topic or channel name breaks the naming rule.

    Names are 1-200 characters of ``[A-Za-z0-9._:-]`` and case-sensitive.
    """


class InvalidOption(NovaqueError, ValueError):
    """An option or argument is out of range (delay, TTL, attempts, lease...).

    The message names the offending value and the allowed range.
    """


class InvalidFilter(NovaqueError, ValueError):
    """A channel filter is not a boolean CEL expression over ``headers``,
    ``group`` and ``topic`` (the message says why, with the parser's text)."""


class MessageTooLarge(NovaqueError, ValueError):
    """A body is larger than ``Options.max_body_bytes``."""


class TopicNotFound(NovaqueError, LookupError):
    """A read or delete named a topic that does not exist."""


class TopicGone(TopicNotFound):
    """A publish or replay found its topic deleted by another transaction
    (PostgreSQL, where no foreign key stops it first). novaque's own
    publish looks the topic up again (creating it) and publishes there; in a
    caller's transaction it is raised, as the foreign key's error was."""

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"topic {topic!r} was deleted by another transaction while this one wrote to it"
        )
        self.topic = topic


class ChannelNotFound(NovaqueError, LookupError):
    """A read or delete named a channel that does not exist on an existing topic."""


class MessageNotFound(NovaqueError, LookupError):
    """No message has the given id (never published, or purged by TTL/prune)."""


class ScheduleNotFound(NovaqueError, LookupError):
    """No schedule has the given name (``get_schedule``, ``pause_schedule``,
    ``resume_schedule``)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}")
        self.name = name


class DedupConflict(NovaqueError, ValueError):
    """A ``dedup_key`` is held by a live message of the topic with a different
    body, headers or group; nothing was written (by the whole ``publish_many``).

    ``key`` is the dedup key, ``message_id`` the id of the message holding it.
    """

    def __init__(self, key: str, message_id: int) -> None:
        super().__init__(
            f"dedup_key {key!r} is held by message {message_id} with a different body, "
            "headers or group: publish it under another key, or the same content"
        )
        self.key = key
        self.message_id = message_id


class LeaseLost(NovaqueError):
    """The lease token is no longer current.

    The delivery was settled already, reaped after its lease expired, or claimed
    again by another consumer. Nothing was changed.
    """


class SchemaOutOfDate(NovaqueError):
    """novaque's tables are missing or older than this version of the library."""


class UnsupportedDatabase(NovaqueError):
    """The database (or its version) is not one novaque can run on."""


class DatabaseUnavailable(NovaqueError):
    """The database did not answer, lost the connection, or does not take
    writes now (a failover in progress, a cluster node still joining).

    The driver's error is chained as ``__cause__``. A call that fails this
    way may still have committed (the connection can drop after the commit
    and before its answer): publish with a ``dedup_key`` to retry safely.
    """


class Reject(Exception):
    """Raise from a handler to dead-letter the message at once, without retries.

    ``reason`` is kept as the dead letter's reason (``"rejected"`` when empty).
    It is deliberately not a :class:`NovaqueError`: it is a signal from your
    code, not an error of the library.
    """

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class Defer(Exception):
    """Raise from a handler to set the message aside: its delivery becomes
    ``"deferred"``, is never claimed again, and is fetched by id with
    ``claim_deferred`` (as ``Client.defer`` does). Like :class:`Reject`, a
    signal from your code, not an error of the library.
    """


class Snooze(Exception):
    """Raise from a handler to put the message back for ``delay`` (a
    ``timedelta`` or seconds) without spending its attempt (as
    ``Client.snooze`` does). A signal, like :class:`Reject`.
    """

    def __init__(self, delay: float | timedelta) -> None:
        super().__init__(delay)
        self.delay = delay
