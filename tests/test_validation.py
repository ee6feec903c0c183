"""Bad input raises the named error, with the value and the limit, before any write."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

import novaque
from novaque.schema import messages, topics
from tests.conftest import Backend


def table_counts(backend: Backend) -> tuple[int, int]:
    with backend.engine().connect() as conn:
        return (
            conn.execute(sa.select(sa.func.count()).select_from(topics)).scalar_one(),
            conn.execute(sa.select(sa.func.count()).select_from(messages)).scalar_one(),
        )


BAD_NAMES = ["", "a" * 201, "has space", "slash/name", "ümlaut", "new\nline", "trailing\n", "*"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused_before_touching_the_database(
    backend: Backend, client: novaque.Client, name: str
) -> None:
    with pytest.raises(novaque.InvalidName, match="1-200 characters"):
        client.publish(name, b"x")
    with pytest.raises(novaque.InvalidName):
        client.ensure_channel("ok", name)
    with pytest.raises(novaque.InvalidName):
        client.claim(name, "c")
    assert table_counts(backend) == (0, 0)


def test_names_at_the_limits_are_accepted(client: novaque.Client) -> None:
    longest = "a" * 200
    client.ensure_channel(longest, "A-z.0_9:x")
    client.publish(longest, b"x")
    assert client.list_topics() == [longest]
    with pytest.raises(novaque.InvalidName, match="must be a str"):
        client.publish(42, b"x")  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [None, 42, 1.5, ["list"], {"a": 1}, bytearray(b"x")])
def test_body_must_be_bytes_or_str(backend: Backend, client: novaque.Client, body: object) -> None:
    with pytest.raises(TypeError, match="bytes or str"):
        client.publish("t", body)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes or str"):
        client.publish_many("t", [b"fine", body])  # type: ignore[list-item]
    assert table_counts(backend) == (0, 0)


def test_body_over_the_limit_is_too_large(backend: Backend) -> None:
    client = backend.client(max_body_bytes=10)
    client.publish("t", b"0123456789")
    with pytest.raises(novaque.MessageTooLarge, match="11 bytes, larger than max_body_bytes=10"):
        client.publish("t", b"01234567890")
    with pytest.raises(novaque.MessageTooLarge):
        client.publish("t", "ééééééé")  # 14 bytes in UTF-8
    assert table_counts(backend) == (1, 1)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"delay": -1}, "delay must be >= 0"),
        ({"delay": timedelta(days=91)}, "limit is 7776000 s"),
        ({"delay": 3600, "ttl": 3600}, "shorter than the ttl"),
        ({"ttl": 0}, "ttl must be > 0"),
        ({"ttl": timedelta(days=4000)}, "3650 days"),
        ({"ttl": "soon"}, "timedelta or a number"),
        ({"max_attempts": 0}, "max_attempts must be between 1"),
        ({"max_attempts": 2.5}, "must be an integer"),
        ({"delay": float("nan")}, "delay must be >= 0"),
    ],
)
def test_bad_publish_options_raise_invalid_option(
    backend: Backend, client: novaque.Client, kwargs: dict[str, object], pattern: str
) -> None:
    with pytest.raises(novaque.InvalidOption, match=pattern):
        client.publish("t", b"x", **kwargs)  # type: ignore[arg-type]
    assert table_counts(backend) == (0, 0)


def test_bad_headers_and_dedup_keys(client: novaque.Client) -> None:
    with pytest.raises(TypeError, match="headers must map str to str"):
        client.publish("t", b"x", headers={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="headers must be a dict"):
        client.publish("t", b"x", headers=[("a", "b")])  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidOption, match="dedup_key must be 1-200"):
        client.publish("t", b"x", dedup_key="")
    with pytest.raises(novaque.InvalidOption, match="2 entries for 1 bodies"):
        client.publish_many("t", [b"x"], dedup_keys=["a", "b"])


def test_bad_claim_and_settle_arguments(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    with pytest.raises(novaque.InvalidOption, match="lease must be > 0"):
        client.claim("t", "c", lease=0)
    with pytest.raises(novaque.InvalidOption, match="max_messages must be between 1 and 1000"):
        client.claim("t", "c", max_messages=0)
    client.publish("t", b"x")
    (msg,) = client.claim("t", "c")
    with pytest.raises(novaque.InvalidOption, match="delay must be >= 0"):
        client.requeue(msg, delay=-5)
    with pytest.raises(novaque.InvalidOption, match="lease must be > 0"):
        client.renew(msg, lease=-1)
    client.ack(msg)  # nothing above touched the lease


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        ({"default_lease": 0}, "Options.default_lease must be > 0"),
        ({"max_in_flight": 0}, "Options.max_in_flight must be >= 1"),
        ({"default_max_attempts": 0}, "Options.default_max_attempts must be >= 1"),
        ({"poll_interval": -1}, "Options.poll_interval"),
        ({"backoff": 5}, "must be a novaque.Backoff"),
        ({"dead_max_count": -1}, "Options.dead_max_count must be >= 0"),
    ],
)
def test_bad_options(fields: dict[str, object], pattern: str) -> None:
    with pytest.raises(novaque.InvalidOption, match=pattern):
        novaque.Options(**fields)  # type: ignore[arg-type]


def test_backoff_validates_its_durations() -> None:
    with pytest.raises(novaque.InvalidOption, match="Backoff.base must be >= 0"):
        novaque.Backoff(base=-1)


def test_a_naive_clock_is_refused(backend: Backend) -> None:
    client = backend.client(clock=lambda: datetime(2026, 1, 1))
    with pytest.raises(novaque.InvalidOption, match="timezone-aware"):
        client.publish("t", b"x")


def test_errors_share_one_base_and_the_usual_builtins() -> None:
    for error in (novaque.InvalidName, novaque.InvalidOption, novaque.MessageTooLarge):
        assert issubclass(error, ValueError)
        assert issubclass(error, novaque.NovaqueError)
    for error in (novaque.TopicNotFound, novaque.ChannelNotFound, novaque.MessageNotFound):
        assert issubclass(error, LookupError)
    assert not issubclass(novaque.Reject, novaque.NovaqueError)
    assert novaque.Reject("why").reason == "why"
