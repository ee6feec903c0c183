"""One backend-parametrized suite: every test that takes ``backend`` (or
``client``) runs on SQLite, PostgreSQL and MySQL/MariaDB.

Where the servers come from:
- ``NOVAQUE_TEST_POSTGRES_URL`` / ``NOVAQUE_TEST_MYSQL_URL`` point at a server
  (any database on it); the suite creates a private database there for the
  session and drops it at the end, so several runs can share a server. A URL
  that is set but unreachable fails the run: it never turns into a skip.
- With neither set and a Docker engine available, ``testcontainers`` starts
  both servers.
- Otherwise those backends are skipped, with one summary line per backend
  saying how to enable it (``skip_reason``, ``pytest_runtest_makereport``).

Modules marked ``pooled`` run their ``backend`` tests a fourth time, as
``pgbouncer``: PostgreSQL through PgBouncer in transaction pooling, at
``NOVAQUE_TEST_PGBOUNCER_URL`` (``tests/topologies/pgbouncer.sh`` starts one;
``.ci/run`` does), with the settings ``novaque.connect(url, pgbouncer=True)``
uses (no prepared statements, no LISTEN). Unset, those runs are skipped, but
fail when ``CI=true``: CI never skips a topology silently.

Each backend's database is migrated once per session; every test then starts
from empty tables (rows deleted, schema kept), which keeps the suite fast.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque import _core, schema
from novaque.testing import FakeClock
from tests import _preloaded, _serial, _testdb, _twin

BACKENDS = ("sqlite", "postgres", "mysql")
ENV = {"postgres": "NOVAQUE_TEST_POSTGRES_URL", "mysql": "NOVAQUE_TEST_MYSQL_URL"}
#: The fourth backend of modules marked ``pgbouncer``: PostgreSQL through PgBouncer.
PGBOUNCER = "pgbouncer"
PGBOUNCER_ENV = "NOVAQUE_TEST_PGBOUNCER_URL"
#: Example server URLs: any database that exists on the server will do (the
#: suite creates its own); ``postgres`` and ``mysql`` exist on every server.
EXAMPLE_URL = {
    "postgres": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mysql": "mysql+pymysql://root@127.0.0.1:3306/mysql",
}
#: How a backend's skip reason begins: these skips are folded into one line each.
NOT_TESTED = "{name} not tested: "


def skip_reason(name: str) -> str:
    """Why a server backend is skipped, and exactly how to enable it."""
    return (
        NOT_TESTED.format(name=name) + f"set {ENV[name]}={EXAMPLE_URL[name]} (any existing "
        "database of the server; the suite creates and drops its own), or leave both "
        "NOVAQUE_TEST_*_URL unset with a running Docker engine and testcontainers starts "
        "PostgreSQL and MariaDB"
    )


def pytest_configure(config: pytest.Config) -> None:
    """Tests marked ``serial`` run alone (tests/_serial.py)."""
    config.pluginmanager.register(_serial.SerialTests(ENV), "novaque-serial-tests")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Give every skip of an unconfigured backend one location, so that ``-ra``
    prints one line per backend instead of one per test (other skips keep theirs);
    make captured output encodable for the workers of ``make test``."""
    report = yield
    # Captured output may hold lone surrogates (tests feed novaque unstorable
    # text on purpose): a report sent from an xdist worker must be UTF-8.
    report.sections = [
        (name, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for name, text in report.sections
    ]
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2]).removeprefix("Skipped: ")
        if any(reason.startswith(NOT_TESTED.format(name=name)) for name in [*ENV, PGBOUNCER]):
            report.longrepr = (__file__, None, reason)
    return report


