"""Client options and the retry backoff policy."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from novaque._time import US
from novaque.errors import InvalidOption

__all__ = ["Backoff", "Duration", "Options", "seconds"]

#: A duration: a ``timedelta`` or a number of seconds.
Duration = timedelta | float | int

# Limits of the numbers that reach the database, so that a bad one raises
# InvalidOption before any statement instead of a driver's overflow error.
#: Largest delay of a message or a retry (Backoff too): 90 days.
MAX_DELAY_S = 90 * 86_400.0
#: Longest TTL, and the longest dead-letter age that can matter: 3650 days.
MAX_TTL_S = 3650 * 86_400.0
#: Largest attempt budget (an INTEGER column).
MAX_ATTEMPTS = 1_000_000
#: Largest value of a 32-bit INTEGER column (``dead_max_count``).
MAX_INT32 = 2**31 - 1
#: Largest value of a 64-bit BIGINT column (``dead_max_bytes``).
MAX_BIGINT = 2**63 - 1
#: Largest maintenance batch: its ids go into one statement, and SQLite takes
#: at most 32,766 bound parameters.
MAX_BATCH = 10_000
#: Longest interval of the change watcher (seconds): one that looks less often
#: than consumers poll wakes nobody early.
MAX_WATCH_S = 60.0
#: Longest stats retention (100 years; further back is before year 1 soon).
MAX_RETENTION_DAYS = 36_500


def seconds(value: Duration, name: str, *, allow_zero: bool = True, hint: str = "") -> float:
    """Return ``value`` in seconds, or raise :class:`InvalidOption` naming ``name``.

    Durations are kept in whole microseconds (:func:`microseconds`), so where
    one must be positive (``allow_zero=False``) it must round to at least one;
    ``hint`` ends the error of a duration that is not positive.
    """
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value)
    else:
        raise InvalidOption(
            f"{name} must be a timedelta or a number of seconds, got {type(value).__name__}"
        )
    if not math.isfinite(result) or result < 0:
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidOption(f"{name} must be {bound} seconds, got {result!r}")
    if not allow_zero and result < 1 and microseconds(result) < 1:  # (huge ones overflow)
        rounded = "" if result == 0 else ", which rounds to 0 (durations are whole microseconds)"
        raise InvalidOption(f"{name} must be > 0 seconds, got {result!r}{rounded}{hint}")
    return result


def microseconds(seconds: float) -> int:
    """A duration in seconds as the whole microseconds it is kept in, to the
    nearest one (``1.001`` is 1,001,000: its float times a million is a hair
    below, which truncating would lose)."""
    return round(seconds * US)


@dataclass(frozen=True)
class Backoff:
    """Exponential retry delay: ``base * 2**(attempt-1)``, capped at ``cap``.

    ``attempt`` is the attempt that just failed (the first failure waits
    ``base``). With ``jitter`` the delay is drawn uniformly from ``[0, delay]``
    ("full jitter"), which spreads retries of a burst of failures.
    ``Backoff(base=0)`` retries at once.
    """

    base: Duration = 1.0
    cap: Duration = 3600.0
    jitter: bool = True

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            value = seconds(getattr(self, name), f"Backoff.{name}")
            if value > MAX_DELAY_S:
                raise InvalidOption(
                    f"Backoff.{name} is {value:.15g} s; the limit is {MAX_DELAY_S:.15g} s "
                    "(90 days, the longest retry delay)"
                )

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retrying after failed attempt number ``attempt``."""
        base = seconds(self.base, "Backoff.base")
        cap = seconds(self.cap, "Backoff.cap")
        exponent = min(max(attempt, 1) - 1, 62)
        raw = min(cap, base * (2.0**exponent))
        return raw * rand() if self.jitter else raw


