"""What the broker reads from requests and writes in answers: JSON in, JSON out.

Every check here refuses a request with :class:`ApiError` (400 ``invalid``
or 413 ``too_large``) before anything is written, saying what was wrong and
what is allowed.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from novaque._validate import MAX_ID, MAX_LEASE_S
from novaque.models import Message
from novaque.options import MAX_DELAY_S

__all__ = [
    "MAX_DEFERRED",
    "MAX_ITEMS",
    "MAX_PUBLISH",
    "MAX_RECEIVE",
    "MAX_WAIT_S",
    "ApiError",
    "Receive",
    "message_json",
    "settings_json",
]

#: Messages of one publish request.
MAX_PUBLISH = 500
#: Items of one settle or renew request.
MAX_ITEMS = 500
#: Messages one receive returns at most.
MAX_RECEIVE = 100
#: Delivery ids of one ``deferred`` request.
MAX_DEFERRED = 100
#: The longest long poll of a receive, in seconds.
MAX_WAIT_S = 20.0

MESSAGE_FIELDS = (
    "body",
    "body_b64",
    "headers",
    "delay",
    "ttl",
    "max_attempts",
    "dedup_key",
    "group",
    "priority",
)
SETTLE_ACTIONS = ("complete", "abandon", "defer", "dead_letter", "snooze")
MODES = ("peek_lock", "receive_and_delete")


class ApiError(Exception):
    """A refused request: HTTP status, error code and a message for the caller."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def invalid(message: str) -> ApiError:
    return ApiError(400, "invalid", message)


def shown(value: object) -> str:
    """A value as a message quotes it (long ones cut)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_fields(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """400 naming the first key of ``data`` not in ``allowed``."""
    for key in data:
        if key not in allowed:
            raise invalid(
                f"{where} has an unknown field {shown(key)}; the fields are " + ", ".join(allowed)
            )


def obj(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(f"{where} must be a JSON object, got {type_name(value)}")
    return value


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def seconds(value: object, what: str, *, low: float = 0.0, high: float | None = None) -> float:
    """A number of seconds (``low <= value``, ``<= high`` when given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"{what} must be a number of seconds, got {shown(value)}")
    if value < low or (high is not None and value > high):
        bound = f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}"
        raise invalid(f"{what} must be {bound} seconds, got {value:g}")
    return float(value)


def positive_seconds(value: object, what: str) -> float:
    got = seconds(value, what)
    if got <= 0:
        raise invalid(f"{what} must be a positive number of seconds, got {got:g}")
    return got


def lease(value: object, what: str = "lease") -> float:
    """A lease: positive seconds, at most what the client allows (7 days)."""
    got = positive_seconds(value, what)
    if got > MAX_LEASE_S:
        raise invalid(f"{what} must be at most {MAX_LEASE_S:g} seconds (7 days), got {got:g}")
    return got


