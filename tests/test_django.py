"""novaque.django on every backend, through a minimal Django project
(tests/django_project) run in subprocesses: Django is configured once per
process, and each test gets a fresh database of its backend."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque import _migrate
from novaque.schema import channels, deliveries
from tests import _preloaded
from tests.conftest import Backend

pytest.importorskip("django")

ROOT = Path(__file__).resolve().parent.parent
#: Statements novaque may send on Django's connection: no BEGIN, COMMIT,
#: ROLLBACK, SAVEPOINT or SET (Django alone runs its transaction); a MariaDB
#: compound statement (BLOCK) only without any of them inside.
DATA_STATEMENTS = {"SELECT", "INSERT", "UPDATE", "WITH", "BLOCK"}


class Project:
    """The test project on one database: ``manage.py`` commands and scenarios."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.env = {**os.environ, "NOVAQUE_DJANGO_URL": url}

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "tests.django_project", *args]

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = _preloaded.run(self.command(*args)[1:], cwd=ROOT, env=self.env, timeout=120)
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def scenario(self, name: str) -> Any:
        """Run a scenario of tests/django_project/shop/management/commands/scenario.py."""
        return json.loads(self.manage("scenario", name).stdout.strip().splitlines()[-1])

    def engine(self) -> sa.Engine:
        return sa.create_engine(self.url, poolclass=sa.NullPool)


@pytest.fixture
def project(backend: Backend, tmp_path: Path) -> Project:
    """A fresh database with Django's and novaque's migrations applied, and
    the channels orders/mailer and orders/audit."""
    made = Project(backend.scratch_url(tmp_path))
    made.manage("migrate", "-v0")
    made.manage("novaque", "migrate")  # creates the channels of NOVAQUE["CONSUMERS"]
    return made


def order(number: int) -> str:
    return json.dumps({"order": number})


def test_commit_stores_the_messages_with_the_rows_of_the_block(project: Project) -> None:
    seen = project.scenario("commit")
    assert seen["orders"] == [1]
    assert len(set(seen["ids"])) == 3
    assert seen["claimed"] == sorted([order(1), order(10), order(11)])
    assert seen["headers"] == {"source": "shop"}
    # Inside the block: Django's transaction, nothing committed, nobody else sees it.
    assert seen["inside"] == [True, False]
    assert seen["seen_before_commit"] == 0
    assert set(seen["sent"]) <= DATA_STATEMENTS, seen["sent"]
    # The counters of a publish count once Django committed.
    assert seen["published"] == 3


def test_rollback_leaves_neither_the_rows_nor_the_message(project: Project) -> None:
    seen = project.scenario("rollback")
    assert seen["orders"] == []
    assert seen["stored"] == []
    assert seen["claimed"] == []
    assert seen["published"] == 0


def test_a_rolled_back_savepoint_drops_only_its_publish(project: Project) -> None:
    seen = project.scenario("savepoint")
    assert seen["orders"] == [3]
    assert seen["claimed"] == sorted([order(3), order(5)])
    assert seen["published"] == 2


def test_publish_outside_atomic_is_one_transaction(project: Project) -> None:
    seen = project.scenario("outside")
    # Django's connection is back in autocommit, outside any block.
    assert seen["after"] == [False, True]
    # The publish that failed after writing its rows left none of them.
    assert seen["failed"] is True
    assert seen["stored"] == [order(6)]
    assert seen["claimed"] == [order(6)]
    assert seen["published"] == 1


def test_migrate_command_applies_novaque_migrations_once(project: Project) -> None:
    again = project.manage("novaque", "migrate")
    assert f"novaque schema at revision {_migrate.head()}" in again.stdout
    assert "channels ready: orders/mailer, orders/audit" in again.stdout
    with project.engine().connect() as conn:
        assert _migrate.current(conn) == _migrate.head()
    client = novaque.connect(project.url)
    try:
        assert client.list_channels("orders") == ["audit", "mailer"]
    finally:
        client.shutdown(timeout=10)


