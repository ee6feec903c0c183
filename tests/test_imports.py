"""What importing novaque loads, in a fresh interpreter each time: Alembic, the
dialect modules of other databases, the admin and the optional integrations
are imported only when used; every public name still resolves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import novaque

ROOT = Path(__file__).resolve().parent.parent

#: Never loaded by ``import novaque``, a client's work or an up-to-date migrate().
OPTIONAL = (
    "alembic",
    "mako",
    "sqlalchemy.orm",
    "novaque.admin",
    "novaque.broker",
    "starlette",
    "uvicorn",
    "novaque.cli",
    "novaque.kombu",
    "kombu",
    "novaque.django",
    "django",
    "novaque.otel",
    "opentelemetry",
    "celery",
)
#: The dialect layers of the other databases (the example works on SQLite).
OTHER_DIALECTS = ("novaque.dialects.mysql", "novaque.dialects.postgres")


def loaded(code: str, *args: str) -> set[str]:
    """The modules in ``sys.modules`` after ``code`` ran in a fresh interpreter."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def under(modules: set[str], names: tuple[str, ...]) -> set[str]:
    return {m for m in modules if any(m == n or m.startswith(f"{n}.") for n in names)}


def test_import_novaque_loads_no_alembic_dialect_or_integration() -> None:
    modules = loaded("import novaque")
    assert under(modules, OPTIONAL) == set()
    assert under(modules, ("novaque.dialects", "sqlalchemy.dialects", "novaque.client")) == set()


def test_a_client_at_work_loads_no_alembic_and_no_other_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    novaque.connect(url).migrate()
    modules = loaded(
        "import sys, novaque\n"
        "client = novaque.connect(sys.argv[1])\n"
        "client.migrate()\n"  # up to date: nothing to run
        "client.ensure_channel('t', 'c')\n"
        "client.publish('t', b'x')\n"
        "[msg] = client.claim('t', 'c')\n"
        "client.ack(msg)",
        url,
    )
    assert under(modules, OPTIONAL) == set()
    assert under(modules, OTHER_DIALECTS) == set()
    assert "novaque.dialects.sqlite" in modules


def test_the_command_line_loads_no_alembic_and_no_admin() -> None:
    modules = loaded("import novaque.cli\nnovaque.cli.build_parser()")
    assert under(modules, tuple(n for n in OPTIONAL if n != "novaque.cli")) == set()


def test_every_public_name_resolves() -> None:
    code = (
        "import novaque\n"
        "missing = [n for n in novaque.__all__ if getattr(novaque, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert novaque.Client.__module__ == 'novaque.client'\n"
        "assert novaque.connect.__module__ == 'novaque.client'\n"
        "assert novaque.Consumer.__module__ == 'novaque.consumer'\n"
        "assert set(novaque.__all__) <= set(dir(novaque))\n"
        "assert novaque.schema.VERSION_TABLE\n"  # a submodule, as an attribute
        "try:\n"
        "    novaque.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
        "from novaque import Client, connect, Consumer\n"
        "from novaque.dialects import MySQLDialect, PostgresDialect, SQLiteDialect, on_index"
    )
    loaded(code)
    assert novaque.__all__ == sorted(novaque.__all__)
