"""What real use broke around ids and transactions (issue 9): misrouted messages,
stale and rolled-back topic ids, savepoints, other databases, exact dedup keys,
claims racing publishes, TTL purge racing replay, counters of publish-only
processes, and the warning for a topic without channels."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import novaque
from novaque import _context, _topology
from novaque.schema import deliveries, messages
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")

ROOT = Path(__file__).resolve().parent.parent


def _wait_for(predicate: object, timeout: float = 20.0) -> bool:
    """Poll ``predicate`` until it holds (a bounded wait for background work)."""
    assert callable(predicate)
    done = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return True
        done.wait(0.02)
    return bool(predicate())


# -- ids are never reused, and cached ids never misroute ----------------------------------


def test_a_running_consumer_never_handles_another_topics_message(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_topology, "CHANNEL_CACHE_S", 0.0)
    consumer_client = backend.client(clock=clock, poll_interval=0.02)
    admin = backend.client(clock=clock)
    seen: list[tuple[str, str, bytes]] = []
    consumer = consumer_client.subscribe_and_start(
        "orders", "billing", lambda m: seen.append((m.topic, m.channel, m.body))
    )
    admin.publish("orders", b"order")
    assert _wait_for(lambda: len(seen) == 1)
    admin.delete_topic("orders")
    admin.ensure_channel("payroll", "salaries")
    admin.publish("payroll", b"salary")
    # The orders consumer keeps polling its deleted channel (and says so) ...
    assert consumer._signals.wait("claim_errors", 1, timeout=20)
    # ... while payroll's message waits for payroll's own consumers.
    consumer.shutdown(timeout=10)
    assert seen == [("orders", "billing", b"order")]
    [msg] = admin.claim("payroll", "salaries")
    assert msg.body == b"salary"


def test_a_publisher_with_a_cached_topic_id_never_reaches_another_topic(
    backend: Backend, clock: FakeClock
) -> None:
    publisher, admin = backend.client(clock=clock), backend.client(clock=clock)
    publisher.publish("orders", b"first")  # caches the id of orders
    admin.delete_topic("orders")
    admin.ensure_channel("payroll", "salaries")
    message_id = publisher.publish("orders", b"second")
    assert admin.get_message(message_id).topic == "orders"
    assert admin.channel_backlog("payroll", "salaries").ready == 0
    assert sorted(admin.list_topics()) == ["orders", "payroll"]


def test_a_deleted_and_recreated_channel_is_consumed_again(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_topology, "CHANNEL_CACHE_S", 0.0)
    consumer_client = backend.client(clock=clock, poll_interval=0.02)
    admin = backend.client(clock=clock)
    seen: list[bytes] = []
    consumer = consumer_client.subscribe_and_start(
        "orders", "billing", lambda m: seen.append(m.body)
    )
    admin.publish("orders", b"before")
    assert _wait_for(lambda: seen == [b"before"])
    admin.delete_channel("orders", "billing")
    admin.ensure_channel("orders", "billing")
    admin.publish("orders", b"after")
    assert _wait_for(lambda: seen == [b"before", b"after"])
    consumer.shutdown(timeout=10)


# -- a topic id learned in a rolled-back transaction is never used --------------------------


@pytest.mark.sync_only
@pytest.mark.parametrize("how", ["session", "connection", "savepoint"])
def test_a_rolled_back_first_publish_leaves_nothing_behind(
    backend: Backend, client: novaque.Client, how: str
) -> None:
    engine = backend.engine()
    if how == "session":
        with Session(engine) as session:
            client.publish("fresh", b"gone", session=session)
            session.rollback()
    elif how == "connection":
        with engine.connect() as conn:
            client.publish("fresh", b"gone", connection=conn)
            conn.rollback()
    else:
        with engine.begin() as conn:
            savepoint = conn.begin_nested()
            client.publish("fresh", b"gone", connection=conn)
            savepoint.rollback()
    assert client.list_topics() == []

    with Session(engine) as session, session.begin():
        kept = client.publish("fresh", b"kept", session=session)
    assert client.get_message(kept).topic == "fresh"
    assert client.list_topics() == ["fresh"]

    with engine.connect() as conn:
        client.publish("other", b"gone", connection=conn)
        conn.rollback()
    client.ensure_topic("other")  # does not trust what the rollback left behind
    assert sorted(client.list_topics()) == ["fresh", "other"]


@pytest.mark.sync_only
def test_a_publish_in_a_rolled_back_savepoint_is_not_counted(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "c")
    engine = backend.engine()
    with engine.begin() as conn:
        outer = conn.begin_nested()
        inner = conn.begin_nested()
        client.publish("t", b"inner", connection=conn)  # inside both savepoints
        inner.commit()
        outer.rollback()  # takes the released inner savepoint with it
        dropped = conn.begin_nested()
        client.publish("t", b"dropped", connection=conn)
        dropped.rollback()
        kept = conn.begin_nested()
        client.publish("t", b"kept", connection=conn)
        kept.commit()
        client.publish("t", b"outside", connection=conn)
    with Session(engine) as session, session.begin():
        with session.begin_nested() as nested:
            client.publish("t", b"orm-dropped", session=session)
            nested.rollback()
        client.publish("t", b"orm-kept", session=session)
    client.flush_stats()
    assert client.channel_counters("t", "c").published == 3
    assert client.channel_backlog("t", "c").ready == 3


# -- a caller's transaction on MariaDB's REPEATABLE READ, and other databases ---------------


@pytest.mark.sync_only
# Not on SQLite: a transaction that read first cannot write after another
# writer committed (SQLITE_BUSY_SNAPSHOT), whatever novaque does.
@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)
def test_a_topic_created_after_the_callers_snapshot_is_found(
    backend: Backend, client: novaque.Client
) -> None:
    other = backend.client()
    engine = backend.engine()  # the server's default isolation (REPEATABLE READ on MariaDB)
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT count(*) FROM novaque_topics")).scalar()  # snapshot taken
        other.ensure_channel("late", "c")
        message_id = client.publish("late", b"x", connection=conn)
        conn.commit()
    [msg] = other.claim("late", "c")
    assert msg.id == message_id


@pytest.mark.sync_only
def test_a_session_bound_to_another_database_uses_that_databases_ids(
    backend: Backend, client: novaque.Client, tmp_path: Path
) -> None:
    client.publish("alpha", b"here")  # the client's cache now knows alpha on its database
    elsewhere_url = backend.scratch_url(tmp_path)
    elsewhere_engine = backend.engine(elsewhere_url)
    elsewhere = novaque.Client(elsewhere_engine)
    elsewhere.migrate()
    elsewhere.ensure_channel("beta", "c")
    elsewhere.ensure_channel("alpha", "c")
    with Session(elsewhere_engine) as session, session.begin():
        message_id = client.publish("alpha", b"there", session=session)
    assert elsewhere.get_message(message_id).topic == "alpha"
    [msg] = elsewhere.claim("alpha", "c")
    assert msg.body == b"there"
    assert elsewhere.channel_backlog("beta", "c").ready == 0
    # Counted in that database, in the publishing transaction.
    assert elsewhere.channel_counters("alpha", "c").published == 1
    client.flush_stats()
    assert client.topic_counters("alpha").published == 0  # no channel here


@pytest.mark.sync_only
@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)  # vs. SQLite
def test_a_connection_to_another_kind_of_database_is_refused(
    backend: Backend, client: novaque.Client, tmp_path: Path
) -> None:
    sqlite = backend.engine(f"sqlite:///{tmp_path / 'other.db'}")
    with (
        Session(sqlite) as session,
        pytest.raises(novaque.InvalidOption, match="use a client of that database"),
    ):
        client.publish("t", b"x", session=session)


@pytest.mark.sync_only
def test_a_session_on_an_unmigrated_database_raises_schema_out_of_date(
    backend: Backend, client: novaque.Client, tmp_path: Path
) -> None:
    unmigrated = backend.engine(backend.scratch_url(tmp_path))
    with (
        Session(unmigrated) as session,
        pytest.raises(novaque.SchemaOutOfDate, match="novaque migrate"),
    ):
        client.publish("t", b"x", session=session)


# -- dedup keys compare exactly -------------------------------------------------------------


def test_dedup_keys_differing_only_by_trailing_spaces_are_two_keys(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "c")
    first = client.publish("t", b"1", dedup_key="order-1")
    second = client.publish("t", b"2", dedup_key="order-1 ")
    third = client.publish("t", b"3", dedup_key="Order-1")
    assert len({first, second, third}) == 3
    assert client.publish("t", b"2", dedup_key="order-1 ") == second  # the same message again
    assert [m.body for m in client.claim("t", "c", max_messages=10)] == [b"1", b"2", b"3"]


# -- claims racing publishes ----------------------------------------------------------------


_DIGITS = " UNION ALL ".join(f"SELECT {i} AS d" for i in range(10))


def _claim_into(client: novaque.Client, results: list[object]) -> None:
    try:
        results.append(client.claim("race", "c", max_messages=10))
    except BaseException as exc:
        results.append(exc)


@pytest.mark.sync_only  # the dialect's claim statement under a race: one twin shows it
def test_a_claim_scanning_while_a_publish_commits_gets_whole_messages(
    backend: Backend, clock: FakeClock
) -> None:
    """MariaDB: the claim's locking read returns a delivery committed after the
    statement began, while the message fields it reads by subquery come from
    the statement's older snapshot (they were NULL: the claim failed)."""
    claimer = backend.client(clock=clock)
    # The publisher's clock is a second behind: its deliveries are due for the
    # claim, and sort after everything below.
    publisher = backend.client(clock=FakeClock(clock() - timedelta(seconds=1)))
    claimer.ensure_channel("race", "c")
    anchor = publisher.publish("race", b"anchor")
    [held] = claimer.claim("race", "c")
    now_us = int(clock().timestamp() * 1_000_000)
    with backend.engine().begin() as conn:
        # 100,000 spent deliveries the claim must step over: a long scan.
        conn.execute(
            sa.text(
                f"INSERT INTO {deliveries.name} (message_id, channel_id, state, visible_at, "
                f"attempts, max_attempts) SELECT :mid, :cid, 1, :at, 5, 5 FROM "
                + ", ".join(f"({_DIGITS}) AS t{i}" for i in range(5))
            ),
            {"mid": anchor, "cid": held.channel_id, "at": now_us - 100_000_000},
        )
    for _ in range(3):
        # A claimable delivery first in the scan, so the claim reads a message early.
        early = sa.insert(deliveries).values(
            message_id=anchor,
            channel_id=held.channel_id,
            state=0,
            visible_at=now_us - 200_000_000,
            attempts=0,
            max_attempts=5,
        )
        with backend.engine().begin() as conn:
            conn.execute(early)
        # A client that has not claimed yet: its claim reads the channel from
        # the first entry (written behind the claim cursor of one that has).
        claimer = backend.client(clock=clock)
        results: list[object] = []
        scan = threading.Thread(target=_claim_into, args=(claimer, results))
        scan.start()
        threading.Event().wait(0.05)  # let the scan begin (the race needs no more)
        late = publisher.publish("race", b"late")
        scan.join(timeout=60)
        [got] = results
        assert isinstance(got, list), got
        claimed = {m.id: m.body for m in got}
        for msg in claimer.claim("race", "c", max_messages=10):
            claimed[msg.id] = msg.body
        assert claimed == {anchor: b"anchor", late: b"late"}


