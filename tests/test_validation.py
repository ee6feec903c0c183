"""Bad input raises the named error, with the value and the limit, before any write."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

import novaque
from novaque.schema import messages, topics
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")


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
        # Both are 1 s as stored (whole microseconds).
        ({"delay": 0.9999996, "ttl": 1.0000004}, "shorter than the ttl"),
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
        ({"default_max_attempts": 0}, "Options.default_max_attempts must be between 1"),
        ({"poll_interval": -1}, "Options.poll_interval"),
        ({"backoff": 5}, "must be a novaque.Backoff"),
        ({"dead_max_count": -1}, "Options.dead_max_count must be between 0"),
        ({"dead_max_count": 2**40}, "between 0 and 2147483647, got 1099511627776"),
        ({"default_max_attempts": 2**40}, "between 1 and 1000000, got 1099511627776"),
        ({"maintenance_batch": 10**6}, "between 1 and 10000, got 1000000"),
        ({"stats_retention_days": 10**9}, "between 1 and 36500, got 1000000000"),
        ({"dead_max_age": timedelta(days=4000)}, "the limit is 315360000 s"),
    ],
)
@pytest.mark.sync_only
def test_bad_options(fields: dict[str, object], pattern: str) -> None:
    with pytest.raises(novaque.InvalidOption, match=pattern):
        novaque.Options(**fields)  # type: ignore[arg-type]


@pytest.mark.sync_only
def test_backoff_validates_its_durations() -> None:
    with pytest.raises(novaque.InvalidOption, match="Backoff.base must be >= 0"):
        novaque.Backoff(base=-1)
    # A retry is due at most 90 days away: a larger backoff would overflow visible_at.
    with pytest.raises(
        novaque.InvalidOption, match="Backoff.cap is 1000000000000 s; the limit is 7776000"
    ):
        novaque.Backoff(cap=1e12)
    with pytest.raises(novaque.InvalidOption, match="Backoff.base is"):
        novaque.Backoff(base=timedelta(days=91))


# -- numbers and text the driver would refuse: InvalidOption, before any statement ----------

MAX_ID = 2**63 - 1
ID_LIMIT = "between 1 and 9223372036854775807"


def test_headers_up_to_what_every_backend_stores(backend: Backend, client: novaque.Client) -> None:
    # {"k":"..."} is 8 bytes of JSON around the value; MySQL/MariaDB TEXT holds 65,535.
    largest = {"k": "v" * (65_535 - 8)}
    message_id = client.publish("t", b"x", headers=largest)
    assert client.get_message(message_id).headers == largest
    with pytest.raises(novaque.InvalidOption, match="65536 bytes as JSON; the limit is 65535"):
        client.publish("t", b"x", headers={"k": "v" * (65_536 - 8)})
    with pytest.raises(novaque.InvalidOption, match="65537 bytes"):  # é is 2 bytes
        client.publish_many("t", [b"x"], headers={"k": "é" + "v" * (65_535 - 8)})
    assert table_counts(backend) == (1, 1)


#: Header text that JSON keeps exactly (NUL and the other control characters
#: as escapes, whatever else as UTF-8), read back as given on every backend.
EXACT_HEADERS = {
    "nul": "a\x00b",
    "key\x00": "v",
    "controls": "\x01\t\n\x1f\x7f\x9f",
    'quote"\\': "\\u0000 is six characters here",
    "ümlaut ✓": "😀 \u2028 \ufeff \ufffd",
    "": "",
}


def test_headers_come_back_exactly_as_published(backend: Backend, client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    # The filter reads the headers as stored: "a\x00b" is three characters.
    client.ensure_channel("t", "filtered", filter='headers["nul"].size() == 3')
    message_id = client.publish("t", b"x", headers=EXACT_HEADERS)
    [many] = client.publish_many("t", [b"y"], headers={"k": "\x00"})
    assert client.get_message(message_id).headers == EXACT_HEADERS
    assert client.get_message(many).headers == {"k": "\x00"}
    first, second = client.claim("t", "c", max_messages=2)
    assert (first.headers, second.headers) == (EXACT_HEADERS, {"k": "\x00"})
    (routed,) = client.claim("t", "filtered")
    assert (routed.id, routed.headers) == (message_id, EXACT_HEADERS)
    # NUL is stored as JSON's escape, which every backend's text holds.
    with backend.engine().connect() as conn:
        stored = conn.execute(sa.select(messages.c.headers).where(messages.c.id == many)).scalar()
    assert stored == '{"k":"\\u0000"}'


@pytest.mark.parametrize(
    ("headers", "shown"),
    [
        ({"path": "caf\udce9"}, "headers['path'] holds '\\udce9' at index 3"),
        (
            {"ok": "v", "bad\ud800key": "v"},
            "headers key 'bad\\ud800key' holds '\\ud800' at index 3",
        ),
        # Two surrogates are no character of a str, and JSON would join them into one.
        ({"pair": "\ud83d\ude00"}, "headers['pair'] holds '\\ud83d' at index 0"),
    ],
)
def test_headers_holding_a_lone_surrogate_are_refused_naming_the_key(
    backend: Backend, client: novaque.Client, headers: dict[str, str], shown: str
) -> None:
    with pytest.raises(novaque.InvalidOption) as raised:
        client.publish("t", b"x", headers=headers)
    assert str(raised.value).startswith(shown + ": ")
    assert "lone surrogate" in str(raised.value)
    with pytest.raises(novaque.InvalidOption, match="lone surrogate"):
        client.publish_many("t", [b"x"], headers=headers)
    assert table_counts(backend) == (0, 0)


def test_headers_hold_at_most_128_keys(backend: Backend, client: novaque.Client) -> None:
    """The count bounds what a channel's filter may cost each publish."""
    client.ensure_channel("t", "c")
    most = {f"k{i:03}": "v" for i in range(128)}
    client.publish("t", b"ok", headers=most)
    for call in (
        lambda: client.publish("t", b"x", headers={**most, "one-more": "v"}),
        lambda: client.publish_many("t", [b"x"], headers={**most, "one-more": "v"}),
    ):
        with pytest.raises(novaque.InvalidOption) as raised:
            call()
        assert str(raised.value) == (
            "headers hold 129 keys; the limit is 128 (put larger sets of values in the body)"
        )
    assert table_counts(backend) == (1, 1)
    [message] = client.claim("t", "c")
    assert message.headers == most


