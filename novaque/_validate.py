"""Checks of user input, run before anything touches the database."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import date, datetime, timedelta
from typing import Any

from novaque import _filters
from novaque._limits import MAX_HEADERS, MAX_HEADERS_BYTES, UNSTORABLE
from novaque._tables import ORDERINGS
from novaque._waits import THREADS, Waits
from novaque.errors import InvalidName, InvalidOption, MessageTooLarge
from novaque.options import (
    MAX_ATTEMPTS,
    MAX_BIGINT,
    MAX_DELAY_S,
    MAX_INT32,
    MAX_TTL_S,
    Duration,
    check_int,
    dead_max_age,
    microseconds,
    seconds,
)

_NAME = re.compile(r"[A-Za-z0-9._:-]{1,200}")

MAX_LEASE_S = 7 * 86_400.0
#: Longest wait of a long poll (``claim(wait=)``, ``pop(wait=)``).
MAX_WAIT_S = 300.0
MAX_ERROR_CHARS = 4000
MAX_DEDUP_KEY = 200
#: Largest id (message, delivery, ``after_id``): a signed 64-bit BIGINT.
MAX_ID = 2**63 - 1

_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` as every backend can store it: NUL and lone surrogates become U+FFFD.

    For text novaque keeps but does not look up by (error texts, reasons):
    what a handler raised must never make a settle fail.
    """
    return UNSTORABLE.sub("\ufffd", text)


def name(value: object, kind: str) -> str:
    """Return a valid topic/channel name or raise :class:`InvalidName`."""
    if not isinstance(value, str):
        raise InvalidName(f"{kind} name must be a str, got {type(value).__name__}")
    if not _NAME.fullmatch(value):
        shown = value if len(value) <= 60 else value[:57] + "..."
        raise InvalidName(
            f"invalid {kind} name {shown!r}: use 1-200 characters of A-Z a-z 0-9 . _ : -"
        )
    return value


def handler(value: object, waits: Waits = THREADS) -> None:
    """Raise :class:`TypeError` unless ``value`` is a callable that ``waits`` can
    run: a plain function on threads, an ``async def`` on the asyncio twin."""
    if not callable(value):
        raise TypeError(f"handler must be callable, got {type(value).__name__}")
    waits.check_handler(value)


