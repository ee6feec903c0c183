"""Alembic environment for novaque's own schema history.

Run from code (``client.migrate()``, ``novaque migrate``): the caller passes an
open connection in ``config.attributes["connection"]``. Offline (``--sql``)
from an application's ``env.py`` (``novaque.schema.upgrade(context)``), the
caller passes the dialect name and the output to write into in
``config.attributes["offline"]``. Run from the command
line with the root ``alembic.ini``: the URL comes from ``NOVAQUE_DATABASE_URL``
or the ini file. Either way the history lives in ``novaque_alembic_version``
and only ``novaque_`` tables are looked at, so an application's own tables and
Alembic history in the same database are never touched.
"""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa
from alembic import context

from novaque._tables import REVISION_TABLE, VERSION_TABLE, exists_on, metadata

config = context.config


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    if type_ == "table":
        # The version table and the revision row are the migrations' own records.
        return (name or "").startswith("novaque_") and name not in (VERSION_TABLE, REVISION_TABLE)
    return reflected or exists_on(obj, context.get_context().dialect.name)


def run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline(opts: dict[str, Any]) -> None:
    context.configure(
        **opts,
        literal_binds=True,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def url() -> str:
    return (
        os.environ.get("NOVAQUE_DATABASE_URL")
        or config.get_main_option("sqlalchemy.url")
        or "sqlite:///novaque.db"
    )


connection = config.attributes.get("connection")
if context.is_offline_mode():
    run_offline(config.attributes.get("offline") or {"url": url()})
elif connection is not None:
    run(connection)
else:
    engine = sa.create_engine(url())
    with engine.connect() as conn:
        run(conn)
    engine.dispose()