def test_run_command_consumes_until_sigterm(project: Project) -> None:
    ids = project.scenario("publish_orders")["ids"]
    proc = _preloaded.popen(
        project.command("novaque", "run")[1:],
        cwd=ROOT,
        env=project.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        engine = project.engine()
        deadline = time.monotonic() + 60
        mails: list[tuple[int, int]] = []
        audited = False
        while time.monotonic() < deadline and proc.poll() is None:
            with engine.connect() as conn:
                mails = sorted(
                    (int(n), int(m))
                    for n, m in conn.exec_driver_sql(
                        "SELECT order_number, message_id FROM shop_mail"
                    )
                )
                # The audit consumer's deliveries too: it may start after the mailer.
                audited = not conn.execute(
                    sa.select(deliveries.c.id)
                    .join(channels, channels.c.id == deliveries.c.channel_id)
                    .where(channels.c.name == "audit")
                ).first()
            if len(mails) == 2 and audited:
                break
            time.sleep(0.1)  # polling another process, not waiting for time to pass
        assert proc.poll() is None, proc.communicate(timeout=60)
        assert mails == [(20, ids[0]), (21, ids[1])]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == 0, out + err
    assert "novaque: consuming orders/mailer" in out
    assert "orders/audit" in out
    assert "novaque: stopped" in out
    # Both consumers acked everything before the shutdown.
    client = novaque.connect(project.url)
    try:
        for channel in ("mailer", "audit"):
            backlog = client.channel_backlog("orders", channel)
            assert (backlog.ready, backlog.in_flight, backlog.dead) == (0, 0, 0)
    finally:
        client.shutdown(timeout=10)


def test_errors_name_what_is_wrong(tmp_path: Path) -> None:
    made = Project(f"sqlite:///{tmp_path / 'errors.db'}")
    seen = made.scenario("errors")
    assert seen["alias"].startswith("InvalidOption: 'nope' is not a database")
    assert "django.db.backends.oracle" in seen["engine"]
    assert "django.db.backends.postgresql" in seen["engine"]
    assert seen["connection"].startswith("TypeError: novaque.django publishes on Django's")
    assert seen["option"].startswith("InvalidOption: delay")
    # A schema that was never migrated: the command to run is named.
    missing = made.manage("novaque", "run", check=False)
    assert missing.returncode == 1
    assert "novaque migrate" in missing.stderr
    unknown = made.manage("novaque", "run", "orders/nobody", check=False)
    assert unknown.returncode == 1
    assert "'orders/nobody' not in settings.NOVAQUE" in unknown.stderr


def test_a_misspelt_setting_fails_at_start(tmp_path: Path) -> None:
    made = Project(f"sqlite:///{tmp_path / 'typo.db'}")
    made.env["NOVAQUE_DJANGO_TYPO"] = "1"
    done = made.manage("check", check=False)
    assert done.returncode != 0
    assert "settings.NOVAQUE has unknown key(s) 'CONSUMER'" in done.stderr


def test_without_django_the_error_names_the_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['django'] = None; import novaque.django"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "ImportError: novaque.django needs Django" in done.stderr
    assert "pip install 'novaque[django]'" in done.stderr


def test_database_settings_map_to_sqlalchemy_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    import pymysql

    from novaque.django._connect import url_of

    def url(**found: Any) -> str:
        return url_of("default", found).render_as_string(hide_password=False)

    pg = "django.db.backends.postgresql"
    assert url(ENGINE=pg, NAME="app", USER="u", PASSWORD="p@ss", HOST="db", PORT="6432") == (
        "postgresql+psycopg://u:p%40ss@db:6432/app"
    )
    assert url(
        ENGINE=pg, NAME="app", HOST="/run/postgresql", OPTIONS={"sslmode": "require", "pool": {}}
    ) == ("postgresql+psycopg:///app?host=%2Frun%2Fpostgresql&sslmode=require")
    # Django's MySQL backend imports MySQLdb: here PyMySQL's shim.
    monkeypatch.setitem(sys.modules, "MySQLdb", pymysql)
    mysql = "django.db.backends.mysql"
    assert url(ENGINE=mysql, NAME="shop", USER="root", HOST="db", PORT=3307) == (
        "mysql+pymysql://root@db:3307/shop?charset=utf8mb4"
    )
    assert url(ENGINE=mysql, NAME="shop", HOST="/run/mysqld/mysqld.sock") == (
        "mysql+pymysql:///shop?charset=utf8mb4&unix_socket=%2Frun%2Fmysqld%2Fmysqld.sock"
    )
    assert url(ENGINE="django.db.backends.sqlite3", NAME=Path("/srv/app.db")) == (
        "sqlite:////srv/app.db"
    )
    with pytest.raises(novaque.InvalidOption, match="the supported engines are"):
        url(ENGINE="django.db.backends.oracle", NAME="x")


MANAGE_PY = """\
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""


def console_output(page: Path) -> dict[str, list[str]]:
    """What a page's console blocks show each ``$ command`` printing (its
    trailing ``# comment`` left out of the command)."""
    shown: dict[str, list[str]] = {}
    for block in re.findall(r"```console\n(.*?)```", page.read_text(), re.S):
        command = None
        for line in block.splitlines():
            if line.startswith("$ "):
                command = line[2:].split("#")[0].strip()
                shown[command] = []
            elif command is not None:
                shown[command].append(line)
    return shown


def test_the_docs_django_project_publishes_and_consumes(tmp_path: Path) -> None:
    """docs/how-to/django.md, as a project of its own on SQLite: its files,
    Django's own manage.py, and the commands the page shows."""
    import django

    from tests.test_docs import doc_file

    if django.VERSION < (5, 1):
        pytest.skip("the docs' settings use SQLite's transaction_mode (Django >= 5.1)")

    for name in ("mysite/settings.py", "shop/models.py", "shop/orders.py", "shop/handlers.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(doc_file(name))
    (tmp_path / "mysite" / "__init__.py").write_text("")
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "manage.py").write_text(MANAGE_PY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}

    def manage(*args: str) -> str:
        done = _preloaded.run(["manage.py", *args], cwd=tmp_path, env=env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    manage("makemigrations", "shop", "-v0")
    manage("migrate", "-v0")
    migrated = manage("novaque", "migrate")
    assert f"sqlite:///shop.db: novaque schema at revision {_migrate.head()}" in migrated
    assert "channels ready: orders/mailer, orders/stock" in migrated
    # The page's console block shows what these commands print, line for line.
    shown = console_output(ROOT / "docs/how-to/django.md")
    assert shown["python manage.py novaque migrate"] == migrated.splitlines()
    placed = manage(
        "shell",
        "-c",
        "from shop.orders import place_order; print(place_order('ada@example.com').pk)",
    )
    order_id = int(placed.split()[-1])
    proc = _preloaded.popen(
        ["manage.py", "novaque", "run"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'shop.db'}", poolclass=sa.NullPool)
        deadline = time.monotonic() + 60
        confirmed = False
        while not confirmed and time.monotonic() < deadline and proc.poll() is None:
            with engine.connect() as conn:
                confirmed = bool(
                    conn.exec_driver_sql(
                        "SELECT confirmed FROM shop_order WHERE id = ?", (order_id,)
                    ).scalar_one()
                )
            time.sleep(0.1)  # polling another process, not waiting for time to pass
        assert confirmed, proc.communicate(timeout=60) if proc.poll() is not None else "timeout"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == 0, out + err
    assert "novaque: consuming orders/mailer (shop.handlers.send_confirmation)" in out
    started = shown["python manage.py novaque run"]
    assert out.splitlines()[: len(started)] == started