@pytest.mark.parametrize("key", ["nul\x00key", "surrogate\udcffkey"])
def test_a_dedup_key_the_database_cannot_store_is_refused(
    backend: Backend, client: novaque.Client, key: str
) -> None:
    with pytest.raises(novaque.InvalidOption, match="may not contain NUL or lone surrogates"):
        client.publish("t", b"x", dedup_key=key)
    with pytest.raises(novaque.InvalidOption, match="at index"):
        client.publish_many("t", [b"x", b"y"], dedup_keys=["fine", key])
    assert table_counts(backend) == (0, 0)


@pytest.mark.parametrize("bad", [2**63, 10**30, 10**5000], ids=["2**63", "10**30", "10**5000"])
def test_ids_beyond_64_bits_are_refused(backend: Backend, client: novaque.Client, bad: int) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    for call in (
        lambda: client.get_message(bad),
        lambda: client.replay(bad),
        lambda: client.requeue_dead("t", "c", [1, bad]),
        lambda: client.delete_dead("t", "c", [bad]),
    ):
        with pytest.raises(novaque.InvalidOption, match=ID_LIMIT):
            call()
    for call in (
        lambda: client.list_dead("t", "c", after_id=bad),
        lambda: client.list_messages("t", after_id=bad),
    ):
        with pytest.raises(novaque.InvalidOption, match="after_id must be between 0 and"):
            call()
    assert table_counts(backend) == (1, 1)


