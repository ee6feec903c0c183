"""novaque.kombu: kombu's routing on novaque, leases as unacked messages, and
real ``celery worker`` processes (tests/celery_app.py) on every backend.

Conditions are awaited by polling with a deadline, never by sleeping a fixed
time.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kombu.pools
import pytest
import sqlalchemy as sa
from celery import Celery

import novaque
import novaque.kombu
from kombu import Connection, Exchange, Queue
from novaque import _validate
from novaque.kombu import channel_name, topic_names
from novaque.testing import FakeClock
from tests import _preloaded, _procs
from tests.celery_app import make_app
from tests.conftest import Backend, driverless
from tests.test_docs import doc_file

ROOT = Path(__file__).resolve().parent.parent
WAIT = 60.0


def eventually(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll ``condition`` until it returns something true; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


@pytest.fixture
def broker(backend: Backend) -> Iterator[str]:
    """The backend's database as a kombu URL; the transport's clients closed afterwards.

    kombu's global connection pools are reset too: their connections remember
    what they declared, and the next test starts on emptied tables.
    """
    yield "novaque+" + backend.url
    kombu.pools.reset()
    novaque.kombu.shutdown_clients()


def drain(conn: Connection, queue: Queue, *, ack: bool = True) -> list[Any]:
    """Every payload ready in ``queue`` now (acked unless told otherwise)."""
    bound = queue(conn.default_channel)
    got = []
    while (message := bound.get()) is not None:
        got.append(message.payload)
        if ack:
            message.ack()
    return got


# -- names --------------------------------------------------------------------------


def test_names_fit_novaque_and_stay_apart() -> None:
    assert topic_names("kombu", "", "direct", "celery") == "kombu::celery"
    assert topic_names("kombu", "ex", "direct", "a.b") == "kombu::ex::direct::a.b"
    assert topic_names("kombu", "celery.pidbox", "fanout") == "kombu::celery.pidbox::fanout"
    assert topic_names("kombu", "ev", "topic", "worker.#") == "kombu::ev::topic::worker.:23"
    assert channel_name("celery@host.celery.pidbox") == "celery:40host.celery.pidbox"
    # ":" itself is escaped, so a name never makes a separator of its own.
    assert channel_name("a::b") != channel_name("a:b") != channel_name("a")
    assert topic_names("k", "a::direct::b", "direct", "c") != topic_names(
        "k", "a", "direct", "b::c"
    )
    long = [channel_name("q" * 300), channel_name("q" * 301)]
    assert all(len(n) == 200 for n in long)
    assert long[0] != long[1]
    for name in ["celery", "x" * 300, "é@:/ %", "a.b-c_d"]:  # novaque takes them all
        _validate.name(channel_name(name), "channel")


# -- routing without Celery ---------------------------------------------------------


def test_direct_exchange_routes_by_key_across_connections(broker: str) -> None:
    exchange = Exchange("orders", "direct")
    q_a1, q_a2, q_b = (
        Queue("a1", exchange, "a"),
        Queue("a2", exchange, "a"),
        Queue("b", exchange, "b"),
    )
    with Connection(broker) as consumer_side, Connection(broker) as producer_side:
        for queue in (q_a1, q_a2, q_b):
            queue(consumer_side.default_channel).declare()
        # The producer never declared the queues: the bindings come from the database.
        producer = producer_side.Producer(exchange=exchange)
        producer.publish({"n": 1}, routing_key="a")
        producer.publish({"n": 2}, routing_key="b")
        producer.publish({"n": 3}, routing_key="nobody")
        # The default exchange: the routing key names the queue.
        producer_side.Producer().publish({"n": 4}, routing_key="b")
        assert drain(consumer_side, q_a1) == [{"n": 1}]
        assert drain(consumer_side, q_a2) == [{"n": 1}]
        # Two topics (the exchange's and the queue's home): no order between them.
        assert sorted(p["n"] for p in drain(consumer_side, q_b)) == [2, 4]


def test_topic_exchange_routes_by_pattern_across_connections(broker: str) -> None:
    exchange = Exchange("news", "topic")
    queues = {
        "usa": Queue("usa", exchange, "usa.#"),
        "weather": Queue("weather", exchange, "*.weather"),
        "all": Queue("all", exchange, "#"),
    }
    with Connection(broker) as consumer_side, Connection(broker) as producer_side:
        for queue in queues.values():
            queue(consumer_side.default_channel).declare()
        producer = producer_side.Producer(exchange=exchange)
        for key in ["usa.news", "usa.weather", "europe.weather", "asia.sports.today"]:
            producer.publish({"key": key}, routing_key=key)
        got = {name: [p["key"] for p in drain(consumer_side, q)] for name, q in queues.items()}
    assert got == {
        "usa": ["usa.news", "usa.weather"],
        "weather": ["usa.weather", "europe.weather"],
        "all": ["usa.news", "usa.weather", "europe.weather", "asia.sports.today"],
    }


def test_fanout_exchange_copies_to_every_bound_queue(broker: str, backend: Backend) -> None:
    exchange = Exchange("broadcast", "fanout")
    first, second, late = (Queue(n, exchange) for n in ("first", "second", "late"))
    with Connection(broker) as conn, Connection(broker) as producer_side:
        first(conn.default_channel).declare()
        second(conn.default_channel).declare()
        producer_side.Producer(exchange=exchange).publish({"n": 1}, routing_key="ignored")
        late(conn.default_channel).declare()
        producer_side.Producer(exchange=exchange).publish({"n": 2})
        assert drain(conn, first) == [{"n": 1}, {"n": 2}]
        assert drain(conn, second) == [{"n": 1}, {"n": 2}]
        assert drain(conn, late) == [{"n": 2}]  # bound after the first publish
    # One message per publish, one delivery per bound queue: novaque's fan-out.
    client = backend.client()
    topic = topic_names("kombu", "broadcast", "fanout")
    assert client.list_channels(topic) == ["first", "late", "second"]
    assert len(client.list_messages(topic)) == 2


def elsewhere(broker: str, *declare: tuple[Any, ...]) -> None:
    """Declare queues and bindings (or unbind, see ``_procs.declare_kombu_queues``)
    in another process: its kombu state is not this process's."""
    ctx = _preloaded.context
    out = ctx.Queue()
    proc = _preloaded.process(_procs.declare_kombu_queues, (broker, list(declare), out))
    proc.start()
    try:
        status, detail = out.get(timeout=120)
    finally:
        proc.join(timeout=60)
    assert status == "ok", detail