@dataclass
class Backend:
    """A migrated database of one backend, shared by the session's tests."""

    name: str
    url: str
    server_url: str | None = None
    engines: list[sa.Engine] = field(default_factory=list)
    clients: list[novaque.Client] = field(default_factory=list)
    _scratch: list[Callable[[], None]] = field(default_factory=list)
    #: Which client :meth:`client` makes: "sync", or "aio" (the asyncio twin
    #: behind the sync surface, see tests/_twin.py) while a ``twin`` test runs.
    twin: str = "sync"
    twins: list[_twin.SyncTwin] = field(default_factory=list)
    #: PostgreSQL through PgBouncer in transaction pooling (``name`` is
    #: "postgres"): engines without prepared statements, clients without LISTEN.
    pgbouncer: bool = False

    @property
    def connect_args(self) -> dict[str, Any]:
        """The driver's arguments of every engine on this backend."""
        return {"prepare_threshold": None} if self.pgbouncer else {}

    def engine(self, url: str | None = None) -> sa.Engine:
        """A plain application-style engine (what users pass to ``Client``)."""
        engine = sa.create_engine(url or self.url, connect_args=self.connect_args)
        self.engines.append(engine)
        return engine

    def client(self, url: str | None = None, **options: Any) -> novaque.Client:
        """A client of the test's twin on a plain engine (``url``: another
        database of the backend, default the session's)."""
        if self.pgbouncer:
            options.setdefault("listen", False)
        if self.twin == "aio":
            made_twin = _twin.make(
                self.name,
                url or self.url,
                _twin_loop(),
                novaque.Options(**options),
                connect_args=self.connect_args,
            )
            self.twins.append(made_twin)
            return made_twin  # type: ignore[return-value]  # the same surface
        made = novaque.Client(self.engine(url), novaque.Options(**options))
        self.clients.append(made)
        return made

    def release(self) -> None:
        """Close what one test opened (the session's database stays)."""
        # Clients a test built itself that counted something: their counter
        # flushers must not outlive the test (and the engines it disposes).
        twin_cores = {id(t.aio._core) for t in self.twins}
        for made_twin in self.twins:
            made_twin.close()
            _core._unflushed.discard(made_twin.aio._core)
        self.twins.clear()
        others = [
            c for c in list(_core._unflushed) if c not in self.clients and id(c) not in twin_cores
        ]
        for made in [*self.clients, *others]:
            shutdown = getattr(made, "shutdown", None)
            if shutdown is not None:
                shutdown(timeout=10)
            _core._unflushed.discard(made)
            if made._context.executor.engine is not made.engine:
                made._context.executor.engine.dispose()
        for engine in self.engines:
            engine.dispose()
        self.clients.clear()
        self.engines.clear()

    def scratch_url(self, tmp_path: Path) -> str:
        """A fresh, empty database of this backend (dropped at session end)."""
        if self.name == "sqlite":
            return f"sqlite:///{tmp_path / ('scratch-' + secrets.token_hex(4) + '.db')}"
        assert self.server_url is not None
        url, drop = _create_database(self.name, self.server_url)
        self._scratch.append(drop)
        return url

    _cleaner: sa.Engine | None = None

    def empty_tables(self) -> None:
        """Delete every row of novaque's tables (the schema stays).

        On one engine kept for the session: a fresh one per test paid a
        server connection and SQLAlchemy's first-connect queries each time
        (25 ms on MariaDB). Its connection is checked before each use: a test
        may have ended it (sessions killed, a server restarted)."""
        if self._cleaner is None:
            self._cleaner = sa.create_engine(
                self.url, pool_pre_ping=True, pool_size=1, connect_args=self.connect_args
            )
        with self._cleaner.begin() as conn:
            for table in reversed(schema.metadata.sorted_tables):
                conn.execute(table.delete())

    def close(self) -> None:
        self.release()
        if self._cleaner is not None:
            self._cleaner.dispose()
        # The suite is over: counters still buffered in clients of its
        # databases are not flushed at exit to databases dropped by then.
        for made in list(_core._unflushed):
            made._context.stats.take()
        for drop in self._scratch:
            drop()


def _create_database(name: str, server_url: str) -> tuple[str, Callable[[], None]]:
    """A new database of the server, named for this process (tests/_testdb.py)."""
    return _testdb.create(name, server_url)


def _docker_available() -> bool:
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return False
    try:
        import docker  # type: ignore[import-untyped]

        engine = docker.from_env()
        try:
            return bool(engine.ping())
        finally:
            engine.close()
    except Exception:
        return False


_containers: dict[str, Any] = {}


def _check_reachable(env: str, url: str) -> None:
    """Fail the test (never skip it) when the server ``env`` names does not answer."""
    engine = sa.create_engine(url)
    try:
        with engine.connect():
            pass
    except Exception as exc:
        pytest.fail(
            f"{env} is set to {url!r} but the server is unreachable: {type(exc).__name__}: {exc}"
        )
    finally:
        engine.dispose()


def _server_url(name: str) -> tuple[str | None, str]:
    """The server URL for a backend, or None with the reason it is skipped."""
    configured = os.environ.get(ENV[name])
    if configured:
        _check_reachable(ENV[name], configured)
        return configured, ""
    if any(os.environ.get(v) for v in ENV.values()) or not _docker_available():
        return None, skip_reason(name)
    if name == "postgres":
        from testcontainers.postgres import PostgresContainer

        container: Any = PostgresContainer("postgres:16", driver="psycopg")
    else:
        from testcontainers.mysql import MySqlContainer

        container = MySqlContainer("mariadb:11", dialect="pymysql")
    container.start()
    _containers[name] = container
    return container.get_connection_url(), ""


@pytest.fixture(scope="session")
def _backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Backend]]:
    made: dict[str, Backend] = {}
    yield made
    for backend in made.values():
        backend.close()
    for container in _containers.values():
        container.stop()


def topology_url(env: str, name: str, how: str) -> str:
    """The URL of a topology the test set-up starts (``env``), or a skip saying
    how to start it; under ``CI=true`` a failure instead: CI never skips one."""
    url = os.environ.get(env)
    if url:
        return url
    reason = f"{NOT_TESTED.format(name=name)}set {env} ({how})"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def _make_backend(name: str, made: dict[str, Backend], tmp: Path) -> Backend:
    if name in made:
        return made[name]
    if name == "sqlite":
        backend = Backend("sqlite", f"sqlite:///{tmp / 'novaque-test.db'}")
    elif name == PGBOUNCER:
        server = topology_url(
            PGBOUNCER_ENV,
            PGBOUNCER,
            "tests/topologies/pgbouncer.sh start; then export "
            f"{PGBOUNCER_ENV}=$(tests/topologies/pgbouncer.sh url)",
        )
        _check_reachable(PGBOUNCER_ENV, server)
        url, drop = _create_database("postgres", server)
        backend = Backend("postgres", url, server_url=server, pgbouncer=True)
        backend._scratch.append(drop)
    else:
        server, reason = _server_url(name)
        if server is None:
            pytest.skip(reason)
        url, drop = _create_database(name, server)
        backend = Backend(name, url, server_url=server)
        backend._scratch.append(drop)
    backend.client().migrate()
    backend.release()
    made[name] = backend
    return backend