def test_ids_at_the_64_bit_limit_and_below_one(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    # The largest id reaches the database, which simply has no such row.
    with pytest.raises(novaque.MessageNotFound):
        client.get_message(MAX_ID)
    with pytest.raises(novaque.MessageNotFound):
        client.replay(MAX_ID)
    assert client.list_dead("t", "c", after_id=MAX_ID) == []
    assert client.list_messages("t", after_id=MAX_ID) == []
    assert client.requeue_dead("t", "c", [MAX_ID]) == 0
    assert client.delete_dead("t", "c", [MAX_ID]) == 0
    for bad in (0, -1):
        with pytest.raises(novaque.InvalidOption, match=ID_LIMIT):
            client.get_message(bad)
        with pytest.raises(novaque.InvalidOption, match=ID_LIMIT):
            client.replay(bad)
        with pytest.raises(novaque.InvalidOption, match=ID_LIMIT):
            client.delete_dead("t", "c", [bad])
    with pytest.raises(novaque.InvalidOption, match="after_id must be between 0"):
        client.list_messages("t", after_id=-1)


def test_channel_bounds_beyond_their_columns_are_refused(
    backend: Backend, client: novaque.Client
) -> None:
    with pytest.raises(novaque.InvalidOption, match="between 0 and 2147483647, got 1099511627776"):
        client.ensure_channel("t", "c", dead_max_count=2**40)
    with pytest.raises(novaque.InvalidOption, match="dead_max_age is .* the limit is 315360000 s"):
        client.ensure_channel("t", "c", dead_max_age=1e18)
    assert table_counts(backend) == (0, 0)
    client.ensure_channel("t", "c", dead_max_count=2**31 - 1, dead_max_age=timedelta(days=3650))
    assert client.list_channels("t") == ["c"]


def test_a_naive_clock_is_refused(backend: Backend) -> None:
    client = backend.client(clock=lambda: datetime(2026, 1, 1))
    with pytest.raises(novaque.InvalidOption, match="timezone-aware"):
        client.publish("t", b"x")


@pytest.mark.sync_only
def test_errors_share_one_base_and_the_usual_builtins() -> None:
    for error in (novaque.InvalidName, novaque.InvalidOption, novaque.MessageTooLarge):
        assert issubclass(error, ValueError)
        assert issubclass(error, novaque.NovaqueError)
    for error in (novaque.TopicNotFound, novaque.ChannelNotFound, novaque.MessageNotFound):
        assert issubclass(error, LookupError)
    assert not issubclass(novaque.Reject, novaque.NovaqueError)
    assert novaque.Reject("why").reason == "why"


# -- durations: kept in whole microseconds ----------------------------------------------------

#: Positive durations that round to 0 microseconds (4e-7 s is 0.4 us).
BELOW_ONE_US = [1e-9, 4e-7, timedelta(0)]


@pytest.mark.parametrize("short", BELOW_ONE_US, ids=["1e-9", "4e-7", "timedelta(0)"])
def test_a_positive_duration_that_rounds_to_0_us_is_refused(
    backend: Backend, client: novaque.Client, clock: FakeClock, short: float | timedelta
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"deferred")
    (deferring,) = client.claim("t", "c")
    client.defer(deferring)
    message_id = client.publish("t", b"x")
    given = short.total_seconds() if isinstance(short, timedelta) else short
    calls: list[tuple[str, Callable[[], object]]] = [
        ("lease", lambda: client.ensure_channel("t", "c", lease=short)),
        ("dead_max_age", lambda: client.ensure_channel("t", "c", dead_max_age=short)),
        ("lease", lambda: client.claim("t", "c", lease=short)),
        ("wait", lambda: client.claim("t", "c", wait=short)),
        ("wait", lambda: client.pop("t", "c", wait=short)),
        ("lease", lambda: client.claim_deferred("t", "c", [deferring.delivery_id], lease=short)),
        ("ttl", lambda: client.publish("t", b"y", ttl=short)),
        ("ttl", lambda: client.publish_many("t", [b"y"], ttl=short)),
        ("lease", lambda: client.subscribe("t", "c", print, lease=short)),
        ("poll_interval", lambda: client.subscribe("t", "c", print, poll_interval=short)),
    ]
    for name, call in calls:
        with pytest.raises(novaque.InvalidOption) as raised:
            call()
        assert str(raised.value) == (
            f"{name} must be > 0 seconds, got {given!r}"
            + ("" if given == 0 else ", which rounds to 0 (durations are whole microseconds)")
        )
    settings = client.channel_settings("t", "c")
    assert (settings.lease, settings.dead_max_age) == (None, None)
    assert table_counts(backend) == (1, 2)
    # Nothing was claimed by the refused calls: the message is still there to claim.
    (msg,) = client.claim("t", "c")
    assert (msg.id, msg.attempts) == (message_id, 1)
    with pytest.raises(novaque.InvalidOption, match="lease must be > 0 seconds"):
        client.renew(msg, lease=short)
    assert client.renew(msg) == clock() + timedelta(seconds=30)


@pytest.mark.sync_only
@pytest.mark.parametrize(
    "field",
    [
        "default_lease",
        "default_ttl",
        "poll_interval",
        "reap_interval",
        "purge_interval",
        "stats_flush_interval",
        "stats_prune_interval",
        "consumer_heartbeat",
        "dead_max_age",
        "watch_interval",
        "watch_idle_interval",
    ],
)
def test_options_refuse_a_positive_duration_that_rounds_to_0_us(field: str) -> None:
    with pytest.raises(novaque.InvalidOption, match=rf"^Options\.{field} must be > 0 seconds"):
        novaque.Options(**{field: 4e-7})  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidOption, match="which rounds to 0"):
        novaque.Options(**{field: 1e-9})  # type: ignore[arg-type]
    novaque.Options(**{field: 6e-7})  # type: ignore[arg-type]  # 1 us


def test_durations_are_kept_to_the_nearest_microsecond(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    # 1.001 * 1e6 is 1000999.9999999999 as a float: truncated, it lost a microsecond.
    client.ensure_channel("t", "c", lease=1.001, dead_max_age=1.003)
    settings = client.channel_settings("t", "c")
    assert (settings.lease, settings.dead_max_age) == (
        timedelta(seconds=1.001),
        timedelta(seconds=1.003),
    )
    message_id = client.publish("t", b"x", ttl=1.005, delay=1.003)
    info = client.get_message(message_id)
    assert info.expires_at - info.published_at == timedelta(seconds=1.005)
    assert info.deliveries[0].visible_at == clock() + timedelta(seconds=1.003)
    clock.advance(1.003)
    (msg,) = client.claim("t", "c", lease=1.007)
    assert msg.lease_expires_at == clock() + timedelta(seconds=1.007)
    assert client.renew(msg, lease=1.009) == clock() + timedelta(seconds=1.009)
    # The shortest lease, 6e-7 s rounded to 1 us: a claim at the same clock
    # reading does not take the delivery again.
    client.requeue(msg, delay=0)
    client.ensure_channel("t", "c", lease=6e-7)
    assert client.channel_settings("t", "c").lease == timedelta(microseconds=1)
    (again,) = client.claim("t", "c")
    assert again.lease_expires_at == clock() + timedelta(microseconds=1)
    assert client.claim("t", "c") == []
    clock.advance(timedelta(microseconds=1))
    assert [m.id for m in client.claim("t", "c")] == [message_id]