# -- TTL purge racing replay ----------------------------------------------------------------


def test_a_message_replayed_just_before_the_purge_keeps_its_new_delivery(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    message_id = client.publish("t", b"x", ttl=60)
    [msg] = client.claim("t", "c")
    client.ack(msg)
    clock.advance(61)
    assert client.replay(message_id) == 1  # extends the message's life
    assert client.purge_expired() == 0
    [again] = client.claim("t", "c")
    assert again.id == message_id


# Not on SQLite: a replay holds the write lock, so no purge runs beside it.
@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)
def test_the_purge_skips_a_message_a_replay_holds(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    message_id = client.publish("t", b"x", ttl=60)
    [msg] = client.claim("t", "c")
    client.ack(msg)
    clock.advance(61)
    engine = backend.engine()
    with engine.connect() as replay:  # a replay between its lock and its commit
        replay.execute(
            sa.select(messages.c.id).where(messages.c.id == message_id).with_for_update()
        )
        purged: list[int] = []
        purge = threading.Thread(target=lambda: purged.append(client.purge_expired()))
        purge.start()
        purge.join(timeout=20)
        assert not purge.is_alive(), "the purge waited for the replay's lock"
        replay.execute(
            sa.update(messages)
            .where(messages.c.id == message_id)
            .values(expires_at=messages.c.expires_at + 10**12)
        )
        replay.execute(
            sa.insert(deliveries).values(
                message_id=message_id,
                channel_id=msg.channel_id,
                state=0,
                visible_at=0,
                attempts=0,
                max_attempts=5,
            )
        )
        replay.commit()
    assert purged == [0]
    assert client.purge_expired() == 0
    [again] = client.claim("t", "c")
    assert again.id == message_id


# -- counters of processes that only publish ------------------------------------------------


def _run_and_exit(backend: Backend, *lines: str) -> None:
    """Run ``lines`` in a new Python process (``url``: the backend's) that just exits."""
    script = "\n".join(["import sys, sqlalchemy, novaque", "url = sys.argv[1]", *lines])
    subprocess.run([sys.executable, "-c", script, backend.url], check=True, cwd=ROOT, timeout=120)


@pytest.mark.sync_only
def test_a_publish_only_process_flushes_its_counters_at_exit(backend: Backend) -> None:
    reader = backend.client()
    reader.ensure_channel("web", "c")
    _run_and_exit(
        backend,
        "client = novaque.Client(sqlalchemy.create_engine(url))",
        "for _ in range(5):",
        "    client.publish('web', b'x')",
    )
    assert reader.channel_counters("web", "c").published == 5


def test_a_publish_only_client_flushes_its_counters_while_it_lives(backend: Backend) -> None:
    publisher = backend.client(stats_flush_interval=0.05)
    reader = backend.client()
    reader.ensure_channel("web", "c")
    publisher.publish_many("web", [b"1", b"2"])
    assert _wait_for(lambda: reader.channel_counters("web", "c").published == 2)
    publisher.publish("web", b"3")  # the flusher starts again after going idle
    assert _wait_for(lambda: reader.channel_counters("web", "c").published == 3)


@pytest.mark.sync_only
def test_counters_of_a_started_client_reach_the_database_at_exit(backend: Backend) -> None:
    reader = backend.client()
    reader.ensure_channel("web", "c")
    _run_and_exit(
        backend,
        "client = novaque.connect(url, stats_flush_interval=3600)",
        "client.start()",
        "client.publish('web', b'x')",
    )
    assert reader.channel_counters("web", "c").published == 1


# -- a topic without channels ---------------------------------------------------------------


def test_a_publish_to_a_topic_without_channels_warns_once_per_topic(
    client: novaque.Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_context, "_warned_no_channel", set())
    with caplog.at_level(logging.WARNING, logger="novaque"):
        client.publish("lonely", b"1")
        client.publish_many("lonely", [b"2", b"3"])
        client.publish("lonely2", b"1")
        client.ensure_channel("served", "c")
        client.publish("served", b"1")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "lonely has no channel" in warnings[0]
    assert "ensure_channel" in warnings[0]
    assert "lonely2" in warnings[1]
    assert len(client.list_messages("lonely")) == 3  # kept, browsable


def test_no_warning_for_a_repeated_dedup_key(
    client: novaque.Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_context, "_warned_no_channel", set())
    client.ensure_channel("t", "c")
    client.publish("t", b"1", dedup_key="k")
    with caplog.at_level(logging.WARNING, logger="novaque"):
        client.publish("t", b"1", dedup_key="k")
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
