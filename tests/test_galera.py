"""Consumers on every node of a 3-node MariaDB Galera Cluster.

``NOVAQUE_TEST_GALERA_URLS`` names the three nodes (space- or comma-separated
SQLAlchemy URLs, any existing database: the tests create and drop their own),
as ``tests/topologies/galera.sh start`` prints them; the test that kills a
node drives that script, so it needs the cluster the script started. Unset,
these tests are skipped, except under ``CI=true``, where they fail: CI starts
the cluster (``.ci/run``) and must never skip it silently.

Each consumer is a process (``tests/galera_worker.py``) on one node,
recording every lease it handled: its token, when its handler ran and when
the lease expired. From those records the tests check that nothing is lost
and that no delivery was leased to two consumers at once. Every node has two
consumers (in its one process, on engines of their own), one of the sync
client and one of the asyncio twin, so one run (and one node killed) covers
both clients.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from novaque.dialects import MySQLDialect, mysql
from novaque.schema import deliveries
from tests import _twin
from tests._handshake import go
from tests.conftest import _twin_loop
from tests.test_docs import blocks

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "topologies" / "galera.sh"
ENV = "NOVAQUE_TEST_GALERA_URLS"
WAIT = 90.0
#: A lease that expired may be taken again: allow this much skew between the
#: clocks the client of each node read from its server (one machine here).
SKEW_US = 100_000

pytestmark = pytest.mark.slow
CLIENTS = ("sync", "aio")


def node_urls() -> list[str]:
    urls = os.environ.get(ENV, "").replace(",", " ").split()
    if not urls:
        reason = (
            f"Galera not tested: set {ENV} to the three node URLs that "
            "tests/topologies/galera.sh start prints"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the cluster must be started, never skipped)")
        pytest.skip(reason)
    if len(urls) != 3:
        pytest.fail(f"{ENV} names {len(urls)} URLs; it needs the three nodes'")
    return urls


def live(url: str) -> int:
    """The deliveries left, as the node of ``url`` sees them."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            count = conn.execute(sa.select(sa.func.count()).select_from(deliveries))
            return int(count.scalar_one())
    finally:
        engine.dispose()


