"""Publishing to routed channels (a filter, an ordering) while their settings
change: filters evaluated outside the publish's transaction, and the routed
channels read as the plain ones are, in novaque's transactions and in the
caller's (MariaDB's REPEATABLE READ, PostgreSQL's REPEATABLE READ); on both
twins."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

import novaque
from novaque import _filters
from novaque._publishing import EVALUATION_TRIES
from tests._twin import async_url
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")

GOLD = 'headers["tier"] == "gold"'
SILVER = 'headers["tier"] == "silver"'
#: How long a test waits for another thread before calling it stuck (a hang
#: turned into a failure; nothing here depends on how long anything takes).
STUCK = 30.0


def bodies(client: novaque.Client, topic: str, channel: str) -> list[bytes]:
    got = client.claim(topic, channel, max_messages=100)
    client.ack_many(got)
    return [m.body for m in got]


def orphans(backend: Backend) -> int:
    """Deliveries whose channel no longer exists."""
    with backend.engine().connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT count(*) FROM novaque_deliveries WHERE channel_id NOT IN "
                "(SELECT id FROM novaque_channels)"
            ).scalar_one()
        )


def sync_client(backend: Backend) -> novaque.Client:
    """A sync client of the backend (another process's, as far as the test's
    client is concerned), whichever twin the test runs on."""
    made = novaque.Client(backend.engine())
    backend.clients.append(made)
    return made


# -- filters evaluated before the publish's transaction -----------------------------------


class Blocking:
    """``_filters.matches`` made to stop, the first time it evaluates a message
    with the header ``block``, until the test releases it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self._real = _filters.matches
        self._done = False
        monkeypatch.setattr(_filters, "matches", self.matches)

    def matches(
        self, text: str, headers: Mapping[str, str], group: str | None, topic: str
    ) -> bool | str:
        if "block" in headers and not self._done:
            self._done = True
            self.entered.set()
            assert self.release.wait(STUCK)
        return self._real(text, headers, group, topic)


