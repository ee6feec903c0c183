"""The public accessors tools use instead of novaque's internals."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

import novaque
from novaque import schema
from novaque._time import US
from tests.conftest import Backend

FAMILY = {"postgres": "PostgreSQL", "mysql": "MySQL", "sqlite": "SQLite"}


def test_the_database_family_and_own_engine(backend: Backend) -> None:
    client = backend.client()
    assert client.database_family == FAMILY[backend.name]
    if backend.name == "sqlite":  # a second engine on the application's file
        assert client.own_engine is not client.engine
        assert client.own_engine.url == client.engine.url
    else:
        assert client.own_engine is client.engine


def test_connect_runs_on_its_own_engine(tmp_path: Path) -> None:
    client = novaque.connect(f"sqlite:///{tmp_path / 'own.db'}")
    try:
        assert client.own_engine is client.engine
    finally:
        client.shutdown(timeout=10)


def test_explain_of_the_claim_leaves_no_lease(backend: Backend) -> None:
    client = backend.client()
    client.ensure_channel("t-explain", "c")
    client.publish("t-explain", b"x")
    channels, topics = schema.channels, schema.topics
    with client.engine.connect() as conn:
        channel_id = conn.execute(
            sa.select(channels.c.id)
            .join(topics, topics.c.id == channels.c.topic_id)
            .where(topics.c.name == "t-explain", channels.c.name == "c")
        ).scalar_one()
    now = 2**62
    params = {
        "p_channel": channel_id,
        "p_now": now,
        "p_limit": 10,
        "p_until": now + 30 * US,
        "p_token": "0" * 32,
    }
    plan = client.explain(client.claim_statement(), params, analyze=backend.name != "sqlite")
    assert plan.strip()
    backlog = client.channel_backlog("t-explain", "c")
    assert (backlog.ready, backlog.in_flight) == (1, 0)


def test_explain_takes_a_list_for_an_expanding_parameter(backend: Backend) -> None:
    client = backend.client()
    client.ensure_channel("t-explain-in", "c")
    messages = schema.messages
    stmt = sa.select(messages.c.id).where(messages.c.id.in_(sa.bindparam("p_ids", expanding=True)))
    for analyze in (False, backend.name != "sqlite"):
        plan = client.explain(stmt, {"p_ids": [1, 2, 3]}, analyze=analyze)
        assert "novaque_messages" in plan or "pk_novaque_messages" in plan or "PRIMARY" in plan