@dataclass(frozen=True)
class Options:
    """Tuning of a :class:`novaque.Client`; every field has a production default.

    Durations accept a ``timedelta`` or a number of seconds and are stored as
    given; the client converts them. ``clock``, when set, is used for every
    time decision (tests move it to expire leases without sleeping); when unset
    novaque uses the database server's clock (docs/reference.md, "Time").
    ``watch_interval`` is how often the change watcher of SQLite and
    MySQL/MariaDB looks for new messages of other processes while consumers
    or long polls wait and messages move (``None``: no watcher, they poll
    every ``poll_interval``); PostgreSQL is woken by ``NOTIFY`` instead.
    ``watch_idle_interval`` is how often it looks once nothing moved for a
    while (ten times that: two seconds by default), backing off step by step
    from ``watch_interval``, so that an idle client sends at most
    ``1 / watch_idle_interval`` looks a second (5: as often as an idle
    consumer claims, every ``poll_interval``); at or below
    ``watch_interval``, it always looks every ``watch_interval``.
    ``sqlite_on_loop`` concerns the asyncio twin on SQLite only: True runs
    each of novaque's transactions on the event loop's thread while no other
    connection holds the file's write lock (a sync call of a few hundred
    microseconds, the commit's disk sync included; a lock held elsewhere sends
    the transaction to a thread of the client's to wait there); False sends
    every transaction to that thread, so the loop never waits for the disk,
    at the cost of a thread hand-over each.

    ``listen``: whether the client holds a wake-up connection while consumers
    or long polls wait (PostgreSQL's ``LISTEN``, the change watcher of SQLite
    and MySQL/MariaDB). False: none; they find new messages by polling every
    ``poll_interval``, which is what PgBouncer's transaction pooling needs
    (:func:`novaque.connect` with ``pgbouncer=True`` sets it).
    ``transaction_timeout``: the longest one of novaque's own transactions
    (a publish, a claim, an ack, a maintenance batch, ...) may wait for the
    database, its commit included, before it is cancelled and raises
    :class:`~novaque.DatabaseUnavailable` (``None``: no limit). PostgreSQL
    only: there a cancel request stops a statement and a commit's wait for a
    synchronous standby alike; MySQL/MariaDB bound lock waits with
    ``innodb_lock_wait_timeout``, SQLite with its busy timeout. A caller's
    own transactions (``connection=``, ``session=``) are the caller's to
    bound, and migrations are not limited.
    """

    default_ttl: Duration = timedelta(days=7)
    default_lease: Duration = 30.0
    default_max_attempts: int = 5
    poll_interval: Duration = 0.2
    max_in_flight: int = 1
    reap_interval: Duration = 1.0
    purge_interval: Duration = 5.0
    maintenance_batch: int = 100
    stats_retention_days: int = 30
    stats_flush_interval: Duration = 2.0
    stats_prune_interval: Duration = 3600.0
    max_body_bytes: int = 1024 * 1024
    backoff: Backoff = field(default_factory=Backoff)
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("novaque"))
    clock: Callable[[], datetime] | None = None
    dead_max_age: Duration | None = None
    dead_max_count: int | None = None
    dead_max_bytes: int | None = None
    dead_letter_expired: bool = False
    consumer_heartbeat: Duration = 10.0
    watch_interval: Duration | None = 0.002
    watch_idle_interval: Duration = 0.2
    sqlite_on_loop: bool = True
    listen: bool = True
    transaction_timeout: Duration | None = 30.0

    def __post_init__(self) -> None:
        for name in (
            "default_lease",
            "poll_interval",
            "reap_interval",
            "purge_interval",
            "stats_flush_interval",
            "stats_prune_interval",
            "default_ttl",
            "consumer_heartbeat",
        ):
            seconds(getattr(self, name), f"Options.{name}", allow_zero=False)
        if self.dead_max_age is not None:
            dead_max_age(self.dead_max_age, "Options.dead_max_age")
        for name, low, high in (
            ("default_max_attempts", 1, MAX_ATTEMPTS),
            ("max_in_flight", 1, None),
            ("maintenance_batch", 1, MAX_BATCH),
            ("stats_retention_days", 1, MAX_RETENTION_DAYS),
            ("max_body_bytes", 0, None),
        ):
            check_int(getattr(self, name), f"Options.{name}", low, high)
        if self.watch_interval is not None:
            watch_interval(self.watch_interval, "Options.watch_interval")
        watch_interval(self.watch_idle_interval, "Options.watch_idle_interval", idle=True)
        if self.dead_max_count is not None:
            check_int(self.dead_max_count, "Options.dead_max_count", 0, MAX_INT32)
        if self.dead_max_bytes is not None:
            check_int(self.dead_max_bytes, "Options.dead_max_bytes", 0, MAX_BIGINT)
        if self.transaction_timeout is not None:
            seconds(self.transaction_timeout, "Options.transaction_timeout", allow_zero=False)
        for name in ("dead_letter_expired", "sqlite_on_loop", "listen"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidOption(
                    f"Options.{name} must be True or False, got "
                    f"{type(getattr(self, name)).__name__}"
                )
        if not isinstance(self.backoff, Backoff):
            raise InvalidOption(
                f"Options.backoff must be a novaque.Backoff, got {type(self.backoff).__name__}"
            )
        if self.clock is not None and not callable(self.clock):
            raise InvalidOption("Options.clock must be a callable returning an aware datetime")


def check_int(value: object, name: str, low: int, high: int | None = None) -> int:
    """Return ``value`` if it is an int in ``[low, high]``, else raise InvalidOption."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidOption(f"{name} must be an integer, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"between {low} and {high}"
        # str() of an int of thousands of digits raises ValueError: name its size.
        shown = str(value) if value.bit_length() <= 256 else f"a {value.bit_length()}-bit integer"
        raise InvalidOption(f"{name} must be {allowed}, got {shown}")
    return value


def watch_interval(value: Duration, name: str = "watch_interval", *, idle: bool = False) -> float:
    """One of the change watcher's intervals in seconds: > 0 and at most
    :data:`MAX_WATCH_S` (``idle``: ``watch_idle_interval``, which cannot be None)."""
    off = "None turns the change watcher off"
    hint = f"; {off} (consumers then poll every poll_interval)"
    if idle:
        off = "watch_interval=None turns the change watcher off"
        hint = (
            f"; allowed: > 0 and at most {MAX_WATCH_S:.15g} s, and one at or below "
            f"watch_interval keeps the watcher looking every watch_interval ({off})"
        )
    result = seconds(value, name, allow_zero=False, hint=hint)
    if result > MAX_WATCH_S:
        raise InvalidOption(
            f"{name} is {result:.15g} s; the limit is {MAX_WATCH_S:.15g} s (a watcher that "
            f"looks less often than consumers poll wakes nobody early; {off})"
        )
    return result


def dead_max_age(value: Duration, name: str = "dead_max_age") -> float:
    """A dead-letter age bound in seconds: > 0 and at most the longest TTL."""
    result = seconds(value, name, allow_zero=False)
    if result > MAX_TTL_S:
        raise InvalidOption(
            f"{name} is {result:.15g} s; the limit is {MAX_TTL_S:.15g} s (3650 days, the "
            "longest TTL: no dead letter lives longer)"
        )
    return result