@contextmanager
def publishing(client: novaque.Client, topic: str, body: bytes, **kwargs: Any) -> Iterator[None]:
    """``client.publish(topic, body, **kwargs)`` on a thread while the block runs;
    joined (and its error raised) at the end."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            client.publish(topic, body, **kwargs)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield
    finally:
        thread.join(STUCK)
    assert not thread.is_alive(), "the publish did not end"
    if errors:
        raise errors[0]


def finishes(fn: Any) -> bool:
    """Whether ``fn()``, run on a thread, ends (the test's safety net: a call
    that waits for a lock held until the test goes on would never end)."""
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    ended = done.wait(STUCK)
    if errors:
        raise errors[0]
    return ended


@pytest.mark.parametrize("warm", [False, True], ids=["first-publish", "filters-known"])
def test_a_filter_being_evaluated_holds_no_lock_another_writer_needs(
    backend: Backend, client: novaque.Client, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    client.ensure_channel("t", "gold", filter=GOLD)
    other = sync_client(backend)
    other.ensure_channel("elsewhere", "c")
    if warm:  # the client has seen the topic's filters
        client.publish("t", b"warm-up", headers={"tier": "gold"})
    blocking = Blocking(monkeypatch)
    with publishing(client, "t", b"slow", headers={"tier": "gold", "block": "1"}):
        assert blocking.entered.wait(STUCK)
        # While the filter is evaluated, another writer of the database goes on.
        try:
            assert finishes(lambda: other.publish("elsewhere", b"unrelated"))
        finally:
            blocking.release.set()
    assert bodies(other, "elsewhere", "c") == [b"unrelated"]
    assert bodies(client, "t", "gold") == ([b"warm-up"] if warm else []) + [b"slow"]


@pytest.mark.parametrize("warm", [False, True], ids=["first-publish", "filters-known"])
def test_settings_changed_while_a_filter_is_evaluated_hold_for_that_publish(
    backend: Backend, client: novaque.Client, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    client.ensure_channel("t", "c", filter=GOLD)
    client.ensure_channel("t", "gone", filter=SILVER)
    client.ensure_channel("t", "plain-now", filter=GOLD)
    if warm:
        client.publish("t", b"warm-up", headers={"tier": "gold"})
        bodies(client, "t", "c")
        bodies(client, "t", "plain-now")
    operator = sync_client(backend)
    blocking = Blocking(monkeypatch)
    with publishing(client, "t", b"x", headers={"tier": "silver", "block": "1"}):
        assert blocking.entered.wait(STUCK)
        # The filters evaluated so far are GOLD and SILVER: every one changes
        # before the publish's transaction starts.
        try:
            assert finishes(lambda: operator.ensure_channel("t", "c", filter=SILVER))
            assert finishes(lambda: operator.delete_channel("t", "gone"))
            assert finishes(lambda: operator.ensure_channel("t", "plain-now", filter=""))
            assert finishes(lambda: operator.ensure_channel("t", "new", filter=SILVER))
            assert finishes(lambda: operator.ensure_channel("t", "new-gold", filter=GOLD))
        finally:
            blocking.release.set()
    assert bodies(client, "t", "c") == [b"x"]  # its filter is SILVER now
    assert bodies(client, "t", "plain-now") == [b"x"]
    assert bodies(client, "t", "new") == [b"x"]
    assert bodies(client, "t", "new-gold") == []
    assert orphans(backend) == 0


def test_filters_that_change_at_every_try_are_evaluated_in_the_last_one(
    backend: Backend, client: novaque.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.ensure_channel("t", "c", filter=GOLD)
    client.publish("t", b"warm-up", headers={"tier": "gold"})
    operator = sync_client(backend)
    real = _filters.matches
    texts: list[str] = []

    def changing(text: str, headers: Mapping[str, str], group: str | None, topic: str) -> Any:
        texts.append(text)
        # Each evaluation before a try sees the filter changed once more,
        # until the try after the last (in its transaction: no change there).
        if len(texts) <= EVALUATION_TRIES + 1:
            operator.ensure_channel("t", "c", filter=f'{SILVER} && "try" != "{len(texts)}"')
        return real(text, headers, group, topic)

    monkeypatch.setattr(_filters, "matches", changing)
    client.publish("t", b"x", headers={"tier": "silver"})
    assert len(texts) == EVALUATION_TRIES + 2
    assert texts[-1] == f'{SILVER} && "try" != "{EVALUATION_TRIES + 1}"'
    assert bodies(client, "t", "c") == [b"warm-up", b"x"]


def test_a_removed_filter_is_no_longer_evaluated(
    client: novaque.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.ensure_channel("t", "c", filter=GOLD)
    client.publish("t", b"gold", headers={"tier": "gold"})
    client.ensure_channel("t", "c", filter="")
    evaluated: list[str] = []
    real = _filters.matches

    def counting(text: str, headers: Mapping[str, str], group: str | None, topic: str) -> Any:
        evaluated.append(text)
        return real(text, headers, group, topic)

    monkeypatch.setattr(_filters, "matches", counting)
    client.publish("t", b"any")  # GOLD, known from the last publish, evaluated in vain
    evaluated.clear()
    client.publish("t", b"again")
    client.publish_many("t", [b"more"], groups=["g"])
    assert evaluated == []
    assert bodies(client, "t", "c") == [b"gold", b"any", b"again", b"more"]


# -- the caller's transaction: settings committed after its snapshot ----------------------


class CallerTransaction:
    """The application's own transaction on the test client's database: a
    Connection for the sync client, an AsyncConnection on the twin's loop for
    the asyncio twin; at the server's default isolation unless told."""

    def __init__(self, backend: Backend, client: novaque.Client, isolation: str | None) -> None:
        self.client = client
        self.twin = backend.twin == "aio"
        options = {} if isolation is None else {"isolation_level": isolation}
        if self.twin:
            self._loop = client._loop  # type: ignore[attr-defined]
            engine = create_async_engine(async_url(backend.name, backend.url), **options)
            self._aengine = engine
            self._aconn: AsyncConnection = self._loop.run(engine.connect().start())
        else:
            self._conn = backend.engine().execution_options(**options).connect()

    def read(self) -> None:
        """A read of the database (the transaction's snapshot is taken)."""
        self._execute(sa.text("SELECT count(*) FROM novaque_messages"))

    def publish(self, topic: str, body: bytes, **kwargs: Any) -> int:
        if self.twin:
            aio: novaque.aio.AsyncClient = self.client.aio  # type: ignore[attr-defined]
            return int(self._loop.run(aio.publish(topic, body, connection=self._aconn, **kwargs)))
        return self.client.publish(topic, body, connection=self._conn, **kwargs)

    def publish_many(self, topic: str, bodies: list[bytes], **kwargs: Any) -> list[int]:
        if self.twin:
            aio: novaque.aio.AsyncClient = self.client.aio  # type: ignore[attr-defined]
            call = aio.publish_many(topic, bodies, connection=self._aconn, **kwargs)
            return list(self._loop.run(call))
        return self.client.publish_many(topic, bodies, connection=self._conn, **kwargs)

    def _execute(self, stmt: sa.Executable) -> None:
        if self.twin:
            self._loop.run(self._aconn.execute(stmt))
        else:
            self._conn.execute(stmt)

    def end(self, commit: bool) -> None:
        if self.twin:
            conn = self._aconn
            self._loop.run(conn.commit() if commit else conn.rollback())
            self._loop.run(conn.close())
            self._loop.run(self._aengine.dispose())
        else:
            if commit:
                self._conn.commit()
            else:
                self._conn.rollback()
            self._conn.close()