def test_queues_bound_in_another_process_are_consumed_by_name(broker: str) -> None:
    elsewhere(
        broker,
        ("f1", "fan", "fanout", ""),
        ("f2", "fan", "fanout", ""),
        ("d1", "dir", "direct", "k1"),
        ("d1", "dir", "direct", "k2"),
        ("t1", "top", "topic", "a.*"),
        ("t2", "top", "topic", "#"),
    )
    fan, dir_, top = Exchange("fan", "fanout"), Exchange("dir", "direct"), Exchange("top", "topic")
    with Connection(broker) as conn:
        # This process declares the exchanges it publishes to, never the queues.
        conn.Producer(exchange=fan).publish({"via": "fan"})
        for key in ("k1", "k2", "k3"):
            conn.Producer(exchange=dir_).publish({"via": key}, routing_key=key)
        for key in ("a.b", "b.c"):
            conn.Producer(exchange=top).publish({"via": key}, routing_key=key)
        channel = conn.default_channel
        sizes = {q: channel.queue_declare(q, passive=True).message_count for q in ("d1", "t2")}
        assert sizes == {"d1": 2, "t2": 2}
        got = {
            name: sorted(p["via"] for p in drain(conn, Queue(name)))
            for name in ("f1", "f2", "d1", "t1", "t2")
        }
    assert got == {
        "f1": ["fan"],
        "f2": ["fan"],
        "d1": ["k1", "k2"],
        "t1": ["a.b"],
        "t2": ["a.b", "b.c"],
    }


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic"])
def test_a_binding_made_or_removed_elsewhere_is_seen_within_the_cache_time(
    broker: str, kind: str
) -> None:
    clock = FakeClock()
    exchange = Exchange("ex", kind)
    key = "" if kind == "fanout" else "k"
    bound = topic_names("kombu", "ex", kind, key)
    options = {"options": {"clock": clock}}  # one client, on the test's clock, for both sides
    with (
        Connection(broker, transport_options=options) as conn,
        Connection(broker, transport_options=options) as producer_side,
    ):
        queue = Queue("q")(conn.default_channel)
        queue.declare()
        assert queue.get() is None  # what the queue is bound to is read, and kept a while
        elsewhere(broker, ("q", "ex", kind, key))
        producer_side.Producer(exchange=exchange).publish({"n": 1}, routing_key=key)
        assert queue.get() is None  # within the cache time
        clock.advance(novaque.kombu.Transport.topics_ttl)
        got = queue.get()
        assert got is not None
        assert got.payload == {"n": 1}
        got.ack()
        assert bound in conn.default_channel._topics_of("q")
        elsewhere(broker, ("q", None, "ex", kind, key))
        assert bound in conn.default_channel._topics_of("q")
        clock.advance(novaque.kombu.Transport.topics_ttl)
        assert bound not in conn.default_channel._topics_of("q")


