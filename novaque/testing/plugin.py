"""novaque's pytest plugin: fixtures for testing code that uses novaque.

Registered through the ``pytest11`` entry point, so installing novaque is
enough (with plugin autoloading off: ``pytest -p novaque.testing.plugin``).
Every fixture name starts with ``novaque_``:

- ``novaque_clock``: a :class:`~novaque.testing.FakeClock` for the test;
- ``novaque_options``: a ``dict`` of further :class:`~novaque.Options`
  fields for ``novaque_client`` (empty; override the fixture in a
  ``conftest.py`` to change them);
- ``novaque_client``: a :class:`~novaque.Client` on a migrated SQLite
  database of the test's own (in ``tmp_path``), with ``novaque_clock`` as
  its clock; shut down at the end of the test.

The schema is migrated once per test session, into a template database
that each test gets a copy of.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import novaque
from novaque.testing import FakeClock

__all__ = ["novaque_client", "novaque_clock", "novaque_options"]

#: What the files of a SQLite database are called besides the database itself.
_SQLITE_SIDE_FILES = ("-wal", "-shm")


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def _novaque_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database with novaque's schema, migrated once per session."""
    path = tmp_path_factory.mktemp("novaque-template") / "novaque.db"
    client = novaque.connect(_url(path))
    try:
        client.migrate()
    finally:
        client.shutdown(timeout=10)
    return path


@pytest.fixture
def novaque_clock() -> FakeClock:
    """The fake clock of ``novaque_client``: starts at the real time now."""
    return FakeClock()


@pytest.fixture
def novaque_options() -> dict[str, Any]:
    """:class:`~novaque.Options` fields for ``novaque_client`` (none by default).

    Override it in a ``conftest.py`` (or a test module) to change them::

        @pytest.fixture
        def novaque_options():
            return {"default_max_attempts": 3, "backoff": novaque.Backoff(base=0)}
    """
    return {}


@pytest.fixture
def novaque_client(
    _novaque_template: Path,
    tmp_path: Path,
    novaque_clock: FakeClock,
    novaque_options: dict[str, Any],
) -> Iterator[novaque.Client]:
    """A client on a migrated SQLite database of this test's own, on ``novaque_clock``.

    The database is ``tmp_path / "novaque.db"``; ``novaque_client.engine`` is
    its engine, for the application's own tables. The client is shut down
    (consumers, maintenance, connections) when the test ends.
    """
    if "clock" in novaque_options:
        raise TypeError(
            "novaque_options must not set clock: novaque_client runs on the novaque_clock "
            "fixture (override that one instead)"
        )
    path = tmp_path / "novaque.db"
    for suffix in ("", *_SQLITE_SIDE_FILES):
        source = _novaque_template.with_name(_novaque_template.name + suffix)
        if source.exists():
            shutil.copyfile(source, path.with_name(path.name + suffix))
    client = novaque.connect(_url(path), clock=novaque_clock, **novaque_options)
    try:
        yield client
    finally:
        client.shutdown(timeout=10)
