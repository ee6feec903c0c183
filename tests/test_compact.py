"""compact: an SQLite file gives the space of deleted rows back to the file
system (a bounded step per maintenance pass, all of it on ``compact()``, a
rewrite with ``full=True``); PostgreSQL and MySQL/MariaDB manage their own."""

from __future__ import annotations

import logging
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from novaque.dialects import SQLiteDialect
from novaque.testing import FakeClock
from tests.conftest import Backend
from tests.test_consumer import WAIT, waited

pytestmark = pytest.mark.usefixtures("twin")

SQLITE = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
SERVERS = pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)

#: A message body of 4 KiB.
BODY = os.urandom(4096)
#: How far above a fresh database with the same live rows a compacted file may
#: stay, in pages: the pages of the few counter rows the fresh one lacks.
SLACK_PAGES = 8
#: ``PRAGMA auto_vacuum``: none (SQLite's default), full, incremental.
NONE, FULL, INCREMENTAL = 0, 1, 2


@dataclass(frozen=True)
class Pages:
    """What SQLite says of a database file, read on a connection of its own."""

    count: int
    free: int
    size: int
    auto_vacuum: int

    @property
    def bytes(self) -> int:
        return self.count * self.size


def pages(path: Path) -> Pages:
    raw = sqlite3.connect(path)
    try:
        values = [
            int(raw.execute(f"PRAGMA {name}").fetchone()[0])
            for name in ("page_count", "freelist_count", "page_size", "auto_vacuum")
        ]
    finally:
        raw.close()
    return Pages(*values)


def file_of(url: str) -> Path:
    database = sa.make_url(url).database
    assert database
    return Path(database)


def new_database(backend: Backend, tmp_path: Path, clock: FakeClock) -> novaque.Client:
    client = backend.client(backend.scratch_url(tmp_path), clock=clock)
    client.migrate()
    return client


