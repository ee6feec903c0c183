"""Helpers for testing the handlers you write for novaque.

- :class:`FakeClock`: a clock that moves only when told (``Options(clock=...)``),
  so retries, delays, leases and TTLs are tested without sleeping.
- :func:`make_message`: a :class:`~novaque.Message` for calling a handler
  directly, with every field defaulted.
- :func:`drain`: run a handler on every due delivery of a channel, now, in
  the calling thread, with the consumer's rules for what its result means
  (``await drain(...)`` with a :class:`novaque.aio.AsyncClient`).

Installing novaque also installs a pytest plugin (:mod:`novaque.testing.plugin`)
with the fixtures ``novaque_client`` (a client on a migrated SQLite database
of the test's own), ``novaque_clock`` (its :class:`FakeClock`) and
``novaque_options`` (more :class:`~novaque.Options` fields for it). This
module itself needs no pytest.
"""

from __future__ import annotations

import dataclasses
import secrets
import sys
import threading
from collections.abc import Coroutine
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, overload

from novaque import _settle, _validate
from novaque._core import parts_of
from novaque._waits import TASKS, THREADS, Waits
from novaque.client import Client
from novaque.consumer import Handler
from novaque.models import Message
from novaque.options import check_int

if TYPE_CHECKING:
    from novaque.aio import AsyncClient, AsyncHandler

__all__ = ["FakeClock", "drain", "make_message"]


