"""The OpenAPI 3.1 document of the broker (``GET /v1/openapi.json``)."""

from __future__ import annotations

from typing import Any

from novaque import __version__
from novaque.broker import _wire

__all__ = ["document"]

_NUM = {"type": "number", "minimum": 0}
_STR = {"type": "string"}
_INT = {"type": "integer"}
_TIME = {"type": "string", "format": "date-time"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _obj(
    properties: dict[str, Any], required: tuple[str, ...] = (), **extra: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        out["required"] = list(required)
    out.update(extra)
    return out


def _errors(*statuses: int) -> dict[str, Any]:
    text = {
        400: "invalid: bad JSON, a bad field or a value out of range",
        401: "unauthorized: no token, or an unknown one",
        403: "forbidden: the token's scopes do not allow this",
        404: "not_found: the topic, channel or message does not exist",
        409: "dedup_conflict: a dedup_key is held by a message with another body, headers or group",
        413: "too_large: a body over the server's max_body_bytes, or a request over its bound",
        503: "unavailable: the database cannot be reached",
    }
    return {
        str(s): {
            "description": text[s],
            "content": {"application/json": {"schema": _ref("Error")}},
        }
        for s in (401, 503, *statuses)
    }


def _json_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def _ok(status: int, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description}
    if schema is not None:
        answer["content"] = {"application/json": {"schema": schema}}
    return {str(status): answer}


def _op(
    summary: str,
    ok: dict[str, Any],
    errors: tuple[int, ...],
    body: dict[str, Any] | None = None,
    *,
    scope: str,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "summary": summary,
        "description": f"Scope: {scope}.",
        "responses": {**ok, **_errors(*errors)},
    }
    if body is not None:
        out["requestBody"] = body
    return out


def document(setting_names: tuple[str, ...], priority: bool) -> dict[str, Any]:
    """The document; ``setting_names``: the channel settings PUT takes;
    ``priority``: whether messages carry a priority."""
    out_message: dict[str, Any] = {
        "id": _INT,
        "delivery_id": _INT,
        "lease_token": {**_STR, "description": '"" for a message received and deleted'},
        "topic": _STR,
        "channel": _STR,
        "body_b64": _STR,
        "body": {**_STR, "description": "present when the bytes are UTF-8"},
        "headers": {"type": "object", "additionalProperties": _STR},
        "attempts": _INT,
        "max_attempts": _INT,
        "group": _nullable(_STR),
        "published_at": _TIME,
        "lease_expires_at": _nullable(_TIME),
    }
    in_message: dict[str, Any] = {
        "body": {**_STR, "description": "UTF-8 text (exactly one of body and body_b64)"},
        "body_b64": {**_STR, "description": "base64 bytes (exactly one of body and body_b64)"},
        "headers": {"type": "object", "additionalProperties": _STR},
        "delay": {**_NUM, "description": "seconds before it is due"},
        "ttl": {**_NUM, "description": "seconds it lives"},
        "max_attempts": {**_INT, "minimum": 1},
        "dedup_key": _STR,
        "group": _STR,
    }
    if priority:
        out_message["priority"] = _INT
        in_message["priority"] = _INT
    settings: dict[str, Any] = {name: {} for name in setting_names}
    settings["paused"] = {"type": "boolean"}
    results = _obj(
        {
            "results": {
                "type": "array",
                "items": _obj(
                    {
                        "delivery_id": _INT,
                        "ok": {"type": "boolean"},
                        "error": {"enum": ["lease_lost", "invalid"]},
                        "message": _STR,
                        "lease_expires_at": _TIME,
                    },
                    ("delivery_id", "ok"),
                ),
            }
        },
        ("results",),
    )
    messages = _obj({"messages": {"type": "array", "items": _ref("Message")}}, ("messages",))
    count = _obj({"count": _INT}, ("count",))
    dead = {
        "ids": {"type": "array", "items": _INT},
        "limit": {**_INT, "minimum": 1},
        "died_before": _TIME,
    }
    channel = "/v1/topics/{topic}/channels/{channel}"
    consume = "consume:<topic glob>/<channel glob>, or admin"
    paths: dict[str, Any] = {
        "/v1/health": {
            "get": {
                "summary": "Whether the database answers (no token needed)",
                "security": [],
                "responses": {
                    "200": {"description": '{"status": "up"}'},
                    "503": {"description": '{"status": "down"}'},
                },
            }
        },
        "/v1/openapi.json": {
            "get": {
                "summary": "This document",
                "description": "Scope: any token.",
                "responses": {"200": {"description": "OpenAPI 3.1"}, **_errors()},
            }
        },
        "/v1/topics/{topic}/messages": {
            "post": _op(
                f"Publish 1-{_wire.MAX_PUBLISH} messages in one transaction",
                _ok(201, "their ids, in order", _obj({"ids": {"type": "array", "items": _INT}})),
                (400, 403, 409, 413),
                _json_body(
                    _obj(
                        {
                            "messages": {
                                "type": "array",
                                "items": _ref("NewMessage"),
                                "minItems": 1,
                                "maxItems": _wire.MAX_PUBLISH,
                            }
                        },
                        ("messages",),
                    )
                ),
                scope="publish:<topic glob>, or admin",
            )
        },
        "/v1/topics/{topic}": {
            "delete": _op(
                "Delete a topic, its channels and messages",
                _ok(204, "deleted"),
                (403, 404),
                scope="admin",
            )
        },
        channel: {
            "get": _op(
                "A channel's settings, backlog and today's counters",
                _ok(200, "the channel", {"type": "object"}),
                (403, 404),
                scope=consume,
            ),
            "put": _op(
                "Create the channel (and its topic) or change its settings; null resets one",
                _ok(200, "its settings", {"type": "object"}),
                (400, 403),
                _json_body({"type": "object", "properties": settings}, required=False),
                scope="admin",
            ),
            "delete": _op(
                "Delete a channel and its deliveries",
                _ok(204, "deleted"),
                (403, 404),
                scope="admin",
            ),
        },
        f"{channel}/receive": {
            "post": _op(
                "Receive messages (peek_lock leases them; receive_and_delete takes them), "
                f"waiting up to {_wire.MAX_WAIT_S:g} s for one",
                _ok(200, "the messages (none when the wait ran out)", messages),
                (400, 403, 404),
                _json_body(
                    _obj(
                        {
                            "max_messages": {**_INT, "minimum": 1, "maximum": _wire.MAX_RECEIVE},
                            "wait": {**_NUM, "maximum": _wire.MAX_WAIT_S},
                            "lease": {**_NUM, "exclusiveMinimum": 0},
                            "mode": {"enum": list(_wire.MODES)},
                            "attempt_id": _STR,
                        }
                    ),
                    required=False,
                ),
                scope=consume,
            )
        },
        f"{channel}/settle": {
            "post": _op(
                f"Settle 1-{_wire.MAX_ITEMS} leased deliveries, each fenced on its token",
                _ok(200, "one result per item, in order", results),
                (400, 403, 404, 413),
                _json_body(
                    _obj(
                        {
                            "items": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": _wire.MAX_ITEMS,
                                "items": _obj(
                                    {
                                        "delivery_id": _INT,
                                        "lease_token": _STR,
                                        "action": {"enum": list(_wire.SETTLE_ACTIONS)},
                                        "delay": {
                                            **_NUM,
                                            "description": "abandon (default: the backoff) "
                                            "and snooze (required)",
                                        },
                                        "error": {**_STR, "description": "abandon"},
                                        "reason": {**_STR, "description": "dead_letter"},
                                    },
                                    ("delivery_id", "lease_token", "action"),
                                ),
                            }
                        },
                        ("items",),
                    )
                ),
                scope=consume,
            )
        },
        f"{channel}/renew": {
            "post": _op(
                "Extend leases, each fenced on its token",
                _ok(200, "one result per item, in order", results),
                (400, 403, 404, 413),
                _json_body(
                    _obj(
                        {
                            "items": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": _wire.MAX_ITEMS,
                                "items": _obj(
                                    {"delivery_id": _INT, "lease_token": _STR},
                                    ("delivery_id", "lease_token"),
                                ),
                            },
                            "lease": {**_NUM, "exclusiveMinimum": 0},
                        },
                        ("items",),
                    )
                ),
                scope=consume,
            )
        },
        f"{channel}/deferred": {
            "post": _op(
                "Lease deferred deliveries by id",
                _ok(200, "the messages leased", messages),
                (400, 403, 404, 413),
                _json_body(
                    _obj(
                        {
                            "delivery_ids": {
                                "type": "array",
                                "items": _INT,
                                "minItems": 1,
                                "maxItems": _wire.MAX_DEFERRED,
                            },
                            "lease": {**_NUM, "exclusiveMinimum": 0},
                        },
                        ("delivery_ids",),
                    )
                ),
                scope=consume,
            )
        },
        f"{channel}/dead/requeue": {
            "post": _op(
                "Requeue dead letters (all, or those chosen), maybe to another channel",
                _ok(200, "how many", count),
                (400, 403, 404),
                _json_body(_obj({**dead, "to_channel": _STR}), required=False),
                scope="admin",
            )
        },
        f"{channel}/dead/delete": {
            "post": _op(
                "Delete dead letters (all, or those chosen)",
                _ok(200, "how many", count),
                (400, 403, 404),
                _json_body(_obj(dead), required=False),
                scope="admin",
            )
        },
        "/v1/messages/{id}/cancel": {
            "post": _op(
                "Delete a message's deliveries that were never attempted",
                _ok(200, "how many", count),
                (400, 403, 404),
                scope="admin",
            )
        },
    }
    for path, item in paths.items():
        names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
        if names:
            item["parameters"] = [
                {"name": n, "in": "path", "required": True, "schema": _STR} for n in names
            ]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "novaque broker",
            "version": __version__,
            "description": "Publish and consume novaque queues over HTTP. Durations are "
            "seconds; times are ISO 8601 with a zone.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Message": _obj(out_message, tuple(k for k in out_message if k != "body")),
                "NewMessage": _obj(in_message),
                "Error": _obj(
                    {
                        "error": _obj(
                            {
                                "code": {
                                    "enum": [
                                        "invalid",
                                        "unauthorized",
                                        "forbidden",
                                        "not_found",
                                        "dedup_conflict",
                                        "too_large",
                                        "unavailable",
                                        "internal",
                                    ]
                                },
                                "message": _STR,
                            },
                            ("code", "message"),
                        )
                    },
                    ("error",),
                ),
            },
        },
    }