def fill_and_drain(client: novaque.Client, clock: FakeClock, count: int, batch: int) -> None:
    """Publish ``count`` messages of 4 KiB, pop them all, let their TTL pass and
    purge them: their space is left free in the file."""
    client.ensure_channel("bulk", "drain")
    for _ in range(count // batch):
        client.publish_many("bulk", [BODY] * batch)
    drained = 0
    while got := client.pop("bulk", "drain", max_messages=batch):
        drained += len(got)
    assert drained == count
    clock.advance(days=8)  # past the default TTL (7 days) of every message
    assert client.purge_expired() == count
    client.flush_stats()  # nothing left for a later pass to write


@SQLITE
def test_compact_shrinks_the_file_to_a_fresh_databases_size(
    backend: Backend, tmp_path: Path, clock: FakeClock
) -> None:
    """20,000 messages of 4 KiB published, drained and purged: the bodies'
    80 MiB stay in the file as free pages until compact() gives them back."""
    client = new_database(backend, tmp_path, clock)
    path = file_of(str(client.engine.url))
    assert pages(path).auto_vacuum == INCREMENTAL  # made so by migrate()
    fill_and_drain(client, clock, 20_000, batch=1_000)
    before = pages(path)
    assert before.free * before.size >= 20_000 * len(BODY)

    freed = client.compact()

    after = pages(path)
    assert after.free == 0
    assert freed == before.bytes - after.bytes
    # The write-ahead log is checkpointed into the file and emptied: the file
    # on disk is the database's pages, and the log holds nothing.
    assert path.stat().st_size == after.bytes
    assert Path(f"{path}-wal").stat().st_size == 0
    fresh = new_database(backend, tmp_path, FakeClock())
    fresh.ensure_channel("bulk", "drain")
    fresh_pages = pages(file_of(str(fresh.engine.url)))
    assert after.count <= fresh_pages.count + SLACK_PAGES, (after, fresh_pages)
    # Nothing more to give back; a full rewrite of a compact file gains little.
    assert client.compact() == 0
    assert 0 <= client.compact(full=True) <= SLACK_PAGES * after.size
    assert pages(path).auto_vacuum == INCREMENTAL


@SQLITE
@pytest.mark.sync_only  # the commits are counted on the sync client's engine
def test_compact_takes_a_transaction_per_step(
    backend: Backend, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other writers get the lock between the steps: compact() never holds it
    for more than one step's pages."""
    client = new_database(backend, tmp_path, clock)
    path = file_of(str(client.engine.url))
    fill_and_drain(client, clock, 500, batch=500)
    monkeypatch.setattr(SQLiteDialect, "free_pages_step", 64)
    free = pages(path).free
    assert free > 4 * 64
    commits: list[int] = []
    sa.event.listen(client.own_engine, "commit", lambda conn: commits.append(1))
    client.compact()
    assert pages(path).free == 0
    assert len(commits) >= -(-free // 64)


@SQLITE
def test_each_maintenance_pass_gives_back_a_bounded_step(
    backend: Backend, tmp_path: Path, clock: FakeClock
) -> None:
    client = new_database(backend, tmp_path, clock)
    path = file_of(str(client.engine.url))
    fill_and_drain(client, clock, 1_000, batch=500)
    step = SQLiteDialect.free_pages_step
    before = pages(path)
    assert before.free > 2 * step

    client.run_maintenance()
    once = pages(path)
    assert once.free == before.free - step
    assert once.count <= before.count - step
    client.run_maintenance()
    assert pages(path).free == before.free - 2 * step


@SQLITE
def test_the_maintenance_loop_gives_every_free_page_back_step_by_step(
    backend: Backend, tmp_path: Path, clock: FakeClock
) -> None:
    client = backend.client(backend.scratch_url(tmp_path), clock=clock, purge_interval=0.01)
    client.migrate()
    path = file_of(str(client.engine.url))
    fill_and_drain(client, clock, 1_000, batch=500)
    free = pages(path).free
    steps = -(-free // SQLiteDialect.free_pages_step)
    assert steps >= 3
    signals = client._runtime.signals
    client.start()
    waited(signals.wait("purge", steps + 1, WAIT), f"{steps + 1} purge passes")
    client.shutdown()
    assert pages(path).free == 0


@SQLITE
def test_a_database_that_held_tables_keeps_its_mode_until_a_full_compaction(
    backend: Backend, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A file with an application's table before novaque's (or made by an older
    novaque) is in SQLite's default mode: its free pages go back only with
    full=True, which also switches it to incremental mode."""
    path = tmp_path / "older.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE app_things (id INTEGER PRIMARY KEY)")
    raw.close()
    client = backend.client(f"sqlite:///{path}", clock=clock)
    client.migrate()
    assert pages(path).auto_vacuum == NONE
    fill_and_drain(client, clock, 1_000, batch=500)
    before = pages(path)
    assert before.free * before.size >= 1_000 * len(BODY)

    client.run_maintenance()  # nothing it can give back, a step at a time
    with caplog.at_level(logging.WARNING, logger="novaque"):
        assert client.compact() == 0
    assert pages(path).free == before.free
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "not in SQLite's incremental auto-vacuum mode" in warning
    assert "compact(full=True)" in warning

    freed = client.compact(full=True)

    after = pages(path)
    assert (after.auto_vacuum, after.free) == (INCREMENTAL, 0)
    assert freed == before.bytes - after.bytes
    assert after.count <= before.count - before.free + SLACK_PAGES
    # From now on, maintenance gives the free pages back.
    fill_and_drain(client, clock, 1_000, batch=500)
    free = pages(path).free
    client.run_maintenance()
    assert pages(path).free == free - SQLiteDialect.free_pages_step


@SQLITE
def test_a_database_in_full_auto_vacuum_mode_keeps_it(
    backend: Backend, tmp_path: Path, clock: FakeClock
) -> None:
    """Full mode gives pages back at every commit: nothing is left for compact."""
    path = tmp_path / "full.db"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA auto_vacuum = FULL")
    raw.execute("CREATE TABLE app_things (id INTEGER PRIMARY KEY)")
    raw.close()
    client = backend.client(f"sqlite:///{path}", clock=clock)
    client.migrate()
    fill_and_drain(client, clock, 500, batch=500)
    assert pages(path).free == 0
    assert client.compact() == 0
    client.compact(full=True)
    assert (pages(path).auto_vacuum, pages(path).free) == (FULL, 0)


@SERVERS
def test_the_servers_manage_their_own_space(backend: Backend, client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.publish_many("t", [BODY] * 10)
    assert client.compact() == 0
    assert client.compact(full=True) == 0
    assert client.channel_backlog("t", "c").ready == 10  # nothing else happened


@pytest.mark.parametrize("full", ["yes", 1, None])
def test_full_must_be_a_bool(client: novaque.Client, full: object) -> None:
    with pytest.raises(TypeError, match=f"full must be True or False, got {type(full).__name__}"):
        client.compact(full=full)  # type: ignore[arg-type]
