"""Channel settings (DESIGN §8): ensure_channel's settings, channel_settings(),
a channel's lease and max_attempts, pause and resume; on both twins."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

import novaque
from tests.conftest import Backend, FakeClock

pytestmark = pytest.mark.usefixtures("twin")

WAIT = 30.0
DEFAULTS = novaque.ChannelSettings(
    ordering="standard",
    filter=None,
    lease=None,
    max_attempts=None,
    dead_max_age=None,
    dead_max_count=None,
    dead_max_bytes=None,
    dead_letter_expired=None,
    paused=False,
)


def test_a_new_channel_takes_the_settings_given_and_the_defaults_for_the_rest(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "plain")
    assert client.channel_settings("t", "plain") == DEFAULTS
    client.ensure_channel(
        "t", "tuned", ordering="group_fifo", lease=90, max_attempts=2, dead_max_count=5
    )
    assert client.channel_settings("t", "tuned") == novaque.ChannelSettings(
        ordering="group_fifo",
        filter=None,
        lease=timedelta(seconds=90),
        max_attempts=2,
        dead_max_age=None,
        dead_max_count=5,
        dead_max_bytes=None,
        dead_letter_expired=None,
        paused=False,
    )


def test_settings_given_replace_the_stored_ones_and_reset_restores_defaults(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "c", ordering="strict_fifo", lease=timedelta(minutes=2))
    client.ensure_channel("t", "c", max_attempts=7)  # the others keep their values
    got = client.channel_settings("t", "c")
    assert (got.ordering, got.lease, got.max_attempts) == ("strict_fifo", timedelta(minutes=2), 7)
    client.ensure_channel("t", "c", dead_max_age=3600, reset=("lease", "ordering"))
    got = client.channel_settings("t", "c")
    assert (got.ordering, got.lease, got.max_attempts) == ("standard", None, 7)
    assert got.dead_max_age == timedelta(hours=1)
    client.ensure_channel("t", "c", reset=["max_attempts", "dead_max_age"])
    assert client.channel_settings("t", "c") == DEFAULTS


def test_the_dead_letter_settings_of_section_9_are_stored_and_reset(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "c", dead_max_bytes=1 << 20, dead_letter_expired=True)
    got = client.channel_settings("t", "c")
    assert (got.dead_max_bytes, got.dead_letter_expired) == (1 << 20, True)
    client.ensure_channel("t", "c", dead_letter_expired=False)  # False is a value, not a reset
    got = client.channel_settings("t", "c")
    assert (got.dead_max_bytes, got.dead_letter_expired) == (1 << 20, False)
    client.ensure_channel("t", "c", reset=("dead_max_bytes", "dead_letter_expired"))
    assert client.channel_settings("t", "c") == DEFAULTS


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"ordering": "fifo"}, novaque.InvalidOption, "ordering"),
        ({"ordering": 1}, TypeError, "ordering"),
        ({"lease": 0}, novaque.InvalidOption, "lease"),
        ({"lease": -5}, novaque.InvalidOption, "lease"),
        ({"max_attempts": 0}, novaque.InvalidOption, "max_attempts"),
        ({"dead_max_count": -1}, novaque.InvalidOption, "dead_max_count"),
        ({"dead_max_age": -1}, novaque.InvalidOption, "dead_max_age"),
        ({"dead_max_bytes": -1}, novaque.InvalidOption, "dead_max_bytes"),
        ({"dead_max_bytes": 2**63}, novaque.InvalidOption, "dead_max_bytes"),
        ({"dead_letter_expired": "yes"}, TypeError, "dead_letter_expired"),
        ({"reset": ("colour",)}, novaque.InvalidOption, "colour"),
        ({"reset": "lease"}, TypeError, "reset"),
        ({"lease": 5, "reset": ("lease",)}, novaque.InvalidOption, "both"),
    ],
)
def test_bad_settings_are_refused_and_store_nothing(
    client: novaque.Client, settings: dict[str, object], error: type[Exception], match: str
) -> None:
    client.ensure_channel("t", "c", max_attempts=4)
    with pytest.raises(error, match=match):
        client.ensure_channel("t", "c", **settings)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        client.ensure_channel("t", "new", **settings)  # type: ignore[arg-type]
    assert client.list_channels("t") == ["c"]
    assert client.channel_settings("t", "c") == novaque.ChannelSettings(
        **{**vars_of(DEFAULTS), "max_attempts": 4}
    )


def vars_of(settings: novaque.ChannelSettings) -> dict[str, object]:
    return {name: getattr(settings, name) for name in settings.__slots__}


def test_missing_names_raise_not_found(client: novaque.Client) -> None:
    with pytest.raises(novaque.TopicNotFound):
        client.channel_settings("nope", "c")
    client.ensure_topic("t")
    for call in (client.channel_settings, client.pause_channel, client.resume_channel):
        with pytest.raises(novaque.ChannelNotFound):
            call("t", "c")


def test_the_channel_lease_serves_claims_and_renewals_that_name_none(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "slow", lease=600)
    client.ensure_channel("t", "fast")
    client.publish("t", b"x")
    now = clock()
    [slow] = client.claim("t", "slow")
    assert slow.lease_expires_at == now + timedelta(seconds=600)
    [fast] = client.claim("t", "fast")  # no setting: Options.default_lease
    assert fast.lease_expires_at == now + timedelta(seconds=client.options.default_lease)  # type: ignore[arg-type]
    clock.advance(100)
    assert client.renew(slow) == clock() + timedelta(seconds=600)
    assert client.renew(slow, lease=5) == clock() + timedelta(seconds=5)
    clock.advance(6)
    [again] = client.claim("t", "slow", lease=20)  # a lease named wins
    assert again.lease_expires_at == clock() + timedelta(seconds=20)
    assert client.renew(again) == clock() + timedelta(seconds=600)  # the channel's


def test_the_channel_max_attempts_is_the_budget_of_new_deliveries(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "strict", max_attempts=1)
    client.ensure_channel("t", "lenient")
    first = client.publish("t", b"a", max_attempts=5)
    [a] = client.claim("t", "strict")
    assert (a.id, a.max_attempts) == (first, 1)
    [b] = client.claim("t", "lenient")
    assert b.max_attempts == 5
    client.requeue(a, delay=0)  # its one attempt was spent: dead
    assert [d.message_id for d in client.list_dead("t", "strict")] == [first]
    client.ensure_channel("t", "strict", reset=("max_attempts",))
    client.publish_many("t", [b"b", b"c"], max_attempts=3)
    assert [m.max_attempts for m in client.claim("t", "strict", max_messages=5)] == [3, 3]
    # A replay creates deliveries with the channel's budget too.
    client.ensure_channel("t", "strict", max_attempts=2)
    assert client.replay(first, channels=["strict"]) == 0  # still there, dead
    client.delete_dead("t", "strict")
    assert client.replay(first, channels=["strict"]) == 1
    [replayed] = client.claim("t", "strict")
    assert (replayed.id, replayed.max_attempts) == (first, 2)


def test_a_paused_channel_receives_but_hands_out_nothing_until_resumed(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "c")
    client.ensure_channel("t", "other")
    client.publish("t", b"held")
    [held] = client.claim("t", "c")
    client.pause_channel("t", "c")
    assert client.channel_settings("t", "c").paused
    client.publish_many("t", [b"one", b"two"])
    assert client.claim("t", "c", max_messages=10) == []
    assert client.channel_backlog("t", "c").ready == 2  # delivered, waiting
    assert len(client.claim("t", "other", max_messages=10)) == 3  # others go on
    client.renew(held)  # held leases can still be renewed and settled
    client.ack(held)
    client.pause_channel("t", "c")  # twice: no harm
    client.resume_channel("t", "c")
    assert not client.channel_settings("t", "c").paused
    assert [m.body for m in client.claim("t", "c", max_messages=10)] == [b"one", b"two"]


def test_settings_changed_by_one_client_hold_for_the_next_claim_of_another(
    backend: Backend, clock: FakeClock
) -> None:
    writer = backend.client(clock=clock)
    reader = backend.client(clock=clock)
    writer.ensure_channel("t", "c")
    writer.publish_many("t", [b"1", b"2", b"3"])
    [first] = reader.claim("t", "c")  # the reader knows the channel now
    reader.ack(first)
    writer.pause_channel("t", "c")
    assert reader.claim("t", "c") == []
    writer.resume_channel("t", "c")
    writer.ensure_channel("t", "c", lease=444)
    [second] = reader.claim("t", "c")
    assert second.lease_expires_at == clock() + timedelta(seconds=444)
    writer.ensure_channel("t", "c", max_attempts=9)
    writer.publish("t", b"4")
    got = reader.claim("t", "c", max_messages=5)
    assert [(m.body, m.max_attempts) for m in got] == [(b"3", 5), (b"4", 9)]


def test_a_consumer_of_a_paused_channel_idles_and_resumes(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", lease=300)
    client.pause_channel("t", "c")
    client.publish("t", b"x")
    seen: list[tuple[bytes, object]] = []
    done = threading.Event()

    def handler(msg: novaque.Message) -> None:
        seen.append((msg.body, msg.lease_expires_at - msg.published_at))
        done.set()

    consumer = client.subscribe_and_start("t", "c", handler, poll_interval=0.02)
    try:
        polls = consumer._signals.count("polls")
        assert consumer._signals.wait("polls", polls + 3, WAIT)
        assert seen == []
        client.resume_channel("t", "c")
        assert done.wait(WAIT)
    finally:
        consumer.shutdown(timeout=10)
    # The consumer named no lease: the channel's lease served it.
    assert seen == [(b"x", timedelta(seconds=300))]