@dataclass
class Cluster:
    urls: list[str]

    def count_live(self, node: int = 0) -> int:
        """The deliveries left, as ``node`` (0-2) sees them."""
        return live(self.urls[node])

    def control(self, *args: str) -> float:
        """Run the cluster script (``kill N``, ``restart N``); the seconds it took."""
        began = time.monotonic()
        subprocess.run(["bash", str(SCRIPT), *args], check=True, timeout=180)
        return time.monotonic() - began


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    servers = node_urls()
    name = f"novaque_g_{secrets.token_hex(5)}"
    admin = sa.create_engine(servers[0], isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}`")  # replicated in total order
    urls = [
        sa.make_url(u).set(database=name).render_as_string(hide_password=False) for u in servers
    ]
    made = Cluster(urls)
    client = novaque.connect(urls[0])
    client.migrate()
    client.shutdown()
    yield made
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
    admin.dispose()


@pytest.fixture
def channel(cluster: Cluster) -> Cluster:
    """The cluster with an empty channel ``t``/``c``."""
    engine = sa.create_engine(cluster.urls[0], poolclass=sa.NullPool)
    with engine.begin() as conn:
        for table in reversed(novaque.schema.metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()
    client = novaque.connect(cluster.urls[0])
    client.ensure_channel("t", "c")
    client.shutdown()
    return cluster


class Worker:
    """The consumers of ``tests.galera_worker`` on one node (0-2)."""

    def __init__(self, url: str, node: int, out: Path, **flags: object) -> None:
        self.node, self.out = node, out
        args = [sys.executable, "-m", "tests.galera_worker", url, str(out)]
        for name, value in flags.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        self.proc = subprocess.Popen(args, cwd=ROOT)

    def lines(self) -> list[list[str]]:
        if not self.out.exists():
            return []
        text = self.out.read_text()
        complete = text[: text.rfind("\n") + 1]
        return [line.split() for line in complete.splitlines()]

    def handled_since(self, wall_ns: int, client: str) -> int:
        """How many messages ``client`` (sync, aio) handled since ``wall_ns``."""
        return sum(
            1 for f in self.lines() if f[0] == "E" and f[1] == client and int(f[5]) >= wall_ns
        )

    def all_handled_since(self, wall_ns: int) -> bool:
        """Whether both clients handled a message since ``wall_ns``."""
        return all(self.handled_since(wall_ns, client) for client in CLIENTS)

    def errors(self) -> list[str]:
        log = self.out.with_suffix(".log")
        lines = log.read_text().splitlines() if log.exists() else []
        return [line for line in lines if line.startswith("ERROR")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=WAIT)


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Consumer processes a test starts; killed at its end, whatever happened."""
    made: list[Worker] = []
    yield made
    for worker in made:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(timeout=60)


def on_every_node(cluster: Cluster, folder: Path, **flags: object) -> list[Worker]:
    return [
        Worker(url, node, folder / f"node{node + 1}.txt", **flags)
        for node, url in enumerate(cluster.urls)
    ]


def eventually(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass
class Lease:
    token: str
    #: Who handled it: (node, client).
    consumer: tuple[int, str]
    started_ns: int
    ended_ns: int | None
    expires_us: int


def leases(workers: list[Worker]) -> tuple[dict[int, list[Lease]], dict[int, int]]:
    """Every lease handled, per delivery (in the order they began), and the
    message of each delivery."""
    found: dict[tuple[int, str], Lease] = {}
    message_of: dict[int, int] = {}
    for worker in workers:
        for kind, client, delivery_id, token, message_id, at, *expires in worker.lines():
            delivery = int(delivery_id)
            message_of[delivery] = int(message_id)
            if kind == "S":
                consumer = (worker.node, client)
                found[(delivery, token)] = Lease(token, consumer, int(at), None, int(expires[0]))
            else:
                found[(delivery, token)].ended_ns = int(at)
    per_delivery: dict[int, list[Lease]] = defaultdict(list)
    for (delivery, _), lease in found.items():
        per_delivery[delivery].append(lease)
    for held in per_delivery.values():
        held.sort(key=lambda lease: lease.started_ns)
    return per_delivery, message_of


def leased_twice_at_once(per_delivery: dict[int, list[Lease]]) -> list[int]:
    """Deliveries whose next lease began before the lease before it expired (an
    ack ends a lease too, but then the delivery is gone: no next lease)."""
    return [
        delivery
        for delivery, held in per_delivery.items()
        for before, after in itertools.pairwise(held)
        if after.started_ns // 1000 < before.expires_us - SKEW_US
    ]


def publish(url: str, prefix: str, count: int) -> list[int]:
    client = novaque.connect(url)
    try:
        return client.publish_many("t", [f"{prefix} {i}".encode() for i in range(count)])
    finally:
        client.shutdown()


def fed_until(url: str, ids: list[int]) -> Callable[[Callable[[], bool], str], None]:
    """Wait for a condition of the consumers, publishing 30 more messages
    through ``url`` (their ids added to ``ids``) whenever they have drained
    the channel before it held."""

    def wait(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            if live(url) == 0:
                ids.extend(publish(url, "more", 30))
            time.sleep(0.05)

    return wait


def test_consumers_on_every_node_compete_without_double_leasing(
    channel: Cluster, tmp_path: Path, workers: list[Worker]
) -> None:
    """Two consumers per node, 600 messages published through the three nodes:
    each handled exactly once (30 s leases: none expires), never by two at once."""
    ids = [i for n, url in enumerate(channel.urls) for i in publish(url, f"node{n}", 200)]
    workers += on_every_node(channel, tmp_path)
    go(workers, timeout=WAIT)
    eventually(lambda: channel.count_live() == 0, "600 messages to be settled")
    for worker in workers:
        worker.stop()
        assert worker.proc.returncode == 0
    per_delivery, message_of = leases(workers)
    assert sorted(message_of.values()) == sorted(ids)
    assert all(lease.ended_ns is not None for held in per_delivery.values() for lease in held)
    assert leased_twice_at_once(per_delivery) == []
    # Conflicts between the nodes' claims are retried: none reached a consumer
    # (checked first: an error there says why a delivery came twice).
    assert {w.out.name: w.errors() for w in workers if w.errors()} == {}
    assert [d for d, held in per_delivery.items() if len(held) != 1] == []
    busy = {lease.consumer for held in per_delivery.values() for lease in held}
    assert len({node for node, _ in busy}) >= 2, busy
    assert {client for _, client in busy} == set(CLIENTS), busy


@pytest.mark.serial
def test_a_node_killed_mid_run_loses_nothing_and_rejoins(
    channel: Cluster, tmp_path: Path, workers: list[Worker]
) -> None:
    """Two consumers per node; node 2 is SIGKILLed mid-run and restarted. The
    other nodes' consumers go on, the dead node's consumers connect again once
    it is back and consume, nothing is lost, no delivery is leased twice at once."""
    ids = publish(channel.urls[0], "before", 200)
    workers += on_every_node(channel, tmp_path, lease=2.0)
    go(workers, timeout=WAIT)
    fed = fed_until(channel.urls[0], ids)
    fed(lambda: all(w.all_handled_since(0) for w in workers), "every consumer to handle some")
    channel.control("kill", "2")
    killed_ns = time.time_ns()
    try:
        survivors = [w for w in workers if w.node != 1]
        # The survivors take writes (once the cluster has noticed the loss) and consume.
        ids += publish(channel.urls[0], "during", 100) + publish(channel.urls[2], "during", 100)
        fed(
            lambda: all(w.all_handled_since(killed_ns) for w in survivors),
            "the other nodes' consumers to go on",
        )
    finally:  # back for the tests that follow, whatever happened
        rejoin_s = channel.control("restart", "2")
    back_ns = time.time_ns()
    # The restarted node takes writes, and its consumers consume again.
    ids += publish(channel.urls[1], "after", 100)
    fed_until(channel.urls[1], ids)(
        lambda: workers[1].all_handled_since(back_ns),
        "the restarted node's consumers to consume again",
    )
    for node in range(3):  # every node has applied every ack
        eventually(lambda node=node: channel.count_live(node) == 0, f"node {node + 1} to drain")
    for worker in workers:
        worker.stop()
        assert worker.proc.returncode == 0
    per_delivery, message_of = leases(workers)
    assert sorted(set(message_of.values())) == sorted(ids)
    assert leased_twice_at_once(per_delivery) == []
    print(f"node 2 rejoined in {rejoin_s:.1f} s")


def test_the_tutorials_publishing_example_holds_on_galera(channel: Cluster) -> None:
    """The cluster steps auto-increment ids by its size: the tutorial's
    publishing example must not assume consecutive ids."""
    (example,) = [b for b in blocks("docs/tutorial.md") if 'publish_many("orders"' in b]
    client = novaque.connect(channel.urls[0])
    try:
        exec(compile(example, "tutorial: Publish", "exec", dont_inherit=True), {"client": client})
    finally:
        client.shutdown()


def test_unset_urls_skip_here_and_fail_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"set {ENV}"):
        node_urls()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        node_urls()
    monkeypatch.setenv(ENV, "mysql+pymysql://root@127.0.0.1:4306/test")
    with pytest.raises(pytest.fail.Exception, match="names 1 URLs"):
        node_urls()


def driver_error(module: str, code: int, text: str) -> sa.exc.DBAPIError:
    """A driver's error as SQLAlchemy raises it (the driver's own as ``orig``)."""
    errors = importlib.import_module(module)
    return sa.exc.OperationalError("SELECT 1", {}, errors.OperationalError(code, text))


@pytest.mark.parametrize("driver", ["pymysql.err", "asyncmy.errors"])
def test_a_node_not_ready_or_a_lost_connection_is_unavailable_not_a_conflict(
    driver: str,
) -> None:
    dialect = MySQLDialect()
    for code, text in [
        (1047, "WSREP has not yet prepared node for application use"),
        (2003, "Can't connect to MySQL server on '127.0.0.1'"),
        (2006, "MySQL server has gone away"),
        (2013, "Lost connection to MySQL server during query"),
    ]:
        exc = driver_error(driver, code, text)
        assert dialect.is_unavailable(exc), code
        assert not dialect.is_retryable(exc), code
    conflict = driver_error(driver, 1213, "Deadlock found when trying to get lock")
    assert dialect.is_retryable(conflict)
    assert not dialect.is_unavailable(conflict)
    refused = driver_error(driver, 1406, "Data too long for column 'body'")
    assert not dialect.is_unavailable(refused)
    assert not dialect.is_retryable(refused)


@contextlib.contextmanager
def rejecting_queries(url: str) -> Iterator[None]:
    """The node of ``url`` refuses its clients' queries as a node that is not
    ready does (1047), until the block ends."""
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    # One connection throughout: a new one would be refused too (SQLAlchemy's
    # first queries on it), but a SET still runs on an open one.
    with admin.connect() as conn:
        conn.exec_driver_sql("SET GLOBAL wsrep_reject_queries = ALL")
        try:
            yield
        finally:
            conn.exec_driver_sql("SET GLOBAL wsrep_reject_queries = NONE")
    admin.dispose()


@pytest.mark.serial
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_node_not_ready_for_clients_makes_calls_unavailable_then_serves_again(
    channel: Cluster, kind: str
) -> None:
    url = channel.urls[2]
    client: novaque.Client
    if kind == "sync":
        client = novaque.connect(url)
    else:
        client = _twin.make("mysql", url, _twin_loop(), novaque.Options())  # type: ignore[assignment]
    try:
        client.publish("t", b"before")
        with rejecting_queries(url), pytest.raises(novaque.DatabaseUnavailable) as raised:
            client.publish("t", b"during")
        cause = raised.value.__cause__
        assert isinstance(cause, sa.exc.DBAPIError)
        assert MySQLDialect().is_unavailable(cause), cause
        # The same client, its connections kept, publishes once the node is ready.
        client.publish("t", b"after")
    finally:
        if kind == "sync":
            client.shutdown()
        else:
            client.close()  # type: ignore[attr-defined]
    assert live(url) == 2


def test_claims_are_spread_on_every_node(channel: Cluster) -> None:
    """A client finds at its first use that its server is a cluster's node
    (the claims then look in one slice of the due deliveries first)."""
    for url in channel.urls:
        client = novaque.connect(url)
        try:
            client.list_topics()
            assert getattr(client._context.dialect, "slices", 0) == mysql.CLAIM_SLICES, url
        finally:
            client.shutdown()
