"""Checks of user input, run before anything touches the database."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import date, datetime

from novaque.errors import InvalidName, InvalidOption, MessageTooLarge
from novaque.options import Duration, check_int, seconds

_NAME = re.compile(r"[A-Za-z0-9._:-]{1,200}")

MAX_DELAY_S = 90 * 86_400.0
MAX_TTL_S = 3650 * 86_400.0
MAX_LEASE_S = 7 * 86_400.0
MAX_ATTEMPTS = 1_000_000
MAX_HEADERS_BYTES = 64 * 1024
MAX_ERROR_CHARS = 4000
MAX_DEDUP_KEY = 200


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


def body(value: object, max_bytes: int) -> bytes:
    """Return the body as bytes (str is UTF-8 encoded) within ``max_bytes``."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode("utf-8")
    else:
        raise TypeError(f"message body must be bytes or str, got {type(value).__name__}")
    if len(data) > max_bytes:
        raise MessageTooLarge(
            f"message body is {len(data)} bytes, larger than max_body_bytes={max_bytes}"
        )
    return data


def headers(value: object) -> str | None:
    """Headers as stored: a JSON object of str -> str, or None when empty."""
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
    text = json.dumps(dict(value), ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    if len(text.encode("utf-8")) > MAX_HEADERS_BYTES:
        raise InvalidOption(f"headers take {len(text)} characters as JSON; the limit is 64 KiB")
    return text


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
    if result >= ttl_s:
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


def max_attempts(value: object, default: int) -> int:
    return check_int(default if value is None else value, "max_attempts", 1, MAX_ATTEMPTS)


def dedup_key(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"dedup_key must be a str, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_DEDUP_KEY:
        raise InvalidOption(f"dedup_key must be 1-200 characters, got {len(value)}")
    return value


def error_text(error: object) -> str | None:
    """The text kept as a delivery's last error: ``Type: message`` for exceptions."""
    if error is None:
        return None
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    else:
        text = str(error)
    return text[:MAX_ERROR_CHARS]


MAX_PAGE = 1000


def page_limit(value: object) -> int:
    """A page size for listings: 1-1000."""
    return check_int(value, "limit", 1, MAX_PAGE)


def after_id(value: object) -> int:
    """A keyset position (the last id of the previous page); 0 when None."""
    return 0 if value is None else check_int(value, "after_id", 0)


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
        result.add(check_int(item, f"each of {name}", 1))
    return sorted(result)


def names(value: object, kind: str) -> list[str]:
    """A list of valid names (duplicates dropped, sorted)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidOption(f"{kind}s must be a list of {kind} names, got {type(value).__name__}")
    return sorted({name(item, kind) for item in value})


def message_id(value: object, name: str = "id") -> int:
    """A message id: a positive integer."""
    return check_int(value, name, 1)
