"""The two Alembic recipes of docs/how-to/migrations.md, end to end in a
throwaway application.

Each test builds an application Alembic environment in ``tmp_path`` (a real
``alembic.ini``, the docs' ``env.py``, one application migration creating
``things``) and drives the real ``alembic`` command in a subprocess on a
fresh database of each backend.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from novaque import schema
from tests import _preloaded
from tests.conftest import Backend
from tests.test_docs import doc_file, fenced

ROOT = Path(__file__).resolve().parent.parent
NOVAQUE_TABLES = {t.name for t in schema.metadata.sorted_tables}
APP_MIGRATION = """
import sqlalchemy as sa
from alembic import op
revision = "a1"
down_revision = None
branch_labels = ("myapp",)
depends_on = None
def upgrade():
    op.create_table("things", sa.Column("id", sa.Integer, primary_key=True))
def downgrade():
    op.drop_table("things")
"""
MODELS = """
import sqlalchemy as sa
metadata = sa.MetaData()
things = sa.Table("things", metadata, sa.Column("id", sa.Integer, primary_key=True))
"""


def docs_env() -> str:
    """The ``env.py`` of docs/how-to/migrations.md."""
    return doc_file("env.py")


def docs_ini_lines() -> list[str]:
    """The ``alembic.ini`` of docs/how-to/migrations.md (the docs' one ini block)."""
    (ini,) = fenced("ini")
    return str(ini).splitlines()


class App:
    """An application's Alembic project on one database."""

    def __init__(
        self,
        root: Path,
        url: str,
        *,
        branch: bool,
        pythonpath: str = str(ROOT),
        connection: bool = False,
        version_table: str = "alembic_version",
    ):
        self.root, self.url, self.version_table = root, url, version_table
        (root / "migrations" / "versions").mkdir(parents=True)
        (root / "myapp").mkdir()
        (root / "myapp" / "__init__.py").write_text("")
        (root / "myapp" / "models.py").write_text(textwrap.dedent(MODELS))
        env = docs_env()
        if branch:  # the branch recipe: the same env.py without novaque's line
            env = "\n".join(line for line in env.splitlines() if "schema.upgrade" not in line)
        if connection:  # the older recipe: novaque.schema.upgrade(connection)
            env = connection_recipe(env)
        if version_table != "alembic_version":  # the application names its version table
            options = '"include_object": novaque.schema.include_object}'
            assert options in env
            env = env.replace(options, f'{options[:-1]}, "version_table": {version_table!r}}}')
        (root / "migrations" / "env.py").write_text(env)
        (root / "migrations" / "script.py.mako").write_text(
            (ROOT / "migrations" / "script.py.mako").read_text()
        )
        (root / "migrations" / "versions" / "a1_things.py").write_text(
            textwrap.dedent(APP_MIGRATION)
        )
        ini = ["[alembic]", "script_location = %(here)s/migrations", "prepend_sys_path = ."]
        if branch:
            ini = docs_ini_lines()
        (root / "alembic.ini").write_text(
            "\n".join([*ini, f"sqlalchemy.url = {url.replace('%', '%%')}", ""])
        )
        self.env = {**os.environ, "PYTHONPATH": pythonpath}

    def alembic(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = _preloaded.run(["-m", "alembic", *args], cwd=self.root, env=self.env, timeout=120)
        if ok:
            assert done.returncode == 0, done.stderr
        return done

    def tables(self) -> set[str]:
        engine = sa.create_engine(self.url, poolclass=sa.NullPool)
        try:
            return set(sa.inspect(engine).get_table_names())
        finally:
            engine.dispose()

    def versions(self) -> set[str]:
        engine = sa.create_engine(self.url, poolclass=sa.NullPool)
        try:
            with engine.connect() as conn:
                return set(
                    conn.execute(sa.text(f"SELECT version_num FROM {self.version_table}")).scalars()
                )
        finally:
            engine.dispose()

    def generated(self, slug: str) -> str:
        (path,) = [p for p in (self.root / "migrations" / "versions").iterdir() if slug in p.name]
        text = path.read_text()
        path.unlink()  # an empty probe revision; keep the history as it was
        return text


def connection_recipe(env: str) -> str:
    """The docs' env.py with the connection passed instead of ``context``,
    in the online branch and (opening one, as some env.py files do) offline."""
    online = "        novaque.schema.upgrade(context)  # novaque's migrations, after yours"
    offline = "    novaque.schema.upgrade(context)  # novaque's DDL, printed after yours"
    assert online in env
    assert offline in env
    env = env.replace(online, "        novaque.schema.upgrade(connection)")
    return env.replace(
        offline,
        "    live = engine_from_config(config.get_section(config.config_ini_section, {}), "
        'prefix="sqlalchemy.", poolclass=pool.NullPool)\n'
        "    with live.connect() as connection:\n"
        "        novaque.schema.upgrade(connection)\n"
        "    live.dispose()",
    )


def snapshot(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table of the database (to show a command changed nothing)."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            found: dict[str, list[tuple[object, ...]]] = {}
            for name in sorted(sa.inspect(conn).get_table_names()):
                table = sa.Table(name, sa.MetaData(), autoload_with=conn)
                found[name] = sorted((tuple(row) for row in conn.execute(table.select())), key=repr)
            return found
    finally:
        engine.dispose()


def check_client(backend: Backend, url: str) -> None:
    """A client accepts the schema, and migrate() then applies nothing."""
    engine = backend.engine(url)
    client = novaque.Client(engine)
    assert client.list_topics() == []
    before = snapshot(url)
    client.migrate()  # a no-op: the tables exist, in either recipe
    assert snapshot(url) == before  # no table, no row, no version written
    client.publish("orders", b"x")
    assert client.list_topics() == ["orders"]


def assert_offline_sql(out: str, *, heads: bool) -> None:
    for table in (*NOVAQUE_TABLES, "things"):
        assert re.search(rf"CREATE TABLE [`\"]?{table}\b", out), (table, out)
    assert "INSERT INTO alembic_version" in out
    assert f"INSERT INTO {schema.REVISION_TABLE}" in out  # novaque's own record of its revision
    if not heads:  # the env.py recipe: novaque's history in its own table
        assert "INSERT INTO novaque_alembic_version" in out


def test_env_py_recipe_upgrades_both_and_read_only_commands_run_no_ddl(
    backend: Backend, tmp_path: Path
) -> None:
    app = App(tmp_path / "app", backend.scratch_url(tmp_path), branch=False)
    app.alembic("current")
    assert app.tables() == set()  # `current` ran no DDL
    out = app.alembic("upgrade", "head", "--sql").stdout
    assert_offline_sql(out, heads=False)
    assert app.tables() == set()  # offline touched nothing
    app.alembic("upgrade", "heads")  # one application head: the same as `head`
    assert app.tables() >= {"things", "alembic_version", schema.VERSION_TABLE, *NOVAQUE_TABLES}
    assert app.versions() == {"a1"}
    before = snapshot(app.url)
    assert_offline_sql(app.alembic("upgrade", "head", "--sql").stdout, heads=False)
    assert snapshot(app.url) == before  # offline on a migrated database: still nothing
    app.alembic("check")  # novaque's tables are not the application's business
    app.alembic("revision", "--autogenerate", "-m", "probe")
    assert "novaque" not in app.generated("probe")  # nothing proposed about novaque
    app.alembic("upgrade", "head")  # again: changes nothing
    check_client(backend, app.url)
    app.alembic("downgrade", "base")  # the application's: novaque's tables stay
    assert "things" not in app.tables()
    assert app.tables() >= {schema.VERSION_TABLE, *NOVAQUE_TABLES}


def test_env_py_recipe_autogenerate_on_a_fresh_database_runs_no_novaque_ddl(
    backend: Backend, tmp_path: Path
) -> None:
    app = App(tmp_path / "app", backend.scratch_url(tmp_path), branch=False)
    app.alembic("stamp", "head")  # the application is "current" without its table
    assert app.tables() == {"alembic_version"}  # `stamp` ran none of novaque's DDL
    app.alembic("revision", "--autogenerate", "-m", "probe")
    generated = app.generated("probe")
    assert "things" in generated
    assert "novaque" not in generated
    app.alembic("current")
    app.alembic("history")
    app.alembic("check", ok=False)  # `things` is missing: check fails, and changes nothing
    app.alembic("stamp", "base")
    assert app.tables() == {"alembic_version"}
    with pytest.raises(novaque.SchemaOutOfDate, match="novaque migrate"):
        novaque.Client(backend.engine(app.url)).list_topics()


def test_connection_recipe_is_offline_safe_and_upgrades_both(
    backend: Backend, tmp_path: Path
) -> None:
    """``novaque.schema.upgrade(connection)``: the same rules as with ``context``,
    even from an offline branch that opens a connection to the live database."""
    app = App(tmp_path / "app", backend.scratch_url(tmp_path), branch=False, connection=True)
    assert "novaque.schema.upgrade(context)" not in (app.root / "migrations" / "env.py").read_text()
    out = app.alembic("upgrade", "head", "--sql").stdout
    assert_offline_sql(out, heads=False)
    assert app.tables() == set()  # the open connection was not used
    app.alembic("stamp", "head")
    app.alembic("revision", "--autogenerate", "-m", "probe")
    assert "novaque" not in app.generated("probe")
    assert app.tables() == {"alembic_version"}  # stamp and autogenerate: no novaque DDL
    app.alembic("stamp", "base")
    app.alembic("upgrade", "heads")
    assert app.tables() >= {"things", "alembic_version", schema.VERSION_TABLE, *NOVAQUE_TABLES}
    before = snapshot(app.url)
    app.alembic("upgrade", "head", "--sql")
    assert snapshot(app.url) == before
    check_client(backend, app.url)


def from_the_source_tree(app: App) -> App:
    """From the source tree novaque's scripts are not inside the package: point
    at them by path (test_branch_recipe_from_an_installed_layout covers the
    resource name of the docs)."""
    assert f"{schema.version_location()}" == str(ROOT / "migrations" / "versions")
    ini = (app.root / "alembic.ini").read_text()
    (app.root / "alembic.ini").write_text(
        ini.replace("novaque:migrations/versions", schema.version_location())
    )
    return app


def test_branch_recipe_upgrade_heads_applies_both(backend: Backend, tmp_path: Path) -> None:
    app = from_the_source_tree(App(tmp_path / "app", backend.scratch_url(tmp_path), branch=True))
    out = app.alembic("upgrade", "heads", "--sql").stdout
    assert_offline_sql(out, heads=True)
    assert app.tables() == set()
    app.alembic("upgrade", "heads")
    assert app.tables() >= {"things", "alembic_version", *NOVAQUE_TABLES}
    assert app.versions() == {"a1", novaque._migrate.head()}
    assert "(novaque)" in app.alembic("heads").stdout  # the branch label
    before = snapshot(app.url)
    assert_offline_sql(app.alembic("upgrade", "heads", "--sql").stdout, heads=True)
    assert snapshot(app.url) == before  # offline on a migrated database: still nothing
    app.alembic("check")
    app.alembic("revision", "--autogenerate", "--head", "myapp@head", "-m", "probe")
    assert "novaque" not in app.generated("probe")
    check_client(backend, app.url)
    assert app.versions() == {"a1", novaque._migrate.head()}  # migrate() wrote nothing
    with sa.create_engine(app.url, poolclass=sa.NullPool).connect() as conn:
        assert novaque._migrate.current(conn) == novaque._migrate.head()


def test_branch_recipe_with_the_applications_own_version_table(
    backend: Backend, tmp_path: Path
) -> None:
    """An environment that names its version table: novaque's revision is
    found all the same, and migrate() applies nothing a second time."""
    url = backend.scratch_url(tmp_path)
    app = App(tmp_path / "app", url, branch=True, version_table="app_alembic_version")
    from_the_source_tree(app).alembic("upgrade", "heads")
    tables = app.tables()
    assert tables >= {"things", "app_alembic_version", *NOVAQUE_TABLES}
    assert not {"alembic_version", schema.VERSION_TABLE} & tables
    assert app.versions() == {"a1", novaque._migrate.head()}
    check_client(backend, url)
    assert app.versions() == {"a1", novaque._migrate.head()}  # migrate() wrote nothing
    with sa.create_engine(url, poolclass=sa.NullPool).connect() as conn:
        assert novaque._migrate.current(conn) == novaque._migrate.head()
    with pytest.raises(
        novaque.SchemaOutOfDate,
        match=r"kept by your Alembic history \(in novaque_schema\): move it with `alembic "
        r"upgrade` or `alembic downgrade` there, not with migrate\(to='0005'\)",
    ):
        novaque.Client(backend.engine(url)).migrate(to="0005")
    assert app.versions() == {"a1", novaque._migrate.head()}


def test_own_version_table_from_before_the_revision_table_asks_for_alembic(
    backend: Backend, tmp_path: Path
) -> None:
    """Migrated into the application's own version table before novaque's
    migrations recorded their revision themselves: the error names the
    revision found, where, and the command; that command then cures it."""
    url = backend.scratch_url(tmp_path)
    app = App(tmp_path / "app", url, branch=True, version_table="app_alembic_version")
    before = novaque._migrate.history()[schema_revision_since()][0]
    from_the_source_tree(app).alembic("upgrade", "myapp@head")
    app.alembic("upgrade", before)
    assert app.versions() == {"a1", before}
    assert schema.REVISION_TABLE not in app.tables()
    for call in (lambda c: c.list_topics(), lambda c: c.migrate()):
        with pytest.raises(
            novaque.SchemaOutOfDate,
            match=rf"at revision '{before}' \(recorded in app_alembic_version\), this version "
            rf"of novaque needs '{novaque._migrate.head()}': run `alembic upgrade heads`",
        ):
            call(novaque.Client(backend.engine(url)))
    assert app.versions() == {"a1", before}  # migrate() ran nothing
    app.alembic("upgrade", "heads")
    check_client(backend, url)


def test_novaque_tables_without_any_revision_say_what_was_found(
    backend: Backend, tmp_path: Path
) -> None:
    url = backend.scratch_url(tmp_path)
    app = App(tmp_path / "app", url, branch=True, version_table="app_alembic_version")
    from_the_source_tree(app).alembic("upgrade", "heads")
    engine = backend.engine(url)
    with engine.begin() as conn:  # novaque's revision lost (a hand-made copy of the tables)
        conn.execute(sa.text(f"DROP TABLE {schema.REVISION_TABLE}"))
        conn.execute(sa.text("DELETE FROM app_alembic_version WHERE version_num <> 'a1'"))
    novaque._migrate.forget(engine.url)
    expected = (
        rf"novaque's tables are in this database \({len(NOVAQUE_TABLES)} of them\), but no "
        rf"table records their revision: {schema.REVISION_TABLE} and "
        rf"{schema.VERSION_TABLE} are missing or empty, and no Alembic version table holds "
        r"exactly one of novaque's revisions \(app_alembic_version: 'a1'\)\. If an Alembic "
        r"environment of yours ran novaque's migrations, run `alembic upgrade heads` there"
    )
    for call in (lambda c: c.list_topics(), lambda c: c.migrate()):
        with pytest.raises(novaque.SchemaOutOfDate, match=expected):
            call(novaque.Client(engine))
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE app_alembic_version"))
    with pytest.raises(novaque.SchemaOutOfDate, match="has no other Alembic version table"):
        novaque.Client(engine).list_topics()


def schema_revision_since() -> str:
    """The first revision that writes novaque's revision table."""
    return novaque._migrate.REVISION_TABLE_SINCE


def test_branch_recipe_with_an_older_novaque_revision_asks_for_alembic(
    backend: Backend, tmp_path: Path
) -> None:
    url = backend.scratch_url(tmp_path)
    engine = backend.engine(url)
    novaque.Client(engine).migrate()
    with engine.begin() as conn:  # as if novaque's revision lived in the app's table
        conn.execute(sa.text(f"DELETE FROM {schema.VERSION_TABLE}"))
        conn.execute(sa.text(f"DROP TABLE {schema.REVISION_TABLE}"))  # as before 0009
        conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
        conn.execute(sa.text("INSERT INTO alembic_version VALUES ('a1'), ('0000')"))
    novaque._migrate.forget(engine.url)  # as in another process, which never saw it current
    with pytest.raises(
        novaque.SchemaOutOfDate,
        match=r"novaque's tables are in this database .* no table records their revision.*"
        r"alembic_version: '0000', 'a1'.*run `alembic upgrade heads` there",
    ):
        novaque.Client(engine).list_topics()  # '0000' is not one of novaque's
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE alembic_version SET version_num = 'old' WHERE version_num = '0000'")
        )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            novaque._migrate, "known_revisions", lambda: frozenset({"old", novaque._migrate.head()})
        )
        with pytest.raises(novaque.SchemaOutOfDate, match=r"'old'.*alembic upgrade heads"):
            novaque.Client(engine).list_topics()
        with pytest.raises(novaque.SchemaOutOfDate, match=r"'old'.*alembic upgrade heads"):
            novaque.Client(engine).migrate()


def test_branch_recipe_from_an_installed_layout(tmp_path: Path) -> None:
    """The docs' ``novaque:migrations/versions`` names the folder of the wheel."""
    site = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "novaque", site / "novaque", ignore=ignore)
    # pyproject.toml force-includes the top-level migrations/ as novaque/migrations
    shutil.copytree(ROOT / "migrations", site / "novaque" / "migrations", ignore=ignore)
    url = f"sqlite:///{tmp_path / 'app.db'}"
    app = App(tmp_path / "app", url, branch=True, pythonpath=str(site))
    app.alembic("upgrade", "heads")
    assert app.tables() >= {"things", *NOVAQUE_TABLES}
    located = subprocess.run(
        [sys.executable, "-c", "import novaque.schema as s; print(s.version_location())"],
        env=app.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert located == str(site / "novaque" / "migrations" / "versions")