def _aware_utc(moment: object, name: str) -> datetime:
    if not isinstance(moment, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {moment!r}")
    return moment.astimezone(timezone.utc)


class FakeClock:
    """A clock for ``Options(clock=...)`` that moves only when told.

    Calling it returns the current fake time, an aware UTC ``datetime``.
    It starts at ``start`` (an aware datetime; default: the real time now)
    and is safe to share between threads (a consumer's and the test's).
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = datetime.now(timezone.utc) if start is None else _aware_utc(start, "start")
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<novaque.testing.FakeClock {self().isoformat()}>"

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float | timedelta = 0, **delta: float) -> datetime:
        """Move the time on by ``seconds`` (a number or a ``timedelta``) plus any
        ``timedelta`` keyword (``minutes=``, ``days=``, ...); returns the new time.

        ``clock.advance(30)``, ``clock.advance(timedelta(hours=1))`` and
        ``clock.advance(days=2)`` all work. A negative step moves it back.
        """
        if isinstance(seconds, timedelta):
            step = seconds + timedelta(**delta)
        elif isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
            step = timedelta(seconds=seconds, **delta)
        else:
            raise TypeError(
                f"advance() takes seconds as a number or a timedelta, got {type(seconds).__name__}"
            )
        with self._lock:
            self._now += step
            return self._now

    def set(self, moment: datetime) -> None:
        """Jump to ``moment`` (an aware datetime), forwards or back."""
        moment = _aware_utc(moment, "moment")
        with self._lock:
            self._now = moment


#: The fields of :func:`make_message` that have fixed defaults (the times and
#: the lease token are made at each call).
_DEFAULTS: dict[str, Any] = {
    "id": 1,
    "topic": "test",
    "channel": "test",
    "attempts": 1,
    "max_attempts": 5,
    "delivery_id": 1,
}
#: How long the lease of a made message runs from its ``published_at``
#: (``Options.default_lease``'s default).
_LEASE = timedelta(seconds=30)
#: The Message fields a caller may set (``channel_id`` is novaque's own).
_FIELDS = tuple(f.name for f in dataclasses.fields(Message) if f.repr)


def make_message(body: bytes | str = b"", **fields: Any) -> Message:
    """A :class:`~novaque.Message` as a handler would receive it, for unit tests.

    ``body`` is bytes, or str encoded UTF-8 (as ``publish`` takes it). Every
    other field may be given by keyword; the defaults are ``topic`` and
    ``channel`` ``"test"``, ``attempts=1``, ``max_attempts=5``, ``headers={}``,
    ``id`` and ``delivery_id`` 1, ``published_at`` now (aware UTC),
    ``lease_expires_at`` 30 s after ``published_at`` and a fresh random
    ``lease_token``. An unknown keyword raises :class:`TypeError` naming the
    fields there are. Nothing touches a database: settling such a message
    with a client raises :class:`~novaque.LeaseLost`.
    """
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        allowed = ", ".join(_FIELDS)
        raise TypeError(
            f"make_message() got unknown field(s) {', '.join(unknown)}; a Message has: {allowed}"
        )
    data = _validate.body(body, max_bytes=2**63)
    headers = fields.pop("headers", None)
    published_at = fields.pop("published_at", None)
    published_at = (
        datetime.now(timezone.utc)
        if published_at is None
        else _aware_utc(published_at, "published_at")
    )
    values: dict[str, Any] = {
        **_DEFAULTS,
        "body": data,
        "headers": {} if headers is None else dict(headers),
        "published_at": published_at,
        "lease_token": secrets.token_hex(16),
        "lease_expires_at": published_at + _LEASE,
        **fields,
    }
    return Message(**values)


@overload
def drain(
    client: Client, topic: str, channel: str, handler: Handler, *, limit: int | None = None
) -> int: ...


@overload
def drain(
    client: AsyncClient,
    topic: str,
    channel: str,
    handler: AsyncHandler,
    *,
    limit: int | None = None,
) -> Coroutine[Any, Any, int]: ...


def drain(
    client: Client | AsyncClient,
    topic: str,
    channel: str,
    handler: Any,
    *,
    limit: int | None = None,
) -> int | Coroutine[Any, Any, int]:
    """Run ``handler`` on every due delivery of ``topic``/``channel``, now, in
    this thread; return how many times it ran.

    Deliveries are claimed one at a time (with the client's default lease),
    so a handler may publish, and what it publishes that is due is handled
    too. What the handler's result means is exactly what it means to a
    consumer: return ⇒ ack; :class:`~novaque.Reject` ⇒ dead at once;
    :class:`~novaque.Defer` ⇒ deferred (not due again: fetch it with
    ``claim_deferred``); :class:`~novaque.Snooze` ⇒ due again after its
    delay, its attempt given back; any other exception ⇒ retry after the
    client's backoff (``Options.backoff``), or dead once attempts ran out. A
    retry or a snooze is due again only when the client's clock reaches it:
    advance the :class:`FakeClock` and drain again (with ``Backoff(base=0)``
    a retry is due at once, and one drain runs it to its end; so is a
    ``Snooze(0)``, which spends no attempt: give such a handler a ``limit``).
    Nothing the handler raises escapes; ``drain`` returns when nothing is due
    or after ``limit`` runs of the handler (``None``: no limit).

    With a :class:`novaque.aio.AsyncClient` and an ``async def`` handler it
    returns a coroutine: ``ran = await drain(client, ...)``, the same rules.

    Raises :class:`~novaque.TopicNotFound` / :class:`~novaque.ChannelNotFound`
    for a channel that does not exist (``drain`` creates none: a message
    published before its channel existed was never delivered to it), and
    :class:`~novaque.LeaseLost` if the handler's delivery was settled (by the
    handler itself, say) or leased again before its result was written.
    """
    if limit is not None:
        check_int(limit, "limit", 0)
    if isinstance(client, Client):
        _validate.handler(handler)
        return _drain(client, topic, channel, handler, limit, THREADS)
    aio = sys.modules.get("novaque.aio")  # imported by whoever made an AsyncClient
    if aio is not None and isinstance(client, aio.AsyncClient):
        from sqlalchemy.util import greenlet_spawn

        _validate.handler(handler, TASKS)
        return greenlet_spawn(_drain, aio.core_of(client), topic, channel, handler, limit, TASKS)
    raise TypeError(
        f"drain() needs a novaque.Client or novaque.aio.AsyncClient, got {type(client).__name__}"
    )


def _drain(
    client: Client, topic: str, channel: str, handler: Any, limit: int | None, waits: Waits
) -> int:
    backoff = client.options.backoff
    settler = parts_of(client).consuming
    ran = 0
    while limit is None or ran < limit:
        claimed = client.claim(topic, channel)
        if not claimed:
            break
        (msg,) = claimed
        outcome = _settle.outcome_of(handler, msg, backoff=backoff, log=client.log, waits=waits)
        ran += 1
        _settle.write(settler, outcome)
    return ran