def test_deleting_a_queue_drops_the_bindings_another_process_made(
    broker: str, backend: Backend
) -> None:
    elsewhere(broker, ("gone", "fan", "fanout", ""), ("gone", "dir", "direct", "k"))
    with Connection(broker) as conn:
        conn.default_channel.queue_delete("gone")
    client = backend.client()
    left = [t for t in client.list_topics() if "gone" in client.list_channels(t)]
    assert left == []


def test_a_broker_url_whose_database_url_names_no_driver(backend: Backend) -> None:
    """``novaque+postgres://`` (the form platforms give), ``novaque+postgresql://``,
    ``novaque+mysql://``: novaque's driver, as for novaque.connect."""
    try:
        for given in driverless(backend):
            scheme = sa.make_url(given).drivername
            with Connection("novaque+" + given) as conn:
                queue = Queue(scheme)(conn.default_channel)
                queue.declare()
                conn.Producer().publish({"via": scheme}, routing_key=scheme)
                assert drain(conn, Queue(scheme)) == [{"via": scheme}]
                driver = {"postgresql": "psycopg", "mysql": "pymysql", "sqlite": "pysqlite"}
                engine = conn.default_channel.client.engine
                assert engine.dialect.driver == driver[engine.dialect.name]
    finally:
        kombu.pools.reset()
        novaque.kombu.shutdown_clients()


# -- unacked messages are leases ----------------------------------------------------


def test_unacked_message_is_leased_renewed_and_given_back(broker: str) -> None:
    queue = Queue("work")
    options = {"lease": 0.6}
    with (
        Connection(broker, transport_options=options) as holder,
        Connection(broker, transport_options=options) as other,
    ):
        queue(holder.default_channel).declare()
        holder.Producer().publish({"n": 1}, routing_key="work")
        held = queue(holder.default_channel).get()
        assert held is not None
        assert held.payload == {"n": 1}
        # Held for several leases: renewed, so nobody else gets it.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert queue(other.default_channel).get() is None
            time.sleep(0.1)
        held.ack()
    with Connection(broker) as conn:
        assert drain(conn, queue) == []
        # Unacked at close: given back at once, its attempt not counted.
        conn.Producer().publish({"n": 2}, routing_key="work")
        with Connection(broker) as leaving:
            assert queue(leaving.default_channel).get().payload == {"n": 2}
        again = queue(conn.default_channel).get()
        assert again.payload == {"n": 2}
        assert not again.delivery_info["redelivered"]
        again.ack()


def test_reject_requeues_or_dead_letters(broker: str, backend: Backend) -> None:
    queue = Queue("jobs")
    with Connection(broker) as conn:
        bound = queue(conn.default_channel)
        bound.declare()
        conn.Producer().publish({"n": 1}, routing_key="jobs")
        bound.get().requeue()
        again = bound.get()
        assert again.payload == {"n": 1}
        assert again.delivery_info["redelivered"]
        again.reject()
        assert bound.get() is None
    dead = backend.client().list_dead(topic_names("kombu", "", "direct", "jobs"), "jobs")
    assert [d.reason for d in dead] == ["rejected by the kombu consumer"]


