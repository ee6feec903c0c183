"""Channel filters (DESIGN §8): CEL expressions over headers, group and topic,
checked at ensure_channel, evaluated at publish, failing closed; on both twins."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

import novaque
from tests.conftest import Backend, FakeClock

pytestmark = pytest.mark.usefixtures("twin")

GOLD = 'headers["tier"] == "gold"'


def bodies(client: novaque.Client, topic: str, channel: str) -> list[bytes]:
    got = client.claim(topic, channel, max_messages=100)
    client.ack_many(got)
    return [m.body for m in got]


@pytest.mark.parametrize(
    ("expression", "match"),
    [
        ("headers[", "does not parse"),
        ("tier == 'gold'", "uses tier"),
        ("group", "not boolean"),
        ('headers["tier"]', "not boolean"),
        ('topic + "x"', "not boolean"),
        ("size(topic)", "not boolean"),
        # Text no database stores.
        ('headers["k"] == "\udcff"', "lone surrogate"),
        ('headers["k"] == "a\x00b"', "NUL"),
        ("headers.tier == 'gold' // \udcff", "lone surrogate"),
    ],
)
def test_a_bad_filter_raises_invalid_filter_and_stores_nothing(
    client: novaque.Client, expression: str, match: str
) -> None:
    client.ensure_channel("t", "c", filter=GOLD)
    with pytest.raises(novaque.InvalidFilter, match=match) as raised:
        client.ensure_channel("t", "c", filter=expression)
    assert isinstance(raised.value, novaque.NovaqueError)
    assert client.channel_settings("t", "c").filter == GOLD
    with pytest.raises(novaque.InvalidFilter):
        client.ensure_channel("t", "new", filter=expression)
    assert client.list_channels("t") == ["c"]
    with pytest.raises(TypeError, match="filter must be a str"):
        client.ensure_channel("t", "c", filter=1)  # type: ignore[arg-type]


def test_a_filter_takes_only_the_messages_it_is_true_for(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "gold", filter=GOLD)
    client.ensure_channel("t", "eu", filter='topic == "t" && headers["region"].startsWith("eu-")')
    client.ensure_channel("t", "all")
    client.publish("t", b"g", headers={"tier": "gold", "region": "us-1"})
    client.publish_many("t", [b"s1", b"s2"], headers={"tier": "silver", "region": "eu-2"})
    client.publish("t", b"g-eu", headers={"tier": "gold", "region": "eu-1"})
    assert bodies(client, "t", "gold") == [b"g", b"g-eu"]
    assert bodies(client, "t", "eu") == [b"s1", b"s2", b"g-eu"]
    assert bodies(client, "t", "all") == [b"g", b"s1", b"s2", b"g-eu"]
    client.flush_stats()
    # A channel whose filter is false counts nothing.
    assert client.channel_counters("t", "gold").published == 2
    assert client.channel_counters("t", "all").published == 4


def test_group_is_the_empty_string_for_a_message_without_one(client: novaque.Client) -> None:
    client.ensure_channel("t", "ungrouped", filter='group == ""')
    client.ensure_channel("t", "grouped", filter='group != ""')
    client.publish("t", b"x")
    assert bodies(client, "t", "ungrouped") == [b"x"]
    assert bodies(client, "t", "grouped") == []


def test_an_evaluation_error_fails_closed_with_a_warning(
    client: novaque.Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.ensure_channel("t", "gold", filter=GOLD)
    client.ensure_channel("t", "all")
    with caplog.at_level(logging.WARNING, logger="novaque"):
        client.publish("t", b"no tier")  # headers["tier"]: no such key
    assert bodies(client, "t", "gold") == []
    assert bodies(client, "t", "all") == [b"no tier"]
    [record] = [r for r in caplog.records if "filter" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert GOLD in record.getMessage()
    assert "topic t" in record.getMessage()


def test_a_message_every_filter_refuses_is_stored_without_the_no_channel_warning(
    client: novaque.Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.ensure_channel("quiet", "gold", filter=GOLD)
    with caplog.at_level(logging.WARNING, logger="novaque"):
        message_id = client.publish("quiet", b"x", headers={"tier": "tin"})
    assert client.get_message(message_id).deliveries == []
    assert not [r for r in caplog.records if "has no channel" in r.getMessage()]


def test_removing_a_filter_with_the_empty_string_or_reset(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", filter=GOLD)
    client.ensure_channel("t", "c", filter="")
    assert client.channel_settings("t", "c").filter is None
    client.publish("t", b"1")
    client.ensure_channel("t", "c", filter=GOLD)
    client.publish("t", b"2")
    client.ensure_channel("t", "c", reset=("filter",))
    client.publish("t", b"3")
    assert bodies(client, "t", "c") == [b"1", b"3"]


def test_filters_hold_for_dedup_keys_and_a_callers_transaction(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "gold", filter=GOLD)
    client.ensure_channel("t", "all")
    client.publish("t", b"k", dedup_key="k", headers={"tier": "gold"})
    client.publish("t", b"k", dedup_key="k", headers={"tier": "gold"})  # no second copy
    client.publish("t", b"j", dedup_key="j", headers={"tier": "iron"})
    assert bodies(client, "t", "gold") == [b"k"]
    assert bodies(client, "t", "all") == [b"k", b"j"]
    if backend.twin == "sync":  # the twin's caller transactions are tested in test_aio
        with backend.engine().begin() as conn:
            client.publish("t", b"in-tx", headers={"tier": "gold"}, connection=conn)
        assert bodies(client, "t", "gold") == [b"in-tx"]


def test_a_filter_set_by_another_client_holds_for_the_next_publish(
    backend: Backend, clock: FakeClock
) -> None:
    publisher = backend.client(clock=clock)
    operator = backend.client(clock=clock)
    publisher.ensure_channel("t", "c")
    publisher.publish("t", b"before")  # the publisher knows the topic: one statement
    operator.ensure_channel("t", "c", filter=GOLD)
    publisher.publish("t", b"iron", headers={"tier": "iron"})
    publisher.publish_many("t", [b"gold"], headers={"tier": "gold"})
    operator.ensure_channel("t", "c", filter="")
    publisher.publish("t", b"after")
    assert bodies(operator, "t", "c") == [b"before", b"gold", b"after"]


def test_replay_honours_filters_unless_channels_are_named(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "gold", filter=GOLD)
    client.ensure_channel("t", "all")
    iron = client.publish("t", b"iron", headers={"tier": "iron"})
    gold = client.publish("t", b"gold", headers={"tier": "gold"})
    bodies(client, "t", "gold")
    bodies(client, "t", "all")
    assert client.replay(iron) == 1  # to "all" only
    assert client.replay(gold) == 2
    assert bodies(client, "t", "gold") == [b"gold"]
    assert bodies(client, "t", "all") == [b"iron", b"gold"]
    assert client.replay(iron, channels=["gold"]) == 1  # named: the filter is bypassed
    assert bodies(client, "t", "gold") == [b"iron"]
    since = clock() - __import__("datetime").timedelta(minutes=1)
    assert client.replay_range("t", since, clock() + __import__("datetime").timedelta(1)) == 3


@contextmanager
def statements(backend: Backend) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(*args: object) -> None:
        seen.append(str(args[2]))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", count)


#: Statements of a publish of one message, and of three, to a topic of plain
#: channels, as novaque sent them before filters existed (measured at
#: 72e7bf7): PostgreSQL one; SQLite the message and the fan-out (for three:
#: the messages, last_insert_rowid, the channels, the fan-out); MariaDB the
#: messages, the fan-out and SET TRANSACTION.
PUBLISH_STATEMENTS = {"postgres": (1, 1), "sqlite": (2, 4), "mysql": (3, 3)}


def test_publishing_to_a_topic_without_filters_costs_no_extra_statement(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("plain", "a")
    client.ensure_channel("plain", "b")
    client.ensure_channel("other", "gold", filter=GOLD)  # another topic's filter
    client.publish("plain", b"warm-up")  # learns the topic id
    with statements(backend) as seen:
        client.publish("plain", b"x")
    assert len(seen) == PUBLISH_STATEMENTS[backend.name][0], seen
    with statements(backend) as seen:
        client.publish_many("plain", [b"1", b"2", b"3"])
    assert len(seen) == PUBLISH_STATEMENTS[backend.name][1], seen
