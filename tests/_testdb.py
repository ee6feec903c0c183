"""The suite's databases on the PostgreSQL and MySQL servers: named for the
process that made them, dropped when it ends, and cleaned up after a run
that could not.

A database is ``novaque_t_<pid>_<start>_<n>``: the test process's id, when
that process started (UTC, to the second) and a counter. The process drops
its databases at the end of the session, at exit, and on SIGTERM (then dies
of the signal, as it would have). What a killed run leaves behind,
``make test-clean`` (``python -m tests._testdb``) drops: every such database
whose process no longer runs on this host.
"""

from __future__ import annotations

import atexit
import calendar
import contextlib
import itertools
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

import sqlalchemy as sa

PREFIX = "novaque_t_"
#: ``novaque_t_<pid>_<YYYYmmddHHMMSS>_<n>``.
NAME = re.compile(rf"{PREFIX}(\d+)_(\d{{14}})_\d+")
#: Databases an older suite named ``novaque_t_<10 hex digits>``: whose, nothing says.
OLD_NAME = re.compile(rf"{PREFIX}[0-9a-f]{{10}}")
#: How far apart two readings of one process's start may be (seconds): the
#: kernel's boot time, which it is counted from, is itself a rounded figure.
SLACK = 2


def started(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch); None if it does
    not run or where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The 22nd field, after the command in parentheses (which may hold spaces).
            ticks = int(stat.read().rpartition(")")[2].split()[19])
        with open("/proc/stat") as boot:
            btime = next(int(line.split()[1]) for line in boot if line.startswith("btime "))
    except (OSError, ValueError, StopIteration):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def runs(pid: int) -> bool:
    """Whether process ``pid`` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stamp(when: float) -> str:
    return time.strftime("%Y%m%d%H%M%S", time.gmtime(when))


_PID = os.getpid()
_START = stamp(started(_PID) or time.time())
_count = itertools.count(1)
#: This process's databases not dropped yet: name -> drop.
_live: dict[str, Callable[[], None]] = {}
_lock = threading.Lock()


def create(backend: str, server_url: str) -> tuple[str, Callable[[], None]]:
    """A new database on the server: its URL, and the function that drops it."""
    _install_handlers()
    db = f"{PREFIX}{_PID}_{_START}_{next(_count)}"
    server = sa.make_url(server_url)
    # No pool: a connection kept from session start would not survive a server restart.
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    quote = '"' if backend == "postgres" else "`"
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {quote}{db}{quote}")

    def drop() -> None:
        with _lock:
            if _live.pop(db, None) is None:
                return
        try:
            _drop(admin, backend, db)
        finally:
            admin.dispose()

    with _lock:
        _live[db] = drop
    return server.set(database=db).render_as_string(hide_password=False), drop


def _drop(admin: sa.Engine, backend: str, db: str) -> None:
    with admin.connect() as conn:
        if backend == "postgres":
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            return
        # MySQL waits for the metadata locks of the database's sessions (on
        # SIGTERM, maybe this process's own, stopped mid-transaction): end them.
        sessions = conn.exec_driver_sql(
            "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()",
            (db,),
        ).all()
        for (session,) in sessions:
            with contextlib.suppress(sa.exc.DBAPIError):  # it may have ended meanwhile
                conn.exec_driver_sql(f"KILL {int(session)}")
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{db}`")


def drop_all() -> None:
    """Drop every database this process made and still has (best effort)."""
    if os.getpid() != _PID:  # a forked child: the databases are its parent's
        return
    for drop in list(_live.values()):
        try:
            drop()
        except Exception as exc:
            print(f"novaque tests: could not drop a test database: {exc}", file=sys.stderr)


_installed = False


def _install_handlers() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(drop_all)
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGTERM)
        if previous in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Drop this process's databases, then die of SIGTERM as without the handler."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    drop_all()
    os.kill(os.getpid(), signal.SIGTERM)


# -- make test-clean ------------------------------------------------------------------------


def leftovers(names: list[str], *, old: bool = False) -> Iterator[tuple[str, str | None]]:
    """Each test database among ``names`` with why it is kept (None: drop it).

    ``old``: drop those of an older suite too (whose they are cannot be told)."""
    for name in names:
        found = NAME.fullmatch(name)
        if found is None:
            if OLD_NAME.fullmatch(name):
                yield name, None if old else OLDER
            continue
        pid, made = int(found.group(1)), found.group(2)
        start = started(pid)  # None where /proc does not say: then a running pid is enough
        if runs(pid) and (start is None or abs(_epoch(made) - start) <= SLACK):
            yield name, f"process {pid} still runs"
        else:
            yield name, None


OLDER = "named by an older suite"


def _epoch(made: str) -> float:
    return calendar.timegm(time.strptime(made, "%Y%m%d%H%M%S"))


def clean(backend: str, server_url: str, *, old: bool = False) -> None:
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            if backend == "postgres":
                query = "SELECT datname FROM pg_database"
            else:
                query = "SELECT schema_name FROM information_schema.schemata"
            names = sorted(n for (n,) in conn.exec_driver_sql(query) if n.startswith(PREFIX))
        older = 0
        for name, kept in leftovers(names, old=old):
            if kept == OLDER:
                older += 1
            elif kept:
                print(f"{backend}: kept {name} ({kept})")
            else:
                _drop(admin, backend, name)
                print(f"{backend}: dropped {name}")
        if older:
            print(
                f"{backend}: kept {older} databases named novaque_t_<hex> by an older suite, "
                "whose run cannot be told; with no such run going, "
                "`python -m tests._testdb --old` drops them"
            )
    finally:
        admin.dispose()


def main(argv: list[str] | None = None) -> int:
    """Drop the test databases of runs that ended without dropping them, on the
    servers of NOVAQUE_TEST_POSTGRES_URL and NOVAQUE_TEST_MYSQL_URL (else the
    local ones of the README's examples, where they answer)."""
    import argparse

    from tests.conftest import ENV, EXAMPLE_URL

    parser = argparse.ArgumentParser(prog="python -m tests._testdb", description=main.__doc__)
    parser.add_argument(
        "--old",
        action="store_true",
        help="also drop the novaque_t_<hex> databases of an older suite (when none of its runs "
        "is going: whose they are cannot be told)",
    )
    args = parser.parse_args(argv)
    status = 0
    for backend, variable in ENV.items():
        url = os.environ.get(variable)
        try:
            clean(backend, url or EXAMPLE_URL[backend], old=args.old)
        except sa.exc.OperationalError as exc:
            if url:  # asked for: say so, and fail
                print(f"{backend}: {variable}={url} is unreachable: {exc.orig}", file=sys.stderr)
                status = 1
            else:
                print(f"{backend}: no server at {EXAMPLE_URL[backend]} (set {variable})")
    return status


if __name__ == "__main__":
    sys.exit(main())