def integer(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{what} must be an integer from {low} to {high}, got {shown(value)}")
    if not low <= value <= high:
        raise invalid(f"{what} must be an integer from {low} to {high}, got {value}")
    return value


def delivery_id(value: object, what: str) -> int:
    return integer(value, what, 1, MAX_ID)


def string(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise invalid(f"{what} must be a string, got {type_name(value)}")
    return value


def items(data: Mapping[str, Any], key: str, high: int) -> list[Any]:
    """The non-empty array ``data[key]`` of at most ``high`` entries (413 above)."""
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise invalid(f'send "{key}": a non-empty array of at most {high} entries')
    if len(value) > high:
        raise ApiError(
            413, "too_large", f"{key} has {len(value)} entries; at most {high} per request"
        )
    return value


def moment(value: object, what: str) -> datetime:
    """An ISO 8601 time with its zone (``Z`` for UTC)."""
    text = string(value, what).strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise invalid(
            f"{what} must be an ISO 8601 time like 2026-11-29T09:00:00Z, got {shown(value)}"
        ) from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise invalid(f"{what} must give its time zone (2026-11-29T09:00:00Z, or +02:00)")
    return parsed.astimezone(timezone.utc)


# -- publish ---------------------------------------------------------------------------


@dataclass
class Outgoing:
    """One message of a publish request, checked."""

    body: bytes
    dedup_key: str | None
    group: str | None
    #: What ``publish_many`` takes for the whole call (messages that share them
    #: are published together).
    shared: tuple[tuple[str, Any], ...]


def outgoing(value: object, n: int, supports_priority: bool) -> Outgoing:
    where = f"message {n}"
    data = obj(value, where)
    check_fields(data, MESSAGE_FIELDS, where)
    has_text, has_b64 = "body" in data, "body_b64" in data
    if has_text == has_b64:
        raise invalid(
            f"{where} must have exactly one of body (UTF-8 text) and body_b64 (base64 bytes)"
        )
    if has_text:
        text = string(data["body"], f"{where}: body")
        try:
            body = text.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid(f"{where}: body is not valid Unicode text (a lone surrogate)") from None
    else:
        encoded = string(data["body_b64"], f"{where}: body_b64")
        try:
            body = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"{where}: body_b64 is not base64 (RFC 4648, with padding)") from None
    shared: list[tuple[str, Any]] = []
    headers = data.get("headers")
    if headers is not None:
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise invalid(f"{where}: headers must be an object of string values")
        shared.append(("headers", tuple(sorted(headers.items()))))
    for key in ("delay", "ttl"):
        if data.get(key) is not None:
            shared.append((key, seconds(data[key], f"{where}: {key}")))
    if data.get("max_attempts") is not None:
        value = data["max_attempts"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(f"{where}: max_attempts must be an integer, got {shown(value)}")
        shared.append(("max_attempts", value))
    if data.get("priority") is not None:
        if not supports_priority:
            raise invalid(f"{where}: priority is not supported by this server")
        value = data["priority"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(f"{where}: priority must be an integer, got {shown(value)}")
        shared.append(("priority", value))
    dedup = data.get("dedup_key")
    if dedup is not None:
        dedup = string(dedup, f"{where}: dedup_key")
    group = data.get("group")
    if group is not None:
        group = string(group, f"{where}: group")
    return Outgoing(body, dedup, group, tuple(shared))


def publish_kwargs(shared: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """``publish_many``'s keyword arguments from :attr:`Outgoing.shared`."""
    kwargs = dict(shared)
    if "headers" in kwargs:
        kwargs["headers"] = dict(kwargs["headers"])
    return kwargs


# -- receive ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Receive:
    """A receive request, checked."""

    max_messages: int = 1
    wait: float = 0.0
    lease: float | None = None
    mode: str = "peek_lock"
    attempt_id: str | None = None


def receive(data: Mapping[str, Any]) -> Receive:
    check_fields(data, ("max_messages", "wait", "lease", "mode", "attempt_id"), "the request")
    got: dict[str, Any] = {}
    if data.get("max_messages") is not None:
        got["max_messages"] = integer(data["max_messages"], "max_messages", 1, MAX_RECEIVE)
    if data.get("wait") is not None:
        got["wait"] = seconds(data["wait"], "wait", high=MAX_WAIT_S)
    mode = data.get("mode")
    if mode is not None:
        if mode not in MODES:
            raise invalid(f"mode must be one of {', '.join(MODES)}, got {shown(mode)}")
        got["mode"] = mode
    if data.get("lease") is not None:
        got["lease"] = lease(data["lease"])
    if data.get("attempt_id") is not None:
        got["attempt_id"] = string(data["attempt_id"], "attempt_id")
    if got.get("mode") == "receive_and_delete":
        for key in ("lease", "attempt_id"):
            if key in got:
                raise invalid(f"{key} is for mode peek_lock: receive_and_delete leases nothing")
    return Receive(**got)


# -- settle and renew ------------------------------------------------------------------


@dataclass(frozen=True)
class Settle:
    delivery_id: int
    lease_token: str
    action: str
    delay: float | None = None
    error: str | None = None
    reason: str = ""


_SETTLE_FIELDS = ("delivery_id", "lease_token", "action", "delay", "error", "reason")
#: What each action takes besides the delivery and its token.
_ACTION_FIELDS = {
    "complete": (),
    "abandon": ("delay", "error"),
    "defer": (),
    "dead_letter": ("reason",),
    "snooze": ("delay",),
}


def lease_pair(value: object, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    data = obj(value, where)
    check_fields(data, allowed, where)
    data = dict(data)
    data["delivery_id"] = delivery_id(data.get("delivery_id"), f"{where}: delivery_id")
    data["lease_token"] = string(data.get("lease_token"), f"{where}: lease_token")
    return data


def settle_item(value: object, n: int) -> Settle:
    where = f"item {n}"
    data = lease_pair(value, where, _SETTLE_FIELDS)
    action = data.get("action")
    if action not in SETTLE_ACTIONS:
        raise invalid(
            f"{where}: action must be one of {', '.join(SETTLE_ACTIONS)}, got {shown(action)}"
        )
    takes = _ACTION_FIELDS[action]
    for key in ("delay", "error", "reason"):
        if data.get(key) is not None and key not in takes:
            raise invalid(f"{where}: {key} is not for action {action}")
    delay = None
    if data.get("delay") is not None:
        delay = seconds(data["delay"], f"{where}: delay", high=MAX_DELAY_S)
    elif action == "snooze":
        raise invalid(f"{where}: action snooze needs delay (seconds)")
    error = None if data.get("error") is None else string(data["error"], f"{where}: error")
    reason = "" if data.get("reason") is None else string(data["reason"], f"{where}: reason")
    return Settle(data["delivery_id"], data["lease_token"], action, delay, error, reason)


def no_repeats(ids: list[int]) -> None:
    seen: set[int] = set()
    for value in ids:
        if value in seen:
            raise invalid(f"delivery_id {value} appears twice; name each delivery once")
        seen.add(value)


# -- answers ---------------------------------------------------------------------------


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, ``Z`` for the zone."""
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def message_json(msg: Message) -> dict[str, Any]:
    """A message as an answer shows it."""
    leased = msg.lease_token != ""
    out: dict[str, Any] = {
        "id": msg.id,
        "delivery_id": msg.delivery_id,
        "lease_token": msg.lease_token,
        "topic": msg.topic,
        "channel": msg.channel,
        "body_b64": base64.b64encode(msg.body).decode("ascii"),
    }
    with contextlib.suppress(UnicodeDecodeError):
        out["body"] = msg.body.decode("utf-8")
    out["headers"] = msg.headers
    out["attempts"] = msg.attempts
    out["max_attempts"] = msg.max_attempts
    out["group"] = msg.group
    if hasattr(msg, "priority"):
        out["priority"] = msg.priority
    out["published_at"] = iso(msg.published_at)
    out["lease_expires_at"] = iso(msg.lease_expires_at) if leased else None
    return out


def plain(value: Any) -> Any:
    """A setting's value as JSON: durations in seconds, tuples as arrays."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    return value


def settings_json(settings: object) -> dict[str, Any]:
    """A channel's settings (every field of ``ChannelSettings``) as JSON."""
    found = plain(settings)
    assert isinstance(found, dict)
    return found
