"""Alembic owns the schema: migrations equal the metadata, downgrade is clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import novaque
from novaque import _migrate, dialects, schema
from tests import _preloaded
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parent.parent


def novaque_tables(engine: sa.Engine) -> set[str]:
    return {t for t in sa.inspect(engine).get_table_names() if t.startswith("novaque_")}


def test_the_history_read_without_alembic_is_alembics() -> None:
    scripts = ScriptDirectory.from_config(_migrate.config())
    assert _migrate.head() == scripts.get_current_head()
    assert _migrate.known_revisions() == {s.revision for s in scripts.walk_revisions()}
    assert _migrate.history() == {
        s.revision: tuple(s._all_down_revisions) for s in scripts.walk_revisions()
    }


def test_migrated_schema_equals_the_metadata(backend: Backend, tmp_path: Path) -> None:
    url = backend.scratch_url(tmp_path)
    client = novaque.Client(backend.engine(url))
    client.migrate()
    with backend.engine(url).connect() as conn:

        def only_novaque(
            obj: object, name: str | None, type_: str, reflected: bool, _: object
        ) -> bool:
            if type_ != "table":
                return reflected or schema.exists_on(obj, conn.dialect.name)
            own = (schema.VERSION_TABLE, schema.REVISION_TABLE)
            return (name or "").startswith("novaque_") and name not in own

        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_object": only_novaque}
        )
        assert compare_metadata(context, schema.metadata) == []
        command.check(_migrate.config(conn))  # `alembic check` agrees


def test_migrate_twice_is_a_no_op_and_downgrade_removes_every_table(
    backend: Backend, tmp_path: Path
) -> None:
    url = backend.scratch_url(tmp_path)
    engine = backend.engine(url)
    client = novaque.Client(engine)
    client.migrate()
    client.migrate()
    assert novaque_tables(engine) == {t.name for t in schema.metadata.sorted_tables} | {
        schema.VERSION_TABLE,
        schema.REVISION_TABLE,
    }
    client.publish("t", b"x")
    client.downgrade()
    assert novaque_tables(engine) == {schema.VERSION_TABLE}
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {schema.VERSION_TABLE}")).scalar() == 0
    with pytest.raises(novaque.SchemaOutOfDate, match="novaque migrate"):
        client.publish("t", b"x")
    client.migrate()
    assert client.publish("t", b"x") > 0


def test_unmigrated_database_raises_schema_out_of_date_until_migrated(
    backend: Backend, tmp_path: Path
) -> None:
    url = backend.scratch_url(tmp_path)
    client = novaque.Client(backend.engine(url))  # touches no database
    for call in (
        lambda: client.publish("t", b"x"),
        lambda: client.list_topics(),
        lambda: client.claim("t", "c"),
        lambda: client.ensure_channel("t", "c"),
    ):
        with pytest.raises(novaque.SchemaOutOfDate, match=r"run `novaque migrate`"):
            call()
    novaque.Client(backend.engine(url)).migrate()  # migrated from elsewhere
    assert client.list_topics() == []  # the first client heals


def test_a_publish_after_its_clients_downgrade_raises_schema_out_of_date(
    backend: Backend, tmp_path: Path
) -> None:
    # The topic id is cached, so the publish would take the driver path: it
    # checks the schema first, as every transaction does.
    client = novaque.Client(backend.engine(backend.scratch_url(tmp_path)))
    client.migrate()
    client.ensure_channel("t", "c")
    client.publish("t", b"cached")
    client.downgrade("base")
    with pytest.raises(novaque.SchemaOutOfDate):
        client.publish("t", b"after")
    client.migrate()
    assert client.publish("t", b"again") > 0


def test_an_older_schema_is_reported_with_both_revisions(backend: Backend, tmp_path: Path) -> None:
    url = backend.scratch_url(tmp_path)
    engine = backend.engine(url)
    novaque.Client(engine).migrate()
    with engine.begin() as conn:  # as a newer novaque would leave it
        conn.execute(sa.text(f"UPDATE {schema.VERSION_TABLE} SET version_num = 'zzzz'"))
        conn.execute(sa.text(f"UPDATE {schema.REVISION_TABLE} SET revision = 'zzzz'"))
    _migrate.forget(engine.url)  # as in another process, which never saw it current
    with pytest.raises(
        novaque.SchemaOutOfDate,
        match=f"'zzzz' \\(recorded in {schema.REVISION_TABLE}\\).*does not know",
    ):
        novaque.Client(engine).list_topics()
    with pytest.raises(novaque.SchemaOutOfDate, match="'zzzz'.*does not know"):
        novaque.Client(engine).migrate()


def test_the_application_tables_are_left_alone(backend: Backend, tmp_path: Path) -> None:
    url = backend.scratch_url(tmp_path)
    engine = backend.engine(url)
    app = sa.MetaData()
    sa.Table("app_things", app, sa.Column("id", sa.Integer, primary_key=True))
    app.create_all(engine)
    client = novaque.Client(engine)
    client.migrate()
    client.downgrade()
    assert "app_things" in sa.inspect(engine).get_table_names()


def test_floors_refuse_old_servers() -> None:
    def conn(version: tuple[int, ...], mariadb: bool = False) -> sa.Connection:
        dialect = SimpleNamespace(server_version_info=version, is_mariadb=mariadb)
        return SimpleNamespace(dialect=dialect)  # type: ignore[return-value]

    pg = dialects.PostgresDialect
    pg.check_floor(conn((14, 0)))
    with pytest.raises(novaque.UnsupportedDatabase, match=r"PostgreSQL 13.9 .* >= 14"):
        pg.check_floor(conn((13, 9)))
    my = dialects.MySQLDialect
    my.check_floor(conn((8, 0, 1)))
    with pytest.raises(novaque.UnsupportedDatabase, match=r"MySQL 5.7.44 .* >= 8.0.1"):
        my.check_floor(conn((5, 7, 44)))
    my.check_floor(conn((10, 6, 0), mariadb=True))
    with pytest.raises(novaque.UnsupportedDatabase, match=r"MariaDB 10.5.9 .* >= 10.6"):
        my.check_floor(conn((10, 5, 9), mariadb=True))


def test_in_memory_sqlite_and_unknown_databases_are_refused() -> None:
    with pytest.raises(novaque.UnsupportedDatabase, match="file-backed SQLite"):
        novaque.Client(sa.create_engine("sqlite://"))
    with pytest.raises(novaque.UnsupportedDatabase, match="file-backed SQLite"):
        novaque.connect("sqlite:///:memory:")
    with pytest.raises(novaque.UnsupportedDatabase, match="does not support"):
        novaque.connect("oracle+oracledb://u:p@h/db")


def test_alembic_ini_drives_the_same_migrations(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dev.db'}"
    env = {
        "NOVAQUE_DATABASE_URL": url,
        "PATH": str(Path(sys.executable).parent),
        "PYTHONPATH": str(ROOT),  # this tree's novaque, which env.py imports
    }
    for args in (["upgrade", "head"], ["check"], ["downgrade", "base"]):
        done = _preloaded.run(
            ["-m", "alembic", "-c", str(ROOT / "alembic.ini"), *args],
            cwd=tmp_path,
            env=env,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    assert novaque_tables(sa.create_engine(url)) == {schema.VERSION_TABLE}


def test_processes_migrating_at_once_all_succeed(backend: Backend, tmp_path: Path) -> None:
    url = backend.scratch_url(tmp_path)
    code = "import sys, novaque; novaque.connect(sys.argv[1]).migrate()"
    procs = [
        _preloaded.popen(["-c", code, url], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    client = novaque.Client(backend.engine(url))
    assert client.list_topics() == []


def test_a_worker_started_before_migrate_gets_one_clear_error(
    backend: Backend, tmp_path: Path
) -> None:
    url = backend.scratch_url(tmp_path)
    client = novaque.Client(backend.engine(url))
    calls = {
        "subscribe_and_start": lambda: client.subscribe_and_start("t", "c", lambda msg: None),
        "start": client.start,
        "publish": lambda: client.publish("t", b"x"),
    }
    for name, call in calls.items():
        with pytest.raises(
            novaque.SchemaOutOfDate, match=r"novaque migrate.*client\.migrate\(\)"
        ) as out:
            call()
        # one exception, not the driver's "no such table" chained under it
        assert out.value.__cause__ is None, name
        assert out.value.__context__ is None or out.value.__suppress_context__, name
    assert client._runtime.maintenance is None  # start() refused before starting anything
    client.migrate()
    client.start()
    client.shutdown()


def test_background_loops_log_schema_out_of_date_without_a_traceback() -> None:
    from novaque.consumer import RetryDelay

    errors = RetryDelay()
    assert errors.traceback(novaque.SchemaOutOfDate("run `novaque migrate`")) is None
    first = RuntimeError("boom")
    assert errors.traceback(first) is first  # other errors: the traceback, the first time
    errors.next()
    assert errors.traceback(first) is None