@contextmanager
def caller_transaction(
    backend: Backend, client: novaque.Client, isolation: str | None = None
) -> Iterator[CallerTransaction]:
    """A :class:`CallerTransaction`, committed at the end (rolled back on an error)."""
    tx = CallerTransaction(backend, client, isolation)
    try:
        yield tx
    except BaseException:
        tx.end(commit=False)
        raise
    tx.end(commit=True)


def snapshot(backend: Backend, tx: CallerTransaction) -> None:
    """Fix the caller's snapshot with a read, where the database lets a
    transaction that read write after another writer committed (SQLite does
    not: SQLITE_BUSY_SNAPSHOT, whatever novaque does)."""
    if backend.name != "sqlite":
        tx.read()


@pytest.mark.parametrize("shape", ["one", "many", "alone"])
@pytest.mark.parametrize(
    "change",
    ["filter-set", "ordering-set", "filtered-channel-created", "filter-removed"],
)
def test_a_routed_setting_committed_after_the_callers_snapshot_holds(
    backend: Backend, client: novaque.Client, change: str, shape: str
) -> None:
    """The server's default isolation: REPEATABLE READ on MariaDB, READ
    COMMITTED on PostgreSQL. ``shape``: one message or two, to a topic with
    another (plain) channel, or one message to a topic with no other."""
    deploy = sync_client(backend)
    if shape != "alone":
        deploy.ensure_channel("t", "other")
    if change in ("filter-set", "ordering-set"):
        deploy.ensure_channel("t", "c")
    if change == "filter-removed":
        deploy.ensure_channel("t", "c", filter='headers["k"] == "1"')
    client.publish("t", b"before")  # the client knows the topic
    sent = [b"app", b"app-2"] if shape == "many" else [b"app"]
    with caller_transaction(backend, client) as tx:
        snapshot(backend, tx)
        if change == "filter-set":
            deploy.ensure_channel("t", "c", filter='headers["k"] == "1"')
        elif change == "ordering-set":
            deploy.ensure_channel("t", "c", ordering="group_fifo")
        elif change == "filtered-channel-created":
            deploy.ensure_channel("t", "c", filter='headers["k"] == "1"')
        else:
            deploy.ensure_channel("t", "c", filter="")
        for body in sent if shape != "many" else ():
            tx.publish("t", body, headers={"k": "1"}, group="g1")
        if shape == "many":
            tx.publish_many("t", sent, headers={"k": "1"}, groups=["g1", "g2"])
    if shape != "alone":
        assert bodies(deploy, "t", "other") == [b"before", *sent]
    plain_before = change in ("filter-set", "ordering-set")
    assert bodies(deploy, "t", "c") == ([b"before"] if plain_before else []) + sent


@pytest.mark.parametrize("dedup_key", [None, "k1"], ids=["", "dedup"])
@pytest.mark.parametrize("kind", ["plain", "filtered", "ordered"])
def test_a_channel_deleted_after_the_callers_snapshot_gets_no_orphan_delivery(
    backend: Backend, client: novaque.Client, kind: str, dedup_key: str | None
) -> None:
    """REPEATABLE READ on the servers: PostgreSQL refuses the publish (a
    serialization failure, the caller retries its transaction), MariaDB's
    publish leaves the deleted channel out. With a dedup key or without (two
    ways of writing the deliveries to plain channels)."""
    deploy = sync_client(backend)
    deploy.ensure_channel("t", "kept")
    settings: dict[str, Any] = {
        "plain": {},
        "filtered": {"filter": 'headers["k"] == "1"'},
        "ordered": {"ordering": "group_fifo"},
    }[kind]
    deploy.ensure_channel("t", "doomed", **settings)
    client.publish("t", b"before", headers={"k": "1"}, group="g1")
    bodies(deploy, "t", "doomed")
    isolation = None if backend.name == "sqlite" else "REPEATABLE READ"
    failed = None
    try:
        with caller_transaction(backend, client, isolation) as tx:
            snapshot(backend, tx)
            deploy.delete_channel("t", "doomed")
            tx.publish("t", b"app", headers={"k": "1"}, group="g1", dedup_key=dedup_key)
    except sa.exc.OperationalError as exc:
        failed = exc
    assert orphans(backend) == 0
    if backend.name == "postgres":
        assert failed is not None
        assert type(failed.orig).__name__ == "SerializationFailure"
        assert bodies(deploy, "t", "kept") == [b"before"]
    else:
        assert failed is None
        assert bodies(deploy, "t", "kept") == [b"before", b"app"]