@pytest.fixture  # parametrized by pytest_generate_tests
def backend(
    request: pytest.FixtureRequest,
    _backends: dict[str, Backend],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Backend]:
    """Each backend in turn, its tables emptied for the test."""
    made = _make_backend(request.param, _backends, tmp_path_factory.getbasetemp())
    made.empty_tables()
    yield made
    made.release()


_loop: _twin.Loop | None = None


def _twin_loop() -> _twin.Loop:
    """The session's event loop for the asyncio twin (started on first use)."""
    global _loop
    if _loop is None:
        _loop = _twin.Loop()
    return _loop


TWINS = ("sync", "aio")
#: The two ways a hot operation runs (a module that uses the ``way`` fixture
#: runs on both): in the driver's SQL where the dialect writes it so, and
#: through SQLAlchemy Core.
WAYS = ("driver", "core")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    definition = metafunc.definition
    if "backend" in metafunc.fixturenames and not any(
        "backend" in str(m.args[0]) for m in definition.iter_markers("parametrize")
    ):
        # Every backend, unless the test names its own; in a module marked
        # pooled, PostgreSQL through PgBouncer too.
        through = [PGBOUNCER] if definition.get_closest_marker("pooled") is not None else []
        metafunc.parametrize("backend", [*BACKENDS, *through], indirect=True)
    if "twin" in metafunc.fixturenames:
        # A test of what only the sync client has (a sync caller's connection,
        # threads) is marked sync_only.
        sync_only = metafunc.definition.get_closest_marker("sync_only") is not None
        metafunc.parametrize("twin", ["sync"] if sync_only else TWINS, indirect=True)
    if "way" in metafunc.fixturenames:
        metafunc.parametrize("way", WAYS)


@pytest.fixture
def twin(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each client in turn: a module that uses this fixture (``pytestmark =
    pytest.mark.usefixtures("twin")``) runs its tests on novaque.Client and on
    novaque.aio.AsyncClient (through tests/_twin.py's sync surface), but those
    marked ``sync_only``."""
    if "backend" not in request.fixturenames:  # a test of no database
        yield request.param
        return
    backend: Backend = request.getfixturevalue("backend")
    backend.twin = request.param
    yield request.param
    backend.release()
    backend.twin = "sync"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def client(request: pytest.FixtureRequest, backend: Backend, clock: FakeClock) -> novaque.Client:
    """A client on the backend with the fake clock (closed by ``backend``); the
    twin of the test's ``twin`` parameter where the module runs on both."""
    if "twin" in request.fixturenames:
        request.getfixturevalue("twin")
    made = backend.client(clock=clock)
    if "way" in request.fixturenames:
        # The executor's own switch: "core" runs every operation through
        # SQLAlchemy Core, as an engine with cursor events does.
        made._context.executor.use_driver = request.getfixturevalue("way") == "driver"
    return made


@pytest.fixture
def workers() -> Iterator[list[Any]]:
    """Worker processes a test starts (anything with a ``proc``: a ``Popen``);
    whatever is still running at the end is killed, whatever happened."""
    made: list[Any] = []
    yield made
    for worker in made:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(timeout=60)


def run_pytest(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """pytest in a subprocess in ``cwd`` (quiet, no cache), as a project would run it.

    ``env`` defaults to this process's environment without its ``PYTEST_*``
    variables (so this run's options do not leak into the project's).
    """
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return _preloaded.run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=cwd, env=env, timeout=timeout
    )


def driverless(backend: Backend) -> list[str]:
    """The backend's URL in each form that names no driver, as platforms give
    them (Heroku and many others: ``postgres://``)."""
    url = sa.make_url(backend.url)
    schemes = {"postgresql": ["postgres", "postgresql"], "mysql": ["mysql"], "sqlite": ["sqlite"]}
    return [
        url.set(drivername=scheme).render_as_string(hide_password=False)
        for scheme in schemes[url.get_backend_name()]
    ]


def kill_other_sessions(backend: Backend) -> int:
    """End every other server session on the test database; how many were ended."""
    admin = sa.create_engine(backend.url, poolclass=sa.NullPool)
    try:
        with admin.begin() as conn:
            if backend.name == "postgres":
                return len(
                    conn.exec_driver_sql(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    ).all()
                )
            ids = conn.exec_driver_sql(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            ).all()
            for (session,) in ids:
                conn.exec_driver_sql(f"KILL {int(session)}")
            return len(ids)
    finally:
        admin.dispose()
