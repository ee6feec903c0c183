"""``python -m tests.django_project scenario NAME``: one scenario of
tests/test_django.py, run in a configured Django process; prints its
observations as one JSON line."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import sqlalchemy as sa
from django.core.management.base import BaseCommand
from django.db import DEFAULT_DB_ALIAS, connection, transaction

import novaque
import novaque.django
from novaque.django import _connect
from novaque.errors import TopicNotFound
from tests.django_project.shop.models import Order


class Failed(Exception):
    """Raised inside an atomic block to roll it back."""


def body(order: int) -> str:
    return json.dumps({"order": order})


def stored_bodies() -> list[str]:
    """Every message of topic orders (what is stored, claimed or not)."""
    try:
        found = novaque.django.client().list_messages("orders")
    except TopicNotFound:
        return []
    return sorted(m.body.decode() for m in found)


def claim_all() -> list[str]:
    made = novaque.django.client()
    claimed = made.claim("orders", "mailer", max_messages=100)
    made.ack_many(claimed)
    return sorted(m.body.decode() for m in claimed)


def published() -> int:
    made = novaque.django.client()
    made.flush_stats()
    return made.channel_counters("orders", "mailer").published


def orders() -> list[int]:
    return sorted(Order.objects.values_list("number", flat=True))


def peek(url: str) -> int:
    """How many messages another connection sees."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT COUNT(*) FROM novaque_messages").scalar_one())
    finally:
        engine.dispose()


#: Words of transaction control, inside a compound statement too.
_CONTROL = re.compile(
    r"\b(COMMIT|ROLLBACK|SAVEPOINT|START\s+TRANSACTION|SET\s+TRANSACTION)\b", re.I
)


def statement_kind(statement: str) -> str:
    """A statement's first word; ``BLOCK`` for a MariaDB compound statement
    (``BEGIN NOT ATOMIC``: one statement, no transaction of its own) unless
    it controls the transaction inside (then ``BLOCK+CONTROL``)."""
    if re.match(r"\s*BEGIN\s+NOT\s+ATOMIC\b", statement, re.I):
        return "BLOCK+CONTROL" if _CONTROL.search(statement) else "BLOCK"
    return statement.split(None, 1)[0].upper()


def commit() -> dict[str, Any]:
    """Publishing in a block that commits; the publish is the process's first
    call of novaque, after a write of Django's (SQLite: Django holds the write lock)."""
    sent: list[str] = []
    lending = _connect._entry(DEFAULT_DB_ALIAS).borrowing()

    @sa.event.listens_for(lending, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement_kind(statement))

    with transaction.atomic():
        Order.objects.create(number=1)
        first = novaque.django.publish("orders", body(1), headers={"source": "shop"})
        many = novaque.django.publish_many("orders", [body(10), body(11)])
        inside = [connection.in_atomic_block, connection.get_autocommit()]
        seen_before_commit = peek(os.environ["NOVAQUE_DJANGO_URL"])
    message = novaque.django.client().get_message(first)
    return {
        "ids": [first, *many],
        "inside": inside,
        "headers": message.headers,
        "orders": orders(),
        "claimed": claim_all(),
        "published": published(),
        "seen_before_commit": seen_before_commit,
        "sent": sorted(set(sent)),
    }


def rollback() -> dict[str, Any]:
    try:
        with transaction.atomic():
            Order.objects.create(number=2)
            novaque.django.publish("orders", body(2))
            raise Failed
    except Failed:
        pass
    return {
        "orders": orders(),
        "stored": stored_bodies(),
        "claimed": claim_all(),
        "published": published(),
    }


def savepoint() -> dict[str, Any]:
    """A publish in a savepoint that rolls back, inside a block that commits."""
    with transaction.atomic():
        Order.objects.create(number=3)
        novaque.django.publish("orders", body(3))
        try:
            with transaction.atomic():
                novaque.django.publish("orders", body(4))
                raise Failed
        except Failed:
            pass
        novaque.django.publish("orders", body(5))
    return {"orders": orders(), "claimed": claim_all(), "published": published()}


def outside() -> dict[str, Any]:
    """Publishing in autocommit mode: the call opens its own atomic block."""
    made = novaque.django.client()
    mid = novaque.django.publish("orders", body(6))
    after = [connection.in_atomic_block, connection.get_autocommit()]
    # A publish that fails after its rows were written leaves none of them.
    dialect = type(made._context.dialect)
    original = dialect.publish_plain

    def write_then_fail(self: Any, *args: Any, **kwargs: Any) -> Any:
        original(self, *args, **kwargs)
        raise Failed

    dialect.publish_plain = write_then_fail  # type: ignore[method-assign]
    try:
        novaque.django.publish("orders", body(7))
    except Failed:
        failed = True
    else:
        failed = False
    finally:
        dialect.publish_plain = original  # type: ignore[method-assign]
    return {
        "id": mid,
        "after": after,
        "failed": failed,
        "stored": stored_bodies(),
        "claimed": claim_all(),
        "published": published(),
    }


def errors() -> dict[str, str]:
    seen: dict[str, str] = {}
    for name, call in {
        "alias": lambda: novaque.django.publish("orders", "x", using="nope"),
        "engine": lambda: novaque.django.client("legacy"),
        "connection": lambda: novaque.django.publish("orders", "x", connection=None),
        "option": lambda: novaque.django.publish("orders", "x", delay=-1),
    }.items():
        try:
            call()
        except Exception as exc:
            seen[name] = f"{type(exc).__name__}: {exc}"
    return seen


def publish_orders() -> dict[str, Any]:
    """For ``manage.py novaque run``: two committed orders, each with its message."""
    ids = []
    for number in (20, 21):
        with transaction.atomic():
            Order.objects.create(number=number)
            ids.append(novaque.django.publish("orders", body(number)))
    return {"ids": ids}


SCENARIOS = {f.__name__: f for f in (commit, rollback, savepoint, outside, errors, publish_orders)}


class Command(BaseCommand):
    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", choices=sorted(SCENARIOS))

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(json.dumps(SCENARIOS[options["name"]]()))