def test_no_ack_takes_the_message_for_good(broker: str) -> None:
    queue = Queue("fire")
    with Connection(broker) as conn:
        queue(conn.default_channel).declare()
        conn.Producer().publish({"n": 1}, routing_key="fire")
        assert queue(conn.default_channel).get(no_ack=True).payload == {"n": 1}
    with Connection(broker) as conn:
        assert drain(conn, queue) == []


def test_kombu_priority_is_novaques_priority(broker: str) -> None:
    """Celery's ``priority=`` (kombu's 0-9, 0 first) orders the queue; a value
    outside 0-9 goes to the nearest end."""
    queue = Queue("ranked")
    with Connection(broker) as conn:
        queue(conn.default_channel).declare()
        producer = conn.Producer()
        producer.publish({"n": "plain"}, routing_key="ranked")
        producer.publish({"n": "nine"}, routing_key="ranked", priority=9)
        producer.publish({"n": "three"}, routing_key="ranked", priority=3)
        producer.publish({"n": "zero"}, routing_key="ranked", priority=0)
        producer.publish({"n": "huge"}, routing_key="ranked", priority=255)
        assert [p["n"] for p in drain(conn, queue)] == ["plain", "zero", "three", "nine", "huge"]


def test_consumer_drains_with_prefetch_and_purge_counts(broker: str) -> None:
    queue = Queue("bulk", Exchange("bulk", "direct"), "bulk")
    with Connection(broker, transport_options={"polling_interval": 0.01}) as conn:
        queue(conn.default_channel).declare()
        producer = conn.Producer(exchange=queue.exchange, routing_key="bulk")
        for n in range(7):
            producer.publish({"n": n})
        seen: list[int] = []

        def on_message(body: dict[str, int], message: Any) -> None:
            seen.append(body["n"])
            message.ack()

        with conn.Consumer(queue, callbacks=[on_message], prefetch_count=3):
            deadline = time.monotonic() + WAIT
            while len(seen) < 7 and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.5)
        assert sorted(seen) == list(range(7))
        for n in range(4):
            producer.publish({"n": n})
        assert queue(conn.default_channel).purge() == 4
        assert drain(conn, queue) == []


def test_celery_task_arguments_fit_in_three_quarters_of_max_body_bytes(broker: str) -> None:
    """What docs/how-to/celery.md says of large task arguments: kombu sends them base64-encoded
    in a JSON envelope, so the default 1 MiB body holds about 766 KiB of them."""

    def send(size: int, **options: Any) -> None:
        app = Celery("big", broker=broker, set_as_current=False)
        app.conf.broker_transport_options = {"options": options}
        try:
            app.send_task("tests.big", args=["x" * size])
        finally:
            app.close()

    send(764 * 1024)
    with pytest.raises(novaque.MessageTooLarge, match="max_body_bytes=1048576"):
        send(768 * 1024)
    send(768 * 1024, max_body_bytes=2 * 1024 * 1024)


# -- Celery workers -----------------------------------------------------------------


class Worker:
    """One ``celery worker`` process on the test app."""

    def __init__(self, broker: str, out: Path, name: str, *args: str, lease: float = 30.0):
        env = dict(
            os.environ,
            NOVAQUE_CELERY_BROKER=broker,
            NOVAQUE_CELERY_OUT=str(out),
            NOVAQUE_CELERY_LEASE=str(lease),
        )
        self.log = out.parent / f"{name}.log"
        command = [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker"]
        command += ["-n", f"{name}@%h", "-l", "info", "--without-mingle", "--without-gossip"]
        with self.log.open("wb") as log:
            self.proc = _preloaded.popen(
                [*command, *args][1:], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=WAIT)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    return folder


def traces(out: Path, prefix: str) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith(prefix))


def explain(workers: list[Worker]) -> str:
    return "\n".join(f"--- {w.log.name}\n{w.log.read_text()[-3000:]}" for w in workers)


