"""The code in README.md and docs/guide.md runs as written.

Blocks without a marker run in order, in one namespace, on SQLite in a fresh
folder. ``# backend: postgres`` / ``# backend: mysql`` blocks run against the
test server (the example URL swapped for the server's). ``# file: NAME``
blocks are files that a test builds a project around.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import Backend

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
EXAMPLE_URL = re.compile(r'"(postgresql\+psycopg|mysql\+pymysql)://app:secret@localhost/app"')


def blocks(doc: str) -> list[str]:
    return BLOCK.findall((ROOT / doc).read_text())


def marker(block: str) -> str:
    first = block.splitlines()[0]
    return first[2:].strip() if first.startswith("# ") and ":" in first else ""


@pytest.mark.parametrize("doc", ["README.md", "docs/guide.md"])
def test_sqlite_examples_run(doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "docs_example"}
    ran = 0
    for block in blocks(doc):
        if marker(block):
            continue
        exec(compile(block, f"{doc} example {ran + 1}", "exec", dont_inherit=True), namespace)
        ran += 1
    assert ran >= 1
    for value in namespace.values():
        if isinstance(value, sa.Engine):
            value.dispose()
        engine = getattr(getattr(value, "_dialect", None), "engine", None)
        if isinstance(engine, sa.Engine):
            engine.dispose()


def test_server_examples_run(backend: Backend) -> None:
    wanted = {"postgres": "backend: postgres", "mysql": "backend: mysql"}.get(backend.name)
    if wanted is None:
        return  # SQLite's examples run in test_sqlite_examples_run
    examples = [b for b in blocks("docs/guide.md") if marker(b) == wanted]
    assert examples, f"the guide shows no {backend.name} example"
    for block in examples:
        code = EXAMPLE_URL.sub(repr(backend.url), block)
        namespace: dict[str, object] = {}
        exec(compile(code, f"guide {backend.name} example", "exec", dont_inherit=True), namespace)
        client = namespace["client"]
        assert client.list_topics() == ["audit"]  # type: ignore[attr-defined]
        client.engine.dispose()  # type: ignore[attr-defined]


def test_alembic_env_example_upgrades_both_histories(tmp_path: Path) -> None:
    (env,) = [b for b in blocks("docs/guide.md") if marker(b) == "file: env.py"]
    project = tmp_path / "app"
    (project / "migrations" / "versions").mkdir(parents=True)
    (project / "myapp").mkdir()
    (project / "myapp" / "__init__.py").write_text("")
    (project / "myapp" / "models.py").write_text(
        textwrap.dedent("""
        import sqlalchemy as sa
        metadata = sa.MetaData()
        things = sa.Table("things", metadata, sa.Column("id", sa.Integer, primary_key=True))
    """)
    )
    (project / "migrations" / "env.py").write_text(env)
    (project / "migrations" / "script.py.mako").write_text(
        (ROOT / "migrations" / "script.py.mako").read_text()
    )
    (project / "migrations" / "versions" / "a1_things.py").write_text(
        textwrap.dedent("""
        import sqlalchemy as sa
        from alembic import op
        revision = "a1"
        down_revision = None
        branch_labels = None
        depends_on = None
        def upgrade():
            op.create_table("things", sa.Column("id", sa.Integer, primary_key=True))
        def downgrade():
            op.drop_table("things")
    """)
    )
    db = project / "app.db"
    (project / "alembic.ini").write_text(
        f"[alembic]\nscript_location = migrations\nprepend_sys_path = .\n"
        f"sqlalchemy.url = sqlite:///{db}\n"
    )
    env_vars = {**os.environ, "PYTHONPATH": str(ROOT)}

    def alembic(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "alembic", *args],
            cwd=project,
            env=env_vars,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done

    alembic("upgrade", "head")
    tables = set(sa.inspect(sa.create_engine(f"sqlite:///{db}")).get_table_names())
    assert {"things", "alembic_version", "novaque_alembic_version", "novaque_messages"} <= tables
    # the application's autogenerate proposes nothing about novaque's tables
    out = alembic("revision", "--autogenerate", "-m", "noop")
    generated = next(
        p for p in (project / "migrations" / "versions").iterdir() if "noop" in p.name
    ).read_text()
    assert "novaque" not in generated, out.stderr
    import novaque

    client = novaque.Client(sa.create_engine(f"sqlite:///{db}"))
    assert client.list_topics() == []  # novaque finds its schema current
    client._dialect.engine.dispose()
