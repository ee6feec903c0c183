"""Migration 0013: a channel's lanes (``low_lane``, ``high_lane``). A 0012
database with live data keeps every row, and each channel gets the lowest
and highest priority of the messages it holds deliveries of (dead ones
included), 0 when none is below or above; claims find those lanes from then
on. Downgrading drops the columns and keeps every row."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from tests._migration_rows import ADDED_BY_0013, columns, rows
from tests.conftest import Backend
from tests.test_migration_0005 import _migrated_0004
from tests.test_migration_0009 import TABLES, _recorded


def _lanes(engine: sa.Engine) -> dict[str, tuple[int, int]]:
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT name, low_lane, high_lane FROM novaque_channels"))
        return {name: (low, high) for name, low, high in found}


def _prioritize(engine: sa.Engine, message_id: int, priority: int) -> None:
    """Give a message ``priority`` as 0012 stores it (its claimable deliveries
    in that lane)."""
    params = {"p": priority, "id": message_id}
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE novaque_messages SET priority = :p WHERE id = :id"), params)
        conn.execute(
            sa.text(
                "UPDATE novaque_deliveries SET priority = :p "
                "WHERE message_id = :id AND state IN (0, 1)"
            ),
            params,
        )


def test_each_channel_gets_the_lanes_of_its_messages_and_loses_them_on_downgrade(
    backend: Backend, tmp_path: Path
) -> None:
    engine, client, _ = _migrated_0004(backend, tmp_path)
    client.migrate(to="0012")
    # Message 10 has a ready delivery in billing, a dead one in audit, a
    # leased one in ship and a deferred one in later; 11 and 12 are fifo's.
    _prioritize(engine, 10, 7)
    _prioritize(engine, 11, -3)
    before = rows(engine, TABLES)
    assert not set(ADDED_BY_0013["novaque_channels"]) & set(columns(engine, "novaque_channels"))

    client.migrate(to="0013")
    assert _recorded(engine) == ["0013"]
    assert rows(engine, TABLES) == before
    assert _lanes(engine) == {
        **dict.fromkeys(("billing", "audit", "ship", "later"), (0, 7)),
        "fifo": (-3, 0),
    }

    client.migrate()
    client.publish("orders", b"now")
    assert [m.priority for m in client.claim("orders", "billing", max_messages=10)] == [0, 7]
    assert client.requeue_dead("orders", "audit") == 1
    assert [m.priority for m in client.claim("orders", "audit", max_messages=10)] == [0, 7]
    assert [m.priority for m in client.claim("orders", "fifo", max_messages=10)] == [-3, 0]

    client.downgrade(to="0012")
    assert _recorded(engine) == ["0012"]
    assert not set(ADDED_BY_0013["novaque_channels"]) & set(columns(engine, "novaque_channels"))