@pytest.mark.slow
def test_celery_worker_runs_tasks_retries_and_countdown(
    broker: str, out: Path, workers: list[Worker]
) -> None:
    # prefork: retries are published from the pool's forked child.
    workers.append(Worker(broker, out, "w1", "-Q", "celery,other", "-P", "prefork", "-c", "1"))
    app = make_app(broker, str(out))
    app.send_task("tests.add", args=(2, 3, "a"))
    app.send_task("tests.add", args=(4, 5, "other"), queue="other")
    app.send_task("tests.flaky", args=("f", 2))
    sent = time.time()
    app.send_task("tests.stamp", args=("late",), countdown=1.0)
    try:
        eventually(lambda: (out / "stamp-late").exists(), "the countdown task")
        eventually(lambda: (out / "flaky-f-done").exists(), "the retried task")
        eventually(lambda: (out / "add-other").exists(), "the task sent to queue 'other'")
    except AssertionError:
        raise AssertionError(explain(workers)) from None
    assert (out / "add-a").read_text().split()[0] == "5"
    assert (out / "add-other").read_text().split()[0] == "9"
    assert traces(out, "flaky-f-try") == ["flaky-f-try0", "flaky-f-try1", "flaky-f-try2"]
    assert float((out / "stamp-late").read_text()) >= sent + 1.0
    workers[0].stop()
    assert workers[0].proc.returncode == 0, explain(workers)


@pytest.mark.slow
def test_celery_task_of_a_killed_worker_runs_again(
    broker: str, out: Path, workers: list[Worker]
) -> None:
    first = Worker(broker, out, "first", "-P", "solo", lease=1.5)
    workers.append(first)
    make_app(broker, str(out)).send_task("tests.hang", args=("h",))
    try:
        eventually(lambda: traces(out, "hang-h-started"), "the first worker to start the task")
    except AssertionError:
        raise AssertionError(explain(workers)) from None
    first.stop(signal.SIGKILL)
    (out / "release").touch()
    second = Worker(broker, out, "second", "-P", "solo", lease=1.5)
    workers.append(second)
    try:
        done = eventually(lambda: traces(out, "hang-h-done"), "the task to run again")
    except AssertionError:
        raise AssertionError(explain(workers)) from None
    assert traces(out, "hang-h-started") == sorted(
        [f"hang-h-started-{first.proc.pid}", f"hang-h-started-{second.proc.pid}"]
    )
    assert done == [f"hang-h-done-{second.proc.pid}"]
    second.stop()


@pytest.mark.slow
def test_the_docs_celery_example_runs(tmp_path: Path, workers: list[Worker]) -> None:
    """docs/how-to/celery.md's tasks.py and send.py as written, with a default worker
    (mingle, gossip and heartbeats on), and remote control answering."""
    for name in ("tasks.py", "send.py"):
        (tmp_path / name).write_text(doc_file(name))
    log = tmp_path / "worker.log"
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    with log.open("wb") as out:
        proc = _preloaded.popen(
            ["-m", "celery", "-A", "tasks", "worker", "-l", "info", "-c", "1"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    worker = Worker.__new__(Worker)
    worker.proc, worker.log = proc, log
    workers.append(worker)
    sent = _preloaded.run(["send.py"], cwd=tmp_path, env=env, timeout=WAIT)
    assert sent.returncode == 0, sent.stderr
    try:
        eventually(lambda: "succeeded" in log.read_text(), "the first task")
        eventually(lambda: log.read_text().count("succeeded") == 2, "the countdown task")
    except AssertionError:
        raise AssertionError(explain(workers)) from None
    results = re.findall(r"succeeded in [0-9.e-]+s: (\d+)", log.read_text())
    assert sorted(results) == ["5", "9"]
    # Addressed to the worker, the ping returns with its answer (to all, it
    # would wait out the 5 s for more).
    node = f"celery@{socket.gethostname()}"
    ping = _preloaded.run(
        ["-m", "celery", "-A", "tasks", "inspect", "ping", "-t", "5", "-d", node],
        cwd=tmp_path,
        env=env,
        timeout=WAIT,
    )
    assert "pong" in ping.stdout, ping.stdout + ping.stderr
    worker.stop()
    assert proc.returncode == 0, explain(workers)