def body(value: object, max_bytes: int) -> bytes:
    """Return the body as bytes (str is UTF-8 encoded) within ``max_bytes``."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidOption(
                f"message body str holds {value[exc.start]!r} at index {exc.start}, which "
                "UTF-8 cannot encode (a lone surrogate): pass bytes, or text without it"
            ) from None
    else:
        raise TypeError(f"message body must be bytes or str, got {type(value).__name__}")
    if len(data) > max_bytes:
        raise MessageTooLarge(
            f"message body is {len(data)} bytes, larger than max_body_bytes={max_bytes}"
        )
    return data


def headers(value: object) -> str | None:
    """Headers as stored: a JSON object of str -> str, or None when empty.

    Read back exactly as given: JSON holds NUL and the other control
    characters as escapes, and everything else as UTF-8. A key or value
    holding a lone surrogate (no character: UTF-8 cannot encode it, and
    JSON's escapes would join two of them into one character) is refused.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"headers must be a dict of str to str, got {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise TypeError(
                f"headers must map str to str, got {type(key).__name__} -> "
                f"{type(item).__name__} for key {key!r}"
            )
    if not value:
        return None
    if len(value) > MAX_HEADERS:
        raise InvalidOption(
            f"headers hold {len(value)} keys; the limit is {MAX_HEADERS} "
            "(put larger sets of values in the body)"
        )
    text = json.dumps(dict(value), ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidOption(_surrogate_in(value)) from None
    if size > MAX_HEADERS_BYTES:
        raise InvalidOption(
            f"headers take {size} bytes as JSON; the limit is {MAX_HEADERS_BYTES} bytes"
        )
    return text


def _surrogate_in(value: Mapping[str, str]) -> str:
    """What is wrong with headers whose JSON UTF-8 cannot encode: the first key
    or value (in sorted order) holding a lone surrogate."""
    for key, item in sorted(value.items()):
        for text, where in ((key, f"headers key {key[:60]!r}"), (item, f"headers[{key[:60]!r}]")):
            bad = _SURROGATE.search(text)
            if bad is not None:
                return (
                    f"{where} holds {bad.group()!r} at index {bad.start()}: header keys and "
                    "values may not contain lone surrogates (U+D800-U+DFFF, what "
                    "os.fsdecode makes of bytes that are not UTF-8), which UTF-8 cannot encode"
                )
    raise AssertionError("unreachable: only a surrogate fails to encode")  # pragma: no cover


def decode_headers(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    decoded: dict[str, str] = json.loads(text)
    return decoded


def ttl(value: Duration | None, default: Duration) -> float:
    result = seconds(default if value is None else value, "ttl", allow_zero=False)
    if result > MAX_TTL_S:
        raise InvalidOption(f"ttl is {result:.15g} s; the limit is {MAX_TTL_S:.15g} s (3650 days)")
    return result


def delay(value: Duration | None, ttl_s: float) -> float:
    if value is None:
        return 0.0
    result = seconds(value, "delay")
    if result > MAX_DELAY_S:
        raise InvalidOption(
            f"delay is {result:.15g} s; the limit is {MAX_DELAY_S:.15g} s (90 days)"
        )
    if microseconds(result) >= microseconds(ttl_s):  # as stored
        raise InvalidOption(
            f"delay is {result:.15g} s but the message expires after its ttl of {ttl_s:.15g} s: "
            "the delay must be shorter than the ttl"
        )
    return result


def retry_delay(value: Duration) -> float:
    result = seconds(value, "delay")
    if result > MAX_DELAY_S:
        raise InvalidOption(
            f"delay is {result:.15g} s; the limit is {MAX_DELAY_S:.15g} s (90 days)"
        )
    return result


def lease(value: Duration | None, default: Duration) -> float:
    result = seconds(default if value is None else value, "lease", allow_zero=False)
    if result > MAX_LEASE_S:
        raise InvalidOption(f"lease is {result:.15g} s; the limit is {MAX_LEASE_S:.15g} s (7 days)")
    return result


def wait(value: Duration | None) -> float | None:
    """A long poll's wait in seconds (0 < wait <= 300), or None for none."""
    if value is None:
        return None
    result = seconds(value, "wait", allow_zero=False)
    if result > MAX_WAIT_S:
        raise InvalidOption(f"wait is {result:.15g} s; the limit is {MAX_WAIT_S:.15g} s")
    return result


def max_attempts(value: object, default: int) -> int:
    return check_int(default if value is None else value, "max_attempts", 1, MAX_ATTEMPTS)


def dedup_key(value: object, name: str = "dedup_key") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_DEDUP_KEY:
        raise InvalidOption(f"{name} must be 1-200 characters, got {len(value)}")
    # A key is looked up exactly: refuse what cannot be stored, never alter it.
    bad = UNSTORABLE.search(value)
    if bad is not None:
        raise InvalidOption(
            f"{name} {value[:60]!r} holds {bad.group()!r} at index {bad.start()}: "
            "a key may not contain NUL or lone surrogates (U+D800-U+DFFF)"
        )
    return value


#: The priorities a message may have (lower first).
MIN_PRIORITY, MAX_PRIORITY = -100, 100


def priority(value: object) -> int:
    """A message's priority: an int from -100 to 100 (lower runs first)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(
            f"priority must be an int from {MIN_PRIORITY} to {MAX_PRIORITY}, "
            f"got {type(value).__name__}"
        )
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        shown = str(value) if value.bit_length() <= 256 else f"a {value.bit_length()}-bit int"
        raise InvalidOption(
            f"priority must be from {MIN_PRIORITY} (first) to {MAX_PRIORITY} (last), got {shown}"
        )
    return value


def group(value: object) -> str | None:
    """An ordering key (``publish(group=...)``): 1-200 characters, compared exactly."""
    return dedup_key(value, "group")


def attempt_id(value: object) -> str | None:
    """The id of an idempotent claim (``claim(attempt_id=...)``): 1-200
    characters, compared exactly."""
    return dedup_key(value, "attempt_id")


def error_text(error: object) -> str | None:
    """The text kept as a delivery's last error: ``Type: message`` for exceptions.

    At most :data:`MAX_ERROR_CHARS` characters, made :func:`storable`; an
    exception whose ``str()`` fails is kept by its type name.
    """
    if error is None:
        return None
    message = text_of(error)
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    else:
        text = message
    return storable(text[:MAX_ERROR_CHARS])


def reason(value: object) -> str:
    """A dead letter's reason as stored: the text (``"rejected"`` when empty)."""
    if not isinstance(value, str):
        raise TypeError(f"reason must be a str, got {type(value).__name__}")
    return storable(value[:MAX_ERROR_CHARS]) or "rejected"


def text_of(value: object) -> str:
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__} whose str() failed>"


MAX_PAGE = 1000


def page_limit(value: object) -> int:
    """A page size for listings: 1-1000."""
    return check_int(value, "limit", 1, MAX_PAGE)


def after_id(value: object) -> int:
    """A keyset position (the last id of the previous page); 0 when None."""
    return 0 if value is None else check_int(value, "after_id", 0, MAX_ID)


def utc_day(value: object, name: str) -> date | None:
    """A UTC day bound for counter reads (a ``date``, not a ``datetime``), or None."""
    if value is None:
        return None
    if isinstance(value, datetime) or not isinstance(value, date):
        raise InvalidOption(
            f"{name} must be a datetime.date (a UTC day), got {type(value).__name__} {value!r}"
        )
    return value


def day_range(since: object, until: object) -> tuple[date | None, date | None]:
    first, last = utc_day(since, "since"), utc_day(until, "until")
    if first is not None and last is not None and first > last:
        raise InvalidOption(f"since ({first}) must not be after until ({last})")
    return first, last


def moment(value: object, name: str) -> datetime:
    """An aware datetime (naive ones are refused: their zone is unknown)."""
    if not isinstance(value, datetime):
        raise InvalidOption(
            f"{name} must be a timezone-aware datetime, got {type(value).__name__} {value!r}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidOption(f"{name} must be timezone-aware (UTC), got naive {value!r}")
    return value


def ids(value: object, name: str = "ids") -> list[int]:
    """A list of positive integer ids (duplicates dropped, ascending)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidOption(f"{name} must be a list of integer ids, got {type(value).__name__}")
    result: set[int] = set()
    for item in value:
        result.add(check_int(item, f"each of {name}", 1, MAX_ID))
    return sorted(result)


def names(value: object, kind: str) -> list[str]:
    """A list of valid names (duplicates dropped, sorted)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidOption(f"{kind}s must be a list of {kind} names, got {type(value).__name__}")
    return sorted({name(item, kind) for item in value})


def message_id(value: object, name: str = "id") -> int:
    """A message id: a positive integer of 64 bits."""
    return check_int(value, name, 1, MAX_ID)


def rate(value: object, name: str = "rate") -> float:
    """A pace: a finite number > 0 (of things per second)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidOption(
            f"{name} must be a number of letters per second (> 0), got {type(value).__name__}"
        )
    try:
        result = float(value)
    except OverflowError:  # an int beyond every float
        result = math.inf
    if not math.isfinite(result) or result <= 0:
        shown = repr(value) if math.isfinite(result) or isinstance(value, float) else "a huge int"
        raise InvalidOption(
            f"{name} must be a finite number of letters per second > 0, got {shown}"
        )
    return result


def dead_max_age_us(value: Duration) -> int:
    """A channel's dead-letter age bound, in microseconds as stored."""
    return microseconds(dead_max_age(value))


def dead_max_count(value: object, name: str = "dead_max_count") -> int:
    """A bound on a channel's dead letters: 0 to the largest 32-bit INTEGER."""
    return check_int(value, name, 0, MAX_INT32)


def async_hint(value: object) -> str:
    """For a TypeError: a pointer to the asyncio twin when ``value`` is one of
    SQLAlchemy's asyncio objects (an AsyncEngine, AsyncConnection, AsyncSession)."""
    if type(value).__module__.startswith("sqlalchemy.ext.asyncio"):
        return (
            f"; {type(value).__name__} is asyncio's: use novaque.aio.AsyncClient "
            "(import novaque.aio) with an AsyncEngine"
        )
    return ""


def sync_hint(value: object) -> str:
    """For a TypeError of the asyncio twin: what to pass instead of a sync object."""
    names = {"Engine": "AsyncEngine", "Connection": "AsyncConnection", "Session": "AsyncSession"}
    wanted = names.get(type(value).__name__)
    if wanted is not None and type(value).__module__.startswith("sqlalchemy"):
        return f"; novaque.aio.AsyncClient works with asyncio's {wanted} (novaque.Client with this)"
    return ""


#: The settings ``ensure_channel(reset=...)`` can name.
CHANNEL_SETTINGS = (
    "ordering",
    "filter",
    "lease",
    "max_attempts",
    "dead_max_age",
    "dead_max_count",
    "dead_max_bytes",
    "dead_letter_expired",
    "max_leased",
    "rate_limit",
    "group_max_leased",
)

#: Shortest and longest period of a channel's ``rate_limit`` (seconds).
MIN_RATE_PERIOD_S = 1.0
MAX_RATE_PERIOD_S = 86_400.0


def leased_limit(value: object, name: str) -> int:
    """``max_leased`` or ``group_max_leased``: an int from 1 to the largest
    32-bit INTEGER."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int >= 1 (None: no limit), got {type(value).__name__}")
    if not 1 <= value <= MAX_INT32:
        shown = str(value) if value.bit_length() <= 256 else f"a {value.bit_length()}-bit int"
        raise InvalidOption(f"{name} must be from 1 to {MAX_INT32}, got {shown}")
    return value


def rate_limit(value: object) -> tuple[int, int]:
    """A channel's ``rate_limit``: ``(count, period)``, count an int >= 1 and
    period a duration from 1 s to 1 day; as stored: (count, period in
    microseconds)."""
    shape = (
        "rate_limit must be a (count, period) pair such as (100, 60) or (100, timedelta(minutes=1))"
    )
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{shape} (None: no limit), got {type(value).__name__}")
    if len(value) != 2:
        raise TypeError(f"{shape}, got {len(value)} items")
    count, period = value
    if not isinstance(count, int) or isinstance(count, bool):
        raise TypeError(f"rate_limit's count must be an int >= 1, got {type(count).__name__}")
    if not 1 <= count <= MAX_INT32:
        shown = str(count) if count.bit_length() <= 256 else f"a {count.bit_length()}-bit int"
        raise InvalidOption(f"rate_limit's count must be from 1 to {MAX_INT32}, got {shown}")
    if isinstance(period, bool) or not isinstance(period, (timedelta, int, float)):
        raise TypeError(
            "rate_limit's period must be a timedelta or a number of seconds, "
            f"got {type(period).__name__}"
        )
    period_s = period.total_seconds() if isinstance(period, timedelta) else float(period)
    if not (math.isfinite(period_s) and MIN_RATE_PERIOD_S <= period_s <= MAX_RATE_PERIOD_S):
        raise InvalidOption(
            f"rate_limit's period must be from {MIN_RATE_PERIOD_S:.15g} s to "
            f"{MAX_RATE_PERIOD_S:.15g} s (1 day), got {period_s!r} s"
        )
    return count, microseconds(period_s)


def channel_settings(reset: object, **given: Any) -> dict[str, Any]:
    """The columns of ``novaque_channels`` to store, from the settings given (not
    None) and those named in ``reset`` (stored as their defaults)."""
    if isinstance(reset, str) or not isinstance(reset, Iterable):
        raise TypeError(f"reset must be a tuple of setting names, got {type(reset).__name__}")
    names = list(reset)
    for item in names:
        if item not in CHANNEL_SETTINGS:
            raise InvalidOption(
                f"reset names {item!r}, which is no channel setting; the settings are "
                + ", ".join(CHANNEL_SETTINGS)
            )
        if given.get(item) is not None:
            raise InvalidOption(f"{item} is both given and reset")
    stored: dict[str, Any] = {}
    for item in names:
        stored.update(dict.fromkeys(_COLUMNS_OF.get(item, (item,))))
    if "ordering" in stored:
        stored["ordering"] = ORDERINGS["standard"]
    ordering = given.get("ordering")
    if ordering is not None:
        if not isinstance(ordering, str):
            raise TypeError(f"ordering must be a str, got {type(ordering).__name__}")
        if ordering not in ORDERINGS:
            raise InvalidOption(
                f"ordering is {ordering!r}; it must be one of " + ", ".join(map(repr, ORDERINGS))
            )
        stored["ordering"] = ORDERINGS[ordering]
    if given.get("filter") is not None:
        stored["filter_expr"] = _filters.check(given["filter"])
    if given.get("lease") is not None:
        stored["lease"] = microseconds(lease(given["lease"], 0))
    if given.get("max_attempts") is not None:
        stored["max_attempts"] = max_attempts(given["max_attempts"], 1)
    if given.get("dead_max_age") is not None:
        stored["dead_max_age"] = dead_max_age_us(given["dead_max_age"])
    if given.get("dead_max_count") is not None:
        stored["dead_max_count"] = dead_max_count(given["dead_max_count"])
    if given.get("dead_max_bytes") is not None:
        stored["dead_max_bytes"] = check_int(
            given["dead_max_bytes"], "dead_max_bytes", 0, MAX_BIGINT
        )
    expired = given.get("dead_letter_expired")
    if expired is not None:
        if not isinstance(expired, bool):
            raise TypeError(
                f"dead_letter_expired must be True or False, got {type(expired).__name__}"
            )
        stored["dead_letter_expired"] = expired
    for name in ("max_leased", "group_max_leased"):
        if given.get(name) is not None:
            stored[name] = leased_limit(given[name], name)
    if given.get("rate_limit") is not None:
        stored["rate_count"], stored["rate_period"] = rate_limit(given["rate_limit"])
    if stored.get("group_max_leased") is not None and stored.get("ordering", 0) != 0:
        raise InvalidOption(
            "group_max_leased applies to standard channels only, not to ordering "
            f"{ordering!r} (an ordered channel leases one delivery of a group at a time already)"
        )
    return stored


#: The columns of ``novaque_channels`` a setting is stored in, where not its own name.
_COLUMNS_OF = {"filter": ("filter_expr",), "rate_limit": ("rate_count", "rate_period")}
