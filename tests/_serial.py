"""Tests marked ``serial`` run alone inside the one session of ``make test``.

A serial test disturbs a server every test shares (it restarts PostgreSQL):
it waits until the tests running on the other xdist workers are done, and
no test starts until it is. Every test holds a shared lock on a file of the
session for its whole run (set-up to teardown), a serial test an exclusive
one; a second lock, taken on the way in, lets a waiting serial test in
before tests that come after it. Serial tests go last in the order, so the
others are not held up early, and there is no locking at all in a session
without one that can run.

A serial test of a server backend that is not configured is left out
without a word: the server line of the summary says that backend was not
tested (and a serial test is never pointed at a server it was not given).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator, Mapping
from typing import IO, Any

import pytest


class SerialTests:
    """The plugin (registered by tests/conftest.py)."""

    def __init__(self, server_env: Mapping[str, str]) -> None:
        #: Backend name -> the variable that configures its server.
        self.server_env = server_env
        self.active = False
        self.path: str | None = None
        self.files: tuple[IO[bytes], IO[bytes]] | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        serial = [item for item in items if item.get_closest_marker("serial") is not None]
        runnable = [item for item in serial if self._configured(item)]
        items[:] = [item for item in items if item not in serial] + runnable
        self.active = any(not _skipped(item) for item in runnable)
        workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        if self.active and workerinput is not None:
            self.path = os.path.join(
                tempfile.gettempdir(), f"novaque-serial-{workerinput['testrunuid']}.lock"
            )

    def _configured(self, item: pytest.Item) -> bool:
        params: dict[str, Any] = getattr(getattr(item, "callspec", None), "params", {})
        variable = self.server_env.get(params.get("backend", ""))
        return variable is None or bool(os.environ.get(variable))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        if self.path is None:  # no serial test, or no other worker
            return (yield)
        with self._held(exclusive=item.get_closest_marker("serial") is not None):
            return (yield)

    @contextlib.contextmanager
    def _held(self, *, exclusive: bool) -> Iterator[None]:
        assert self.path is not None
        if self.files is None:
            self.files = (open(self.path + ".in", "ab"), open(self.path, "ab"))  # noqa: SIM115
        turnstile, lock = self.files
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.files is not None:
            for file in self.files:
                file.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(file.name)


def _skipped(item: pytest.Item) -> bool:
    """Whether a ``skipif`` of the item with a boolean condition skips it."""
    return any(
        mark.args and isinstance(mark.args[0], bool) and mark.args[0]
        for mark in item.iter_markers("skipif")
    )
